"""The balancer's rounds in the simulator (DESIGN §9): the decisions of ``octopis
balance`` (:class:`~octopis.balance.rounds.BalanceRounds`, one implementation) on
simulated load, carried out by the simulator's moves and topology changes."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import islice
from typing import Any, Protocol

from octopis.accounting import DeliveryLedger
from octopis.balance.observe import CLIENTS_READ, load_state
from octopis.balance.policy import BalanceOptions, Elasticity
from octopis.balance.rounds import BalanceRounds
from octopis.core import BrokerCore
from octopis.core.load import LoadSample, load_report
from octopis.core.node import BrokerNode
from octopis.core.sessions import interests
from octopis.defaults import LOAD_WINDOW
from octopis.sim.clients import Clients
from octopis.topology import Scot, TopologyError
from octopis.topology_change import add_cluster, refuge_turns, remove_cluster

_EMPTY = LoadSample(0.0, 0, 0, {})


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


class _Meter:
    """One broker's load analysis as the simulator keeps it for the balancer (DESIGN §9):
    its cumulative counts, and the :class:`LoadSample` of them taken at each of the
    balancer's samples over the last load window (``bound`` of them at most)."""

    __slots__ = ("clients", "delivered", "samples")

    def __init__(self, bound: int) -> None:
        self.delivered = 0
        """Deliveries to subscribers attached here, those gone since included."""
        self.clients: Counter[str] = Counter()
        """Per subscriber attached here now: deliveries since it attached."""
        self.samples: deque[LoadSample] = deque(maxlen=bound)


class SimBalancer:
    """The balancer of one simulated overlay (``sim``): feeds :attr:`rounds`
    (:class:`~octopis.balance.rounds.BalanceRounds`, the decisions of ``octopis balance``,
    one implementation) the simulated load and carries out its decisions by the
    simulator's moves and topology changes. It observes as ``octopis balance`` does
    (DESIGN §9): a sample every ``options.sample`` seconds between rounds, each broker's
    load report over the brokers' load window by the brokers' own rule, and a round
    planning on a sample of its own."""

    def __init__(self, sim: Balanced) -> None:
        self._sim = sim
        self.rounds: BalanceRounds | None = None
        """What it saw and did once started (:meth:`start`)."""
        self.window = LOAD_WINDOW
        """Seconds each broker's load report covers (:meth:`start`'s ``window``)."""
        self._capacity = 0.0
        self._until = 0.0
        self._meters: dict[str, _Meter] = {}
        self._counted: Counter[str] = Counter()
        """Deliveries to each subscriber read from the ledger so far."""
        self._keys = self._total = 0
        """The ledger's keys and deliveries when last read."""
        self._taken: dict[str, int] = {}
        """Each subscriber's deliveries at the last load sample."""
        self._held: dict[str, str] = {}
        """The broker each subscriber was attached to at the last load sample."""

    def start(
        self,
        options: BalanceOptions,
        until: float,
        capacity: float = 0.0,
        elastic: Elasticity | None = None,
        window: float = LOAD_WINDOW,
    ) -> None:
        """Run the balancer's rounds on simulated load every ``options.interval`` seconds
        from now until ``until``, carried out by the simulator's ``move``, sampling the
        load every ``options.sample`` seconds in between, as ``octopis balance`` does
        (:meth:`~octopis.balance.loop.Balancer.run`). A broker's load is, per second over
        its last ``window`` seconds (``[load] window``; less while the run is younger),
        the deliveries to the subscribers attached to it, plus the notification copies it
        sent when ``options.load_measure`` is ``output``; a subscriber's, its deliveries
        per second there since it attached; ``capacity`` (messages/s) is every broker's,
        for the plans on load ratios. With ``elastic`` (and a capacity) each round also
        asks it whether the mean load ratio calls for a cluster more (``reshape``) or the
        last one fewer (``shrink``, its subscribers moving to their refuges in turn, as
        ``octopis scale``'s do: :func:`~octopis.topology_change.refuge_turns`)."""
        if window <= 0:
            raise ValueError("the load window must be > 0 seconds")
        self.rounds = BalanceRounds(options, elastic if capacity else None)
        self.window, self._capacity, self._until = window, capacity, until
        self._meters, self._taken, self._held = {}, {}, {}
        self._take_samples()
        self._cycle(self._sim.now)

    def _cycle(self, begun: float) -> None:
        """The samples and the round of the cycle ``begun`` then, as
        :meth:`~octopis.balance.loop.Balancer.run` paces them: one every
        ``options.sample`` seconds while before the round, the round ``options.interval``
        seconds on."""
        assert self.rounds is not None
        options, sim = self.rounds.options, self._sim
        k = 1
        while k * options.sample < options.interval:
            sim.at(begun + k * options.sample, self._sample)
            k += 1
        sim.at(begun + options.interval, self._balance_round)

    def _interests(self, subscribers: Iterable[str]) -> dict[str, frozenset[str]]:
        """Each subscriber's interests at the broker it is attached to, by the rule a
        broker's ``clients`` RPC reports them to the balancer's SDM
        (:func:`~octopis.core.sessions.interests`)."""
        sim, home = self._sim, self._sim.clients.home
        return {
            s: interests(sim.cores[home[s]], sim.nodes[home[s]].sessions, s) for s in subscribers
        }

    def _delivered(self) -> Counter[str]:
        """Deliveries to each subscriber so far, read from the ledger: the keys it gained
        since the last read (its keys only come, in order), or all of them again when an
        older key's count grew too (a duplicate)."""
        received = self._sim.ledger.received
        total = sum(received.values())
        fresh: Counter[str] = Counter()
        for (subscriber, _, _), n in islice(received.items(), self._keys, None):
            fresh[subscriber] += n
        if fresh.total() == total - self._total:
            self._counted.update(fresh)
        else:
            self._counted = Counter()
            for (subscriber, _, _), n in received.items():
                self._counted[subscriber] += n
        self._keys, self._total = len(received), total
        return self._counted

    def _take_samples(self) -> None:
        """Each broker's meter takes a :class:`LoadSample` of its counts now and keeps
        the last ``window`` seconds of them (DESIGN §9): the copies it sent, deliveries
        in all and to each subscriber attached to it. A subscriber's deliveries since
        the last sample count at the broker it is attached to now; one attached anew
        starts from none there (a new session: what an earlier one there got is
        forgotten) and one gone is no longer listed, as a broker lists the clients of its
        live connections."""
        sim, now = self._sim, self._sim.now
        assert self.rounds is not None
        options = self.rounds.options
        bound = int(self.window // options.sample) + int(self.window // options.interval) + 3
        meters = {b: self._meters.get(b) or _Meter(bound) for b in sim.cores}
        counts, home = self._delivered(), sim.clients.home
        subscribers = dict.fromkeys(sim.subscriber_of.values())
        for gone in self._held.keys() - subscribers.keys():
            if (was := self._held.pop(gone)) in meters:
                meters[was].clients.pop(gone, None)
        for subscriber in subscribers:
            meter = meters[home[subscriber]]
            was = self._held.get(subscriber)
            if was != home[subscriber]:  # a new session: its count starts here
                if was in meters:
                    meters[was].clients.pop(subscriber, None)
                for sample in meter.samples:  # an earlier one here is another session
                    sample.deliveries.pop(subscriber, None)
                meter.clients[subscriber] = 0
                self._held[subscriber] = home[subscriber]
            n = counts[subscriber] - self._taken.get(subscriber, 0)
            self._taken[subscriber] = counts[subscriber]
            meter.clients[subscriber] += n
            meter.delivered += n
        for broker, meter in meters.items():
            copies = {"": sim.cores[broker].notification_copies}
            samples = meter.samples
            samples.append(LoadSample(now, 0, 0, copies, meter.delivered, Counter(meter.clients)))
            while samples[0].at < now - self.window - 1e-9:
                samples.popleft()
        self._meters = meters

    def _reports(self) -> dict[str, dict[str, Any]]:
        """Each broker's load report now, by the brokers' own rule (:func:`load_report`
        over its meter's samples, as :meth:`~octopis.core.load.LoadMeter.report`: all
        rates 0 until two are in), listing as many clients as the balancer reads."""
        reports = {}
        for broker, meter in self._meters.items():
            samples = meter.samples
            first, last = (samples[0], samples[-1]) if len(samples) > 1 else (_EMPTY, _EMPTY)
            reports[broker] = load_report(first, last, self._capacity, CLIENTS_READ)
        return reports

    def _observe(self, round_: bool) -> None:
        """Hand :attr:`rounds` the loads read now (:meth:`~BalanceRounds.sampled`, the
        timeline and the subscribers' averaged rates), as ``octopis balance``'s samples
        (:func:`~octopis.balance.observe.load_state`) take them from the load reports; a
        ``round_``'s with the subscribers' interests for SDM."""
        rounds, sim = self.rounds, self._sim
        assert rounds is not None
        options = rounds.options
        reports = self._reports()
        state = load_state(reports, sim.scot, options.load_measure, lambda client, _: client)
        if round_ and options.plan == "sdm":
            state = replace(state, interests=self._interests(state.hosts))
        output = {b: report["output_per_s"] for b, report in reports.items()}
        ratio = sum(r["load_ratio"] for r in reports.values()) / len(reports)
        rounds.sampled(sim.now, state, output, ratio, sim.scot.clusters)

    def _sample(self) -> None:
        """A sample between rounds: the brokers' meters sample; the loads go to
        :attr:`rounds` unless a shrink is under way (the process's balancer awaits it)."""
        self._take_samples()
        if not self._sim.retiring:
            self._observe(round_=False)

    def _balance_round(self) -> None:
        """One round, as ``octopis balance``'s (:meth:`~octopis.balance.loop.Balancer.round`):
        a sample of its own, then what :attr:`rounds` decides on it carried out (a change
        of shape, or the plan's moves, subscribers whose move is still under way left
        out). While a shrink is under way no round runs: the process's balancer awaits
        the change."""
        rounds, sim = self.rounds, self._sim
        assert rounds is not None
        if sim.now + rounds.options.interval <= self._until:
            self._cycle(sim.now)
        self._take_samples()
        if sim.retiring:
            return
        rounds.new_round()
        self._observe(round_=True)
        change = rounds.elastic_change(sim.now, sim.scot.clusters)
        if change is not None:
            self._reshape(rounds, change)
        subscribers = set(sim.subscriber_of.values())
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
