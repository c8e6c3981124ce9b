"""A publisher's confirm on real broker processes (DESIGN §7, custody):

    python -m bench.confirm [--count 2000] [--rounds 3] [--out bench/results/confirm.json]

fig2 (18 brokers, DNR, keys on as ``octopis up`` starts them, default settings), idle but
for one subscriber on f:2 taking every publication. One publisher on a:0:

- *awaited*: ``count`` calls of ``await Publisher.publish(...)`` one after another (the
  default ``wait=True``: each returns once a:0's neighbours hold their copies); the
  latency of each call (mean, p50, p99, max) and the calls per second;
- *pipelined*: ``count`` calls with ``wait=False`` and one ``flush()``; publications per
  second.

Every round counts what the subscriber got: expected, delivered, duplicated, lost. To
compare two commits, run it at each (the JSON holds the commit) and divide.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from octopis.accounting import distribution
from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster, prepare_topology
from octopis.keys import KEYS_ENV

PUBLISHER_HOST, SUBSCRIBER_HOST = "a:0", "f:2"
REPO = Path(__file__).resolve().parents[1]


async def _round(cluster: LocalCluster, count: int, number: int) -> dict[str, Any]:
    """One awaited and one pipelined series from a fresh publisher; the subscriber's
    exactly-once counts over both."""
    scot = cluster.scot
    got: Counter[tuple[int, int]] = Counter()
    sub = await Subscriber.connect(
        scot.client_endpoints(SUBSCRIBER_HOST),
        f"reader-{number}",
        on_notification=lambda n: got.update([(n.publication["round"], n.seq)]),
    )
    await sub.subscribe(f"[class,eq,'STOCK'],[round,=,{number}]")
    await _until(lambda: _spread(cluster), "the subscription reaches a:0")
    pub = await Publisher.connect(scot.client_endpoints(PUBLISHER_HOST), f"feed-{number}")
    latencies = []
    started = time.perf_counter()
    for i in range(count):
        sent = time.perf_counter()
        await pub.publish({"class": "STOCK", "round": number, "close": float(i)})
        latencies.append(time.perf_counter() - sent)
    awaited_rate = count / (time.perf_counter() - started)
    started = time.perf_counter()
    for i in range(count):
        await pub.publish({"class": "STOCK", "round": number, "close": float(i)}, wait=False)
    await pub.flush(60)
    pipelined_rate = count / (time.perf_counter() - started)
    expected = 2 * count
    await _until(lambda: len(got) >= expected, "every publication arrives", timeout=60)
    await asyncio.sleep(0.5)  # a late copy would show as a duplicate
    await pub.close()
    await sub.close()
    latency = distribution(latencies)
    return {
        "awaited_per_second": awaited_rate,
        "pipelined_per_second": pipelined_rate,
        "latency_ms": {k: v * 1e3 for k, v in latency.items()},
        "expected": expected,
        "delivered": len(got),
        "duplicates": sum(n - 1 for n in got.values()),
        "lost": expected - len(got),
    }


async def _spread(cluster: LocalCluster) -> bool:
    stats = await cluster.call_all("stats")
    sizes = {s["routing_table_size"] for s in stats.values()}
    return len(sizes) == 1 and sizes.pop() >= 1


async def _until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)


def run(count: int, rounds: int) -> dict[str, Any]:
    """Start fig2, run ``rounds`` rounds of ``count`` publications each, stop it."""
    with tempfile.TemporaryDirectory(prefix="octopis-confirm-") as tmp:
        run_dir = Path(tmp)
        scot, path = prepare_topology(run_dir, preset="fig2")
        cluster = LocalCluster(scot, path, "dnr", run_dir)
        cluster.spawn()
        os.environ[KEYS_ENV] = str(cluster.keys_dir)
        try:

            async def scenario() -> list[dict[str, Any]]:
                try:
                    await cluster.wait_ready(120)
                    return [await _round(cluster, count, n) for n in range(1, rounds + 1)]
                finally:
                    await cluster.close_control()

            results = asyncio.run(scenario())
        finally:
            cluster.stop()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {"commit": commit, "count": count, "rounds": results}


def table(report: dict[str, Any]) -> str:
    """The rounds as a Markdown table."""
    lines = [
        f"commit {report['commit']}, {report['count']} publications per series",
        "",
        "| round | awaited mean ms | p50 | p99 | max | awaited /s | pipelined /s "
        "| expected | delivered | duplicated | lost |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in enumerate(report["rounds"], 1):
        lat = r["latency_ms"]
        lines.append(
            f"| {n} | {lat['mean']:.2f} | {lat['p50']:.2f} | {lat['p99']:.2f} | {lat['max']:.1f} "
            f"| {r['awaited_per_second']:,.0f} | {r['pipelined_per_second']:,.0f} "
            f"| {r['expected']} | {r['delivered']} | {r['duplicates']} | {r['lost']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="publications per series")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    report = run(args.count, args.rounds)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(table(report))
    bad = [r for r in report["rounds"] if r["lost"] or r["duplicates"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
