"""The balancer at work (DESIGN §9): rounds of observe → plan → move on a running overlay.

Each round reads every broker's load analysis (:func:`~octopis.balance.observe.observe`),
makes the plan :class:`BalanceOptions` names and orders each of its moves from the
subscriber's broker over the control RPC (``move``): that broker tells the client, which
moves make-before-break (inside the cluster by adoption, else by subscribing afresh) and
drops what it gets twice meanwhile. Every decision is logged with its reason. Between
rounds the loads are sampled every ``sample`` seconds, so a run can show the load of every
broker over time; a round waits ``interval`` seconds (at least the brokers' load window,
so that it sees what the last round's moves did).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from octopis.balance.observe import Ask, BalanceError, observe
from octopis.balance.plans import LoadState, Plan
from octopis.balance.policy import (
    HISTORY_LIMIT,
    BalanceOptions,
    Elasticity,
    SubscriberLoads,
    coefficient_of_variation,
    load_sample,
    plan_round,
    recently_moved,
)
from octopis.topology import Scot

log = logging.getLogger("octopis.balance")

ORDERS_AT_ONCE = 16
"""Move orders a round has under way at once."""

Call = Callable[..., Awaitable[Any]]
"""``call(broker, method, *args)``: one broker's answer over a kept control connection."""
Reshape = Callable[[str], Awaitable[Scot]]
"""``reshape(change)``: carry out ``add-cluster`` or ``remove-cluster`` (the last) on the
running overlay (``octopis.cluster.scale``) and return its new topology version."""


class Balancer:
    """Runs rounds on the overlay ``scot`` through ``ask`` (``LocalCluster.ask``) and
    keeps what it saw and did: :attr:`timeline` (per sample: time, each broker's load,
    their coefficient of variation and mean) and :attr:`moves` (per ordered move: round,
    time, subscriber, source, target, inside, reason, and the sub ids moved or the
    error). With ``elastic`` and ``reshape`` each acting round first asks the elasticity
    rule (Dynamoth's, a cluster as the unit) about the mean load ratio; a round that
    changes the overlay's shape plans no moves (the next one sees the new shape), and
    :attr:`changes` records each change."""

    def __init__(
        self,
        scot: Scot,
        ask: Ask,
        options: BalanceOptions,
        timeout: float = 5.0,
        call: Call | None = None,
        elastic: Elasticity | None = None,
        reshape: Reshape | None = None,
    ):
        if (elastic is None) != (reshape is None):
            raise ValueError("elasticity needs both the rule and a way to reshape the overlay")
        self.elastic = elastic
        self.reshape = reshape
        self.changes: deque[dict[str, Any]] = deque(maxlen=HISTORY_LIMIT)
        """Per change: time, change, mean load ratio before, and clusters after and
        seconds, or the error that stopped it (the rule asks again after t_wait)."""
        self.changes_failed = 0
        self.scot = scot
        self.ask = ask
        self.call = call
        """Orders moves over kept control connections when given (``LocalCluster.call``);
        else each order asks over a connection of its own."""
        self.options = options
        self.timeout = timeout
        self.timeline: deque[dict[str, Any]] = deque(maxlen=HISTORY_LIMIT)
        self.moves: deque[dict[str, Any]] = deque(maxlen=HISTORY_LIMIT)
        self.counts: Counter[str] = Counter()
        """Moves ordered (``inside``, ``across``) and ``failed``, all of them."""
        self.rounds = 0
        self.reads_failed = 0
        """Samples and rounds skipped because some broker's load report did not come."""
        self.subscriber_loads = SubscriberLoads(options.smoothing)
        """Each subscriber's rate averaged over the samples, which the plans take."""
        self._started = time.monotonic()

    async def run(self) -> None:
        """Rounds until ``options.rounds`` are done (or forever), the first ``interval``
        seconds from now (a load window has passed), sampling in between. A sample or
        round whose load reports do not all come in time is skipped (logged, counted in
        :attr:`reads_failed`); the next one tries again."""
        self._started = time.monotonic()
        while True:
            next_round = time.monotonic() + self.options.interval
            while (left := next_round - time.monotonic()) > 0:
                await asyncio.sleep(min(self.options.sample, left))
                if time.monotonic() < next_round:
                    await self._skipping_failed_reads(self._sample())
            await self._skipping_failed_reads(self.round())
            if self.options.rounds and self.rounds >= self.options.rounds:
                return

    async def _skipping_failed_reads(self, work: Awaitable[Any]) -> None:
        try:
            await work
        except BalanceError:
            self.reads_failed += 1

    async def round(self) -> Plan:
        """Observe, plan, and order the plan's moves, one per subscriber (from where it
        is to where the plan leaves it), subscribers moved within ``cooldown`` seconds
        left out; returns the plan."""
        self.rounds += 1
        state = await self._sample()
        now = time.monotonic() - self._started
        if await self._elastic_change(now):
            return Plan(note="the overlay changed shape this round")
        recent = recently_moved(self.moves, now, self.options.cooldown)
        planned = self.subscriber_loads.applied(state)
        plan = plan_round(self.options, planned, recent)
        cov, mean = self.timeline[-1]["cov"], self.timeline[-1]["mean"]
        self.timeline[-1]["cov_planned"] = coefficient_of_variation(
            b.load for b in planned.brokers.values()
        )
        if not plan.moves:
            log.info(
                "round %d: no move (cov %.2f, mean %.0f/s)%s",
                self.rounds,
                cov,
                mean,
                f": {plan.note}" if plan.note else "",
            )
        self.timeline[-1]["planned"] = len(plan.moves)
        if not self.options.act:
            if plan.moves:
                log.info(
                    "round %d: would move %d subscribers (dry run)", self.rounds, len(plan.moves)
                )
            return plan
        at, wall = time.monotonic() - self._started, time.time()
        records = [{"round": self.rounds, "t": at, "wall": wall, **asdict(m)} for m in plan.moves]
        room = asyncio.Semaphore(ORDERS_AT_ONCE)

        async def order(record: dict[str, Any]) -> None:
            async with room:
                record["sub_ids"], record["error"] = await self._order(
                    record["subscriber"], record["source"], record["target"],
                    record["inside_cluster"],
                )  # fmt: skip

        await asyncio.gather(*(order(r) for r in records))
        for move, record in zip(plan.moves, records, strict=True):
            self.moves.append(record)
            if record["error"]:
                self.counts["failed"] += 1
            else:
                self.counts["inside" if record["inside_cluster"] else "across"] += 1
            where = "inside its cluster" if move.inside_cluster else "across clusters"
            if record["error"]:
                log.warning(
                    "round %d: move of %s from %s to %s failed: %s",
                    self.rounds,
                    move.subscriber,
                    move.source,
                    move.target,
                    record["error"],
                )
            else:
                log.info(
                    "round %d: %s %s -> %s (%s, %d subscriptions): %s",
                    self.rounds,
                    move.subscriber,
                    move.source,
                    move.target,
                    where,
                    len(record["sub_ids"]),
                    move.reason,
                )
        return plan

    async def _elastic_change(self, now: float) -> bool:
        """Ask the elasticity rule about the last sample's mean load ratio; carry out a
        change it asks for. Returns whether the shape changed."""
        if self.elastic is None or self.reshape is None or not self.options.act:
            return False
        ratio = self.timeline[-1]["mean_ratio"]
        change = self.elastic.decide(now, ratio, self.scot.clusters)
        if change is None:
            return False
        log.info(
            "round %d: %s (mean load ratio %.2f, %d clusters)",
            self.rounds,
            change,
            ratio,
            self.scot.clusters,
        )
        started = time.monotonic()
        try:
            self.scot = await self.reshape(change)
        except Exception as exc:  # refused or failed: tried again after t_wait
            self.changes_failed += 1
            log.error("round %d: %s failed: %s", self.rounds, change, exc)
            self.changes.append(
                {"round": self.rounds, "t": now, "wall": time.time(), "change": change,
                 "mean_ratio": ratio, "error": str(exc)}
            )  # fmt: skip
            return False
        self.changes.append(
            {
                "round": self.rounds,
                "t": now,
                "wall": time.time(),
                "change": change,
                "mean_ratio": ratio,
                "clusters": self.scot.clusters,
                "seconds": time.monotonic() - started,
            }
        )
        return True

    async def _order(
        self, subscriber: str, source: str, target: str, inside: bool
    ) -> tuple[list[str], str]:
        """Tell ``source`` to move ``subscriber`` (``name@connection@broker``) to
        ``target``; returns (sub ids, "") or ([], the error)."""
        client = subscriber.rsplit("@", 1)[0]
        to = self.scot.brokers[target].client_endpoint
        try:
            if self.call is not None:
                sub_ids = await asyncio.wait_for(
                    self.call(source, "move", client, to, inside), self.timeout
                )
            else:
                sub_ids = (await self.ask([source], "move", self.timeout, client, to, inside))[
                    source
                ]
        except TimeoutError:
            sub_ids = None
        except Exception as exc:  # the broker refused: the client left meanwhile, say
            return [], str(exc)
        if sub_ids is None:
            return [], f"{source} did not answer within {self.timeout:g} s"
        return list(sub_ids), ""

    async def _sample(self) -> LoadState:
        """Read every broker's load; append it to the timeline."""
        try:
            state, reports = await observe(
                self.scot,
                self.ask,
                self.timeout,
                self.options.load_measure,
                interests=self.options.plan == "sdm",
            )
        except BalanceError as exc:
            log.warning("load not read: %s", exc)
            raise
        loads = {b: v.load for b, v in state.brokers.items()}
        outputs = {b: r["output_per_s"] for b, r in reports.items()}
        ratios = [r["load_ratio"] for r in reports.values()]
        now = time.monotonic() - self._started
        self.subscriber_loads.update(state, now)
        self.timeline.append(
            {
                "t": now,
                "wall": time.time(),
                **load_sample(loads, outputs),
                "mean_ratio": sum(ratios) / len(ratios),
                "clusters": self.scot.clusters,
            }
        )
        return state

    def report(self) -> dict[str, Any]:
        """What the balancer saw and did."""
        counts = self.counts
        return {
            "options": asdict(self.options),
            "rounds": self.rounds,
            "reads_failed": self.reads_failed,
            "moves": counts["inside"] + counts["across"],
            "moves_inside": counts["inside"],
            "moves_across": counts["across"],
            "moves_failed": counts["failed"],
            "decisions": list(self.moves),
            "decisions_dropped": sum(counts.values()) - len(self.moves),
            "timeline": list(self.timeline),
            "changes": list(self.changes),
            "changes_failed": self.changes_failed,
        }
