"""Backpressure of one broker (DESIGN §8): which neighbours it holds back, and why.

A neighbour is held back (its acknowledgements withheld, so its custody fills and it
stops sending) while a link to another neighbour has ``links.queue_limit`` frames
waiting, while more than ``clients.queue_limit`` deliveries wait for
``clients.capacity`` (every neighbour then, named :data:`CLIENTS`), or, over the memory
budget (``memory.budget_mb``), while the longest link has anything waiting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import psutil

from octopis.logs import RateLimitedLog
from octopis.transport.links import OutputLink

CLIENTS = "(clients)"
"""The name :attr:`Backpressure.full` gives the broker's own clients when more than
``clients.queue_limit`` deliveries wait for ``clients.capacity``: every neighbour is then
held back."""


class Backpressure:
    """What holds a broker's neighbours back, refreshed by :meth:`check`; episodes are
    counted in ``counters`` and logged through ``warn``. ``queue_limit``:
    ``links.queue_limit``; ``deliveries_limit``: ``clients.queue_limit``; ``budget_mb``:
    ``memory.budget_mb``."""

    def __init__(
        self,
        broker_id: str,
        queue_limit: int,
        deliveries_limit: int,
        budget_mb: int,
        counters: Counter[str],
        warn: RateLimitedLog,
    ) -> None:
        self.broker_id = broker_id
        self.queue_limit = queue_limit
        self.deliveries_limit = deliveries_limit
        self.counters = counters
        self._warn = warn
        self.full: set[str] = set()
        """Neighbours whose link has ``queue_limit`` frames waiting, or whose link is the
        longest while the broker is over its memory budget, and :data:`CLIENTS`."""
        self.memory = MemoryBudget(budget_mb)

    def check(self, now: float, links: Mapping[str, OutputLink], waiting: int) -> set[str]:
        """Refresh :attr:`full` from the ``links``' queues and the ``waiting`` deliveries;
        count and log when backpressure starts. Over the memory budget, the link with the
        longest queue counts as full (if anything waits on it): the broker takes in no
        faster than it sends out until it is back under."""
        limit = self.queue_limit
        full = {n for n, link in links.items() if len(link.queue) >= limit}
        if waiting >= self.deliveries_limit:
            full.add(CLIENTS)
        memory = self.memory
        if memory.over(now):
            longest = max(links, key=lambda n: len(links[n].queue))
            pressing = bool(links[longest].queue)
            if pressing:
                full.add(longest)
            if pressing and not memory.pressing:
                self.counters["memory.pressure_episodes"] += 1
                self._warn.warning(
                    "memory",
                    "%s is over its memory budget (RSS %d MB, memory.budget_mb = %d): "
                    "holding back its neighbours while %s has %d frames waiting",
                    self.broker_id,
                    memory.rss >> 20,
                    memory.budget_mb,
                    longest,
                    len(links[longest].queue),
                )
            memory.pressing = pressing
        else:
            memory.pressing = False
        if full - self.full:
            self.counters["backpressure.episodes"] += 1
            self._warn.warning(
                "pressure",
                "%s holds back its neighbours: %s (links.queue_limit = %d frames, "
                "clients.queue_limit = %d deliveries)",
                self.broker_id,
                ", ".join(
                    f"{n} has {waiting if n == CLIENTS else len(links[n].queue)} waiting"
                    for n in sorted(full)
                ),
                limit,
                self.deliveries_limit,
            )
        self.full = full
        return full

    def holds(self, name: str) -> bool:
        """Whether neighbour ``name``'s acknowledgements are withheld (as :attr:`full`
        last said): something other than its own link is full. What its own full link
        carries never goes back to it, and withholding from it could lock two brokers
        that wait on each other."""
        full = self.full
        return bool(full) and (len(full) > 1 or name not in full)


class MemoryBudget:
    """The broker's memory budget (DESIGN §8, ``[memory] budget_mb``): its RSS, read at
    most every ``every`` seconds (psutil; ~20 µs a read)."""

    def __init__(self, budget_mb: int, every: float = 0.5) -> None:
        self.budget_mb = budget_mb
        self.every = every
        self.rss = 0
        self.pressing = False
        """Over budget with data waiting: a link is held as full."""
        self._process = psutil.Process()
        self._next = 0.0

    def over(self, now: float) -> bool:
        """Whether the RSS last read is above the budget (read again if due)."""
        if now >= self._next:
            self.rss = self._process.memory_info().rss
            self._next = now + self.every
        return self.rss > self.budget_mb << 20

    def snapshot(self) -> dict[str, int | bool]:
        """RSS last read and budget (MB), and whether a link is held for it."""
        return {"rss_mb": self.rss >> 20, "budget_mb": self.budget_mb, "pressing": self.pressing}
