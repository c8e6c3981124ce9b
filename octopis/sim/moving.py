"""Subscribers moving between brokers in the simulator (DESIGN §9), and the balancer's
rounds that order moves on simulated load: a mixin of the
:class:`~octopis.sim.engine.Simulator`, beside its event loop (it reads the clients,
cores and links the engine keeps)."""

from __future__ import annotations

from collections import Counter, deque

from octopis.balance.plans import BrokerLoad, LoadState
from octopis.balance.policy import (
    HISTORY_LIMIT,
    BalanceOptions,
    Elasticity,
    SubscriberLoads,
    load_sample,
    plan_round,
)
from octopis.core import Subscribe
from octopis.core.clustered import ClusteredBroker
from octopis.sim.reshaping import MOVE_POLL
from octopis.topology_change import add_cluster, remove_cluster

MOVE_LINGER = 1.0
"""Seconds a subscription moved across clusters stays after its successor is stored by every
broker, and the subscriber keeps dropping repeats after that (the SDK's ``linger``)."""


class SubscriberMoves:
    """Moves of subscribers and the balancer's rounds (see the module docstring)."""

    def move(
        self, subscriber: str, broker: str, *, poll: float = MOVE_POLL, linger: float = MOVE_LINGER
    ) -> dict[str, str]:
        """Move every subscription of ``subscriber`` to ``broker`` now (DESIGN §9);
        returns old id → the id it has at ``broker``. One move of a subscriber at a time.

        Inside the subscriber's cluster (SNR, DNR without covering) the new host adopts
        each subscription (:meth:`ClusteredBroker.adopt`): same id, and the path turns
        without losing a copy. Otherwise (another cluster, covering, or BID) it subscribes
        afresh at ``broker``; once every live broker stores the new subscription, or with
        covering once no message of its broadcast is on its way or held (checked every
        ``poll`` seconds), the old one stays ``linger`` seconds more, for copies routed by
        it before, and is then withdrawn. Either way both hosts deliver for a while (a
        copy that reaches the new host for another subscriber's sake is delivered there
        too), so the subscriber drops a delivery it has had already from the start until
        ``linger`` seconds after the old host let go (``moves.absorbed``), as the SDK
        does: exactly once as long as no copy is in flight longer than ``linger``."""
        old = self._home.get(subscriber)
        if old is None:
            raise KeyError(f"{subscriber} is attached to no broker")
        if broker not in self.cores:
            raise KeyError(f"no broker {broker!r} in topology {self.scot.name}")
        if broker == old:
            raise ValueError(f"{subscriber} is attached to {broker} already")
        if self.moving(subscriber):
            raise ValueError(f"a move of {subscriber} is under way; one at a time")
        held = [sub_id for sub_id, owner in self.subscriber_of.items() if owner == subscriber]
        self._home[subscriber] = broker
        core, moved = self.cores[broker], {}
        inside = (
            isinstance(core, ClusteredBroker)
            and core.adopts
            and core.cluster == self.cores[old].cluster
        )
        self._linger = linger
        self.record_of(subscriber)
        for sub_id in held:
            self._moving[subscriber] += 1
            self._overlap[subscriber] += 1
            if inside:
                self.moves["inside"] += 1
                moved[sub_id] = sub_id
                self.sessions[old].detach(subscriber, sub_id)
                self.sessions[broker].attach(subscriber, sub_id)
                self._dispatch_local(broker, core.adopt(subscriber, sub_id))
                continue
            self.moves["across"] += 1
            subscription = self.cores[old].table.entries[sub_id].subscription
            moved[sub_id] = new_id = self.subscribe(subscriber, broker, subscription)
            self.subscriber_of.pop(sub_id)
            self.at(self.now + poll, self._spread, subscriber, old, sub_id, new_id, poll, linger)
        return moved

    def balance(
        self,
        options: BalanceOptions,
        until: float,
        capacity: float = 0.0,
        elastic: Elasticity | None = None,
    ) -> None:
        """Run the balancer's rounds on simulated load every ``options.interval`` seconds
        from now until ``until``: the decisions of ``octopis balance`` (:func:`plan_round`,
        one implementation), carried out by :meth:`move`. A broker's load is, per second
        over the last interval, the deliveries to the subscribers attached to it, plus
        the notification copies it sent when ``options.load_measure`` is ``output``; a
        subscriber's, its deliveries per second;
        ``capacity`` (messages/s) is every broker's, for the plans on load ratios. With
        ``elastic`` (and a capacity) each round also asks it whether the mean load ratio
        calls for a cluster more (:meth:`reshape`) or the last one fewer (:meth:`shrink`,
        its subscribers moving to their region's least loaded broker elsewhere)."""
        self.balance_log = {
            "options": vars(options),
            "decisions": deque(maxlen=HISTORY_LIMIT),
            "decisions_made": 0,
            "timeline": deque(maxlen=HISTORY_LIMIT),
            "elastic": deque(maxlen=HISTORY_LIMIT),
        }
        self._subscriber_loads = SubscriberLoads(options.smoothing)
        mark = self._load_counts()
        self.at(
            self.now + options.interval,
            self._balance_round,
            options,
            until,
            capacity,
            mark,
            elastic,
        )

    def _interests(self, subscribers: set[str]) -> dict[str, frozenset[str]]:
        """Each subscriber's interests (``Subscription.interests``), as a broker's
        ``clients`` RPC reports them to the balancer's SDM."""
        held: dict[str, set[str]] = {s: set() for s in subscribers}
        for sub_id, subscriber in self.subscriber_of.items():
            entry = self.cores[self._home[subscriber]].table.entries.get(sub_id)
            if entry is not None and subscriber in held:
                held[subscriber] |= entry.subscription.interests()
        return {s: frozenset(i) for s, i in held.items()}

    def _load_counts(self) -> tuple[dict[str, int], Counter[str]]:
        """Copies sent by each broker, deliveries to each subscriber, so far."""
        copies = {b: c.notification_copies for b, c in self.cores.items()}
        delivered: Counter[str] = Counter()
        for (subscriber, _, _), n in self.ledger.received.items():
            delivered[subscriber] += n
        return copies, delivered

    def _balance_round(
        self,
        options: BalanceOptions,
        until: float,
        capacity: float,
        mark: tuple[dict[str, int], Counter[str]],
        elastic: Elasticity | None = None,
    ) -> None:
        assert self.balance_log is not None
        copies, delivered = counts = self._load_counts()
        span = options.interval
        subscribers = set(self.subscriber_of.values())
        rate = {s: (delivered[s] - mark[1][s]) / span for s in subscribers}
        deliveries = dict.fromkeys(self.cores, 0.0)
        for subscriber, r in rate.items():
            deliveries[self._home[subscriber]] += r
        output = {b: (copies[b] - mark[0].get(b, 0)) / span + deliveries[b] for b in self.cores}
        load = deliveries if options.load_measure == "deliveries" else output
        brokers = {
            b: BrokerLoad(load[b], capacity, self.scot.brokers[b].cluster)
            for b in self.cores
            if b not in self.retiring
        }
        state = LoadState(
            brokers,
            rate,
            {s: self._home[s] for s in subscribers},
            self._interests(subscribers) if options.plan == "sdm" else {},
        )
        log = self.balance_log
        recent = {s for s in subscribers if self.moving(s)}
        for decision in reversed(log["decisions"]):
            if self.now - decision["t"] >= options.cooldown:
                break
            recent.add(decision["subscriber"])
        self._subscriber_loads.update(state, self.now)
        plan = plan_round(options, self._subscriber_loads.applied(state), recent)
        for move in plan.moves if options.act else ():
            self.move(move.subscriber, move.target)
            log["decisions"].append({"t": self.now, **vars(move)})
            log["decisions_made"] += 1
        log["timeline"].append(
            {
                "t": self.now,
                **load_sample(load, output),
                "moves": len(plan.moves),
                "clusters": self.scot.clusters,
                "mean_ratio": sum(output.values()) / len(output) / capacity if capacity else 0.0,
            }
        )
        if elastic is not None and capacity and not self.retiring:
            self._elastic_round(elastic, log["timeline"][-1]["mean_ratio"], load)
        if self.now + span <= until:
            args = (options, until, capacity, counts, elastic)
            self.at(self.now + span, self._balance_round, *args)

    def _elastic_round(self, elastic: Elasticity, ratio: float, load: dict[str, float]) -> None:
        """Grow or shrink by a cluster if ``elastic`` says so (Dynamoth, issue 18)."""
        assert self.balance_log is not None
        change = elastic.decide(self.now, ratio, self.scot.clusters)
        if change is None:
            return
        self.balance_log["elastic"].append(
            {"t": self.now, "change": change, "mean_ratio": ratio, "clusters": self.scot.clusters}
        )
        if change == "add-cluster":
            self.reshape(add_cluster(self.scot))
            return
        last = self.scot.clusters - 1

        def refuge(broker: str) -> str:
            region = self.scot.brokers[broker].region
            return min((f"{region}:{k}" for k in range(last)), key=lambda b: (load[b], b))

        self.shrink(remove_cluster(self.scot, last), refuge)

    def moving(self, subscriber: str) -> bool:
        """Whether a move of ``subscriber`` has not finished yet."""
        return subscriber in self._moving

    def _spread(
        self, subscriber: str, old: str, sub_id: str, new_id: str, poll: float, linger: float
    ) -> None:
        """Once every live broker stores ``new_id`` (with covering: once its broadcast is
        over), withdraw ``sub_id`` ``linger`` later."""
        dead = self.failures.dead if self.failures is not None else ()
        if (
            self._broadcasting(new_id)
            if self.covering == "active"
            else any(new_id not in c.table for b, c in self.cores.items() if b not in dead)
        ):
            args = (subscriber, old, sub_id, new_id, poll, linger)
            self.at(self.now + poll, self._spread, *args)
            return
        self.at(self.now + linger, self._withdraw_moved, subscriber, old, sub_id, linger)

    def _broadcasting(self, sub_id: str) -> bool:
        """Whether a subscription message of ``sub_id`` is on its way or held for a
        neighbour (with covering, the broadcast is over once none is)."""

        def names(message: object) -> bool:
            return type(message) is Subscribe and message.sub_id == sub_id  # type: ignore[attr-defined]

        return any(map(names, self.events.messages())) or any(
            names(m) for node in self.nodes.values() for m in node.held_messages()
        )

    def _withdraw_moved(self, subscriber: str, old: str, sub_id: str, linger: float) -> None:
        self.sessions[old].detach(subscriber, sub_id)
        self.ledger.unsubscribed(sub_id)
        self._dispatch_local(old, self.cores[old].unsubscribe(subscriber, sub_id))
        self.moves["withdrawn"] += 1
        self._let_go(subscriber)

    def _let_go(self, subscriber: str) -> None:
        """The old host of a subscription of ``subscriber`` delivers no more."""
        self._moved(subscriber, self._moving)
        self.at(self.now + self._linger, self._lingered, subscriber)

    def _lingered(self, subscriber: str) -> None:
        """``linger`` after a host of ``subscriber`` let go: once no move of it overlaps,
        a subscriber that never failed over stops checking its deliveries (a repeat after
        that is the overlay's, counted by the ledger)."""
        self._moved(subscriber, self._overlap)
        if subscriber not in self._overlap and subscriber not in self.failed_over:
            self.records.pop(subscriber, None)

    @staticmethod
    def _moved(subscriber: str, moving: Counter[str]) -> None:
        moving[subscriber] -= 1
        if not moving[subscriber]:
            del moving[subscriber]
