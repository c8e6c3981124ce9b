"""Backpressure of one broker process (DESIGN §8): what the rule
(:class:`octopis.core.pressure.Backpressure`) is fed and what it starts, logged.

The process reads each link's queue, the deliveries waiting for ``clients.capacity`` and
its RSS (psutil, at most every half second), hands them to the rule, and logs the
episodes it starts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import psutil

from octopis.core.pressure import Backpressure, Pressed
from octopis.logs import RateLimitedLog
from octopis.transport.links import OutputLink


class PressureGauge:
    """Feeds one broker's backpressure rule (:attr:`rule`) and logs what it starts through
    ``warn``. ``queue_limit``: ``links.queue_limit``; ``deliveries_limit``:
    ``clients.queue_limit``; ``budget_mb``: ``memory.budget_mb``."""

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
        self.rule = Backpressure(queue_limit, deliveries_limit, budget_mb, counters)
        self.memory = MemoryGauge()
        self._warn = warn

    def check(self, now: float, links: Mapping[str, OutputLink], waiting: int) -> set[str]:
        """Look at backpressure afresh (the links' queues, the ``waiting`` deliveries, the
        RSS): the neighbours held back; log the episodes that start."""
        queues = {name: len(link.queue) for name, link in links.items()}
        pressed = self.rule.check(queues, waiting, self.memory.rss(now))
        if pressed is not None:
            self._log(pressed)
        return self.rule.full

    def _log(self, pressed: Pressed) -> None:
        rule = self.rule
        if pressed.memory is not None:
            self._warn.warning(
                "memory",
                "%s is over its memory budget (RSS %d MB, memory.budget_mb = %d): "
                "holding back its neighbours while %s has %d frames waiting",
                self.broker_id,
                self.memory.last >> 20,
                rule.budget_mb,
                pressed.memory,
                pressed.longest_waiting,
            )
        if pressed.full:
            self._warn.warning(
                "pressure",
                "%s holds back its neighbours: %s (links.queue_limit = %d frames, "
                "clients.queue_limit = %d deliveries)",
                self.broker_id,
                ", ".join(f"{n} has {waiting} waiting" for n, waiting in pressed.full.items()),
                rule.queue_limit,
                rule.deliveries_limit,
            )

    def snapshot(self) -> dict[str, int | bool]:
        """RSS last read and budget (MB), and whether a link is held for it."""
        rule = self.rule
        return {
            "rss_mb": self.memory.last >> 20,
            "budget_mb": rule.budget_mb,
            "pressing": rule.pressing,
        }


class MemoryGauge:
    """The process's RSS, read at most every ``every`` seconds (psutil; ~20 µs a read)."""

    def __init__(self, every: float = 0.5) -> None:
        self.every = every
        self.last = 0
        """The RSS last read, in bytes."""
        self._process = psutil.Process()
        self._next = 0.0

    def rss(self, now: float) -> int:
        """The RSS in bytes (read again if due)."""
        if now >= self._next:
            self.last = self._process.memory_info().rss
            self._next = now + self.every
        return self.last
