"""The simulator: one routing core per broker, wired by in-memory links (DESIGN §2).

Deterministic and seedable. The :class:`Simulator` is composed of parts with one job
each: :class:`~octopis.sim.events.EventQueue` (simulated time: scheduled calls and the
messages in flight), :class:`~octopis.sim.network.Network` (when a copy arrives, what a
broker sees of its links), :class:`~octopis.sim.cpu.BrokerCpus` (each broker's CPU, with
a service model) and :class:`~octopis.sim.failures.FailureState` (dead brokers, cut
links, custody). In SNR and DNR every core's routing table is a part of one
:class:`~octopis.matching.SharedMatcher` unless a matcher is given: each subscription
is compiled once, not once per broker. What it does is in mixins with one job each, the
parts above their state: the brokers' loops (:class:`~octopis.sim.dispatch.ActionDispatch`),
failures, pauses, subscribers failing over and their replays
(:class:`~octopis.sim.replaying.SubscriberFailover`), the subscribers' seams
(:class:`~octopis.sim.seams.ReplaySeams`), reshaping and moves.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

from octopis.accounting import DeliveryLedger, cpu_shares, run_report, simulation_report
from octopis.core import DEFAULT_COVERING, Notification
from octopis.core.answer import CommitWaits
from octopis.core.node import NotKept, NotServing
from octopis.core.sessions import check_advertised
from octopis.core.table import MatcherFactory
from octopis.defaults import DOWN_AFTER, LINGER, RETAIN
from octopis.failure_schedule import Failure
from octopis.filters.language import Publication, Subscription
from octopis.matching import SharedMatcher
from octopis.sim.balancing import SimBalancer
from octopis.sim.brokers import Brokers
from octopis.sim.clients import Clients
from octopis.sim.composite_clients import CompositeClients
from octopis.sim.congestion import FreeLinks, LinkModel, TimedLinks
from octopis.sim.cpu import BrokerCpus
from octopis.sim.dispatch import ActionDispatch
from octopis.sim.events import EventQueue, Sampler, collector_paused
from octopis.sim.failures import FailureEvents, FailureState
from octopis.sim.moving import SubscriberMoves
from octopis.sim.network import LatencyModel, Network
from octopis.sim.pauses import PausedBrokers
from octopis.sim.publishers import PublisherFailover
from octopis.sim.replaying import SubscriberFailover
from octopis.sim.reshaping import Reshaping
from octopis.sim.seams import ReplaySeams
from octopis.sim.service import ServiceModel
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


class Simulator(
    ActionDispatch,
    FailureEvents,
    PausedBrokers,
    SubscriberFailover,
    ReplaySeams,
    Reshaping,
    SubscriberMoves,
):
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
        self.mode = mode
        self.seed = seed
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
        with collector_paused():
            self.brokers = Brokers(
                scot,
                mode,
                matcher_factory,
                covering=covering,
                advertisements=advertisements,
                notify=lambda client, notice: self.composites.notify(client, notice),
            )
        """Each broker's core, node, client sessions and incarnation."""
        self.cores = self.brokers.cores
        self.nodes = self.brokers.nodes
        self.service = service
        """Each broker's CPU as one server (measured costs), or None: routing is free."""
        if service is not None:
            links = links or TimedLinks(scot, receiver_paced=True)
            if not getattr(links, "receiver_paced", False):
                raise ValueError(
                    "a service model needs receiver-paced timed links "
                    "(TimedLinks(..., receiver_paced=True)): DNR must see the CPU queues"
                )
        self.links: LinkModel = links or FreeLinks()
        self.events = EventQueue(scot.brokers)
        """Simulated time: scheduled calls and the messages in flight on each link."""
        self.network = Network(self.links, latency or LatencyModel(), random.Random(seed))
        """When a copy arrives, what each broker sees of its links."""
        self.cpus = (
            None
            if service is None
            else BrokerCpus(
                service,
                scot.brokers,
                self.events,
                self._take,
                self._dispatch,
                lambda broker: len(self.cores[broker].table.entries),
            )
        )
        """Each broker's CPU (with :attr:`service`)."""
        self.subscription_delay: dict[str, float] = {}
        self.subscription_depth: dict[str, int] = {}
        self.sampler = Sampler(self.events, self.queued)
        """:meth:`queued` every so often during :meth:`replay` (``sample_every``)."""
        self._on_forward = on_forward
        self.clients = Clients(self.brokers, self.ledger, self.events, self._dispatch_local)
        """Where each client is attached, what it subscribed and advertised."""
        self.composites = CompositeClients(
            self.brokers, self.events, self._dispatch_local, self._dead
        )
        """The composite subscriptions hosted at the brokers (DESIGN §12)."""
        self._home, self.subscriber_of = self.clients.home, self.clients.subscriber_of
        self.clocks = self.clients.clocks
        self.failures: FailureState | None = None
        """Set by :meth:`fail`: dead brokers, down links, custody (DESIGN §7)."""
        self.failure_counts: Counter[str] = Counter()
        self.hosts_failed: set[str] = set()
        self.moves: Counter[str] = Counter()
        """Subscriber moves: ``inside`` / ``across`` started, ``released`` (inside, done),
        ``withdrawn`` (across, done), ``absorbed`` (deliveries dropped as seen twice),
        ``release_overdue`` (inside, ended without the old host's release)."""
        self._moving: Counter[str] = Counter()
        """Subscribers with a move under way: subscriptions not yet released or withdrawn."""
        self._awaiting_release: dict[str, set[tuple[str, str]]] = {}
        """Per subscriber moving inside a cluster, the (old host, sub_id) adopted and not
        yet released, until the SDK's wait for them ends (:meth:`_release_overdue`)."""
        self.balancer = SimBalancer(self)
        self.balance = self.balancer.start
        """Run the balancer's rounds from now on (:meth:`SimBalancer.start`)."""
        self._overlap: Counter[str] = Counter()
        """Subscribers served by two hosts (a move under way, until ``linger`` after it
        ends): each checks its deliveries against the SDK's record (:attr:`records`) meanwhile."""
        self._linger = LINGER
        self.retiring: set[str] = set()
        """Brokers on their way out (:meth:`shrink`): no move or placement targets them."""
        self._init_failover()
        self._init_seams()
        self.publishers = PublisherFailover(self)
        """What each publisher sent and had no answer to, and its fail-overs (DESIGN §7)."""

    @property
    def scot(self) -> Scot:
        """The overlay's topology (its current version: :meth:`reshape` changes it)."""
        return self.brokers.scot

    @property
    def undeliverable_keys(self) -> set[tuple[str, int]]:
        """Notifications some copy of which was counted undeliverable (with failures), or
        is still held for a neighbour that has not come back, or held by a broker that
        is not serving yet."""
        return self.brokers.undeliverable_keys()

    # -- clients -------------------------------------------------------------------------

    def subscribe(self, subscriber: str, broker: str, subscription: Subscription) -> str:
        """``subscriber`` (attached to ``broker``) subscribes now; returns the sub_id."""
        sub_id = self.clients.subscribe(subscriber, broker, subscription)
        self.subscription_delay[sub_id] = 0.0
        self.subscription_depth[sub_id] = 0
        return sub_id

    def advertise(self, publisher: str, broker: str, advertisement: Subscription) -> str:
        """``publisher`` (attached to ``broker``) advertises now; returns the adv_id."""
        return self.clients.advertise(publisher, broker, advertisement)

    def unadvertise(self, publisher: str, adv_id: str) -> None:
        """``publisher`` withdraws its advertisement ``adv_id`` now (at its broker)."""
        self.clients.unadvertise(publisher, adv_id)

    def unsubscribe(self, sub_id: str) -> None:
        """Withdraw ``sub_id`` now (from its subscriber's broker)."""
        self.clients.unsubscribe(sub_id)

    def publish(
        self, publisher: str, broker: str, publication: Publication, seq: int | None = None
    ) -> tuple[str, int]:
        """``publisher`` (attached to ``broker``) publishes now; returns (publisher, seq).
        A publisher whose broker left, or is leaving (:meth:`shrink` moved it), publishes
        where it was moved; one that failed over, where it is connected
        (:class:`~octopis.sim.publishers.PublisherFailover`, which sends again what a dead
        broker did not answer)."""
        if broker not in self.cores or broker in self.retiring:
            broker = self._home.get(publisher, broker)
        broker = self.publishers.broker_of(publisher, broker)
        self.clients.attach(publisher, broker)
        seq = self.clients.sequence(publisher, seq)
        if not self.publishers.sent(publisher, seq, publication):  # else it fails over:
            stamp = self.publishers.published_at(publisher, seq)  # sent where it gets
            self._take_publication(broker, Notification(publisher, seq, stamp, publication))
        return publisher, seq

    def _take_publication(self, broker: str, notification: Notification) -> None:
        """``broker`` takes a publisher's request to publish ``notification`` now: a paused
        one at its resume (the request waits in its socket, and that broker takes it even
        if its publisher failed over meanwhile, as a process does); a dead one never (the
        publication is unanswered, and sent again once its publisher fails over)."""
        if self._asleep(broker, self._take_publication, broker, notification):
            return
        publisher, seq, _, publication = notification[:4]
        if self._dead(broker):
            if not self.publishers.silent(publisher, broker):
                self.failure_counts["publications_refused"] += 1
            return
        core = self.cores[broker]
        check_advertised(core, publisher, publication)
        if self.cpus is not None:  # no failures with a service model: always serving
            self.ledger.published(publisher, seq, publication)
            self.cpus.queue(broker, None, notification)
            return
        node = self.nodes[broker]
        receipt = refusal = None
        if self.failures is not None:  # the stores keep, and confirm through a receipt
            refusal = self.retention.refusal(broker, self.now)
            receipt = self.retention.receipt(broker, notification.key, self.publishers.answered)
        try:
            publish = partial(node.publish, refusal=refusal)
            actions = self._watch(core, notification, publish, notification, receipt)
        except NotKept:  # its disk refused a commit just now: neither kept nor routed
            self.publishers.answered(notification.key)
            return
        except NotServing:
            self.failure_counts["publications_refused"] += 1
            self.publishers.answered(notification.key)
            return
        self.publishers.accepted(publisher, seq, publication)
        if receipt is None:
            if actions:
                self._dispatch(broker, actions)
            return
        refusal = self.retention.keep(broker, notification, self.now)
        waits = CommitWaits()  # the store's copy, held at its commit: a simulated one is at once
        waits.kept(receipt)
        if actions is not None:  # else held: answered once routed (:meth:`_check_serving`)
            self._dispatch(broker, actions, receipt)
        waits.committed(refusal)

    def power_loss(self, broker: str, sync: str, unsynced: float) -> None:
        """``broker``'s machine loses power now (it dies at this instant, a failure of its
        own): its store, run with ``sync``, loses what it committed in the last
        ``unsynced`` seconds unless ``sync`` is ``full``
        (:meth:`~octopis.sim.stores.RetentionStores.power_loss`)."""
        self.failure_counts["power_losses"] += 1
        self.retention.power_loss(broker, self.now, sync, unsynced)

    # -- time ----------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The simulated time."""
        return self.events.now

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at simulated time ``when`` (not before now)."""
        self.events.at(when, fn, *args)

    def run(self, until: float = math.inf) -> None:
        """Process events in time order until none is left (or ``until`` is reached)."""
        self.events.run(self._arrive, until)

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
        drain. With ``sample_every``, :attr:`sampler`'s timeline gets ``(t, queued)`` from the start
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
            end = start + max(p.time for p in workload.publications)
            self.sampler.start(start, end, sample_every)
        self.run()

    def queued(self) -> int:
        """Messages waiting now: on the links' output queues (with a service model, the
        copies a receiver's CPU has not taken yet) and local publications waiting for
        their broker's CPU."""
        waiting = self.cpus.waiting_publications() if self.cpus is not None else 0
        return waiting + self.network.queued(self.now)

    # -- report --------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Counts of the run: the keys ``octopis sim`` and ``octopis run`` share, and the
        simulator's own (:func:`~octopis.accounting.simulation_report`)."""
        stats = self.brokers.counts()
        depths = list(self.subscription_depth.values())
        delays = self.subscription_delay.values()
        cpu_busy, cpus = None, self.cpus
        if cpus is not None:
            end = max(self.now, cpus.charged_until)
            cpu_busy = cpu_shares(cpus.busy_time, end, len(self.cores), cpus.service.idle)
        return simulation_report(
            run_report(self.mode, len(self.cores), len(depths), self.ledger, stats, depths, delays),
            covering=self.covering,
            moves=self.moves,
            balance=self.balancer.report(),
            times=(self.now, self.events.wall),
            cpu_busy=cpu_busy,
            target_queue=self.network.target_queue,
            timeline=self.sampler.timeline,
            failures=None if self.failures is None else self._failure_report(stats),
        )
