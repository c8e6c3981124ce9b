"""One fault scenario on broker processes in network namespaces, run from the client host
(``bench.faults`` starts it there): a pipelined publisher, subscribers of every kind, one
fault injected and healed mid-stream, and the checker's count per subscriber.

    ip netns exec CLIENT python -m bench.fault_run SPEC.json

The spec (:class:`bench.faults.Overlay` writes it) names the overlay (topology, keys,
each host's run directory and namespace), the proxy on one link, the scenario and the
workload. Subscribers, all to every quote:

- ``live@d:0`` and ``live@f:2``: on brokers no fault touches;
- ``failover@a:1``: on the broker the faults hit (the far end of the proxied link, on
  host h1): it fails over when its broker or host goes, and replays what it missed;
- ``durable@c:2``: a durable subscription whose client leaves when the fault starts and
  comes back at ``c:0`` once it is healed (what it missed first, then live);
- ``historic@b:2``: after the run, every quote of the run's window from the stores.

Expected per subscriber: every publication the publisher's broker confirmed (a refused
one is not expected, and not delivered either). Printed as one JSON object on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import signal
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.toxic import tell
from octopis.accounting import DeliveryLedger
from octopis.client import Publisher, Subscriber
from octopis.client.deliveries import Received
from octopis.cluster.launcher import LocalCluster
from octopis.defaults import CLOCK_SKEW
from octopis.filters.language import parse_publication, parse_subscription
from octopis.topology import load_topology

QUOTES = "[class,eq,'STOCK']"
COVERED = "[class,eq,'STOCK'],[i,>=,0]"
"""Covered by :data:`QUOTES` (covering on: it stops where a covering one went)."""
PUBLISHER_AT = "a:0"
TARGET = "a:1"
"""The broker the faults hit (h1), the far end of the link through the proxy."""
PLACES = {"live@d:0": QUOTES, "live@f:2": COVERED, "failover@a:1": QUOTES}
DURABLE_AT, DURABLE_BACK, HISTORIC_AT = "c:2", "c:0", "b:2"
OCTOPIS = [sys.executable, "-m", "octopis.cli.main"]
PROXY_TOXICS = {"delay": "delay 0.5", "stall": "stall", "reset": "cut"}
"""The proxy's command for each link fault (:mod:`bench.toxic`)."""


class Faults:
    """Inject and heal each kind of fault (the spec's namespaces, pids, proxy, disk)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.ballast = Path(spec["disk"]) / "ballast"

    def _pid(self, broker: str) -> int:
        host = self.spec["host_of"][broker]
        state = json.loads((Path(self.spec["run_dirs"][host]) / "cluster.json").read_text())
        return int(state["pids"][broker])

    async def _command(self, *argv: str) -> None:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(process.communicate(), 120)
        if process.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed: {out.decode()[-2000:]}")

    async def turn(self, kind: str, on: bool) -> None:
        """Start (``on``) or end fault ``kind``."""
        s = self.spec
        host = s["host_of"][TARGET]
        if kind == "crash" and on:
            os.kill(self._pid(TARGET), signal.SIGKILL)
        elif kind == "crash":
            restart = ["restart", TARGET, "--run-dir", s["run_dirs"][host], "--timeout", "60"]
            await self._command("ip", "netns", "exec", s["namespaces"][host], *OCTOPIS, *restart)
        elif kind == "pause":
            os.kill(self._pid(TARGET), signal.SIGSTOP if on else signal.SIGCONT)
        elif kind == "cut":
            link = ["link", "set", s["cut_port"], "down" if on else "up"]
            await self._command("ip", "-n", s["switch"], *link)
        elif kind == "one-way":
            route = ["route", "add" if on else "del", "blackhole", s["cut_address"]]
            await self._command("ip", "-n", s["publisher_ns"], *route)
        elif kind in PROXY_TOXICS:
            await tell(s["proxy_control"], PROXY_TOXICS[kind] if on else "pass")
        elif kind == "disk" and on:
            _truncate_logs(self.ballast.parent)
            _fill(self.ballast)
        elif kind == "disk":
            self.ballast.unlink()
        else:
            raise ValueError(f"no fault {kind!r}")


def _truncate_logs(data: Path) -> None:
    """Checkpoint every store's write-ahead log in ``data`` into its database and truncate
    it: the next commits need new blocks (a log that grew earlier would otherwise take
    them in the room it already has, and a full disk would not be felt for a while)."""
    for path in data.glob("*.retention.sqlite"):
        db = sqlite3.connect(path, timeout=5)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()


def _fill(path: Path) -> None:
    """Write ``path`` until its file system is full (down to the last 512 bytes)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (65536, 4096, 512):
            with contextlib.suppress(OSError):
                while os.write(fd, bytes(size)):
                    pass
    finally:
        os.close(fd)


class Checker:
    """Deliveries per subscriber against the ledger of confirmed publications."""

    def __init__(self) -> None:
        self.ledger = DeliveryLedger()
        self.first_seq = 0
        """Publications before this sequence number are warm-ups: not counted (0: still
        warming up)."""
        self.feed = ""
        """The scenario's publisher (earlier scenarios' publishers are others)."""
        self.warm: set[str] = set()
        """Subscribers that had a warm-up quote."""
        self.gaps: Counter[str] = Counter()
        self.filled: Counter[str] = Counter()
        self.subscribed_at: dict[str, float] = {}
        self.early: Counter[str] = Counter()
        """Replayed publications of an earlier scenario published less than
        :data:`CLOCK_SKEW` before the subscription: a fail-over replay's documented margin
        (docs/replay.md), counted apart; any older one counts as unexpected."""

    def subscribed(self, name: str, spec: str) -> None:
        """``name`` expects every confirmed publication ``spec`` matches (call it just
        before subscribing)."""
        self.subscribed_at[name] = time.time()
        self.ledger.subscribed(name, name, parse_subscription(spec))

    def received(self, name: str, n: Received) -> None:
        """``name`` was delivered ``n``."""
        if n.publisher == self.feed and (not self.first_seq or n.seq < self.first_seq):
            self.warm.add(name)
        elif self.ours(name, n):
            self.ledger.delivered(name, n.publisher, n.seq)

    def ours(self, name: str, n: Received) -> bool:
        """Whether ``name``'s delivery ``n`` counts: all but an earlier scenario's that
        came in the replay's clock-skew margin (:attr:`early`)."""
        before = self.subscribed_at[name] - n.published_at
        if n.publisher != self.feed and n.replayed and 0 < before <= CLOCK_SKEW:
            self.early[name] += 1
            return False
        return True

    def got(self, name: str) -> set[int]:
        """The sequence numbers delivered to ``name``."""
        return {seq for (s, _, seq) in self.ledger.received if s == name}

    def row(self, name: str, label: str, sub: Subscriber) -> dict[str, Any]:
        """The table's row of subscriber ``name``."""
        counts = self.ledger.summary(lambda key: key[0] == name)
        return {
            "subscriber": label,
            **counts,
            "gaps_reported": self.gaps[name],
            "gaps_open": len(sub.gaps),
            "gaps_filled": self.filled[name],
            "failovers": len(sub.connection.outages),
            "unexpected_sample": self.unexpected(name)[:5],
            "early_within_skew": self.early[name],
        }

    def unexpected(self, name: str) -> list[tuple[str, int]]:
        """``name``'s deliveries no confirmed publication accounts for, as (publisher,
        seq), in order (the report names a few, so that a failure says what came)."""
        keys = set(self.ledger.received) - self.ledger.expected
        return sorted((p, seq) for (s, p, seq) in keys if s == name)


async def scenario(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the spec's scenario; its report."""
    topology, keys = Path(spec["topology"]), spec["keys"]
    scot = load_topology(topology)
    control = LocalCluster(scot, topology, spec["mode"], Path(spec["work"]), keys=Path(keys))
    faults = Faults(spec)
    kind, seconds = spec["kind"], spec["seconds"]
    check = Checker()
    tag = f"{spec['mode']}-{kind}-{time.time_ns() % 10**9}"
    report: dict[str, Any] = {"mode": spec["mode"], "kind": kind, "seconds": seconds}

    async def connect(broker: str, name: str, **options: Any) -> Any:
        client = Subscriber if name != "feed" else Publisher
        return await client.connect(
            broker, f"{name}-{tag}", topology=topology, keys=keys, **options
        )

    def hooks(name: str) -> dict[str, Any]:
        return {
            "on_notification": lambda n: check.received(name, n),
            "on_gap": lambda gap: check.gaps.update([name]),
            "on_gap_filled": lambda gap, left: check.filled.update([name]),
        }

    try:
        report["ready_before_s"] = round(await control.wait_ready(90), 2)
        before = await control.call_all("stats")
        subs = {name: await connect(name.split("@")[1], name, **hooks(name)) for name in PLACES}
        for name, sub in subs.items():
            check.subscribed(name, PLACES[name])
            await sub.subscribe(PLACES[name])
        durable_name = f"durable-{tag}"
        durable = await connect(DURABLE_AT, "durable")
        check.subscribed("durable", QUOTES)
        stream = await durable.subscribe(QUOTES, durable=durable_name)
        pub = await connect(PUBLISHER_AT, "feed")
        check.feed = pub.name
        report["warm_up"] = await _warm_up(pub, check, list(subs))
        check.first_seq = pub.seq + 1
        durable_got: Counter[int] = Counter()

        async def drain(source: Any) -> None:
            async for n in source:
                if n.publisher != check.feed:  # from before its record began: unexpected
                    check.ledger.delivered("durable", n.publisher, n.seq)
                elif n.seq >= check.first_seq:
                    durable_got[n.seq] += 1

        draining = asyncio.ensure_future(drain(stream))
        heal_ready: asyncio.Future[float] | None = None

        async def heal() -> float:
            started = time.monotonic()
            report["load"] = round(os.getloadavg()[0], 1)
            await faults.turn(kind, on=False)
            report["heal_command_s"] = round(time.monotonic() - started, 2)
            await control.wait_ready(120)
            return time.monotonic() - started

        start = time.time()
        count, rate = spec["count"], spec["rate"]
        sent: list[int] = []
        t0 = time.monotonic()
        for i in range(count):
            now = time.monotonic() - t0
            if now >= spec["fault_at"] and not report.get("injected"):
                report["injected"] = True
                await faults.turn(kind, on=True)
                draining.cancel()
                await durable.close()
            if now >= spec["fault_at"] + seconds and heal_ready is None:
                heal_ready = asyncio.ensure_future(heal())
            sent.append(await pub.publish({"class": "STOCK", "i": i}, wait=False, timeout=60))
            await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
        if heal_ready is None:
            heal_ready = asyncio.ensure_future(heal())
        try:
            await pub.flush(90)
            report["unconfirmed"] = 0
        except TimeoutError:
            report["unconfirmed"] = len(pub._unacknowledged)
        refused = set(pub.refused_seqs)
        confirmed = [s for s in sent if s not in refused]
        report.update(sent=len(sent), confirmed=len(confirmed), refused=len(refused))
        report["refusals"] = list(
            dict.fromkeys(re.sub(r"\d+(\.\d+)?", "N", r) for r in pub.refused)
        )
        for seq in confirmed:
            check.ledger.published(pub.name, seq, parse_publication(f"[class,'STOCK'],[i,{seq}]"))
        report["heal_s"] = round(await heal_ready, 2)
        healed = time.monotonic()
        durable = await connect(DURABLE_BACK, "durable")
        stream = await durable.subscribe(QUOTES, durable=durable_name)
        draining = asyncio.ensure_future(drain(stream))
        want = set(confirmed)

        def caught_up() -> bool:
            return all(want <= check.got(n) for n in subs) and want <= set(durable_got)

        report["caught_up_s"] = await _wait(caught_up, 45)
        report["caught_up_after_ready_s"] = round(time.monotonic() - healed, 2)
        for seq, n in durable_got.items():
            for _ in range(n):
                check.ledger.delivered("durable", pub.name, seq)
        historian = await connect(HISTORIC_AT, "historic")
        past = await historian.subscribe(QUOTES, since=start - 0.5, until=time.time())
        check.subscribed("historic", QUOTES)
        for seq in confirmed:  # subscribed after the fact, it expects what the others did
            check.ledger.expected.add(("historic", pub.name, seq))
        async for n in past:  # the window may hold an earlier scenario's last ones
            if n.publisher == check.feed and n.seq >= check.first_seq:
                check.ledger.delivered("historic", pub.name, n.seq)
        await stream.unsubscribe()
        draining.cancel()
        rows = [check.row(name, name, sub) for name, sub in subs.items()]
        rows.append(check.row("durable", f"durable@{DURABLE_AT}→{DURABLE_BACK}", durable))
        row = check.row("historic", f"historic@{HISTORIC_AT}", historian)
        row["history_complete"] = past.history.complete
        row["gaps_open"] += 0 if past.history.complete else 1
        report["subscribers"] = [*rows, row]
        delivered = refused & set().union(*map(check.got, subs))
        report["refused_delivered"] = len(delivered)
        why = zip(pub.refused_seqs, pub.refused, strict=True)
        routed = {seq for seq, reason in why if "delivered" in reason}
        report["refused_delivered_unsaid"] = len(delivered - routed)
        report.update(_counted(before, await control.call_all("stats")))
        for client in (historian, durable, pub, *subs.values()):
            await client.close()
    finally:
        await control.close_control()
    return report


def _counted(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Links declared down and neighbours seen restarted, summed over the brokers, between
    two ``stats`` answers (a restarted broker's own counters start again at zero); and
    the most times one broker declared one link down (``link_down_most``: 1 when no link
    flapped), from the detections each broker lists."""
    counts = dict.fromkeys(("links_down", "peer_restarts"), 0)
    per_link: Counter[tuple[str, str]] = Counter()
    for broker, s in after.items():
        same = before[broker]["incarnation"] == s["incarnation"]
        for key in counts:
            counts[key] += s["counters"].get(key, 0)
            counts[key] -= before[broker]["counters"].get(key, 0) if same else 0
        earlier = before[broker]["detections"] if same else []
        last = max((d["at"] for d in earlier), default=-math.inf)
        per_link.update((broker, d["link"]) for d in s["detections"] if d["at"] > last)
    counts["link_down_most"] = max(per_link.values(), default=0)
    return counts


async def _warm_up(pub: Publisher, check: Checker, names: list[str]) -> int:
    """Publish a warm-up quote every 0.2 s until each of ``names`` had one (the
    subscriptions have spread); how many it took."""
    sent = 0
    deadline = time.monotonic() + 60
    while not check.warm >= set(names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"warm-up quotes reached only {sorted(check.warm)} in 60 s")
        await pub.publish({"class": "STOCK", "i": 0}, timeout=30)
        sent += 1
        await asyncio.sleep(0.2)
    return sent


async def _wait(condition: Any, timeout: float) -> float | None:
    """Seconds until ``condition()`` holds, or None after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            return None
        await asyncio.sleep(0.1)
    return round(time.monotonic() - started, 2)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps(asyncio.run(scenario(spec))))


if __name__ == "__main__":
    main()
