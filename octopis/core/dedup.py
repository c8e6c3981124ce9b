"""Edge dedup (DESIGN §7): a host broker hands a given ``(publisher, seq)`` of one
publisher session to its local subscribers at most once.

Without failures no copy reaches a host twice (the paper's exactly-once law), so dedup
never fires; after a link-down, re-routed custody copies and publications an SDK re-sends
after a fail-over can arrive again, and dedup absorbs them. Memory is bounded: the last
``window`` sequence numbers per publisher session, for at most ``publishers`` of them (the
one first seen longest ago is forgotten first, and counted). A publisher is known by its
name and session, so one that starts again (numbering from 1 again under a new session)
is never taken for a repeat of its earlier self.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

DEFAULT_DEDUP_WINDOW = 4096
"""Sequence numbers remembered per publisher session (``[dedup] window``)."""
DEFAULT_DEDUP_PUBLISHERS = 10_000
"""Publisher sessions remembered at most (``[dedup] publishers``)."""


class EdgeDedup:
    """The ``(publisher, seq)`` pairs this host has delivered, within bounded windows;
    ``publisher`` is any hashable name of a publisher session."""

    __slots__ = ("_seen", "forgotten", "publishers", "window")

    def __init__(
        self, window: int = DEFAULT_DEDUP_WINDOW, publishers: int = DEFAULT_DEDUP_PUBLISHERS
    ) -> None:
        if window < 1 or publishers < 1:
            raise ValueError("dedup window and publisher limit must be at least 1")
        self.window = window
        self.publishers = publishers
        self.forgotten = 0
        """Publishers dropped to stay within ``publishers``."""
        self._seen: dict[Hashable, tuple[set[int], deque[int]]] = {}

    def first(self, publisher: Hashable, seq: int) -> bool:
        """True the first time ``(publisher, seq)`` is offered (and remember it)."""
        seen = self._seen.get(publisher)
        if seen is None:
            if len(self._seen) >= self.publishers:
                del self._seen[next(iter(self._seen))]
                self.forgotten += 1
            seen = self._seen[publisher] = (set(), deque())
        seqs, order = seen
        if seq in seqs:
            return False
        seqs.add(seq)
        order.append(seq)
        if len(order) > self.window:
            seqs.discard(order.popleft())
        return True

    def __len__(self) -> int:
        return sum(len(order) for _, order in self._seen.values())
