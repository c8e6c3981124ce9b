"""Link behaviour in the simulator: what a broker sees of its links, and when a copy leaves.

- :class:`FreeLinks`: no queueing, nothing overloaded (the SNR/BID laws, DNR ≡ SNR).
- :class:`InjectedCongestion`: a seeded set of directed iCOLs is declared overloaded, with
  random loads; no real queueing. Tests DNR's laws under *any* congestion pattern.
- :class:`TimedLinks`: links with a capacity in messages/s and real output queues; every
  broker's Link Status Table is fed from them and sampled each window Δt (paper §6.3).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from itertools import takewhile
from typing import Any, Protocol

from octopis.core import LinkStatusTable, LinkView, NoCongestion
from octopis.core.capacity import SendRate, departure
from octopis.core.lst import DEFAULT_LST_WINDOW, DEFAULT_ORDER, DEFAULT_QUEUE_THRESHOLD
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


class _PatternView:
    __slots__ = ("_busy", "_loads")

    def __init__(self, busy: Callable[[str], bool], loads: Mapping[str, tuple[float, int]]) -> None:
        self._busy = busy
        self._loads = loads

    def overloaded(self, link: str) -> bool:
        return self._busy(link)

    def load(self, link: str) -> tuple[float, int]:
        return self._loads.get(link, (1.0, 0))

    def down(self, link: str) -> bool:
        return False


class InjectedCongestion(FreeLinks):
    """A seeded pattern of overloaded directed links; no real queueing.

    ``overloaded`` lists directed links ``(src, dst)`` overloaded all the time;
    ``schedule`` maps directed links to ``[(from, until), ...]`` windows of simulated time.
    :meth:`random_icols` draws a fraction of all directed iCOLs and :meth:`from_schedule`
    reads a schedule file. Loads (CE, queue length) are random, overloaded ones above 1
    and Q, so "least loaded" choices vary, except where ``fixed_loads`` sets them.
    """

    def __init__(
        self,
        overloaded: Iterable[Link],
        scot: Scot,
        seed: int = 0,
        queue_threshold: int = DEFAULT_QUEUE_THRESHOLD,
        fixed_loads: Mapping[Link, tuple[float, int]] | None = None,
        schedule: Mapping[Link, list[tuple[float, float]]] | None = None,
    ) -> None:
        rng = random.Random(seed)
        fixed_loads = fixed_loads or {}
        self.overloaded_links = set(overloaded)
        self.schedule = {link: list(windows) for link, windows in (schedule or {}).items()}
        self._views: dict[str, _PatternView] = {}
        self._now = 0.0
        for broker in scot.brokers.values():
            loads: dict[str, tuple[float, int]] = {}
            for n in broker.neighbours:
                link = (broker.id, n.id)
                if link in self.overloaded_links or link in self.schedule:
                    drawn = (rng.uniform(1.0, 4.0), rng.randint(queue_threshold, 50))
                else:
                    drawn = (rng.uniform(0.2, 1.0), rng.randint(0, queue_threshold - 1))
                loads[n.id] = fixed_loads.get(link, drawn)
            self._views[broker.id] = _PatternView(self._busy_check(broker.id), loads)

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

    @classmethod
    def from_schedule(cls, entries: Any, scot: Scot, seed: int = 0) -> InjectedCongestion:
        """A schedule ``[{"link": "src>dst", "from": t0, "until": t1}, ...]`` (``until``
        optional: overloaded to the end); every link must be a link of ``scot``."""
        if not isinstance(entries, list):
            raise ValueError("an overload schedule is a list of {link, from, until} objects")
        schedule: dict[Link, list[tuple[float, float]]] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("link"), str):
                raise ValueError(f"schedule entry {i}: needs a 'link' like \"b:2>b:0\"")
            src, _, dst = entry["link"].partition(">")
            if src not in scot.brokers or dst not in scot.graph[src]:
                raise ValueError(
                    f"schedule entry {i}: {entry['link']!r} is not a link of {scot.name}"
                )
            start, until = entry.get("from", 0.0), entry.get("until", math.inf)
            if not all(isinstance(t, (int, float)) for t in (start, until)) or until <= start:
                raise ValueError(f"schedule entry {i}: needs numbers with from < until")
            schedule.setdefault((src, dst), []).append((float(start), float(until)))
        return cls((), scot, seed, schedule=schedule)

    def view(self, broker: str, now: float) -> LinkView:
        """The pattern as ``broker`` sees it at ``now``."""
        self._now = now
        return self._views[broker]

    def _busy_check(self, broker: str) -> Callable[[str], bool]:
        def busy(link: str) -> bool:
            key = (broker, link)
            if key in self.overloaded_links:
                return True
            windows = self.schedule.get(key)
            return bool(windows) and any(a <= self._now < b for a, b in windows)

        return busy


class TimedLinks:
    """Real output queues with limited capacity, feeding each broker's LST (paper §6.3).

    Two limits, alone or together, reproduce the paper's two causes of queueing: a
    *link* capacity (messages/s on one directed link: limited bandwidth) and a *broker*
    capacity (messages/s a broker can send over all its links together: an overwhelmed
    broker). A copy enqueued at ``now`` first waits for its broker's sender
    (``1/broker rate`` each), then for its link (``1/link rate`` each); it counts in its
    link's output queue until it leaves. Without limits copies leave at once, but still
    count as n_in/n_out in the LST. ``order`` is the LSTs' "least loaded" order (``"ce"``
    or ``"bluedove"``, :mod:`octopis.core.lst`).

    ``receiver_paced`` (with a CPU service model, :mod:`octopis.sim.service`): a copy stays
    in its link's output queue until the receiver's event loop takes it (:meth:`taken`),
    not only until it leaves, as the processes' low send high-water mark makes a busy
    receiver's backlog grow its senders' output queues (DESIGN §4). So a broker whose CPU
    falls behind shows as overloaded links to every neighbour sending to it, and DNR
    routes around it.
    """

    measures_queues = True

    def __init__(
        self,
        scot: Scot,
        capacity: Mapping[Link, float] | None = None,
        window: float = DEFAULT_LST_WINDOW,
        queue_threshold: int = DEFAULT_QUEUE_THRESHOLD,
        broker_capacity: Mapping[str, float] | None = None,
        order: str = DEFAULT_ORDER,
        receiver_paced: bool = False,
    ) -> None:
        self.receiver_paced = receiver_paced
        self._link_rate = _send_rates(capacity)
        self._broker_rate = _send_rates(broker_capacity)
        self.lst = {
            b.id: LinkStatusTable(
                [n.id for n in b.neighbours], window, queue_threshold, order=order
            )
            for b in scot.brokers.values()
        }
        self._pending: dict[str, dict[str, deque[float]]] = {b: {} for b in scot.brokers}

    @classmethod
    def uniform(
        cls,
        scot: Scot,
        link_rate: float | None = None,
        broker_rate: float | None = None,
        **kwargs: Any,
    ) -> TimedLinks:
        """Every directed link at ``link_rate`` and every broker at ``broker_rate``."""
        links = (
            {}
            if link_rate is None
            else {link: link_rate for u, v in scot.graph.edges for link in ((u, v), (v, u))}
        )
        brokers = {} if broker_rate is None else dict.fromkeys(scot.brokers, broker_rate)
        return cls(scot, links, broker_capacity=brokers, **kwargs)

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
        senders = [
            rate
            for rate in (self._broker_rate.get(src), self._link_rate.get((src, dst)))
            if rate is not None
        ]
        if not senders:
            if not self.receiver_paced:
                lst.sent(dst, now)
            return now, ahead
        leaves = departure(now, senders)
        if not self.receiver_paced:
            self._pending[src].setdefault(dst, deque()).append(leaves)
        return leaves, ahead

    def waiting(self, broker: str, now: float) -> dict[str, int]:
        """Copies in each of ``broker``'s output queues at ``now``: those its LST counts,
        less those whose departure time has come (read only: the LST is brought up to
        date where the broker routes, :meth:`view`, and nowhere else)."""
        pending = self._pending[broker]
        return {
            dst: row.queue_length - sum(1 for _ in takewhile(now.__ge__, pending.get(dst, ())))
            for dst, row in self.lst[broker].rows.items()
        }

    def taken(self, src: str, dst: str, now: float) -> None:
        """``dst``'s event loop takes the oldest copy from ``src`` at ``now`` (receiver
        paced): it leaves ``src``'s output queue to ``dst``."""
        self._catch_up(src, now)
        self.lst[src].sent(dst, now)

    def _catch_up(self, broker: str, now: float) -> None:
        lst = self.lst[broker]
        for dst, departures in self._pending[broker].items():
            while departures and departures[0] <= now:
                lst.sent(dst, departures.popleft())
        lst.advance(now)


def _send_rates(capacity: Mapping[Any, float] | None) -> dict[Any, SendRate]:
    """A sender per link or broker; a rate that is not positive names its owner."""
    rates = {}
    for owner, rate in (capacity or {}).items():
        if rate <= 0:
            raise ValueError(f"capacity of {owner} must be positive, got {rate}")
        rates[owner] = SendRate(rate)
    return rates
