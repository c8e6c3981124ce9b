"""Other client protocols mapped onto a broker's client sessions (DESIGN §13): STOMP 1.2
(1.0/1.1 negotiated) over TCP and WebSocket, with JMS selectors translated exactly into
PADRES subscriptions. No routing of its own."""
