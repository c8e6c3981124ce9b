"""The simulator: one routing core per broker, wired by in-memory links (DESIGN §2).

Deterministic and seedable. Every directed link is a FIFO channel whose per-message
latency is drawn from a seeded :class:`LatencyModel`, so that BID's first-arrival trees
differ from shortest ones (paper §2, issue I3). A :class:`~octopis.sim.congestion.LinkModel`
decides what brokers see of their links and when copies leave their output queues.

Events are taken in (time, sequence) order from a binary heap. A plain heap rather than a
process-based library: a 1,000-broker run moves ~10^7 messages and a generator per message
would dominate the run time. Links are FIFO, so the messages in flight on one link are
already in that order: each link keeps them in a queue and only its first is in the heap,
which therefore holds at most one entry per link besides the scheduled calls, however many
messages are in flight (3,000 subscriptions issued at once put 337,000 on the links).
A message in flight is one tuple ``(arrival, seq, destination, source, message, queue)``;
a scheduled call is ``(time, seq, None, function, arguments, None)``. In SNR and DNR every
core's routing table is a part of one :class:`~octopis.sim.shared.SharedMatcher` unless a
matcher is given: each subscription is compiled once, not once per broker.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from octopis.accounting import (
    DeliveryLedger,
    distribution,
    failure_counts,
    host_split,
    run_report,
)
from octopis.balance.policy import (
    SubscriberLoads,
)
from octopis.core import (
    DEFAULT_COVERING,
    Action,
    BrokerCore,
    Deliver,
    Forward,
    Hold,
    Notification,
    Released,
    Subscribe,
    make_broker,
)
from octopis.core.clustered import ClusteredBroker
from octopis.core.lst import LinkView
from octopis.core.node import BrokerNode, HandedShare, NotServing
from octopis.core.sessions import ClientTable
from octopis.core.table import MatcherFactory
from octopis.defaults import CUSTODY_LIMIT, DOWN_AFTER, RETAIN, SUBSCRIPTIONS_PER_CLIENT
from octopis.failure_schedule import Failure
from octopis.filters.language import Publication, Subscription
from octopis.sim.congestion import FreeLinks, LinkModel, TimedLinks
from octopis.sim.failures import FailureEvents, FailureState
from octopis.sim.moving import MOVE_LINGER, SubscriberMoves
from octopis.sim.replaying import REPLAY_TYPES, SubscriberFailover
from octopis.sim.reshaping import Reshaping
from octopis.sim.service import ServiceModel
from octopis.sim.shared import SharedMatcher
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


@dataclass(frozen=True)
class LatencyModel:
    """Per-message link latency: ``base`` seconds plus exponential jitter of mean ``jitter``."""

    base: float = 0.001
    jitter: float = 0.001

    def sample(self, rng: random.Random) -> float:
        """One latency draw."""
        return self.sampler(rng)()

    def sampler(self, rng: random.Random) -> Callable[[], float]:
        """A function drawing latencies from ``rng``, one per call: the draws of
        ``rng.expovariate(1 / jitter)`` (the same numbers), without its call per message."""
        base, jitter = self.base, self.jitter
        if jitter <= 0:
            return lambda: base
        rate, draw = 1.0 / jitter, rng.random
        return lambda: base - math.log(1.0 - draw()) / rate


class Simulator(FailureEvents, SubscriberFailover, Reshaping, SubscriberMoves):
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
        service: ServiceModel | None = None,
        covering: str = DEFAULT_COVERING,
        advertisements: bool = False,
    ) -> None:
        if not scot.brokers:
            raise ValueError("the topology has no brokers")
        self.scot = scot
        self.mode = mode
        self.covering = covering
        """``off`` or ``active`` (DESIGN §12), every core's, restarted and added ones too."""
        self.advertisements = advertisements
        """Whether subscriptions travel only toward advertised publishers (DESIGN §12):
        then a publisher advertises (:meth:`advertise`) before it publishes."""
        self.ledger = DeliveryLedger(oracle_factory or matcher_factory)
        self.shared: SharedMatcher | None = None
        """The matcher every core's table shares, when no ``matcher_factory`` is given
        (SNR and DNR; BID's routing reads *which* matching sub_id a destination's match
        yields, so its cores keep a compiled matcher each and their paths stay those of
        the broker processes)."""
        if matcher_factory is None and mode != "bid":
            self.shared = SharedMatcher()
            matcher_factory = self.shared.part
        self.cores: dict[str, BrokerCore] = {
            bid: make_broker(
                scot, bid, mode, matcher_factory, covering=covering, advertisements=advertisements
            )
            for bid in scot.brokers
        }
        self.latency = latency or LatencyModel()
        self.service = service
        """Each broker's CPU as one server (measured costs), or None: routing is free."""
        self._cpu: dict[str, deque[tuple[str | None, Any]]] = {b: deque() for b in scot.brokers}
        """Messages waiting for each broker's CPU, FIFO: (sender, or None for a local
        publication; the message), or (None, the actions of a client's operation)."""
        self._serving: set[str] = set()
        self._charged_until = 0.0
        """When the last CPU charge so far ends."""
        self.busy_time: Counter[str] = Counter()
        """Seconds each broker's CPU was charged (with :attr:`service`)."""
        if service is not None:
            links = links or TimedLinks(scot, receiver_paced=True)
            if not getattr(links, "receiver_paced", False):
                raise ValueError(
                    "a service model needs receiver-paced timed links "
                    "(TimedLinks(..., receiver_paced=True)): DNR must see the CPU queues"
                )
        self.links: LinkModel = links or FreeLinks()
        self._taken = self.links.taken if getattr(self.links, "receiver_paced", False) else None
        """Tells a sender's LST its copy left the output queue (receiver-paced links)."""
        self.now = 0.0
        self.subscription_delay: dict[str, float] = {}
        self.subscription_depth: dict[str, int] = {}
        self.target_queue: list[int] = []
        self.timeline: list[tuple[float, int]] = []
        """(seconds since publishing started, :meth:`queued`) samples of :meth:`replay`."""
        self._on_forward = on_forward
        self._rng = random.Random(seed)
        self._sample_latency = self.latency.sampler(self._rng)
        self._events: list[tuple] = []
        self._seq = 0
        self._in_flight: dict[str, dict[str, deque[tuple]]] = {b: {} for b in scot.brokers}
        """Per sender and receiver (a directed link), its messages in flight in arrival
        order (the first one is also in the heap)."""
        self._instant = (
            type(self.links).transmit is FreeLinks.transmit and not self.links.measures_queues
        )
        """Whether copies leave at once (no output queue to ask)."""
        self._fixed_view = self.links.view("", 0.0) if type(self.links) is FreeLinks else None
        """What every broker sees of free links at any time (None: ask the link model)."""
        self._home: dict[str, str] = {}
        self.subscriber_of: dict[str, str] = {}
        self._next_seq: Counter[str] = Counter()
        self._wall = 0.0
        self._matcher_factory = matcher_factory
        self.failures: FailureState | None = None
        """Set by :meth:`fail`: dead brokers, down links, custody (DESIGN §7)."""
        self.failure_counts: Counter[str] = Counter()
        self.hosts_failed: set[str] = set()
        self._undeliverable_keys: set[tuple[str, int]] = set()
        self.sessions: dict[str, ClientTable] = {
            b: ClientTable(SUBSCRIPTIONS_PER_CLIENT) for b in scot.brokers
        }
        """Each broker's client sessions (:class:`~octopis.core.sessions.ClientTable`, the
        process's rules: limits, withdrawal of a client that is gone)."""
        self.nodes: dict[str, BrokerNode[None]] = {}
        """Each broker's node (:class:`~octopis.core.node.BrokerNode`, the broker process's
        failure decisions: holds, shares, serving), around its core in :attr:`cores`."""
        self.incarnation: dict[str, int] = {b: i for i, b in enumerate(scot.brokers, 1)}
        """Each broker's incarnation (a restart draws the next)."""
        self._incarnations = len(self.incarnation)
        for bid, core in self.cores.items():
            node = self.nodes[bid] = self._node(core, serving=True)  # the overlay starts built
            for neighbour in scot.graph[bid]:
                node.neighbours.built(neighbour, self.incarnation[neighbour], 0.0)
        self._retired: Counter[str] = Counter()
        self.moves: Counter[str] = Counter()
        """Subscriber moves: ``inside`` / ``across`` started, ``released`` (inside, done),
        ``withdrawn`` (across, done), ``absorbed`` (deliveries dropped as seen twice)."""
        self._moving: Counter[str] = Counter()
        """Subscribers with a move under way: subscriptions not yet released or withdrawn."""
        self.balance_log: dict[str, Any] | None = None
        """What :meth:`balance` decided and saw: ``decisions`` and ``timeline``."""
        self._subscriber_loads = SubscriberLoads(0.0)
        """The balancer's subscriber rates (:meth:`balance` sets its smoothing)."""
        self._overlap: Counter[str] = Counter()
        """Subscribers served by two hosts (a move under way, until ``linger`` after it
        ends): each keeps the SDK's record of its deliveries (:attr:`records`) meanwhile."""
        self._linger = MOVE_LINGER
        self.advertised: dict[str, dict[str, Subscription]] = {}
        """Each publisher's advertisements by id (made again where its broker restarts)."""
        self.retiring: set[str] = set()
        """Brokers on their way out (:meth:`shrink`): no move or placement targets them."""
        self._init_failover()

    def _node(self, core: BrokerCore, *, serving: bool = False) -> BrokerNode[None]:
        """A node around ``core`` that tells the ledger of each copy it gives up: serving
        already (the overlay starts built), or a restart (resynced by its neighbours; its
        store, which survives it, says it had a predecessor)."""
        return BrokerNode(
            core,
            CUSTODY_LIMIT,
            on_undeliverable=self._given_up,
            serving=serving,
            predecessor=not serving,
        )

    def _given_up(self, notification: Notification) -> None:
        self._undeliverable_keys.add(notification.key)

    @property
    def undeliverable_keys(self) -> set[tuple[str, int]]:
        """Notifications some copy of which was counted undeliverable (with failures), or
        is still held for a neighbour that has not come back, or held by a broker that
        is not serving yet."""
        held = {n.key for node in self.nodes.values() for n in node.held_notifications()}
        return self._undeliverable_keys | held

    # -- clients -------------------------------------------------------------------------

    def subscribe(self, subscriber: str, broker: str, subscription: Subscription) -> str:
        """``subscriber`` (attached to ``broker``) subscribes now; returns the sub_id."""
        self._attach(subscriber, broker)
        self.sessions[broker].room(subscriber, subscriber)
        sub_id, actions = self.cores[broker].subscribe(subscriber, subscription, self.now)
        self.sessions[broker].attach(subscriber, sub_id)
        self.ledger.subscribed(subscriber, sub_id, subscription)
        self.subscriptions_of.setdefault(subscriber, []).append(subscription)
        self.first_subscribed.setdefault(subscriber, self.now)
        self.subscriber_of[sub_id] = subscriber
        self.subscription_delay[sub_id] = 0.0
        self.subscription_depth[sub_id] = 0
        self._dispatch_local(broker, actions)
        return sub_id

    def advertise(self, publisher: str, broker: str, advertisement: Subscription) -> str:
        """``publisher`` (attached to ``broker``) advertises now; returns the adv_id."""
        self._attach(publisher, broker)
        core = self.cores[broker]
        if not isinstance(core, ClusteredBroker):
            raise ValueError(f"{self.mode} routes without advertisements")
        adv_id, actions = core.advertise(publisher, advertisement)
        self.advertised.setdefault(publisher, {})[adv_id] = advertisement
        self._dispatch_local(broker, actions)
        return adv_id

    def _advertise_again(self, broker: str) -> None:
        """``broker`` restarted empty: its publishers advertise again there, as the SDK
        does when its connection comes back."""
        for publisher, adverts in list(self.advertised.items()):
            if self._home.get(publisher) == broker:
                self.advertised[publisher] = {}
                for advertisement in adverts.values():
                    self.advertise(publisher, broker, advertisement)

    def unadvertise(self, publisher: str, adv_id: str) -> None:
        """``publisher`` withdraws its advertisement ``adv_id`` now (at its broker)."""
        broker = self._home[publisher]
        core = self.cores[broker]
        assert isinstance(core, ClusteredBroker)
        self.advertised.get(publisher, {}).pop(adv_id, None)
        self._dispatch_local(broker, core.unadvertise(publisher, adv_id))

    def unsubscribe(self, sub_id: str) -> None:
        """Withdraw ``sub_id`` now (from its subscriber's broker)."""
        subscriber = self.subscriber_of.pop(sub_id)
        broker = self._home[subscriber]
        self.sessions[broker].detach(subscriber, sub_id)
        self.subscriptions_of[subscriber].remove(self.ledger.subscription_of(sub_id))
        self.ledger.unsubscribed(sub_id)
        self._dispatch_local(broker, self.cores[broker].unsubscribe(subscriber, sub_id))

    def publish(
        self, publisher: str, broker: str, publication: Publication, seq: int | None = None
    ) -> tuple[str, int]:
        """``publisher`` (attached to ``broker``) publishes now; returns (publisher, seq).
        A publisher whose broker left, or is leaving (:meth:`shrink` moved it), publishes
        where it was moved."""
        if broker not in self.cores or broker in self.retiring:
            broker = self._home.get(publisher, broker)
        self._attach(publisher, broker)
        if seq is None:
            seq = self._next_seq[publisher] + 1
        self._next_seq[publisher] = max(seq, self._next_seq[publisher])
        if self.failures is not None and broker in self.failures.dead:
            self.failure_counts["publications_refused"] += 1
            return publisher, seq
        core = self.cores[broker]
        if self.advertisements and isinstance(core, ClusteredBroker):
            core.check_advertised(publisher, publication)
        notification = Notification(
            publisher, seq, self.now + self.clocks.get(publisher, 0), publication
        )
        if self.service is not None:  # no failures with a service model: always serving
            self.ledger.published(publisher, seq, publication)
            self._queue_for_cpu(broker, None, notification)
            return publisher, seq
        node = self.nodes[broker]
        try:
            actions = self._watch(core, notification, node.publish, notification, None)
        except NotServing:
            self.failure_counts["publications_refused"] += 1
            return publisher, seq
        self.ledger.published(publisher, seq, publication)
        if self.failures is not None:
            self.keep(broker, notification)
        if actions:
            self._dispatch(broker, actions)
        return publisher, seq

    # -- time ----------------------------------------------------------------------------

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at simulated time ``when`` (not before now)."""
        self._seq += 1
        heapq.heappush(self._events, (max(when, self.now), self._seq, None, fn, args, None))

    def run(self, until: float = math.inf) -> None:
        """Process events in time order until none is left (or ``until`` is reached).

        Python's cyclic garbage collector is paused meanwhile (and restored after): events
        leave no reference cycles behind, only garbage that reference counting frees at
        once, while every full collection would walk all the live entries and messages —
        a sixth of a 1,000-broker run."""
        started = time.perf_counter()
        events = self._events
        pop, push = heapq.heappop, heapq.heappush
        arrive = self._arrive
        collecting = gc.isenabled()
        gc.disable()
        try:
            while events and events[0][0] <= until:
                self.now, _, dst, a, b, queue = pop(events)
                if dst is None:
                    a(*b)
                    continue
                queue.popleft()
                if queue:
                    push(events, queue[0])
                arrive(dst, a, b)
        finally:
            if collecting:
                gc.enable()
        if until != math.inf:
            self.now = max(self.now, until)
        self._wall += time.perf_counter() - started

    def replay(
        self,
        workload: ReplayableWorkload,
        failures: Sequence[Failure] = (),
        *,
        detection: float = DOWN_AFTER,
        retain: float = RETAIN,
        sample_every: float | None = None,
    ) -> None:
        """Subscriptions at their times, settle, then publications at their times (and
        ``failures``, times counted from the start of publishing, the workload's time 0),
        drain. With ``sample_every``, :attr:`timeline` gets ``(t, queued)`` from the start
        of publishing on, every that many seconds, until the last one is published and
        nothing is queued any more."""
        workload.check_topology(self.scot)
        start = self.now
        for s in workload.subscriptions:
            self.at(start + s.time, self.subscribe, s.subscriber, s.broker, s.subscription)
        self.run()
        start = self.now
        for failure in failures:
            self.fail(failure, start, detection=detection, retain=retain)
        for p in workload.publications:
            self.at(start + p.time, self.publish, p.publisher, p.broker, p.publication, p.seq)
        if sample_every is not None and workload.publications:
            if sample_every <= 0:
                raise ValueError(f"sample_every must be > 0, got {sample_every}")
            end = start + max(p.time for p in workload.publications)
            self.at(start, self._sample, start, end, sample_every)
        self.run()

    def queued(self) -> int:
        """Messages waiting now: on the links' output queues (with a service model, the
        copies a receiver's CPU has not taken yet) and local publications waiting for
        their broker's CPU."""
        waiting = sum(
            1
            for queue in self._cpu.values()
            for src, message in queue
            if src is None and type(message) is Notification
        )
        lst = getattr(self.links, "lst", None)
        if lst is not None:
            for broker, table in lst.items():
                self.links.view(broker, self.now)
                waiting += sum(row.queue_length for row in table.rows.values())
        return waiting

    def _sample(self, start: float, end: float, every: float) -> None:
        queued = self.queued()
        self.timeline.append((self.now - start, queued))
        if self.now < end or queued:
            self.at(self.now + every, self._sample, start, end, every)

    def _watch(self, core: BrokerCore, message: object, step: Callable, *args: Any) -> list:
        """Run ``step(*args, view)`` on ``core``; with failures, remember notifications of
        which a copy was counted undeliverable."""
        view = self._view(core.id)
        if self.failures is None or type(message) is not Notification:
            return step(*args, view)
        before = _undeliverable(core.stats)
        actions = step(*args, view)
        if _undeliverable(core.stats) > before:
            self._undeliverable_keys.add(message.key)  # type: ignore[attr-defined]
        return actions

    def _view(self, broker: str) -> LinkView:
        view = self._fixed_view or self.links.view(broker, self.now)
        return view if self.failures is None else self.failures.view(broker, view)

    # -- report --------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Counts of the run: the keys ``octopis sim`` and ``octopis run`` share."""
        stats: Counter[str] = Counter(self._retired)
        for core in self.cores.values():
            stats.update(core.counts())
        report = run_report(
            self.mode,
            len(self.cores),
            len(self.subscription_depth),
            self.ledger,
            stats,
            list(self.subscription_depth.values()),
            self.subscription_delay.values(),
        )
        if self.mode != "bid":
            report["covering"] = self.covering
        if self.moves:
            report["moves"] = dict(self.moves)
        if self.balance_log is not None:
            log = self.balance_log
            report["balance"] = {
                **log,
                **{k: list(log[k]) for k in ("decisions", "timeline", "elastic")},
                "decisions_dropped": log["decisions_made"] - len(log["decisions"]),
            }
        report["sim_time"] = self.now
        report["wall_time"] = self._wall
        end = max(self.now, self._charged_until)
        if self.service is not None and end > 0:
            busiest = max(self.busy_time, key=self.busy_time.__getitem__, default=None)
            report["cpu_busy"] = {
                "busiest": busiest,
                "busiest_share": self.busy_time[busiest] / end if busiest else 0.0,
                "mean_share": sum(self.busy_time.values()) / len(self.cores) / end,
                "idle_not_charged": self.service.idle,
            }
        if self.target_queue:
            report["target_queue_length"] = distribution(self.target_queue)
        if self.timeline:
            report["queue_timeline"] = [[round(t, 6), n] for t, n in self.timeline]
        if self.failures is not None:
            held = sum(1 for node in self.nodes.values() for _ in node.held_notifications())
            counts = self.failure_counts + sum(
                (node.counts() for node in self.nodes.values()), Counter()
            )
            report["failures"] = {
                **counts,
                **({"undeliverable.held_at_end": held} if held else {}),
                **failure_counts(stats),
                **host_split(self.ledger, {**self._home, **self.first_home}, self.hosts_failed),
                "replays": self.replay_report(),
            }
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

    def _dispatch(self, broker: str, actions: list[Action]) -> None:
        """Carry out a core's actions now: a forwarded copy arrives after its departure
        from the link's queue plus a latency draw, never before the copy sent ahead of it
        (FIFO links); held copies wait; deliveries go to the ledger."""
        if not actions:
            return
        now = self.now
        failures = self.failures
        on_forward = self._on_forward
        transmit = None if self._instant else self.links.transmit
        measures_queues = self.links.measures_queues
        in_flight = self._in_flight[broker]
        events = self._events
        for action in actions:
            kind = type(action)
            if kind is Forward:
                dst, message = action
                if on_forward is not None:
                    on_forward(broker, dst, message)
                if failures is not None:
                    if failures.broken(broker, dst) and type(message) is not Notification:
                        if type(message) is not HandedShare:  # a link frame: lost
                            # it waits on the link for dst's return, as in the process
                            self.nodes[broker].hold_undelivered(dst, [message])
                        continue
                    failures.sent(broker, dst, now, message)
                    if failures.broken(broker, dst):
                        self.failure_counts["lost_in_transit"] += 1
                        continue
                if transmit is None:
                    arrival = now + self._sample_latency()
                else:
                    departure, ahead = transmit(broker, dst, now)
                    if measures_queues and type(message) is Notification:
                        self.target_queue.append(ahead)
                    arrival = departure + self._sample_latency()
                if failures is not None and failures.slow:
                    arrival += failures.slow.get((broker, dst), 0.0)
                queue = in_flight.get(dst)
                if queue is None:
                    queue = in_flight[dst] = deque()
                elif queue and queue[-1][0] > arrival:
                    arrival = queue[-1][0]  # FIFO: never before the copy sent ahead of it
                self._seq += 1
                queue.append((arrival, self._seq, dst, broker, message, queue))
                if len(queue) == 1:
                    heapq.heappush(events, queue[0])
            elif kind is Hold:
                self.nodes[broker].hold(action)
            elif kind is HandedShare:
                self._dispatch(broker, [Forward(action.link, action)])
            elif kind is Released:
                self.moves["released"] += 1
                self._let_go(action.subscriber)
            else:
                subscriber, notification = action
                if self.cut_clients and (subscriber, broker) in self.cut_clients:
                    self.failure_counts["deliveries_to_cut_clients"] += 1
                    continue
                if self.records and subscriber in self.records:
                    self.take(subscriber, notification)
                    continue
                self.ledger.delivered(
                    subscriber,
                    notification.publisher,
                    notification.seq,
                    now - notification.published_at,
                )

    def _arrive(self, broker: str, src: str, message: Any) -> None:
        if self.failures is not None and self.failures.broken(src, broker):
            self.failure_counts["lost_in_transit"] += 1
            if src in self.failures.dead and type(message) is Notification:
                # Only the dead sender could have routed it again (custody died with it).
                self.failure_counts["undeliverable.died_in_flight"] += 1
                self._undeliverable_keys.add(message.key)
            return
        if self.service is not None:
            self._queue_for_cpu(broker, src, message)
            return
        if self._taken is not None:
            self._taken(src, broker, self.now)
        actions = self._receive(broker, src, message)
        if actions:
            self._dispatch(broker, actions)

    def _receive(self, broker: str, src: str, message: Any) -> list[Action]:
        """``broker``'s core takes ``message`` from neighbour ``src`` now; a subscription
        that stored an entry updates its delay and depth."""
        core = self.cores[broker]
        if type(message) is not Subscribe:
            if type(message) in REPLAY_TYPES:
                self._replay_message(broker, src, message)
                return []
            if type(message) is HandedShare:
                self._share_arrived(broker, src, message)
                return []
            return self._watch(core, message, core.receive, src, message)
        entries = core.table.entries
        stored = len(entries)
        actions = core.receive(src, message, self._view(broker))
        if len(entries) > stored:
            sub_id = message.sub_id
            delay = self.now - message.issued_at
            if delay > self.subscription_delay.get(sub_id, 0.0):
                self.subscription_delay[sub_id] = delay
            if message.hops > self.subscription_depth.get(sub_id, 0):
                self.subscription_depth[sub_id] = message.hops
        return actions

    def _dispatch_local(self, broker: str, actions: list[Action]) -> None:
        """Actions of a client's operation at ``broker`` (subscribe, move, ...): with a
        service model they go out behind what its loop holds (copies of notifications
        it has taken or queued), as the processes' one loop sends them; else now."""
        if self.service is not None and (broker in self._serving or self._cpu[broker]):
            self._cpu[broker].append((None, actions))
        else:
            self._dispatch(broker, actions)

    def _queue_for_cpu(self, broker: str, src: str | None, message: Any) -> None:
        """A message waits for ``broker``'s CPU (:attr:`service`), FIFO: every message
        from a neighbour, and local publications (one event loop, as in the processes)."""
        self._cpu[broker].append((src, message))
        if broker not in self._serving:
            self._serve(broker)

    def _serve(self, broker: str) -> None:
        """``broker``'s event loop takes its oldest messages now, in order: each is
        handled with the link status of now; other messages cost nothing, and the first
        notification keeps the CPU busy for its measured cost, its copies and deliveries
        going out when that time is up (:meth:`_served`)."""
        assert self.service is not None
        queue = self._cpu[broker]
        core = self.cores[broker]
        while queue:
            src, message = queue.popleft()
            if type(message) is list:  # a client operation's actions (_dispatch_local)
                self._dispatch(broker, message)
                continue
            if src is None:
                actions = self._watch(core, message, core.publish, message)
            else:
                if self._taken is not None:
                    self._taken(src, broker, self.now)
                actions = self._receive(broker, src, message)
            if type(message) is not Notification:
                self._dispatch(broker, actions)
                continue
            copies = sum(type(a) is Forward for a in actions)
            deliveries = sum(type(a) is Deliver for a in actions)
            cost = self.service.notification(len(core.table.entries), copies, deliveries)
            self.busy_time[broker] += cost
            self._charged_until = max(self._charged_until, self.now + cost)
            self._serving.add(broker)
            self.at(self.now + cost, self._served, broker, actions)
            return
        self._serving.discard(broker)

    def _served(self, broker: str, actions: list[Action]) -> None:
        self._dispatch(broker, actions)
        self._serve(broker)


def _undeliverable(stats: Counter[str]) -> int:
    return sum(n for key, n in stats.items() if key.startswith("undeliverable."))
