"""The balancer at work (DESIGN §9): rounds of observe → plan → move on a running overlay.

Each round reads every broker's load analysis (:func:`~octopis.balance.observe.observe`),
makes the plan :class:`BalanceOptions` names and orders each of its moves from the
subscriber's broker over the control RPC (``move``): that broker tells the client, which
moves make-before-break (inside the cluster by adoption, else by subscribing afresh) and
drops what it gets twice meanwhile. What a round decides, :class:`BalanceRounds`
decides (the simulator's rounds too); every decision is logged with its reason. Between
rounds the loads are sampled every ``sample`` seconds, so a run can show the load of every
broker over time; a round waits ``interval`` seconds (at least the brokers' load window,
so that it sees what the last round's moves did).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from octopis.balance.observe import Ask, BalanceError, observe
from octopis.balance.plans import Plan, PlannedMove
from octopis.balance.policy import BalanceOptions, Elasticity
from octopis.balance.rounds import BalanceRounds
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
    """Runs rounds on the overlay ``scot`` through ``ask`` (``LocalCluster.ask``): feeds
    :attr:`rounds` (:class:`~octopis.balance.rounds.BalanceRounds`, which keeps what it
    saw and did and decides) the loads read, and carries out its decisions: the plan's
    moves ordered over the control RPC, and with ``elastic`` and ``reshape`` the changes
    of shape the elasticity rule (Dynamoth's, a cluster as the unit) asks for."""

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
        self.reshape = reshape
        self.scot = scot
        self.ask = ask
        self.call = call
        """Orders moves over kept control connections when given (``LocalCluster.call``);
        else each order asks over a connection of its own."""
        self.options = options
        self.timeout = timeout
        self.rounds = BalanceRounds(options, elastic)
        self._started = time.monotonic()

    def _now(self) -> float:
        """Seconds since the balancer started."""
        return time.monotonic() - self._started

    async def run(self) -> None:
        """Rounds until ``options.rounds`` are done (or forever), the first ``interval``
        seconds from now (a load window has passed), sampling in between. A sample or
        round whose load reports do not all come in time is skipped (logged, counted in
        the report's ``reads_failed``); the next one tries again."""
        self._started = time.monotonic()
        while True:
            next_round = time.monotonic() + self.options.interval
            while (left := next_round - time.monotonic()) > 0:
                await asyncio.sleep(min(self.options.sample, left))
                if time.monotonic() < next_round:
                    await self._skipping_failed_reads(self._sample())
            await self._skipping_failed_reads(self.round())
            if self.options.rounds and self.rounds.count >= self.options.rounds:
                return

    async def _skipping_failed_reads(self, work: Awaitable[Any]) -> None:
        try:
            await work
        except BalanceError:
            self.rounds.read_failed()

    async def round(self) -> Plan:
        """Observe; carry out the change of shape the rounds ask for, if any; order the
        plan's moves, one per subscriber (from where it is to where the plan leaves it);
        returns the plan."""
        number = self.rounds.new_round()
        await self._sample()
        now = self._now()
        change = self.rounds.elastic_change(now, self.scot.clusters)
        if change is not None:
            await self._reshape(number, now, change)
        plan = self.rounds.plan(now)
        if not plan.moves:
            sample = self.rounds.timeline[-1]
            log.info(
                "round %d: no move (cov %.2f, mean %.0f/s)%s",
                number,
                sample["cov"],
                sample["mean"],
                f": {plan.note}" if plan.note else "",
            )
        orders = self.rounds.orders(plan)
        if plan.moves and not orders:
            log.info("round %d: would move %d subscribers (dry run)", number, len(plan.moves))
        if orders:
            await self._order_all(number, orders)
        return plan

    async def _reshape(self, number: int, now: float, change: str) -> None:
        """Carry out ``change`` on the running overlay and tell :attr:`rounds` how it went
        (refused or failed: the rule asks again after t_wait)."""
        assert self.reshape is not None  # the rounds ask only with the rule, given with it
        ratio = self.rounds.timeline[-1]["mean_ratio"]
        clusters = self.scot.clusters
        log.info(
            "round %d: %s (mean load ratio %.2f, %d clusters)", number, change, ratio, clusters
        )
        started = time.monotonic()
        try:
            self.scot = await self.reshape(change)
        except Exception as exc:  # refused or failed
            log.error("round %d: %s failed: %s", number, change, exc)
            self.rounds.changed(now, change, error=str(exc), wall=time.time())
            return
        seconds = time.monotonic() - started
        self.rounds.changed(
            now, change, clusters=self.scot.clusters, wall=time.time(), seconds=seconds
        )

    async def _order_all(self, number: int, moves: list[PlannedMove]) -> None:
        """Order ``moves`` (:data:`ORDERS_AT_ONCE` at a time) and tell :attr:`rounds`
        how each went."""
        at, wall = self._now(), time.time()
        room = asyncio.Semaphore(ORDERS_AT_ONCE)

        async def order(move: PlannedMove) -> tuple[list[str], str]:
            async with room:
                return await self._order(
                    move.subscriber, move.source, move.target, move.inside_cluster
                )

        results = await asyncio.gather(*(order(m) for m in moves))
        for move, (sub_ids, error) in zip(moves, results, strict=True):
            self.rounds.ordered(move, at, sub_ids, error, wall=wall)
            if error:
                log.warning(
                    "round %d: move of %s from %s to %s failed: %s",
                    number,
                    move.subscriber,
                    move.source,
                    move.target,
                    error,
                )
            else:
                log.info(
                    "round %d: %s %s -> %s (%s, %d subscriptions): %s",
                    number,
                    move.subscriber,
                    move.source,
                    move.target,
                    "inside its cluster" if move.inside_cluster else "across clusters",
                    len(sub_ids),
                    move.reason,
                )

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

    async def _sample(self) -> None:
        """Read every broker's load; hand it to :attr:`rounds` (the timeline)."""
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
        outputs = {b: r["output_per_s"] for b, r in reports.items()}
        ratios = [r["load_ratio"] for r in reports.values()]
        mean_ratio = sum(ratios) / len(ratios)
        self.rounds.sampled(
            self._now(), state, outputs, mean_ratio, self.scot.clusters, wall=time.time()
        )

    def report(self) -> dict[str, Any]:
        """What the balancer saw and did (:meth:`BalanceRounds.report`)."""
        return self.rounds.report()
