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
import faulthandler
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
    delay_distribution,
    delivery_series,
    failure_counts,
    host_split,
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
from octopis.defaults import CLIENT_LIVENESS, DRAIN_TIMEOUT
from octopis.failure_schedule import Failure
from octopis.settings import BrokerSettings
from octopis.topology import Scot
from octopis.workload import Workload

log = logging.getLogger("octopis.run")

STALL_DUMP_AFTER = 5.0
"""Seconds the harness's event loop may stall before every thread's stack is written to
``<run-dir>/logs/harness-stalls.log``: a stuck harness reads as silent clients to the
brokers, which drop them after ``clients.timeout``."""


IDLE_DRAIN = 2.0
"""Seconds without a delivery after which a drain stops early if the overlay is idle:
what is still missing then (a failure's losses) can no longer come."""


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

        self.kills: dict[str, float] = {}
        """Killed broker → time.monotonic() of its kill (the brokers' loop clock)."""
        self.restarts: dict[str, float] = {}
        """Restarted broker → seconds from its start until it was ready again."""
        self._restarted_at: dict[str, float] = {}
        """Restarted broker → time.monotonic() of its restart."""
        self.stalls: dict[str, tuple[float, float]] = {}
        """Stalled broker → time.monotonic() of its SIGSTOP and of its SIGCONT."""
        self.tables: dict[str, dict] = {}
        """Killed broker → its routing table just before the kill; after its restart,
        how the resynced table differs from it (entries it hosted itself left out)."""
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
            self.timings["settle"] = await self._settle()
            watchdog = asyncio.create_task(self._watch_stalls())
            sampler = None
            if self.options.sample_every:
                sampler = asyncio.create_task(self._sample(self.options.sample_every))
            lead = 0.2 if self.options.client_workers else 0.0  # the command reaches them
            t0 = asyncio.get_running_loop().time() + lead
            injector = asyncio.create_task(self._inject(t0)) if self.options.failures else None
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
                self.timings["drain"] = await self._drain()
                for broker in self.restarts:
                    self.tables[broker] = await self._compare_table(broker)
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

    async def _watch_stalls(self) -> None:
        """Warn when this event loop ran late by more than a second; dump every thread's
        stack if it stalls :data:`STALL_DUMP_AFTER` seconds."""
        loop = asyncio.get_running_loop()
        path = self.options.run_dir / "logs" / "harness-stalls.log"
        with open(path, "a") as out:
            try:
                woke = loop.time()
                while True:
                    faulthandler.dump_traceback_later(STALL_DUMP_AFTER, file=out)
                    await asyncio.sleep(1.0)
                    now = loop.time()
                    if now - woke > 2.0:
                        log.warning("the harness's event loop stalled %.1f s", now - woke - 1.0)
                    woke = now
            finally:
                faulthandler.cancel_dump_traceback_later()

    async def _ask_live(self, method: str) -> dict[str, Any]:
        """``method`` of every broker; with failures, of every broker that answers."""
        if not self.options.failures:
            return await self.cluster.call_all(method)
        answers = await self.cluster.ask(list(self.scot.brokers), method, 5.0)
        return {b: a for b, a in answers.items() if a is not None}

    async def _inject(self, t0: float) -> None:
        """Kill and restart, or stop and resume, brokers at their times (DESIGN §7); a
        broker still stopped when this ends (cancelled) is resumed."""
        loop = asyncio.get_running_loop()
        scale = self.options.time_scale
        failures = self.options.failures
        steps = [(f.at, True, f.ends[0], f.stall) for f in failures]
        steps += [(f.until, False, f.ends[0], f.stall) for f in failures if f.until]
        stopped: set[str] = set()
        try:
            for at, fail, broker, stall in sorted(steps):
                delay = t0 + at * scale - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if stall:
                    self.cluster.pause(broker, stopped=fail)
                    now = time.monotonic()
                    (stopped.add if fail else stopped.discard)(broker)
                    self.stalls[broker] = (now, now) if fail else (self.stalls[broker][0], now)
                    log.warning("%s %s", "stopped" if fail else "resumed", broker)
                else:
                    await self._kill_or_restart(broker, fail)
        finally:
            for broker in stopped:
                self.cluster.pause(broker, stopped=False)

    async def _kill_or_restart(self, broker: str, kill: bool) -> None:
        if kill:
            self.kills[broker] = time.monotonic()
            self.cluster.kill(broker)
            log.warning("killed %s (kill -9)", broker)
        else:
            self._restarted_at[broker] = time.monotonic()
            self.cluster.spawn_one(broker)
            serving = await self.cluster.wait_ready(
                self.options.start_timeout, [broker], state="serving"
            )
            self.restarts[broker] = serving
            log.warning("restarted %s; serving after %.2f s", broker, serving)

    async def _compare_table(self, broker: str) -> dict[str, int]:
        """``broker``'s routing table against its neighbours' view of it, read through the
        control RPC at once: each live neighbour names the entries it would resync to
        ``broker`` (``resync_view``). Counts entries it lacks, entries no neighbour
        accounts for, and entries with another last hop."""
        neighbours = [n.id for n in self.scot.brokers[broker].neighbours]
        table, views = await asyncio.gather(
            self.cluster.ask([broker], "table", 5.0),
            self.cluster.ask(neighbours, "resync_view", 5.0, broker),
        )
        own = {k: e for k, e in (table[broker] or {}).items() if e["host"] != broker}
        view = {sub_id: n for n, ids in views.items() for sub_id in ids or ()}
        return {
            "entries": len(own),
            "missing": len(view.keys() - own.keys()),
            "extra": len(own.keys() - view.keys()),
            "changed": sum(own[k]["last_hop"] != hop for k, hop in view.items() if k in own),
        }

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

    async def _settle(self, timeout: float = 300.0) -> float:
        """Every broker stores every subscription of the run, queues are empty, counters
        still. Brokers the run started hold nothing else, so their table sizes tell; on an
        attached overlay, whose other subscriptions may come and go meanwhile (a client of
        an earlier run still being dropped, say), each broker's subscription ids do. With
        covering (DESIGN §12) a broker holds only what was not covered on the way to it:
        then every table holds at least its hosts' own and no table changes any more."""
        started = time.monotonic()
        total = len(self.workload.subscriptions)
        self._phase(f"settling: until every broker holds the {total} subscriptions")
        want = {b: s["routing_table_size"] + total for b, s in self.baseline.items()}
        ours = set(self.ledger.subscription_keys)
        previous = None
        sizes_before: dict[str, int] = {}
        while time.monotonic() - started < timeout:
            stats = await self.cluster.call_all("stats")
            sizes = {b: s["routing_table_size"] for b, s in stats.items()}
            if self.options.settings.routing.covering == "active" or any(
                "covering.quenched" in s["core"] for s in stats.values()
            ):
                baseline = sum(s["routing_table_size"] for s in self.baseline.values())
                stored = sizes == sizes_before and sum(sizes.values()) >= baseline + total
            elif self.options.attach:
                held = await self.cluster.call_all("subscriptions")
                stored = all(ours <= held[b].keys() for b in held)
            else:
                stored = sizes == want
            busy = sum(sum(s["queue_lengths"].values()) for s in stats.values())
            sent = sum(s["core"].get("sent.subscribe", 0) for s in stats.values())
            if stored and not busy and sent == previous:
                return time.monotonic() - started
            previous, sizes_before = sent, sizes
            await asyncio.sleep(0.2)
        raise ClusterError(f"subscription broadcast did not settle within {timeout:.0f} s")

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

    async def _drain(self) -> float:
        """Wait for every expected delivery, then a quiet period to catch duplicates."""
        started = time.monotonic()
        expected = self.ledger.expected
        bar = self._bar(len(expected), "draining")
        last_progress, last_count = time.monotonic(), -1
        while True:
            received = sum(self.ledger.received.values())
            bar.n = min(received, len(expected))
            bar.refresh()
            if received != last_count:
                last_progress, last_count = time.monotonic(), received
            if expected <= self.ledger.received.keys():
                break
            silent = time.monotonic() - last_progress
            if silent > self.options.drain_timeout:
                log.warning(
                    "no delivery for %.0f s; %d expected deliveries missing",
                    self.options.drain_timeout,
                    len(expected - self.ledger.received.keys()),
                )
                break
            if silent > IDLE_DRAIN and not _carrying(await self._ask_live("stats")):
                log.warning(
                    "the overlay is idle, no delivery for %.0f s; %d expected deliveries missing",
                    silent,
                    len(expected - self.ledger.received.keys()),
                )
                break
            await asyncio.sleep(0.05 if silent <= IDLE_DRAIN else 0.5)
        await self._quiet()
        bar.close()
        return time.monotonic() - started

    async def _quiet(self, period: float = 0.5) -> None:
        """Until all broker queues are empty and no delivery arrived for ``period``."""
        while True:
            before = sum(self.ledger.received.values())
            await asyncio.sleep(period)
            busy = _carrying(await self._ask_live("stats"), custody=False)
            if not busy and sum(self.ledger.received.values()) == before:
                return

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

    def _balance_report(self) -> dict[str, Any]:
        """The balancer's report, with the notification delay of the deliveries made
        in the last quarter of the run (the balanced state, if it got there; the moves
        ordered in it are counted) and, if it moved anyone, of those made before its
        first move was ordered."""
        assert self.balancer is not None
        report = self.balancer.report()
        report["stopped_early"] = self.balancer_error
        ordered = [m["wall"] for m in report["decisions"] if not m["error"]]
        if self._arrivals:
            times = [t for t, _ in self._arrivals]
            start, end = min(times), max(times)
            tail = end - (end - start) / 4
            after = [d for t, d in self._arrivals if t >= tail]
            report["delay_after"] = delay_distribution(after)
            report["deliveries_after"] = len(after)
            report["moves_in_last_quarter"] = sum(w >= tail for w in ordered)
            if ordered:
                before = [d for t, d in self._arrivals if t < ordered[0]]
                report["delay_before"] = delay_distribution(before)
                report["deliveries_before"] = len(before)
        report["moves_made"] = self.client_stats.moves
        report["stale_move_orders_ignored"] = self.client_stats.stale_moves
        report["sdk_duplicates_absorbed"] = self.client_stats.duplicates_absorbed
        report["sdk_failovers"] = self.client_stats.failovers
        report["sdk_unclaimed_deliveries"] = self.client_stats.unclaimed
        report["sdk_repeats_forgotten_early"] = self.client_stats.repeats_forgotten_early
        return report

    def _series(self, width: float) -> list[dict[str, float]]:
        """Per ``width`` seconds since the first publication: notifications published,
        deliveries made (and their delay) and deliveries lost, the lost ones counted in
        the interval their notification was published in."""
        if not self._published_at:
            return []
        start = min(self._published_at.values())
        lost_at = [
            self._published_at[key[1:]]
            for key in self.ledger.expected - self.ledger.received.keys()
        ]
        return delivery_series(start, width, self._published_at.values(), self._arrivals, lost_at)

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

    def _failure_report(
        self, stats: dict[str, dict], core: Counter[str], counters: Counter[str]
    ) -> dict[str, Any]:
        """Failure counters of the brokers and the core (detours, custody, dedup), the
        detection time of each kill, and deliveries split by whether the subscriber's
        host was killed (DESIGN §7)."""
        report: dict[str, Any] = {
            k: counters[k]
            for k in (
                "links_down",
                "peer_restarts",
                "stale_frames",
                "clients_dropped",
                "resync_entries_sent",
                "predecessor_entries_withdrawn",
                "publications_held",
                "routed_while_resyncing",
                "sbp_handed_late",
                "held.released",
                "undeliverable.held_for_restarted",
                "undeliverable.hold_full",
            )
        }
        report.update(failure_counts(core))
        if not self.kills and not self.stalls:
            return report
        for broker, killed in self.kills.items():
            restarted = self._restarted_at.get(broker, float("inf"))
            seen = [
                d["at"] - killed
                for s in stats.values()
                for d in s["detections"]
                if d["link"] == broker and killed < d["at"] < restarted
            ]
            report[f"detection.{broker}"] = {
                "neighbours": len(seen),
                "first_s": min(seen, default=float("nan")),
                "last_s": max(seen, default=float("nan")),
            }
        for broker, (stopped, resumed) in self.stalls.items():
            report[f"stall.{broker}"] = {
                "seconds": resumed - stopped,
                "declared_down_by": sum(
                    d["link"] == broker and stopped < d["at"]
                    for s in stats.values()
                    for d in s["detections"]
                ),
            }
        first = self._first_failure()
        planned = self.kills.keys() | self.stalls.keys()
        unplanned = [
            {"by": b, "link": d["link"], "at_s": round(d["at"] - first, 3)}
            for b, s in stats.items()
            for d in s["detections"]
            if d["link"] not in planned
        ]
        report["unplanned_downs"] = sorted(unplanned, key=lambda d: d["at_s"])[:20]
        clients = self.client_stats
        report["sdk_duplicates_absorbed"] = clients.duplicates_absorbed
        report["replays"] = {
            "requests": clients.replays,
            "replayed": clients.replayed,
            "repeats": clients.replay_repeats,
            "replayed_late": clients.replayed_late,
            "gaps": len(clients.replay_gaps),
            "gap_samples": clients.replay_gaps[:5],
        }
        report["failovers_from_live_brokers"] = {
            broker: outages
            for broker, outages in clients.outages.items()
            if broker not in self.kills and outages
        }
        for broker, ready in self.restarts.items():
            report[f"restart.{broker}"] = {"serving_after_s": ready, **self.tables[broker]}
        hosts = {s.subscriber: s.broker for s in self.workload.subscriptions}
        report.update(host_split(self.ledger, hosts, self.kills))
        report["host_alive_lost_samples"] = self._lost_samples(hosts)
        report["host_dead_lost_samples"] = self._lost_samples(hosts, dead=True)
        back = {}
        for broker in self.kills:
            outages = clients.outages.get(broker, ())
            if outages:
                last = outages[-1]
                back[broker] = last["started"] + last["seconds"]
                report[f"failover.{broker}.away_s"] = max(o["seconds"] for o in outages)
        published = self._published_at
        report["host_dead_after_back"] = self.ledger.summary(
            lambda key: hosts[key[0]] in back and published[key[1:]] > back[hosts[key[0]]]
        )
        return report

    def _first_failure(self) -> float:
        """time.monotonic() of the first kill or stall."""
        return min([*self.kills.values(), *(stopped for stopped, _ in self.stalls.values())])

    def _lost_samples(
        self, hosts: dict[str, str], limit: int = 10, *, dead: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` deliveries lost to subscribers whose host never died (``dead``:
        whose host was killed): who, from which publisher's host, and when it was
        published after the first kill or stall."""
        first = time.time() - (time.monotonic() - self._first_failure())
        publisher_host = {p.publisher: p.broker for p in self.workload.publications}
        published = self._published_at
        received = self.ledger.received
        lost = sorted(
            key
            for key in self.ledger.expected
            if key not in received and (hosts[key[0]] in self.kills) == dead
        )
        return [
            {
                "subscriber": f"{subscriber}@{hosts[subscriber]}",
                "publication": f"{publisher}#{seq}@{publisher_host[publisher]}",
                "published_after_failure_s": round(published[(publisher, seq)] - first, 3),
            }
            for subscriber, publisher, seq in lost[:limit]
        ]

    def _report(self, stats: dict[str, dict], subscriptions: dict[str, dict]) -> dict[str, Any]:
        copies = queued = longest = 0
        core: Counter[str] = Counter()
        counters: Counter[str] = Counter()
        match_seconds = 0.0
        for broker, s in stats.items():
            before = self.baseline.get(broker)
            if before is not None and before["incarnation"] == s["incarnation"]:
                core.subtract(before["core"])
                counters.subtract(before["counters"])
                match_seconds -= before["matching"]["seconds"]
                copies -= before["queue_seen"]["copies"]
                queued -= before["queue_seen"]["total"]
            copies += s["queue_seen"]["copies"]
            queued += s["queue_seen"]["total"]
            longest = max(longest, s["queue_seen"]["max"])
            core.update(s["core"])
            counters.update(s["counters"])
            match_seconds += s["matching"]["seconds"]
        core, counters = +core, +counters  # what the run counted (zeros dropped)
        ours = self.ledger.subscription_keys
        delay: dict[str, float] = {}
        depth: dict[str, int] = {}
        for per_broker in subscriptions.values():
            for sub_id, (seconds, hops) in per_broker.items():
                if sub_id in ours:
                    delay[sub_id] = max(delay.get(sub_id, 0.0), seconds)
                    depth[sub_id] = max(depth.get(sub_id, 0), hops)
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
                "mean_per_operation": match_seconds / core["matching"] if core["matching"] else 0.0,
                "total_seconds": match_seconds,
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
            "failures": self._failure_report(stats, core, counters),
            "target_queue_length": {"mean": queued / copies if copies else 0.0, "max": longest},
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
            report["balance"] = self._balance_report()
        if self.options.sample_every:
            report["timeline"] = self.timeline
            report["series"] = self._series(self.options.sample_every)
            delays = self.ledger.delays
            report["max_delay_per_1000"] = [
                max(delays[i : i + 1000]) for i in range(0, len(delays), 1000)
            ]
        return report


def _carrying(stats: dict[str, dict[str, Any]], *, custody: bool = True) -> int:
    """Messages the brokers of ``stats`` still carry toward someone: queued on links or
    for clients, and (``custody``) unacknowledged or held for a neighbour or a client."""
    total = 0
    for s in stats.values():
        total += sum(s["queue_lengths"].values()) + s["client_backlog"] + s["deliveries_waiting"]
        if custody:
            total += sum(s["held"].values())
            total += sum(link["unacknowledged"] for link in s["custody"].values())
    return total
