"""The balancer's rounds in the simulator (DESIGN §9): the decisions of ``octopis
balance`` (:func:`~octopis.balance.policy.plan_round`, one implementation) on simulated
load, carried out by the simulator's moves and topology changes."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from octopis.accounting import DeliveryLedger
from octopis.balance.plans import BrokerLoad, LoadState
from octopis.balance.policy import (
    HISTORY_LIMIT,
    BalanceOptions,
    Elasticity,
    SubscriberLoads,
    load_sample,
    plan_round,
    recently_moved,
)
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
    """The balancer of one simulated overlay (``sim``); :attr:`log` holds what it decided
    and saw once started."""

    def __init__(self, sim: Balanced) -> None:
        self._sim = sim
        self.log: dict[str, Any] | None = None
        """What it decided and saw: ``decisions``, ``timeline``, ``elastic``."""
        self._loads = SubscriberLoads(0.0)
        """The subscriber rates (:meth:`start` sets its smoothing)."""

    def start(
        self,
        options: BalanceOptions,
        until: float,
        capacity: float = 0.0,
        elastic: Elasticity | None = None,
    ) -> None:
        """Run the balancer's rounds on simulated load every ``options.interval`` seconds
        from now until ``until``: the decisions of ``octopis balance`` (:func:`plan_round`,
        one implementation), carried out by the simulator's ``move``. A broker's load is, per second
        over the last interval, the deliveries to the subscribers attached to it, plus
        the notification copies it sent when ``options.load_measure`` is ``output``; a
        subscriber's, its deliveries per second;
        ``capacity`` (messages/s) is every broker's, for the plans on load ratios. With
        ``elastic`` (and a capacity) each round also asks it whether the mean load ratio
        calls for a cluster more (``reshape``) or the last one fewer (``shrink``,
        its subscribers moving to their refuges in turn, as ``octopis scale``'s do:
        :func:`~octopis.topology_change.refuge_turns`)."""
        self.log = {
            "options": vars(options),
            "decisions": deque(maxlen=HISTORY_LIMIT),
            "decisions_made": 0,
            "timeline": deque(maxlen=HISTORY_LIMIT),
            "elastic": deque(maxlen=HISTORY_LIMIT),
        }
        self._loads = SubscriberLoads(options.smoothing)
        mark = self._load_counts()
        self._sim.at(
            self._sim.now + options.interval,
            self._balance_round,
            options,
            until,
            capacity,
            mark,
            elastic,
        )

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
        self,
        options: BalanceOptions,
        until: float,
        capacity: float,
        mark: tuple[dict[str, int], Counter[str]],
        elastic: Elasticity | None = None,
    ) -> None:
        """One round, as ``octopis balance``'s (:meth:`~octopis.balance.loop.Balancer.round`):
        the loads over the last interval sampled; with ``elastic`` (and ``act``) the
        elasticity rule asked first, and a round that changes the shape moves no one;
        else the plan's moves ordered (only with ``act``). While a shrink is under way
        no round runs: the process's balancer awaits the change."""
        assert self.log is not None
        counts = self._load_counts()
        span = options.interval
        if self._sim.now + span <= until:
            args = (options, until, capacity, counts, elastic)
            self._sim.at(self._sim.now + span, self._balance_round, *args)
        if self._sim.retiring:
            return
        subscribers = set(self._sim.subscriber_of.values())
        reports = self._reports(mark, counts, span, subscribers)
        rate = {s: r for report in reports.values() for s, r in report["busiest_clients"].items()}
        deliveries = {b: report["deliveries_per_s"] for b, report in reports.items()}
        output = {b: report["output_per_s"] for b, report in reports.items()}
        load = deliveries if options.load_measure == "deliveries" else output
        cluster = {b: self._sim.scot.brokers[b].cluster for b in load}
        brokers = {b: BrokerLoad(load[b], capacity, cluster[b]) for b in load}
        state = LoadState(
            brokers,
            rate,
            {s: self._sim.clients.home[s] for s in subscribers},
            self._interests(subscribers) if options.plan == "sdm" else {},
        )
        log = self.log
        ratio = sum(output.values()) / len(output) / capacity if capacity else 0.0
        sample = {"t": self._sim.now, **load_sample(load, output), "moves": 0}
        log["timeline"].append({**sample, "clusters": self._sim.scot.clusters, "mean_ratio": ratio})
        self._loads.update(state, self._sim.now)
        if elastic is not None and capacity and options.act and self._elastic_round(elastic, ratio):
            return
        recent = {s for s in subscribers if self._sim.moving(s)}  # still under way, too
        recent |= recently_moved(log["decisions"], self._sim.now, options.cooldown)
        plan = plan_round(options, self._loads.applied(state), recent)
        log["timeline"][-1]["moves"] = len(plan.moves)
        for move in plan.moves if options.act else ():
            self._sim.move(move.subscriber, move.target)
            log["decisions"].append({"t": self._sim.now, **vars(move)})
            log["decisions_made"] += 1

    def _elastic_round(self, elastic: Elasticity, ratio: float) -> bool:
        """Grow or shrink by a cluster if ``elastic`` says so (Dynamoth, issue 18); a
        leaving broker's subscribers go to its refuges in turn, as ``octopis scale``'s do.
        Returns whether the shape changed; a change refused (a publisher on a leaving
        broker) is logged with its error, and the rule asks again after ``t_wait``."""
        assert self.log is not None
        sim = self._sim
        change = elastic.decide(sim.now, ratio, sim.scot.clusters)
        if change is None:
            return False
        done: dict[str, Any] = {"t": sim.now, "change": change, "mean_ratio": ratio}
        try:
            if change == "add-cluster":
                new = add_cluster(sim.scot)
                sim.reshape(new)
            else:
                new = remove_cluster(sim.scot, sim.scot.clusters - 1)
                sim.shrink(new, refuge_turns(sim.scot, new))  # done once the moves are
        except TopologyError as exc:
            self.log["elastic"].append({**done, "error": str(exc)})
            return False
        self.log["elastic"].append({**done, "clusters": new.clusters})
        return True

    def report(self) -> dict[str, Any] | None:
        """What it decided and saw, for the run's report (None: never started)."""
        log = self.log
        if log is None:
            return None
        return {
            **log,
            **{k: list(log[k]) for k in ("decisions", "timeline", "elastic")},
            "decisions_dropped": log["decisions_made"] - len(log["decisions"]),
        }
