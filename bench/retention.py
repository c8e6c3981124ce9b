"""What retention costs (DESIGN §11), side by side with it off, on real broker processes:

    python -m bench.retention [--count 20000] [--rounds 3] [--out bench/results/retention.json]

The line a:0 – b:0 – c:0 (SNR, keys off, default settings): one publisher on a:0 sends
``count`` quotes pipelined (``wait=False``, then ``flush``), one subscriber on c:0 takes
every one. Each round starts the line afresh, once with retention on (``[retention]``
defaults: a:0 keeps every publication in ``<run-dir>/data``) and once off
(``max_age = 0``), in alternating order. Per round: the CPU seconds per notification of
a:0 (the publisher's edge broker: it writes the store) and of b:0 (a transit hop: it
stores nothing), the publisher's rate, the store's rows, its body bytes and its bytes on
disk (database and WAL files) per notification, and the subscriber's expected,
delivered, duplicated and lost. The figures of merit are the median ratios, on / off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import networkx as nx
import psutil

from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster, find_free_base_port
from octopis.settings import BrokerSettings
from octopis.topology import build_scot, complete_factor

REPO = Path(__file__).resolve().parents[1]
EDGE, TRANSIT, READER = "a:0", "b:0", "c:0"


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def _series(cluster: LocalCluster, count: int) -> dict[str, Any]:
    scot = cluster.scot
    got: Counter[int] = Counter()
    await cluster.wait_ready(60)
    sub = await Subscriber.connect(
        scot.brokers[READER].client_endpoint,
        "reader",
        on_notification=lambda n: got.update([n.seq]),
    )
    await sub.subscribe("[class,eq,'STOCK']")
    pub = await Publisher.connect(scot.brokers[EDGE].client_endpoint, "feed")
    while not got:  # the subscription has reached a:0
        await pub.publish({"class": "STOCK", "symbol": "WARM", "close": 0.0})
        await asyncio.sleep(0.05)
    warm = len(got)
    procs = {b: psutil.Process(cluster.processes[b].pid) for b in (EDGE, TRANSIT)}
    before = {b: _cpu(p) for b, p in procs.items()}
    started = time.perf_counter()
    for i in range(count):
        quote = {"class": "STOCK", "symbol": f"S{i % 50}", "close": 10.0 + i % 97, "volume": i}
        await pub.publish(quote, wait=False)
    await pub.flush(120)
    rate = count / (time.perf_counter() - started)
    deadline = time.monotonic() + 60
    while len(got) < warm + count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # a late copy would show as a duplicate
    cpu = {b: (_cpu(p) - before[b]) / count for b, p in procs.items()}
    stats = (await cluster.ask([EDGE], "stats", 10))[EDGE]["retention"]
    await pub.close()
    await sub.close()
    expected = warm + count
    return {
        "edge_cpu_us": cpu[EDGE] * 1e6,
        "transit_cpu_us": cpu[TRANSIT] * 1e6,
        "publish_per_second": rate,
        "retention": stats,
        "expected": expected,
        "delivered": len(got),
        "duplicates": sum(n - 1 for n in got.values()),
        "lost": expected - len(got),
    }


def _round(count: int, retention: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="octopis-retention-") as tmp:
        run_dir = Path(tmp)
        line = nx.path_graph(["a", "b", "c"])
        scot = build_scot(line, complete_factor(1), name="line", base_port=find_free_base_port(3))
        path = run_dir / "line.json"
        path.write_text(json.dumps(scot.to_json()))
        settings = BrokerSettings()
        if not retention:
            settings = settings.changed({"retention": {"max_age": 0.0}})
        cluster = LocalCluster(scot, path, "snr", run_dir, settings, secure=False)
        cluster.spawn()
        try:

            async def scenario() -> dict[str, Any]:
                try:
                    return await _series(cluster, count)
                finally:
                    await cluster.close_control()

            result = asyncio.run(scenario())
        finally:
            cluster.stop()
        files = list((run_dir / "data").glob(f"{EDGE}.retention.sqlite*"))
        result["disk_bytes"] = sum(f.stat().st_size for f in files)
        result["retention_on"] = retention
        return result


def run(count: int, rounds: int) -> dict[str, Any]:
    """``rounds`` pairs of runs, retention on and off in alternating order."""
    results = []
    for n in range(rounds):
        order = (True, False) if n % 2 == 0 else (False, True)
        pair = {("on" if on else "off"): _round(count, on) for on in order}
        results.append(pair)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    ratios = {
        key: statistics.median(r["on"][key] / r["off"][key] for r in results)
        for key in ("edge_cpu_us", "transit_cpu_us", "publish_per_second")
    }
    on = [r["on"] for r in results]
    return {
        "commit": commit,
        "count": count,
        "rounds": results,
        "ratios_on_over_off": ratios,
        "store_body_bytes_per_notification": statistics.median(
            r["retention"]["retention.bytes"] / r["retention"]["retention.rows"] for r in on
        ),
        "disk_bytes_per_notification": statistics.median(
            r["disk_bytes"] / r["retention"]["retention.rows"] for r in on
        ),
    }


def table(report: dict[str, Any]) -> str:
    """The rounds and the ratios as Markdown."""
    lines = [
        f"commit {report['commit']}, {report['count']:,} publications per run",
        "",
        "| round | retention | edge a:0 CPU µs/notification | transit b:0 µs | publish /s "
        "| rows kept | disk bytes | expected | delivered | duplicated | lost |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, pair in enumerate(report["rounds"], 1):
        for name in ("on", "off"):
            r = pair[name]
            lines.append(
                f"| {n} | {name} | {r['edge_cpu_us']:.1f} | {r['transit_cpu_us']:.1f} "
                f"| {r['publish_per_second']:,.0f} | {r['retention'].get('retention.rows', 0):,} "
                f"| {r['disk_bytes']:,} | {r['expected']:,} | {r['delivered']:,} "
                f"| {r['duplicates']} | {r['lost']} |"
            )
    ratios = report["ratios_on_over_off"]
    lines += [
        "",
        f"Median ratios, on / off: edge CPU per notification {ratios['edge_cpu_us']:.3f}, "
        f"transit CPU {ratios['transit_cpu_us']:.3f}, publish rate "
        f"{ratios['publish_per_second']:.3f}. Store: "
        f"{report['store_body_bytes_per_notification']:.0f} body bytes and "
        f"{report['disk_bytes_per_notification']:.0f} bytes on disk per notification.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="publications per run")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs, on and off")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    report = run(args.count, args.rounds)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(table(report))
    bad = [r for pair in report["rounds"] for r in pair.values() if r["lost"] or r["duplicates"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
