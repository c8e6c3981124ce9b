"""A balancer's rounds, sans IO (DESIGN §9): what ``octopis balance``
(:class:`~octopis.balance.loop.Balancer`) and the simulator
(:class:`~octopis.sim.balancing.SimBalancer`) keep and decide, one implementation. Each
feeds it the loads it read and carries out, its own way, the changes of shape and the
moves it decides."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from octopis.balance.plans import LoadState, Plan, PlannedMove, coefficient_of_variation
from octopis.balance.policy import (
    HISTORY_LIMIT,
    BalanceOptions,
    Elasticity,
    SubscriberLoads,
    load_sample,
    plan_round,
    recently_moved,
)

RESHAPED = "the overlay changed shape this round"
"""The note of the plan of a round that changed the overlay's shape: it moves no one
(the next round sees the new shape)."""


class BalanceRounds:
    """The rounds of a balancer under ``options`` and, with ``elastic``, Dynamoth's
    elasticity rule (a cluster as the unit). A round: :meth:`new_round`, then the loads
    read (:meth:`sampled`, also between rounds), the change of shape asked for
    (:meth:`elastic_change`, only with ``act``) and how carrying it out went
    (:meth:`changed`), the plan (:meth:`plan`: none in a round that changed the shape),
    and each order of :meth:`orders` carried out (:meth:`ordered`). Samples, changes and
    move decisions are kept in bounded logs (the last :data:`HISTORY_LIMIT`); every
    order and failed change is counted (:meth:`report`)."""

    def __init__(self, options: BalanceOptions, elastic: Elasticity | None = None) -> None:
        self.options = options
        self.elastic = elastic
        self.count = 0
        """Rounds begun."""
        self.reads_failed = 0
        """Samples and rounds skipped because some broker's load report did not come."""
        self.timeline: deque[dict[str, Any]] = deque(maxlen=HISTORY_LIMIT)
        """Per sample: time, each broker's load and output, their coefficient of
        variation and mean (:func:`load_sample`), the mean load ratio, the clusters; and
        in a round that planned, the moves planned and the spread the plan expects."""
        self.decisions: deque[dict[str, Any]] = deque(maxlen=HISTORY_LIMIT)
        """Per ordered move: round, time, the move (subscriber, source, target, inside,
        reason), and the sub ids moved or the error."""
        self.changes: deque[dict[str, Any]] = deque(maxlen=HISTORY_LIMIT)
        """Per change of shape: round, time, change, mean load ratio before, and the
        clusters after or the error that stopped it."""
        self.moves: Counter[str] = Counter()
        """Moves ordered (``inside``, ``across``) and ``failed``, all of them."""
        self.changes_failed = 0
        self.subscriber_loads = SubscriberLoads(options.smoothing)
        """Each subscriber's rate averaged over the samples, which the plans take."""
        self._state: LoadState | None = None
        self._reshaped_in = 0
        """The round that last changed the overlay's shape."""

    def new_round(self) -> int:
        """A round begins; returns its number."""
        self.count += 1
        return self.count

    def read_failed(self) -> None:
        """A sample or round was skipped: some broker's load report did not come."""
        self.reads_failed += 1

    def sampled(
        self,
        now: float,
        state: LoadState,
        outputs: dict[str, float],
        mean_ratio: float,
        clusters: int,
        **extra: Any,
    ) -> dict[str, Any]:
        """The loads read at ``now``: ``state`` as the plans take it (a broker's load in
        the measure balanced), each broker's ``outputs`` per second, their mean load
        ratio, the overlay's ``clusters``; ``extra`` (the wall clock, say) kept with the
        sample. The subscribers' rates are folded into their averages; returns the
        sample appended to the timeline."""
        self.subscriber_loads.update(state, now)
        self._state = state
        loads = {b: v.load for b, v in state.brokers.items()}
        sample = {
            "t": now,
            **extra,
            **load_sample(loads, outputs),
            "mean_ratio": mean_ratio,
            "clusters": clusters,
        }
        self.timeline.append(sample)
        return sample

    def elastic_change(self, now: float, clusters: int) -> str | None:
        """What the elasticity rule asks of an overlay of ``clusters`` clusters at ``now``
        on the last sample's mean load ratio: ``add-cluster``, ``remove-cluster`` or
        None (always None without the rule or ``act``). The driver carries it out and
        says how that went (:meth:`changed`)."""
        if self.elastic is None or not self.options.act:
            return None
        return self.elastic.decide(now, self.timeline[-1]["mean_ratio"], clusters)

    def changed(
        self,
        now: float,
        change: str,
        *,
        clusters: int | None = None,
        error: str = "",
        **extra: Any,
    ) -> dict[str, Any]:
        """``change``, asked for at ``now`` on the last sample's mean load ratio, was made
        (the overlay now of ``clusters`` clusters: this round moves no one) or refused
        or failed with ``error`` (the rule asks again after ``t_wait``; the round plans
        as usual); ``extra`` (the wall clock, the seconds it took) kept with it. Returns
        the record appended to :attr:`changes`."""
        record = {
            "round": self.count,
            "t": now,
            "change": change,
            "mean_ratio": self.timeline[-1]["mean_ratio"],
            **({"error": error} if error else {"clusters": clusters}),
            **extra,
        }
        self.changes.append(record)
        if error:
            self.changes_failed += 1
        else:
            self._reshaped_in = self.count
        return record

    def plan(self, now: float, moving: Iterable[str] = ()) -> Plan:
        """The round's plan at ``now`` on the last sample, with each subscriber's averaged
        rate: :func:`plan_round` leaving out the subscribers ``moving`` (a move still
        under way) and those moved within ``cooldown`` seconds; none in a round that
        changed the overlay's shape. The sample keeps the moves planned and the spread
        the plan expects (``planned``, ``cov_planned``)."""
        if self._reshaped_in == self.count:
            return Plan(note=RESHAPED)
        if self._state is None:
            raise RuntimeError("a round plans on a sample: none was taken")
        recent = set(moving) | recently_moved(self.decisions, now, self.options.cooldown)
        planned = self.subscriber_loads.applied(self._state)
        plan = plan_round(self.options, planned, recent)
        sample = self.timeline[-1]
        sample["cov_planned"] = coefficient_of_variation(b.load for b in planned.brokers.values())
        sample["planned"] = len(plan.moves)
        return plan

    def orders(self, plan: Plan) -> list[PlannedMove]:
        """The moves of ``plan`` to order: all of them with ``act``, none in a dry run."""
        return plan.moves if self.options.act else []

    def ordered(
        self,
        move: PlannedMove,
        now: float,
        sub_ids: Iterable[str] = (),
        error: str = "",
        **extra: Any,
    ) -> dict[str, Any]:
        """``move`` was ordered at ``now``: it moved ``sub_ids``, or ``error`` stopped it
        (then it counts as failed, and moved no one for the cooldown); ``extra`` (the
        wall clock) kept with it. Returns the record appended to :attr:`decisions`."""
        record = {
            "round": self.count,
            "t": now,
            **extra,
            **asdict(move),
            "sub_ids": list(sub_ids),
            "error": error,
        }
        self.decisions.append(record)
        self.moves["failed" if error else "inside" if move.inside_cluster else "across"] += 1
        return record

    def report(self) -> dict[str, Any]:
        """What the balancer saw and did: the options, the rounds, the moves ordered
        (inside a cluster, across, failed) and the decisions kept (``decisions_dropped``:
        those the bounded log no longer holds), the timeline, the changes of shape."""
        moves = self.moves
        return {
            "options": asdict(self.options),
            "rounds": self.count,
            "reads_failed": self.reads_failed,
            "moves": moves["inside"] + moves["across"],
            "moves_inside": moves["inside"],
            "moves_across": moves["across"],
            "moves_failed": moves["failed"],
            "decisions": list(self.decisions),
            "decisions_dropped": sum(moves.values()) - len(self.decisions),
            "timeline": list(self.timeline),
            "changes": list(self.changes),
            "changes_failed": self.changes_failed,
        }
