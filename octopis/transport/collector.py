"""The cyclic collector's passes, moved to the moments a broker's input runs dry (issue 16).

A broker forwarding notifications frees what it allocates by reference counting, so its
young generation (``memory.gc_young`` net allocations) rarely fills under load. What
fills it is bulk work that leaves long-lived objects: a flood of subscriptions (about ten
objects each) or a custody buffer filling up. Python's collector then traverses them at
the next allocation past the threshold, which can be in the middle of the traffic that
follows: after 10,000 subscriptions, one young pass over ~100,000 live objects held the
hop for 24–41 ms. :class:`IdleCollector` takes that pass when an input has nothing to read.
"""

from __future__ import annotations

import gc


class IdleCollector:
    """Runs the collector when an input runs dry with at least ``young`` objects waiting
    in the young generation (``memory.gc_idle``; 0: never): the pass Python's own would
    take next, the oldest generation whose count is past its threshold (the full pass
    without Python's further rule that a quarter of the old objects be new). Cheap to ask
    when there is nothing to do: one read of the collector's counts."""

    def __init__(self, young: int) -> None:
        self.young = young
        self.passes = [0, 0, 0]
        """Passes taken here, by generation."""

    def idle(self) -> None:
        """Called by an input loop about to wait for input."""
        if self.young:
            counts = gc.get_count()
            if counts[0] >= self.young:
                thresholds = gc.get_threshold()
                generation = 2 if counts[2] > thresholds[2] else int(counts[1] > thresholds[1])
                gc.collect(generation)
                self.passes[generation] += 1
