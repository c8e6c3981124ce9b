"""One subscriber that never reads, a publisher that sends as fast as it is let
(issue 15, DESIGN §8), on real broker processes:

    python -m bench.slow_consumer [--notifications 1000000] [--out bench/results]

fig2 (18 brokers, DNR, keys off, default settings) carries ``--notifications`` quotes from
one publisher on a:0, sent as fast as its publish credit allows, to ten readers (each on
its own broker, each taking one symbol in twenty) and, in the first run, to one more
subscriber on f:1 that takes every quote and never reads. The second run is the same
without it: the baseline for the readers' delays. Each run reports the publisher's rate,
the readers' expected / delivered / duplicated / lost and delay percentiles, the largest
RSS of every broker and of the never-reading subscriber's own process (sampled every
second), and how the broker's slow-subscriber policy ended that subscriber. Writes
``slow-consumer.json`` and ``slow-consumer.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from octopis.accounting import distribution
from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster, prepare_topology
from octopis.settings import BrokerSettings

SYMBOLS = 20
READERS = ("a:1", "b:0", "b:2", "c:0", "c:2", "d:1", "e:0", "e:2", "f:0", "f:2")
PUBLISHER_HOST, SLOW_HOST = "a:0", "f:1"

NEVER_READS = textwrap.dedent(
    """
    import asyncio, json, sys
    from octopis.client import DroppedError, Subscriber

    async def main(endpoint):
        sub = await Subscriber.connect(endpoint, "never-reads")
        stream = await sub.subscribe("[class,eq,'STOCK']")
        print("subscribed", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        got, ended = 0, "still connected"
        try:
            while True:
                await stream.get(timeout=2)
                got += 1
        except DroppedError as exc:
            ended = f"dropped: {exc}"
        except TimeoutError:
            pass
        print(json.dumps({"received": got, "ended": ended}), flush=True)
        await sub.close()

    asyncio.run(main(sys.argv[1]))
    """
)


async def _sample_rss(
    cluster: LocalCluster, pids: dict[str, int], peak: dict[str, int], stop: asyncio.Event
) -> None:
    """Every second: each broker's RSS (its stats) and each process in ``pids``."""
    while not stop.is_set():
        stats = await cluster.call_all("stats")
        for broker, s in stats.items():
            peak[broker] = max(peak.get(broker, 0), s["memory_rss"])
        for name, pid in pids.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                peak[name] = max(peak.get(name, 0), psutil.Process(pid).memory_info().rss)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def _until_stored(cluster: LocalCluster, subscriptions: int, timeout: float = 60) -> None:
    """Wait until every broker holds all ``subscriptions`` (SBP gives each one to all)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = await cluster.call_all("stats")
        if all(s["routing_table_size"] == subscriptions for s in stats.values()):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the {subscriptions} subscriptions did not reach every broker")


async def _scenario(cluster: LocalCluster, notifications: int, slow: bool) -> dict[str, Any]:
    scot = cluster.scot
    await cluster.wait_ready(120)
    got: dict[str, Counter[int]] = {}
    delays: list[float] = []
    readers = []
    for i, broker in enumerate(READERS):
        name = f"R{i}"
        got[name] = Counter()

        def take(n: Any, name: str = name) -> None:
            got[name][n.seq] += 1
            delays.append(n.received_at - n.published_at)

        reader = await Subscriber.connect(
            scot.brokers[broker].client_endpoint, name, on_notification=take
        )
        await reader.subscribe(f"[class,eq,'STOCK'],[symbol,eq,'S{i}']")
        readers.append(reader)
    child = None
    if slow:
        child = subprocess.Popen(
            [sys.executable, "-c", NEVER_READS, scot.brokers[SLOW_HOST].client_endpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "subscribed"
    await _until_stored(cluster, len(READERS) + (child is not None))
    peak: dict[str, int] = {}
    pids = {"harness": psutil.Process().pid} | ({"never_reads": child.pid} if child else {})
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_rss(cluster, pids, peak, stop))
    pub = await Publisher.connect(scot.brokers[PUBLISHER_HOST].client_endpoint, "feed")
    started = time.monotonic()
    for i in range(notifications):
        quote = {"class": "STOCK", "symbol": f"S{i % SYMBOLS}", "close": float(i)}
        await pub.publish(quote, wait=False)
    await pub.flush(600)
    publish_seconds = time.monotonic() - started
    expected = {
        f"R{r}": {i + 1 for i in range(notifications) if i % SYMBOLS == r}
        for r in range(len(READERS))
    }
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(
        len(got[name]) < len(seqs) for name, seqs in expected.items()
    ):
        await asyncio.sleep(0.5)
    stats = await cluster.call_all("stats")
    stop.set()
    await sampler
    ended = None
    if child is not None:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("read\n")
        child.stdin.flush()
        ended = json.loads(child.stdout.readline())
        child.wait(30)
    await pub.close()
    for reader in readers:
        await reader.close()
    await cluster.close_control()
    counts = Counter()
    for name, seqs in expected.items():
        counts["expected"] += len(seqs)
        counts["delivered"] += len(got[name].keys() & seqs)
        counts["duplicated"] += sum(n - 1 for n in got[name].values() if n > 1)
        counts["lost"] += len(seqs - got[name].keys())
    slow_stats = stats[SLOW_HOST]["counters"]
    return {
        "notifications": notifications,
        "publisher_rate_per_s": notifications / publish_seconds,
        "readers": dict(counts),
        "reader_delay_s": distribution(delays),
        "rss_mb": {k: round(v / 2**20, 1) for k, v in sorted(peak.items())},
        "broker_budget_mb": BrokerSettings().memory.budget_mb,
        "never_reads": ended,
        "slow_host_counters": {
            k: v for k, v in slow_stats.items() if k.startswith(("clients_", "slow", "undeliv"))
        },
    }


def run(notifications: int, slow: bool) -> dict[str, Any]:
    """One run on a fresh fig2 cluster (stopped on the way out)."""
    with tempfile.TemporaryDirectory(prefix="octopis-slow-") as tmp:
        run_dir = Path(tmp)
        scot, path = prepare_topology(run_dir, preset="fig2")
        cluster = LocalCluster(scot, path, "dnr", run_dir, BrokerSettings(), secure=False)
        cluster.spawn()
        try:
            return asyncio.run(_scenario(cluster, notifications, slow))
        finally:
            cluster.stop()


def table(with_slow: dict[str, Any], baseline: dict[str, Any]) -> str:
    """The two runs side by side (markdown)."""

    def brokers(report: dict[str, Any]) -> str:
        rss = [v for k, v in report["rss_mb"].items() if ":" in k]
        return f"{max(rss):.0f} MB (median {sorted(rss)[len(rss) // 2]:.0f})"

    rows = [
        ("publisher rate", *(f"{r['publisher_rate_per_s']:,.0f}/s" for r in (with_slow, baseline))),
        (
            "readers: expected / delivered / duplicated / lost",
            *(
                "{expected:,} / {delivered:,} / {duplicated} / {lost}".format(**r["readers"])
                for r in (with_slow, baseline)
            ),
        ),
        *(
            (
                f"readers' delay {q}",
                *(f"{r['reader_delay_s'][q] * 1000:.1f} ms" for r in (with_slow, baseline)),
            )
            for q in ("p50", "p99", "max")
        ),
        ("largest broker RSS", brokers(with_slow), brokers(baseline)),
        (
            "harness (publisher + readers) RSS",
            *(f"{r['rss_mb']['harness']:.0f} MB" for r in (with_slow, baseline)),
        ),
        (
            "never-reading subscriber's process RSS",
            f"{with_slow['rss_mb'].get('never_reads', 0):.0f} MB",
            "—",
        ),
        ("never-reading subscriber", str(with_slow["never_reads"]), "—"),
    ]
    head = [
        f"# Slow consumer: {with_slow['notifications']:,} notifications, "
        "one subscriber never reads",
        "",
        "`python -m bench.slow_consumer` (fig2, DNR, keys off, default settings: "
        f"broker memory budget {with_slow['broker_budget_mb']} MB, slow policy "
        f"`{BrokerSettings().clients.slow_policy}`).",
        "",
        "| | with the never-reading subscriber | without (baseline) |",
        "|---|---|---|",
    ]
    return "\n".join(head + [f"| {a} | {b} | {c} |" for a, b, c in rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.slow_consumer", description=__doc__)
    p.add_argument("--notifications", type=int, default=1_000_000, help="quotes to publish")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="where to write")
    args = p.parse_args(argv)
    if args.notifications < SYMBOLS:
        p.error(f"--notifications must be at least {SYMBOLS}")
    with_slow = run(args.notifications, slow=True)
    baseline = run(args.notifications, slow=False)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"with_never_reading_subscriber": with_slow, "baseline": baseline}
    (args.out / "slow-consumer.json").write_text(json.dumps(report, indent=1))
    (args.out / "slow-consumer.md").write_text(table(with_slow, baseline))
    print(table(with_slow, baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
