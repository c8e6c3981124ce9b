"""What the SDK raises when a broker refuses a request, drops a connection, or cannot be
reached (DESIGN §4, §8): the message says why and what to do next."""

from __future__ import annotations


class BrokerError(Exception):
    """The broker refused a request; the message is the broker's."""


class UnadvertisedError(BrokerError):
    """The broker refused a publication outside every advertisement its publisher made
    (the overlay runs with advertisements on): advertise a filter it matches first
    (:meth:`Publisher.advertise`)."""


class DroppedError(BrokerError):
    """The broker dropped this connection (a slow consumer, DESIGN §8); the message is
    its reason. Its subscriptions are withdrawn; connect again to go on."""


class ConnectError(ConnectionError):
    """A connection could not be opened; the message says why and what to do next."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        """The endpoint the connection tried."""


class HandshakeFailed(ConnectError):
    """The socket's security handshake failed: the broker wants CurveZMQ keys and the
    client has none, it refused the client's key, the client's keys are another
    overlay's, or the broker runs without keys and the client has some."""


class NotAClientSocket(ConnectError):
    """The endpoint is not a broker's client socket (a broker's peer socket, say)."""


class NothingListening(ConnectError):
    """Nothing accepts connections at the endpoint (no broker runs there)."""


class NoReply(ConnectError, TimeoutError):
    """A connection was made (or is still being made) but nothing answered in time; the
    message says how far it got."""
