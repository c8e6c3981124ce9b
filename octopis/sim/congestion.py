"""Link behaviour in the simulator: what a broker sees of its links, and when a copy leaves.

- :class:`FreeLinks`: no queueing, nothing overloaded (the SNR/BID laws, DNR ≡ SNR).
- :class:`InjectedCongestion`: a seeded set of directed iCOLs is declared overloaded, with
  random loads; no real queueing. Tests DNR's laws under *any* congestion pattern.
- :class:`TimedLinks`: links with a capacity in messages/s and real output queues; every
  broker's Link Status Table is fed from them and sampled each window Δt (paper §6.3).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Protocol

from octopis.core import LinkStatusTable, LinkView, NoCongestion
from octopis.topology import ICOL, Scot

Link = tuple[str, str]


class LinkModel(Protocol):
    """How links behave in a simulation; ``measures_queues`` says whether queues are real."""

    measures_queues: bool

    def view(self, broker: str, now: float) -> LinkView:
        """The link status ``broker`` sees at ``now``."""

    def transmit(self, src: str, dst: str, now: float) -> tuple[float, int]:
        """Enqueue one copy on ``src → dst`` at ``now``: (departure time, queue ahead)."""


class FreeLinks:
    """Unlimited links: copies leave at once and no link is ever overloaded."""

    measures_queues = False
    _view = NoCongestion()

    def view(self, broker: str, now: float) -> LinkView:
        """Nothing is overloaded."""
        return self._view

    def transmit(self, src: str, dst: str, now: float) -> tuple[float, int]:
        """Departs immediately behind an empty queue."""
        return now, 0


class _FixedView:
    def __init__(self, overloaded: set[str], loads: Mapping[str, tuple[float, int]]) -> None:
        self._overloaded = overloaded
        self._loads = loads

    def overloaded(self, link: str) -> bool:
        return link in self._overloaded

    def load(self, link: str) -> tuple[float, int]:
        return self._loads.get(link, (1.0, 0))


class InjectedCongestion(FreeLinks):
    """A fixed pattern of overloaded directed links, with seeded loads (CE, queue length).

    ``overloaded`` lists directed links ``(src, dst)``; :meth:`random_icols` draws a
    fraction of all directed iCOLs. Loads are random so "least loaded" choices vary, except
    where ``fixed_loads`` sets them.
    """

    def __init__(
        self,
        overloaded: Iterable[Link],
        scot: Scot,
        seed: int = 0,
        queue_threshold: int = 10,
        fixed_loads: Mapping[Link, tuple[float, int]] | None = None,
    ) -> None:
        rng = random.Random(seed)
        fixed_loads = fixed_loads or {}
        self.overloaded_links = set(overloaded)
        self._views: dict[str, _FixedView] = {}
        for broker in scot.brokers.values():
            loads: dict[str, tuple[float, int]] = {}
            busy: set[str] = set()
            for n in broker.neighbours:
                link = (broker.id, n.id)
                if link in self.overloaded_links:
                    busy.add(n.id)
                    drawn = (rng.uniform(1.0, 4.0), rng.randint(queue_threshold, 50))
                else:
                    drawn = (rng.uniform(0.2, 1.0), rng.randint(0, queue_threshold - 1))
                loads[n.id] = fixed_loads.get(link, drawn)
            self._views[broker.id] = _FixedView(busy, loads)

    @classmethod
    def random_icols(cls, scot: Scot, fraction: float, seed: int = 0) -> InjectedCongestion:
        """Overload ``fraction`` of all directed iCOLs, chosen with ``seed``."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"overload fraction must be within 0..1, got {fraction}")
        rng = random.Random(seed)
        icols = sorted(
            (b.id, n.id) for b in scot.brokers.values() for n in b.neighbours if n.link == ICOL
        )
        return cls(rng.sample(icols, round(fraction * len(icols))), scot, seed)

    def view(self, broker: str, now: float) -> LinkView:
        """The fixed pattern as ``broker`` sees it."""
        return self._views[broker]


class TimedLinks:
    """Links with capacities and real output queues feeding each broker's LST.

    A copy enqueued at ``now`` on a link of capacity c leaves at
    ``max(now, link free) + 1/c``; it counts in the queue until then. Links without a
    capacity send at once (but still count n_in/n_out in the LST).
    """

    measures_queues = True

    def __init__(
        self,
        scot: Scot,
        capacity: Mapping[Link, float],
        window: float = 0.05,
        queue_threshold: int = 10,
    ) -> None:
        for link, rate in capacity.items():
            if rate <= 0:
                raise ValueError(f"capacity of {link[0]}->{link[1]} must be positive, got {rate}")
        self.capacity = dict(capacity)
        self.lst = {
            b.id: LinkStatusTable([n.id for n in b.neighbours], window, queue_threshold)
            for b in scot.brokers.values()
        }
        self._free_at: dict[Link, float] = {}
        self._pending: dict[str, dict[str, deque[float]]] = {b: {} for b in scot.brokers}

    def view(self, broker: str, now: float) -> LinkView:
        """``broker``'s LST brought up to ``now``."""
        self._catch_up(broker, now)
        return self.lst[broker]

    def transmit(self, src: str, dst: str, now: float) -> tuple[float, int]:
        """Enqueue on ``src → dst``; returns the departure time and the queue ahead."""
        self._catch_up(src, now)
        lst = self.lst[src]
        ahead = lst.rows[dst].queue_length
        lst.enqueued(dst, now)
        rate = self.capacity.get((src, dst))
        if rate is None:
            lst.sent(dst, now)
            return now, ahead
        departure = max(now, self._free_at.get((src, dst), 0.0)) + 1.0 / rate
        self._free_at[(src, dst)] = departure
        self._pending[src].setdefault(dst, deque()).append(departure)
        return departure, ahead

    def _catch_up(self, broker: str, now: float) -> None:
        lst = self.lst[broker]
        for dst, departures in self._pending[broker].items():
            while departures and departures[0] <= now:
                lst.sent(dst, departures.popleft())
        lst.advance(now)
