"""The simulator: one routing core per broker, wired by in-memory links (DESIGN §2).

Deterministic and seedable. Every directed link is a FIFO channel whose per-message
latency is drawn from a seeded :class:`LatencyModel`, so that BID's first-arrival trees
differ from shortest ones (paper §2, issue I3). A :class:`~octopis.sim.congestion.LinkModel`
decides what brokers see of their links and when copies leave their output queues.

Events live in a binary heap ordered by (time, sequence). A plain heap rather than a
process-based library: a 1,000-broker run moves ~10^7 messages and a generator per message
would dominate the run time.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from octopis.accounting import DeliveryLedger, delay_distribution, distribution
from octopis.core import (
    Action,
    BrokerCore,
    Forward,
    Notification,
    Subscribe,
    Unsubscribe,
    make_broker,
)
from octopis.core.table import MatcherFactory
from octopis.filters import Publication, Subscription
from octopis.sim.congestion import FreeLinks, LinkModel
from octopis.topology import Scot


class ReplayableWorkload(Protocol):
    """What :meth:`Simulator.replay` reads of a workload (``octopis.workload.Workload``
    is one); the simulator never loads the workload's file format (parquet)."""

    subscriptions: Sequence[Any]
    """Events with ``time``, ``subscriber``, ``broker``, ``subscription``."""
    publications: Sequence[Any]
    """Events with ``time``, ``publisher``, ``broker``, ``publication``, ``seq``."""

    def check_topology(self, scot: Scot) -> None:
        """Raise if a client sits on a broker ``scot`` lacks."""


MESSAGE_KIND = {Subscribe: "subscribe", Unsubscribe: "unsubscribe", Notification: "notification"}


@dataclass(frozen=True)
class LatencyModel:
    """Per-message link latency: ``base`` seconds plus exponential jitter of mean ``jitter``."""

    base: float = 0.001
    jitter: float = 0.001

    def sample(self, rng: random.Random) -> float:
        """One latency draw."""
        return self.base + (rng.expovariate(1.0 / self.jitter) if self.jitter > 0 else 0.0)


class Simulator:
    """N routing cores, in-memory FIFO links, message counts and delivery accounting."""

    def __init__(
        self,
        scot: Scot,
        mode: str,
        *,
        seed: int = 0,
        latency: LatencyModel | None = None,
        links: LinkModel | None = None,
        matcher_factory: MatcherFactory | None = None,
        oracle_factory: Callable[[], Any] | None = None,
        on_forward: Callable[[str, str, Any], None] | None = None,
    ) -> None:
        if not scot.brokers:
            raise ValueError("the topology has no brokers")
        self.scot = scot
        self.mode = mode
        self.cores: dict[str, BrokerCore] = {
            bid: make_broker(scot, bid, mode, matcher_factory) for bid in scot.brokers
        }
        self.latency = latency or LatencyModel()
        self.links: LinkModel = links or FreeLinks()
        self.ledger = DeliveryLedger(oracle_factory or matcher_factory)
        self.now = 0.0
        self.messages: Counter[str] = Counter()
        self.subscription_delay: dict[str, float] = {}
        self.subscription_depth: dict[str, int] = {}
        self.target_queue: list[int] = []
        self._on_forward = on_forward
        self._rng = random.Random(seed)
        self._events: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self._last_arrival: dict[tuple[str, str], float] = {}
        self._home: dict[str, str] = {}
        self.subscriber_of: dict[str, str] = {}
        self._next_seq: Counter[str] = Counter()
        self._wall = 0.0

    # -- clients -------------------------------------------------------------------------

    def subscribe(self, subscriber: str, broker: str, subscription: Subscription) -> str:
        """``subscriber`` (attached to ``broker``) subscribes now; returns the sub_id."""
        self._attach(subscriber, broker)
        sub_id, actions = self.cores[broker].subscribe(subscriber, subscription, self.now)
        self.ledger.subscribed(subscriber, sub_id, subscription)
        self.subscriber_of[sub_id] = subscriber
        self.subscription_delay[sub_id] = 0.0
        self.subscription_depth[sub_id] = 0
        self._dispatch(broker, actions)
        return sub_id

    def unsubscribe(self, sub_id: str) -> None:
        """Withdraw ``sub_id`` now (from its subscriber's broker)."""
        subscriber = self.subscriber_of.pop(sub_id)
        broker = self._home[subscriber]
        self.ledger.unsubscribed(sub_id)
        self._dispatch(broker, self.cores[broker].unsubscribe(subscriber, sub_id))

    def publish(
        self, publisher: str, broker: str, publication: Publication, seq: int | None = None
    ) -> tuple[str, int]:
        """``publisher`` (attached to ``broker``) publishes now; returns (publisher, seq)."""
        self._attach(publisher, broker)
        if seq is None:
            seq = self._next_seq[publisher] + 1
        self._next_seq[publisher] = max(seq, self._next_seq[publisher])
        notification = Notification(publisher, seq, self.now, publication)
        self.ledger.published(publisher, seq, publication)
        view = self.links.view(broker, self.now)
        self._dispatch(broker, self.cores[broker].publish(notification, view))
        return publisher, seq

    # -- time ----------------------------------------------------------------------------

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at simulated time ``when`` (not before now)."""
        self._push(max(when, self.now), fn, args)

    def run(self, until: float = math.inf) -> None:
        """Process events in time order until none is left (or ``until`` is reached)."""
        started = time.perf_counter()
        events = self._events
        while events and events[0][0] <= until:
            self.now, _, fn, args = heapq.heappop(events)
            fn(*args)
        if until != math.inf:
            self.now = max(self.now, until)
        self._wall += time.perf_counter() - started

    def replay(self, workload: ReplayableWorkload) -> None:
        """Subscriptions at their times, settle, then publications at their times, drain."""
        workload.check_topology(self.scot)
        start = self.now
        for s in workload.subscriptions:
            self.at(start + s.time, self.subscribe, s.subscriber, s.broker, s.subscription)
        self.run()
        start = self.now
        for p in workload.publications:
            self.at(start + p.time, self.publish, p.publisher, p.broker, p.publication, p.seq)
        self.run()

    # -- report --------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Counts of the run: the keys ``octopis sim`` and ``octopis run`` share."""
        stats: Counter[str] = Counter()
        for core in self.cores.values():
            stats.update(core.stats)
        depths = list(self.subscription_depth.values())
        report: dict[str, Any] = {
            "mode": self.mode,
            "brokers": len(self.cores),
            "subscriptions": len(self.subscription_depth),
            "notifications": self.ledger.notifications,
            "sbp_messages": self.messages["subscribe"],
            "sbp_duplicates": stats["sbp_duplicates"],
            "unsubscribe_messages": self.messages["unsubscribe"],
            "avg_subscription_tree_length": sum(depths) / len(depths) if depths else 0.0,
            "max_subscription_tree_length": max(depths, default=0),
            "notification_messages": self.messages["notification"],
            "matching_operations": stats["matching"],
            **self.ledger.summary(),
            "subscription_delay": delay_distribution(self.subscription_delay.values()),
            "notification_delay": self.ledger.delay_summary(),
            "sim_time": self.now,
            "wall_time": self._wall,
        }
        if self.mode == "bid":
            report["bids_carried"] = stats["bids_carried"]
        if self.mode == "dnr":
            for key in ("dnr_case_1", "dnr_case_2", "dnr_case_3", "dnr_kept_off"):
                report[key] = stats[key]
        if self.target_queue:
            report["target_queue_length"] = distribution(self.target_queue)
        return report

    def deliveries(self) -> Iterator[dict[str, Any]]:
        """One record per delivery (duplicates repeated): subscriber, publisher, seq."""
        for (subscriber, publisher, seq), count in sorted(self.ledger.received.items()):
            for _ in range(count):
                yield {"subscriber": subscriber, "publisher": publisher, "seq": seq}

    # -- internals -----------------------------------------------------------------------

    def _attach(self, client: str, broker: str) -> None:
        if broker not in self.cores:
            raise KeyError(f"no broker {broker!r} in topology {self.scot.name}")
        home = self._home.setdefault(client, broker)
        if home != broker:
            raise ValueError(f"client {client} is attached to {home}, not {broker}")

    def _push(self, when: float, fn: Callable[..., Any], args: tuple) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, fn, args))

    def _dispatch(self, broker: str, actions: list[Action]) -> None:
        now = self.now
        for action in actions:
            if isinstance(action, Forward):
                dst, message = action
                kind = MESSAGE_KIND[type(message)]
                self.messages[kind] += 1
                if self._on_forward is not None:
                    self._on_forward(broker, dst, message)
                departure, ahead = self.links.transmit(broker, dst, now)
                if kind == "notification" and self.links.measures_queues:
                    self.target_queue.append(ahead)
                arrival = departure + self.latency.sample(self._rng)
                link = (broker, dst)
                arrival = max(arrival, self._last_arrival.get(link, 0.0))
                self._last_arrival[link] = arrival
                self._push(arrival, self._arrive, (dst, broker, message))
            else:
                subscriber, notification = action
                self.ledger.delivered(
                    subscriber,
                    notification.publisher,
                    notification.seq,
                    now - notification.published_at,
                )

    def _arrive(self, broker: str, src: str, message: Any) -> None:
        core = self.cores[broker]
        if isinstance(message, Subscribe):
            stored = len(core.table)
            actions = core.receive(src, message, self.links.view(broker, self.now))
            if len(core.table) > stored:
                sub_id = message.sub_id
                delay = self.now - message.issued_at
                if delay > self.subscription_delay.get(sub_id, 0.0):
                    self.subscription_delay[sub_id] = delay
                if message.hops > self.subscription_depth.get(sub_id, 0):
                    self.subscription_depth[sub_id] = message.hops
        else:
            actions = core.receive(src, message, self.links.view(broker, self.now))
        self._dispatch(broker, actions)
