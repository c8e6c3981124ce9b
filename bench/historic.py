"""A historic answer on real broker processes, and what it costs live traffic (DESIGN §11):

    python -m bench.historic [--retained 100000] [--rounds 3] [--out bench/results/historic.json]

fig2 (18 brokers, DNR, keys on, default settings). a:0's publisher first publishes
``retained`` real quotes (pipelined), which a:0's retention store keeps. Meanwhile and
throughout, a live publisher on c:0 publishes ``--live-rate`` notifications per second to a
live subscriber on f:2. Each round:

- *without*: ``--window`` seconds of live traffic alone; the live deliveries' delay
  (received − published: p50, p99, max);
- *with*: a historic subscription on f:1 (``since="all"``, every retained quote) answered
  from a:0's store across the overlay, page by page; its rate (publications delivered to
  the one subscriber per second, from the request to the end of its answer), its counts
  (expected, delivered, duplicated, lost), and the live deliveries' delay while it ran.

The ratio of the two p99s says how much a large historic answer delays other subscribers.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
from octopis.quotes import read_quote_dir

ARCHIVE, LIVE_PUBLISHER, LIVE_SUBSCRIBER, HISTORIAN = "a:0", "c:0", "f:2", "f:1"
REPO = Path(__file__).resolve().parents[1]


class LiveTraffic:
    """The live publisher and subscriber: delays of what was delivered, by publish time."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.delays: list[tuple[float, float]] = []
        self.got: Counter[int] = Counter()
        self.sent = 0

    def on_notification(self, n: Any) -> None:
        self.got[n.seq] += 1
        self.delays.append((n.published_at, n.received_at - n.published_at))

    async def publish(self, pub: Publisher, stop: asyncio.Event) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not stop.is_set():
            await pub.publish({"class": "LIVE", "n": self.sent}, wait=False)
            self.sent += 1
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def between(self, start: float, end: float) -> dict[str, float]:
        """The delay distribution (ms) of live publications published in [start, end)."""
        chosen = [d for at, d in self.delays if start <= at < end]
        return {**{k: v * 1e3 for k, v in distribution(chosen).items()}, "count": len(chosen)}


async def _scenario(
    cluster: LocalCluster, retained: int, rounds: int, rate: float, window: float
) -> dict[str, Any]:
    scot = cluster.scot
    await cluster.wait_ready(120)
    archive = await Publisher.connect(scot.client_endpoints(ARCHIVE), "archive")
    started = time.perf_counter()
    for quote in itertools.islice(read_quote_dir(), retained):
        await archive.publish(quote, wait=False)
    await archive.flush(300)
    fill_rate = retained / (time.perf_counter() - started)
    await archive.close()
    live = LiveTraffic(rate)
    reader = await Subscriber.connect(
        scot.client_endpoints(LIVE_SUBSCRIBER), "live", on_notification=live.on_notification
    )
    await reader.subscribe("[class,eq,'LIVE']")
    await asyncio.sleep(1.0)  # the subscription spreads
    talker = await Publisher.connect(scot.client_endpoints(LIVE_PUBLISHER), "talker")
    stop = asyncio.Event()
    talking = asyncio.create_task(live.publish(talker, stop))
    await asyncio.sleep(1.0)
    results = []
    for number in range(1, rounds + 1):
        before = time.time()
        await asyncio.sleep(window)
        without = live.between(before, time.time())
        historian = await Subscriber.connect(
            scot.client_endpoints(HISTORIAN), f"historian-{number}"
        )
        asked = time.time()
        clock = time.perf_counter()
        stream = await historian.subscribe("[class,eq,'STOCK']", since="all", until=time.time())
        got: Counter[tuple[str, int]] = Counter()
        async for n in stream:
            got[(n.publisher, n.seq)] += 1
        seconds = time.perf_counter() - clock
        answered = time.time()
        await historian.close()
        history = stream.history
        results.append(
            {
                "answer_seconds": seconds,
                "answer_per_second": len(got) / seconds,
                "complete": bool(history and history.complete),
                "expected": retained,
                "delivered": len(got),
                "duplicates": sum(c - 1 for c in got.values()),
                "lost": retained - len(got),
                "live_without_ms": without,
                "live_during_ms": live.between(asked, answered),
            }
        )
    stop.set()
    await talking
    await talker.flush(30)
    await talker.close()
    deadline = time.monotonic() + 30
    while len(live.got) < live.sent and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # a repeat would arrive meanwhile
    await reader.close()
    live_counts = {
        "expected": live.sent,
        "delivered": len(live.got),
        "duplicates": sum(c - 1 for c in live.got.values()),
        "lost": live.sent - len(live.got),
    }
    return {"fill_per_second": fill_rate, "rounds": results, "live": live_counts}


def run(retained: int, rounds: int, rate: float, window: float) -> dict[str, Any]:
    """Start fig2, run the rounds, stop it."""
    with tempfile.TemporaryDirectory(prefix="octopis-historic-") as tmp:
        run_dir = Path(tmp)
        scot, path = prepare_topology(run_dir, preset="fig2")
        cluster = LocalCluster(scot, path, "dnr", run_dir)
        cluster.spawn()
        os.environ[KEYS_ENV] = str(cluster.keys_dir)
        try:

            async def scenario() -> dict[str, Any]:
                try:
                    return await _scenario(cluster, retained, rounds, rate, window)
                finally:
                    await cluster.close_control()

            report = asyncio.run(scenario())
        finally:
            cluster.stop()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {"commit": commit, "retained": retained, "live_rate": rate, **report}


def table(report: dict[str, Any]) -> str:
    """The rounds as a Markdown table."""
    live = report["live"]
    lines = [
        f"commit {report['commit']}: {report['retained']:,} retained at a:0 (filled at "
        f"{report['fill_per_second']:,.0f}/s), live {report['live_rate']:g}/s c:0 → f:2; "
        f"live over the run: expected {live['expected']}, delivered {live['delivered']}, "
        f"duplicated {live['duplicates']}, lost {live['lost']}",
        "",
        "| round | answer s | answered /s | complete | expected | delivered | duplicated | lost "
        "| live p50 ms without | with | live p99 ms without | with | p99 ratio |",
        "|---:|---:|---:|:-:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in enumerate(report["rounds"], 1):
        a, b = r["live_without_ms"], r["live_during_ms"]
        lines.append(
            f"| {n} | {r['answer_seconds']:.1f} | {r['answer_per_second']:,.0f} "
            f"| {'yes' if r['complete'] else 'no'} | {r['expected']:,} | {r['delivered']:,} "
            f"| {r['duplicates']} | {r['lost']} | {a['p50']:.2f} | {b['p50']:.2f} "
            f"| {a['p99']:.2f} | {b['p99']:.2f} | {b['p99'] / a['p99']:.2f}× |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retained", type=int, default=100_000, help="publications kept")
    parser.add_argument(
        "--rounds", type=int, default=3, help="historic subscribers, one after another"
    )
    parser.add_argument("--live-rate", type=float, default=200.0, help="live publications/s")
    parser.add_argument("--window", type=float, default=5.0, help="seconds of live alone")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    report = run(args.retained, args.rounds, args.live_rate, args.window)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(table(report))
    bad = [r for r in report["rounds"] if r["lost"] or r["duplicates"] or not r["complete"]]
    return 1 if bad or report["live"]["lost"] or report["live"]["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
