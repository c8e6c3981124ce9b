"""The control plane's load balancing (DESIGN §9): plans of subscriber moves from the
brokers' load analysis, the same for the ``octopis balance`` process and the simulator."""
