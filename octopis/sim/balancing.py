"""The balancer's rounds in the simulator (DESIGN §9): the decisions of ``octopis
balance`` (:class:`~octopis.balance.rounds.BalanceRounds`, one implementation) on
simulated load, carried out by the simulator's moves and topology changes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from octopis.accounting import DeliveryLedger
from octopis.balance.plans import BrokerLoad, LoadState
from octopis.balance.policy import BalanceOptions, Elasticity
from octopis.balance.rounds import BalanceRounds
from octopis.core import BrokerCore
from octopis.core.load import LoadSample, load_report
from octopis.core.node import BrokerNode
from octopis.core.sessions import interests
from octopis.sim.clients import Clients
from octopis.topology import Scot, TopologyError
from octopis.topology_change import add_cluster, refuge_turns, remove_cluster


class Balanced(Protocol):
    """What the balancer reads of a simulator and asks it to do."""

    scot: Scot
    cores: dict[str, BrokerCore]
    nodes: dict[str, BrokerNode]
    ledger: DeliveryLedger
    clients: Clients
    subscriber_of: dict[str, str]
    retiring: set[str]

    @property
    def now(self) -> float:
        """The simulated time."""

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at ``when``."""

    def moving(self, subscriber: str) -> bool:
        """Whether a move of ``subscriber`` is under way."""

    def move(self, subscriber: str, broker: str) -> dict[str, str]:
        """Move ``subscriber`` to ``broker`` now."""

    def reshape(self, scot: Scot) -> None:
        """Change the overlay to ``scot`` now."""

    def shrink(self, scot: Scot, refuge: Callable[[str], str]) -> None:
        """Remove the brokers ``scot`` lacks once their subscribers moved to ``refuge``."""


class SimBalancer:
    """The balancer of one simulated overlay (``sim``): feeds :attr:`rounds`
    (:class:`~octopis.balance.rounds.BalanceRounds`, the decisions of ``octopis balance``,
    one implementation) the simulated load and carries out its decisions by the
    simulator's moves and topology changes."""

    def __init__(self, sim: Balanced) -> None:
        self._sim = sim
        self.rounds: BalanceRounds | None = None
        """What it saw and did once started (:meth:`start`)."""

    def start(
        self,
        options: BalanceOptions,
        until: float,
        capacity: float = 0.0,
        elastic: Elasticity | None = None,
    ) -> None:
        """Run the balancer's rounds on simulated load every ``options.interval`` seconds
        from now until ``until``, carried out by the simulator's ``move``. A broker's load
        is, per second over the last interval, the deliveries to the subscribers attached
        to it, plus the notification copies it sent when ``options.load_measure`` is
        ``output``; a subscriber's, its deliveries per second; ``capacity`` (messages/s)
        is every broker's, for the plans on load ratios. With ``elastic`` (and a
        capacity) each round also asks it whether the mean load ratio calls for a cluster
        more (``reshape``) or the last one fewer (``shrink``, its subscribers moving to
        their refuges in turn, as ``octopis scale``'s do:
        :func:`~octopis.topology_change.refuge_turns`)."""
        self.rounds = BalanceRounds(options, elastic if capacity else None)
        mark = self._load_counts()
        self._sim.at(self._sim.now + options.interval, self._balance_round, until, capacity, mark)

    def _interests(self, subscribers: set[str]) -> dict[str, frozenset[str]]:
        """Each subscriber's interests at the broker it is attached to, by the rule a
        broker's ``clients`` RPC reports them to the balancer's SDM
        (:func:`~octopis.core.sessions.interests`)."""
        sim, home = self._sim, self._sim.clients.home
        return {
            s: interests(sim.cores[home[s]], sim.nodes[home[s]].sessions, s) for s in subscribers
        }

    def _load_counts(self) -> tuple[dict[str, int], Counter[str]]:
        """Copies sent by each broker, deliveries to each subscriber, so far."""
        copies = {b: c.notification_copies for b, c in self._sim.cores.items()}
        delivered: Counter[str] = Counter()
        for (subscriber, _, _), n in self._sim.ledger.received.items():
            delivered[subscriber] += n
        return copies, delivered

    def _reports(
        self,
        mark: tuple[dict[str, int], Counter[str]],
        counts: tuple[dict[str, int], Counter[str]],
        span: float,
        subscribers: set[str],
    ) -> dict[str, dict[str, Any]]:
        """Each broker's load report over the last ``span`` seconds, from the counts at
        its start (``mark``) and now (``counts``), read by the brokers' own rule
        (:func:`load_report`): a subscriber's deliveries count at the broker it is
        attached to now."""
        home = self._sim.clients.home
        at: dict[str, list[str]] = {b: [] for b in self._sim.cores}
        for subscriber in subscribers:
            at[home[subscriber]].append(subscriber)
        reports = {}
        for broker, held in at.items():
            samples = []
            for when, (copies, delivered) in ((0.0, mark), (span, counts)):
                per = Counter({s: delivered[s] for s in held})
                total = sum(per.values())
                samples.append(LoadSample(when, 0, 0, {"": copies.get(broker, 0)}, total, per))
            reports[broker] = load_report(*samples, capacity=0.0, top=len(held))
        return reports

    def _balance_round(
        self, until: float, capacity: float, mark: tuple[dict[str, int], Counter[str]]
    ) -> None:
        """One round, as ``octopis balance``'s (:meth:`~octopis.balance.loop.Balancer.round`):
        the loads over the last interval read, then what :attr:`rounds` decides carried
        out (a change of shape, or the plan's moves, subscribers whose move is still
        under way left out). While a shrink is under way no round runs: the process's
        balancer awaits the change."""
        rounds, sim = self.rounds, self._sim
        assert rounds is not None
        options = rounds.options
        counts = self._load_counts()
        span = options.interval
        if sim.now + span <= until:
            sim.at(sim.now + span, self._balance_round, until, capacity, counts)
        if sim.retiring:
            return
        rounds.new_round()
        subscribers = set(sim.subscriber_of.values())
        reports = self._reports(mark, counts, span, subscribers)
        rate = {s: r for report in reports.values() for s, r in report["busiest_clients"].items()}
        deliveries = {b: report["deliveries_per_s"] for b, report in reports.items()}
        output = {b: report["output_per_s"] for b, report in reports.items()}
        load = deliveries if options.load_measure == "deliveries" else output
        brokers = {b: BrokerLoad(load[b], capacity, sim.scot.brokers[b].cluster) for b in load}
        state = LoadState(
            brokers,
            rate,
            {s: sim.clients.home[s] for s in subscribers},
            self._interests(subscribers) if options.plan == "sdm" else {},
        )
        ratio = sum(output.values()) / len(output) / capacity if capacity else 0.0
        rounds.sampled(sim.now, state, output, ratio, sim.scot.clusters)
        change = rounds.elastic_change(sim.now, sim.scot.clusters)
        if change is not None:
            self._reshape(rounds, change)
        plan = rounds.plan(sim.now, moving={s for s in subscribers if sim.moving(s)})
        for move in rounds.orders(plan):
            rounds.ordered(move, sim.now, sim.move(move.subscriber, move.target))

    def _reshape(self, rounds: BalanceRounds, change: str) -> None:
        """Grow or shrink by a cluster as ``change`` says (Dynamoth, issue 18); a leaving
        broker's subscribers go to its refuges in turn, as ``octopis scale``'s do. How it
        went is told ``rounds``: made, or refused with its error (a publisher on a
        leaving broker)."""
        sim = self._sim
        try:
            if change == "add-cluster":
                new = add_cluster(sim.scot)
                sim.reshape(new)
            else:
                new = remove_cluster(sim.scot, sim.scot.clusters - 1)
                sim.shrink(new, refuge_turns(sim.scot, new))  # done once the moves are
        except TopologyError as exc:
            rounds.changed(sim.now, change, error=str(exc))
            return
        rounds.changed(sim.now, change, clusters=new.clusters)

    def report(self) -> dict[str, Any] | None:
        """What it decided and saw, for the run's report (None: never started)."""
        return None if self.rounds is None else self.rounds.report()
