"""Deliveries as the SDK hands them over (DESIGN §4): :class:`Received`, the handler a
connection calls for each, and the record of recent deliveries that lets a client served
by two connections during a move or a fail-over drop what it got twice (DESIGN §7, §9)."""

from __future__ import annotations

import math
from collections import deque
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
DeliveryKey = tuple[str, str, int, int]
"""(client, publisher, publisher session, seq): one delivery."""


class RecentDeliveries:
    """The deliveries of the last ``horizon`` seconds to the clients of one application,
    so that a client served by two connections during a move (or a fail-over) can drop
    what it got twice (every delivery is checked: a repeat is never legitimate, and one
    set lookup costs less than knowing when a repeat may come). A copy can come that much
    later only if the two paths differ by that much: the horizon should exceed the
    connections' ``linger``. At most ``limit`` deliveries are remembered after each frame
    (:meth:`forget_old`); one forgotten before its time is counted in
    :attr:`forgotten_early`."""

    def __init__(self, horizon: float = 30.0, limit: int = 262_144) -> None:
        if horizon <= 0 or limit < 1:
            raise ValueError("a connection group needs a positive horizon and limit")
        self.horizon = horizon
        self.limit = limit
        self.forgotten_early = 0
        """Deliveries forgotten within the horizon to stay within ``limit``."""
        self.seen: set[DeliveryKey] = set()
        """The deliveries remembered; a connection adds each one it hands over, with its
        time in :attr:`recent`."""
        self.recent: deque[tuple[float, DeliveryKey]] = deque()
        """``(time, key)`` of each delivery in :attr:`seen`, oldest first."""

    def first_time(self, key: DeliveryKey, now: float) -> bool:
        """Whether delivery ``key`` comes for the first time (within the horizon); it is
        remembered from ``now`` if so."""
        if key in self.seen:
            return False
        self.seen.add(key)
        self.recent.append((now, key))
        return True

    def forget_old(self, now: float) -> None:
        """Forget the deliveries past the horizon at time ``now``, and the oldest beyond
        the limit."""
        recent = self.recent
        oldest = now - self.horizon
        while recent and (recent[0][0] < oldest or len(recent) > self.limit):
            at, old = recent.popleft()
            if at >= oldest:
                self.forgotten_early += 1
            self.seen.discard(old)
