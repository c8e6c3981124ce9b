"""``octopis run``: a workload on real broker processes, with a delivery report (DESIGN §4).

Start one process per broker (or, ``attach``, use an overlay already running, on this
machine or on several hosts); attach the workload's subscribers and publishers to their
brokers (one client connection per broker, shared by its clients); subscribe; wait until
the subscription broadcast has settled (every broker stores every subscription and all
output queues are empty); replay publications at their (scaled) times; wait until every
expected delivery has arrived, or no progress is made for ``drain_timeout`` seconds, or
the overlay holds nothing more for anyone (every queue, backlog, custody buffer and held
copy empty) and no delivery came for :data:`IDLE_DRAIN` seconds; then
collect the brokers' counters and stop every process it started, also on Ctrl-C or an
error. The report counts what happened from the first subscription on: each broker's
counters are read once before and subtracted.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from octopis.accounting import (
    DeliveryLedger,
    run_report,
)
from octopis.balance.loop import Balancer
from octopis.balance.observe import observe
from octopis.balance.plans import place_subscribers
from octopis.balance.policy import BalanceOptions
from octopis.cluster.harness import (
    Callbacks,
    ClientSide,
    Delivery,
    ShareStats,
    WorkerPool,
    share_of,
    split,
)
from octopis.cluster.launcher import ClusterError, LocalCluster
from octopis.cluster.run_failures import RunFailures, RunRecord
from octopis.cluster.run_report import RunCounts, balance_report, series, subscription_spread
from octopis.cluster.run_waits import drain, settle, watch_stalls
from octopis.defaults import CLIENT_LIVENESS, DRAIN_TIMEOUT
from octopis.failure_schedule import Failure
from octopis.settings import BrokerSettings
from octopis.topology import Scot
from octopis.workload import Workload

log = logging.getLogger("octopis.run")


@dataclass
class RunOptions:
    """How to run a workload on processes."""

    mode: str | None
    """snr, dnr or bid; None with ``attach``: the running overlay's."""
    run_dir: Path
    settings: BrokerSettings
    time_scale: float = 1.0
    drain_timeout: float = DRAIN_TIMEOUT
    start_timeout: float = 180.0
    progress: bool = True
    log_level: str = "INFO"
    log_format: str = "text"
    sample_every: float | None = None
    """Seconds between samples of every broker's queues while publishing and draining
    (the report's ``timeline``); None takes no samples."""
    failures: list[Failure] = field(default_factory=list)
    """Brokers to ``kill -9`` (and restart) or to stall (SIGSTOP, then SIGCONT) while
    publishing, times in seconds from the first publication (scaled like the workload's)."""
    secure: bool = True
    """CurveZMQ with key pairs in ``<run-dir>/keys``; False runs the brokers insecure."""
    keys: Path | None = None
    """A deployment's keys directory (``octopis-topology keys``) instead of new pairs."""
    attach: bool = False
    """Use the brokers of the topology that are already running (``octopis up``, on one
    host or several) instead of starting them; they are left running."""
    client_workers: int = 0
    """Processes the clients are spread over (by broker); 0: the run's own process
    (``octopis run`` defaults to :func:`default_client_workers`)."""
    client_liveness: float = CLIENT_LIVENESS
    """Seconds of a broker's silence before a client connection fails over (the SDK's
    ``liveness``); a loaded machine whose client processes stall wants more."""
    balance: BalanceOptions | None = None
    """Run the balancer (:mod:`octopis.balance.loop`) while publishing: its decisions and
    load timeline go in the report's ``balance``, with the delay before its first move
    and after its last."""
    placement: str = "nearest"
    """Where the subscribers attach (BAD §5.1, :func:`~octopis.balance.plans.initial_broker`):
    ``nearest`` is the workload's own broker; ``round_robin``, ``random`` and
    ``least_loaded`` (inside the workload broker's cluster, by the brokers' delivery
    load read once the overlay is ready) choose another."""
    seed: int = 0
    """Seeds the ``random`` placement."""


class WorkloadRun:
    """One ``octopis run``: cluster, clients, ledger and the timeline of a workload."""

    def __init__(
        self, scot: Scot, topology_path: Path, workload: Workload, options: RunOptions
    ) -> None:
        workload.check_topology(scot)
        if options.attach and options.failures:
            raise ClusterError("an attached run cannot kill or stall brokers it did not start")
        self.scot = scot
        self.workload = workload
        self.options = options
        self.cluster = LocalCluster(
            scot,
            topology_path,
            options.mode or "",
            options.run_dir,
            options.settings,
            options.log_level,
            secure=options.secure,
            log_format=options.log_format,
            keys=options.keys,
            forked=True,
        )
        self.baseline: dict[str, dict[str, Any]] = {}
        """Each broker's stats before the first subscription (subtracted in the report)."""
        self.ledger = DeliveryLedger()
        self.timings: dict[str, float] = {}
        self.timeline: list[dict[str, float]] = []
        self.balancer: Balancer | None = None
        self.balancer_error = ""
        """Why the balancer stopped before publishing ended, if it did."""
        self.placement: dict[str, Any] = {}
        """How ``options.placement`` placed the subscribers (when not ``nearest``)."""
        self.failures = RunFailures(
            self.cluster,
            scot,
            options.failures,
            time_scale=options.time_scale,
            start_timeout=options.start_timeout,
        )
        """The kills and stalls this run injects, and what they did."""
        self._published_at: dict[tuple[str, int], float] = {}
        self.publish_late_max_s = 0.0
        """How far the harness fell behind the workload's schedule (0 when it kept it)."""
        self._arrivals: list[tuple[float, float]] = []
        """(wall time, delay) of each delivery, kept only when sampling."""
        self._clients: ClientSide | WorkerPool | None = None
        self.client_stats = ShareStats()
        """What the clients' connections saw (outages, absorbed repeats, refusals)."""
        self._bars: dict[str, tqdm] = {}

    def run(self) -> dict[str, Any]:
        """Run everything and return the report; every process started here is stopped on
        the way out."""
        (self.options.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        if self.options.attach:
            self._phase(f"starting: attaching to the {len(self.scot.brokers)} running brokers")
        else:
            self._phase(f"starting {len(self.cluster.local)} broker processes")
            self.cluster.spawn()
        try:
            return asyncio.run(self._run())
        finally:
            self.cluster.stop()

    async def _run(self) -> dict[str, Any]:
        try:
            self.timings["start"] = await self.cluster.wait_ready(self.options.start_timeout)
            self.baseline = await self.cluster.call_all("stats")
            self._check_mode({s["mode"] for s in self.baseline.values()})
            if self.options.placement != "nearest":
                await self._place()
            await self._attach_clients()
            self.timings["subscribe"] = await self._subscribe()
            total = len(self.workload.subscriptions)
            self._phase(f"settling: until every broker holds the {total} subscriptions")
            self.timings["settle"] = await settle(
                self.cluster,
                self.baseline,
                self.ledger.subscription_keys,
                covering=self.options.settings.routing.covering == "active",
                attach=self.options.attach,
            )
            stalls = self.options.run_dir / "logs" / "harness-stalls.log"
            watchdog = asyncio.create_task(watch_stalls(stalls))
            sampler = None
            if self.options.sample_every:
                sampler = asyncio.create_task(self._sample(self.options.sample_every))
            lead = 0.2 if self.options.client_workers else 0.0  # the command reaches them
            t0 = asyncio.get_running_loop().time() + lead
            injector = (
                asyncio.create_task(self.failures.inject(t0)) if self.options.failures else None
            )
            balancer = None
            if self.options.balance is not None:
                self.balancer = Balancer(
                    self.scot, self.cluster.ask, self.options.balance, call=self.cluster.call
                )
                balancer = asyncio.create_task(self.balancer.run())
            try:
                self.timings["publish"] = await self._publish(time.time() + lead)
                if balancer is not None:
                    balancer.cancel()
                    (ended,) = await asyncio.gather(balancer, return_exceptions=True)
                    if isinstance(ended, Exception):
                        log.error("the balancer stopped early: %r", ended)
                        self.balancer_error = repr(ended)
                if injector is not None:
                    await injector
                bar = self._bar(len(self.ledger.expected), "draining")
                drain_timeout = self.options.drain_timeout
                self.timings["drain"] = await drain(self.ledger, self._ask_live, bar, drain_timeout)
                bar.close()
                await self.failures.compare_tables()
            finally:
                for task in (sampler, injector, watchdog, balancer):
                    if task is not None:
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)
            stats = await self._ask_live("stats")
            subscriptions = await self._ask_live("subscriptions")
            clients = self._clients
            assert clients is not None
            if isinstance(clients, WorkerPool):
                await clients.run("report", time.time(), 60.0)
                self.client_stats = clients.share_stats()
            else:
                self.client_stats = clients.stats()
            return self._report(stats, subscriptions)
        finally:
            if self._clients is not None:
                await self._clients.close()
            if self.options.attach and self.baseline:
                await self._await_withdrawal()
            await self.cluster.close_control()

    async def _await_withdrawal(self, timeout: float = 30.0) -> None:
        """After an attached run: until no broker holds a subscription of the run any
        more (the clients said bye, so they are withdrawn), so that the next run starts
        from the overlay as this one found it."""
        deadline = time.monotonic() + timeout
        ours = set(self.ledger.subscription_keys)
        while time.monotonic() < deadline:
            held = await self.cluster.ask(list(self.scot.brokers), "subscriptions", 5.0)
            if all(h is not None and not ours & h.keys() for h in held.values()):
                return
            await asyncio.sleep(0.2)
        log.warning("the run's subscriptions were not all withdrawn within %.0f s", timeout)

    def _check_mode(self, modes: set[str]) -> None:
        """The overlay's routing mode is the one asked for (an attached run without one
        takes the overlay's)."""
        if len(modes) != 1:
            raise ClusterError(f"the brokers run different modes: {', '.join(sorted(modes))}")
        (mode,) = modes
        if self.options.mode is None:
            self.options.mode = self.cluster.mode = mode
        elif mode != self.options.mode:
            raise ClusterError(f"the overlay routes with {mode}, not {self.options.mode}")

    async def _ask_live(self, method: str) -> dict[str, Any]:
        """``method`` of every broker; with failures, of every broker that answers."""
        if not self.options.failures:
            return await self.cluster.call_all(method)
        answers = await self.cluster.ask(list(self.scot.brokers), method, 5.0)
        return {b: a for b, a in answers.items() if a is not None}

    async def _place(self) -> None:
        """Re-place the workload's subscribers by ``options.placement`` (every subscription
        of a subscriber goes where it goes), from the running brokers' delivery load."""
        state, _ = await observe(self.scot, self.cluster.ask, measure="deliveries")
        workload = self.workload
        nearest: dict[str, str] = {}
        for subscription in workload.subscriptions:
            nearest.setdefault(subscription.subscriber, subscription.broker)
        placed = place_subscribers(self.options.placement, nearest, state, self.options.seed)
        self.placement = {
            "policy": self.options.placement,
            "moved": sum(placed[s] != b for s, b in nearest.items()),
            "subscribers": len(placed),
            "per_broker": dict(Counter(placed.values()).most_common()),
        }
        self._phase(
            f"placement {self.options.placement}: {self.placement['moved']} of {len(placed)} "
            "subscribers attach elsewhere than the workload says"
        )
        self.workload = Workload(
            workload.meta,
            [replace(s, broker=placed[s.subscriber]) for s in workload.subscriptions],
            workload.publications,
        )

    async def _attach_clients(self) -> None:
        """The workload's clients: in this process, or spread by broker over
        ``client_workers`` processes (their results come back to the same callbacks)."""
        workload, options = self.workload, self.options
        callbacks = Callbacks(self._subscribed, self._sent, self._received)
        events = [*workload.subscriptions, *workload.publications]
        parts = split(events, max(1, options.client_workers))
        shares = [
            share_of(
                self.scot,
                brokers,
                workload.subscriptions,
                workload.publications,
                self.cluster.keys_dir,
                options.time_scale,
                options.client_liveness,
            )
            for brokers in parts
        ]
        if options.client_workers:
            self._clients = WorkerPool(shares, callbacks)
            await self._clients.start()
        else:
            ((share, indices),) = shares or [(share_of(self.scot, [], [], [], None, 1.0))]
            self._clients = ClientSide(share, callbacks, indices)
            await self._clients.attach()

    def _subscribed(self, index: int, sub_id: str) -> None:
        event = self.workload.subscriptions[index]
        self.ledger.subscribed(event.subscriber, sub_id, event.subscription)
        self._bars["subscribing"].update()

    def _sent(self, publisher: str, seq: int, at: float) -> None:
        self._published_at[(publisher, seq)] = at
        self._bars["publishing"].update()

    def _received(self, delivery: Delivery) -> None:
        subscriber, publisher, seq, published_at, received_at, left_at = delivery
        self.ledger.delivered(
            subscriber, publisher, seq, received_at - published_at, left_at - published_at
        )
        if self.options.sample_every or self.options.balance:
            self._arrivals.append((received_at, received_at - published_at))

    async def _subscribe(self) -> float:
        started = time.monotonic()
        self._bars["subscribing"] = self._bar(len(self.workload.subscriptions), "subscribing")
        assert self._clients is not None
        if isinstance(self._clients, WorkerPool):
            await self._clients.run("subscribe", time.time(), self.options.start_timeout)
        else:
            await self._clients.subscribe(time.time())
        self._bars.pop("subscribing").close()
        return time.monotonic() - started

    async def _publish(self, t0: float) -> float:
        """Every publication at its time after the wall-clock start ``t0`` (the ledger
        expects each from the subscriptions made before); refusals fail the run."""
        started = time.monotonic()
        for event in self.workload.publications:
            self.ledger.published(event.publisher, event.seq, event.publication)
        self._bars["publishing"] = self._bar(len(self.workload.publications), "publishing")
        clients = self._clients
        assert clients is not None
        if isinstance(clients, WorkerPool):
            span = max((e.time for e in self.workload.publications), default=0.0)
            await clients.run("publish", t0, 600.0 + span * self.options.time_scale)
            stats = clients.share_stats()
        else:
            await clients.publish(t0)
            stats = clients.stats()
        self._bars.pop("publishing").close()
        self.publish_late_max_s = stats.late_max_s
        if stats.refused:
            raise ClusterError(
                f"brokers refused {len(stats.refused)} publication(s): {stats.refused[0]}"
            )
        return time.monotonic() - started

    async def _sample(self, every: float) -> None:
        """Record, every ``every`` seconds, the total and the longest output queue, and
        the deliveries waiting for ``clients.capacity`` (in all, and at the broker with
        the most)."""
        started = time.monotonic()
        while True:
            stats = await self._ask_live("stats")
            queues = [q for s in stats.values() for q in s["queue_lengths"].values()]
            self.timeline.append(
                {
                    "t": time.monotonic() - started,
                    "total": sum(queues),
                    "max": max(queues, default=0),
                    "deliveries_waiting": sum(s["deliveries_waiting"] for s in stats.values()),
                    "deliveries_waiting_max": max(
                        (s["deliveries_waiting"] for s in stats.values()), default=0
                    ),
                    "delivered": sum(self.ledger.received.values()),
                }
            )
            await asyncio.sleep(every)

    def _phase(self, text: str) -> None:
        """Say which phase the run is in (with progress on)."""
        if self.options.progress:
            tqdm.write(text, file=sys.stderr)

    def _bar(self, total: int, what: str) -> tqdm:
        return tqdm(
            total=total,
            desc=f"{what:>11}",
            unit="msg",
            leave=False,
            disable=not self.options.progress,
            mininterval=0.5,
        )

    def _report(self, stats: dict[str, dict], subscriptions: dict[str, dict]) -> dict[str, Any]:
        counted = RunCounts.since(self.baseline, stats)
        core, counters = counted.core, counted.counters
        delay, depth = subscription_spread(subscriptions, self.ledger.subscription_keys)
        report = run_report(
            self.options.mode,
            len(self.scot.brokers),
            len(self.workload.subscriptions),
            self.ledger,
            core,
            list(depth.values()),
            delay.values(),
        )
        report |= {
            "matching_delay": {
                "mean_per_operation": (
                    counted.match_seconds / core["matching"] if core["matching"] else 0.0
                ),
                "total_seconds": counted.match_seconds,
            },
            "errors": {
                k: counters[k]
                for k in (
                    "wire_errors",
                    "protocol_errors",
                    "client_errors",
                    "internal_errors",
                    "undeliverable",
                )
            },
            "failures": self.failures.report(
                stats,
                core,
                counters,
                RunRecord(self.workload, self.ledger, self._published_at, self.client_stats),
            ),
            "target_queue_length": {
                "mean": counted.queued / counted.copies if counted.copies else 0.0,
                "max": counted.longest,
            },
            "timings": self.timings,
            "publish_late_max_s": self.publish_late_max_s,
            "sdk_failovers": self.client_stats.failovers,
            "sdk_errors": {
                "count": len(self.client_stats.errors),
                "sample": self.client_stats.errors[:5],
            },
        }
        if self.options.mode != "bid":
            report["covering"] = self.options.settings.routing.covering
        if self.placement:
            report["placement"] = self.placement
        if self.balancer is not None:
            report["balance"] = balance_report(
                self.balancer, self.balancer_error, self._arrivals, self.client_stats
            )
        if self.options.sample_every:
            report["timeline"] = self.timeline
            report["series"] = series(
                self._published_at, self.ledger, self._arrivals, self.options.sample_every
            )
            delays = self.ledger.delays
            report["max_delay_per_1000"] = [
                max(delays[i : i + 1000]) for i in range(0, len(delays), 1000)
            ]
        return report
