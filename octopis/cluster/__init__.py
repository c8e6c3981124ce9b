"""Broker processes on this machine: the launcher and the ``octopis run`` driver."""
