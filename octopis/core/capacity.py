"""Send capacity of links and brokers (paper §6.3: limited bandwidth, an overwhelmed
broker; DESIGN §3).

One model for the real brokers and the simulator: a sender limited to ``rate`` sends per
second hands out back-to-back slots of ``1/rate`` seconds; a copy ready at ``t`` takes the
first free slot and leaves when that slot ends. A copy passes its broker's sender first
(shared by all its links) and then its link. The table reads no clock: callers pass the
time.
"""

from __future__ import annotations

from collections.abc import Iterable


class SendRate:
    """At most ``rate`` sends per second, in back-to-back slots.

    ``slack`` lets a sender that fell behind (a late event loop) book slots up to that
    many seconds in the past, so lateness is made up instead of lost; a copy never leaves
    before it is ready.
    """

    __slots__ = ("free_at", "gap", "slack")

    def __init__(self, rate: float, slack: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError(f"a send rate must be positive, got {rate}")
        self.gap = 1.0 / rate
        self.slack = slack
        self.free_at = 0.0

    def book(self, ready: float, count: int = 1) -> float:
        """Book the first ``count`` free slots, back to back, for copies ready at
        ``ready``; returns when the last of them leaves."""
        start = max(self.free_at, ready - self.slack)
        self.free_at = start + count * self.gap
        return max(self.free_at, ready)


def departure(ready: float, senders: Iterable[SendRate]) -> float:
    """When a copy ready at ``ready`` leaves after passing ``senders`` in order (the
    broker's sender, then the link's)."""
    for sender in senders:
        ready = sender.book(ready)
    return ready
