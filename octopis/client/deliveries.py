"""Deliveries as the SDK hands them over (DESIGN §4): :class:`Received` and the handler a
connection calls for each. The record of recent deliveries that lets a client served by
two connections during a move or a fail-over drop what it got twice is the client
policy's :class:`~octopis.client_policy.RecentDeliveries` (DESIGN §7, §9)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from octopis.filters.language import Publication


@dataclass(frozen=True, slots=True)
class Received:
    """A delivered notification with its accounting fields. Times are ``time.time()``
    (the real-time clock) of the publisher (``published_at``), of the broker that
    delivered it as the message left (``left_broker_at``; NaN if it did not say) and of
    this process as the SDK took the message (``received_at``, just before the callback).
    On one host they read the same clock; across hosts their differences are only as
    good as the hosts' clock synchronisation."""

    subscriber: str
    publisher: str
    seq: int
    published_at: float
    received_at: float
    publication: Publication
    left_broker_at: float = math.nan
    session: int = 0
    """The publisher's session (a publisher started again numbers from 1 in a new one)."""
    replayed: bool = False
    """Delivered from the overlay's retention after a fail-over (DESIGN §11)."""
    body: bytes = b""
    """The publication's opaque body, as its publisher gave it (empty when none)."""

    @property
    def overlay_delay(self) -> float:
        """Seconds from publishing to leaving the last broker (the overlay's share)."""
        return self.left_broker_at - self.published_at

    @property
    def client_delay(self) -> float:
        """Seconds from leaving the last broker to the SDK (the client side's share:
        the hop, and any wait in this process's input)."""
        return self.received_at - self.left_broker_at


NotificationHandler = Callable[
    [str, str, int, float, Publication, float, float, int, int, bytes], None
]
"""Called with (client name, publisher, seq, published_at, publication, received_at,
left_broker_at, size, session, body): ``size`` is the delivery's encoded length in bytes,
``session`` the publisher's session, ``body`` the publication's opaque body."""
