"""The failures ``octopis run`` injects into broker processes (DESIGN §7): kills and
restarts, stalls (SIGSTOP, then SIGCONT), at their scheduled times; how a restarted
broker's resynced table compares with its neighbours' view; and what the failures did
to the deliveries, for the run's report."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from octopis.accounting import DeliveryLedger, failure_counts, host_split
from octopis.cluster.harness import ShareStats
from octopis.cluster.launcher import LocalCluster
from octopis.failure_schedule import Failure
from octopis.topology import Scot
from octopis.workload import Workload

log = logging.getLogger("octopis.run")


@dataclass(frozen=True)
class RunRecord:
    """What a run recorded that the failure report reads: the ``workload`` run, its
    ``ledger``, when each publication was sent (``published_at``, wall time) and what the
    clients' connections saw."""

    workload: Workload
    ledger: DeliveryLedger
    published_at: dict[tuple[str, int], float]
    client_stats: ShareStats


class RunFailures:
    """The ``failures`` of one run on ``cluster`` (a topology ``scot``), times scaled by
    ``time_scale``; a restarted broker must serve again within ``start_timeout``
    seconds."""

    def __init__(
        self,
        cluster: LocalCluster,
        scot: Scot,
        failures: list[Failure],
        *,
        time_scale: float,
        start_timeout: float,
    ) -> None:
        self.cluster = cluster
        self.scot = scot
        self.failures = failures
        self.time_scale = time_scale
        self.start_timeout = start_timeout
        self.kills: dict[str, float] = {}
        """Killed broker → time.monotonic() of its kill (the brokers' loop clock)."""
        self.restarts: dict[str, float] = {}
        """Restarted broker → seconds from its start until it was ready again."""
        self._restarted_at: dict[str, float] = {}
        """Restarted broker → time.monotonic() of its restart."""
        self.stalls: dict[str, tuple[float, float]] = {}
        """Stalled broker → time.monotonic() of its SIGSTOP and of its SIGCONT."""
        self.tables: dict[str, dict] = {}
        """Restarted broker → how its resynced table differs from its neighbours' view
        (entries it hosted itself left out)."""

    async def inject(self, t0: float) -> None:
        """Kill and restart, or stop and resume, brokers at their times (DESIGN §7); a
        broker still stopped when this ends (cancelled) is resumed."""
        loop = asyncio.get_running_loop()
        scale = self.time_scale
        failures = self.failures
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
            serving = await self.cluster.wait_ready(self.start_timeout, [broker], state="serving")
            self.restarts[broker] = serving
            log.warning("restarted %s; serving after %.2f s", broker, serving)

    async def compare_tables(self) -> None:
        """Each restarted broker's table against its neighbours' view of it
        (:attr:`tables`)."""
        for broker in self.restarts:
            self.tables[broker] = await self._compare_table(broker)

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

    def report(
        self,
        stats: dict[str, dict],
        core: Counter[str],
        counters: Counter[str],
        run: RunRecord,
    ) -> dict[str, Any]:
        """Failure counters of the brokers (``stats``, ``counters``) and the core
        (``core``: detours, custody, dedup), the detection time of each kill, and the
        ``run``'s deliveries split by whether the subscriber's host was killed (DESIGN §7)."""
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
        clients = run.client_stats
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
        hosts = {s.subscriber: s.broker for s in run.workload.subscriptions}
        report.update(host_split(run.ledger, hosts, self.kills))
        report["host_alive_lost_samples"] = self._lost_samples(run, hosts)
        report["host_dead_lost_samples"] = self._lost_samples(run, hosts, dead=True)
        back = {}
        for broker in self.kills:
            outages = clients.outages.get(broker, ())
            if outages:
                last = outages[-1]
                back[broker] = last["started"] + last["seconds"]
                report[f"failover.{broker}.away_s"] = max(o["seconds"] for o in outages)
        published = run.published_at
        report["host_dead_after_back"] = run.ledger.summary(
            lambda key: hosts[key[0]] in back and published[key[1:]] > back[hosts[key[0]]]
        )
        return report

    def _first_failure(self) -> float:
        """time.monotonic() of the first kill or stall."""
        return min([*self.kills.values(), *(stopped for stopped, _ in self.stalls.values())])

    def _lost_samples(
        self, run: RunRecord, hosts: dict[str, str], limit: int = 10, *, dead: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` deliveries lost to subscribers whose host never died (``dead``:
        whose host was killed): who, from which publisher's host, and when it was
        published after the first kill or stall."""
        first = time.time() - (time.monotonic() - self._first_failure())
        publisher_host = {p.publisher: p.broker for p in run.workload.publications}
        published = run.published_at
        received = run.ledger.received
        lost = sorted(
            key
            for key in run.ledger.expected
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
