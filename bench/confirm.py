"""A publisher's confirm on real broker processes, beside fan-out (DESIGN §7, custody):

    python -m bench.confirm [--count 2000] [--rounds 3] [--baseline DIR]
                            [--out bench/results/confirm.json]

fig2 (18 brokers, DNR, keys on as ``octopis up`` starts them, default settings). One
publisher on a:0, and in each *case* a set of subscribers, each taking every publication,
all in one process of their own (so their work competes with the brokers', as a user's
would): *none*, *one* (on f:2) and *six* (on d:0, e:0, b:1, f:2, f:0, f:0). Each case:

- *awaited*: ``count`` calls of ``await Publisher.publish(...)`` one after another (the
  default ``wait=True``: each returns once a:0's neighbours hold their copies); the
  latency of each call (mean, p50, p99, max) and the calls per second;
- *pipelined*: ``count`` calls with ``wait=False`` and one ``flush()``; publications per
  second.

Every case counts what each subscriber got: expected, delivered, duplicated, lost.

``--baseline DIR`` runs the same cases on brokers started from the source tree ``DIR``
too (a checkout of the commit to compare with, its Cython built in place), the two trees
alternating round by round, so their figures come from one run on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

PUBLISHER_HOST = "a:0"
CASES = {"none": (), "one": ("f:2",), "six": ("d:0", "e:0", "b:1", "f:2", "f:0", "f:0")}
"""Subscriber hosts of each case (a host named twice has two subscribers)."""
REPO = Path(__file__).resolve().parents[1]
TAKE_ALL = "[class,eq,'STOCK'],[case,=,{tag}]"


async def _subscribers(hosts: list[str], tag: int, endpoints: dict[str, list[str]]) -> None:
    """The subscriber process: subscribe on each of ``hosts``, print ``ready`` once each
    has seen a probe, then wait for ``expected N`` on stdin and print each subscriber's
    counts (probes left out) as one JSON line."""
    got: list[Counter[int]] = [Counter() for _ in hosts]
    probed = [False] * len(hosts)
    subs = []
    for i, host in enumerate(hosts):

        def take(n: Any, i: int = i) -> None:
            if n.publication.get("probe"):
                probed[i] = True
            else:
                got[i][n.publication["seq"]] += 1

        sub = await Subscriber.connect(endpoints[host], f"reader-{tag}-{i}", on_notification=take)
        await sub.subscribe(TAKE_ALL.format(tag=tag))
        subs.append(sub)
    await _until(lambda: all(probed), "every subscriber sees a probe", timeout=60)
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    expected = int(line.split()[1])
    with contextlib.suppress(TimeoutError):
        await _until(lambda: all(len(g) >= expected for g in got), "all arrive", timeout=60)
    await asyncio.sleep(0.5)  # a late copy would show as a duplicate
    for sub in subs:
        await sub.close()
    counts = [
        {
            "delivered": len(g),
            "duplicates": sum(n - 1 for n in g.values()),
            "lost": expected - len(g),
        }
        for g in got
    ]
    print(json.dumps(counts), flush=True)


async def _case(cluster: LocalCluster, hosts: tuple[str, ...], count: int, tag: int) -> dict:
    """One case: the subscriber process for ``hosts``, then an awaited and a pipelined
    series from a fresh publisher; the subscribers' exactly-once counts over both."""
    scot = cluster.scot
    pub = await Publisher.connect(scot.client_endpoints(PUBLISHER_HOST), f"feed-{tag}")
    child = None
    if hosts:
        endpoints = {h: scot.client_endpoints(h) for h in hosts}
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.confirm",
            "--subscribe",
            json.dumps([list(hosts), tag, endpoints]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        ready = asyncio.ensure_future(child.stdout.readline())
        deadline = time.monotonic() + 90
        while not ready.done():
            if time.monotonic() > deadline:
                child.kill()
                raise TimeoutError("the subscribers never saw a probe")
            await pub.publish({"class": "STOCK", "case": tag, "probe": 1})
            await asyncio.wait([ready], timeout=0.2)
        if ready.result().strip() != b"ready":
            raise RuntimeError(f"subscriber process: {ready.result()!r}")
    pids = {name: proc.pid for name, proc in cluster.processes.items()}
    pids["publisher"] = os.getpid()
    if child is not None:
        pids["subscribers"] = child.pid
    cpu_before = _cpu(pids)
    latencies = []
    started = time.perf_counter()
    for i in range(count):
        sent = time.perf_counter()
        await pub.publish({"class": "STOCK", "case": tag, "seq": i, "close": float(i)})
        latencies.append(time.perf_counter() - sent)
    awaited_rate = count / (time.perf_counter() - started)
    cpu_after = _cpu(pids)
    started = time.perf_counter()
    for i in range(count, 2 * count):
        await pub.publish({"class": "STOCK", "case": tag, "seq": i, "close": float(i)}, wait=False)
    await pub.flush(60)
    pipelined_rate = count / (time.perf_counter() - started)
    counts = []
    if child is not None:
        out, _ = await child.communicate(f"expected {2 * count}\n".encode())
        counts = json.loads(out.decode().strip().splitlines()[-1])
    await pub.close()
    latency = distribution(latencies)
    return {
        "subscribers": list(hosts),
        "awaited_per_second": awaited_rate,
        "pipelined_per_second": pipelined_rate,
        "latency_ms": {k: v * 1e3 for k, v in latency.items()},
        "expected": 2 * count,
        "counts": counts,
        "awaited_cpu_us": {
            name: (cpu_after[name] - cpu_before[name]) * 1e6 / count
            for name in pids
            if name in cpu_after and name in cpu_before
        },
    }


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user and system) each process has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds[name] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


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


def _cluster_run(tree: Path | None, count: int, cases: list[str], first_tag: int) -> dict:
    """Start fig2 from source ``tree`` (None: this one), run ``cases``, stop it."""
    saved = os.environ.get("PYTHONPATH")
    if tree is not None:
        os.environ["PYTHONPATH"] = str(tree)
    try:
        with tempfile.TemporaryDirectory(prefix="octopis-confirm-") as tmp:
            run_dir = Path(tmp)
            scot, path = prepare_topology(run_dir, preset="fig2")
            cluster = LocalCluster(scot, path, "dnr", run_dir)
            cluster.spawn()
            os.environ[KEYS_ENV] = str(cluster.keys_dir)
            try:

                async def scenario() -> dict:
                    try:
                        await cluster.wait_ready(120)
                        return {
                            case: await _case(cluster, CASES[case], count, first_tag + n)
                            for n, case in enumerate(cases)
                        }
                    finally:
                        await cluster.close_control()

                return asyncio.run(scenario())
            finally:
                cluster.stop()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _commit(tree: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True
    ).stdout.strip()


def run(count: int, rounds: int, cases: list[str], baseline: Path | None) -> dict[str, Any]:
    """``rounds`` rounds, each on a fresh fig2 per tree (this one, and ``baseline`` if
    given, in alternating order)."""
    trees: dict[str, Path | None] = {"this": None}
    if baseline is not None:
        trees["baseline"] = baseline
    report: dict[str, Any] = {
        "count": count,
        "commits": {"this": _commit(REPO), **({"baseline": _commit(baseline)} if baseline else {})},
        "rounds": [],
    }
    for n in range(rounds):
        order = list(trees) if n % 2 == 0 else list(reversed(trees))
        one = {}
        for name in order:
            one[name] = _cluster_run(trees[name], count, cases, 100 * n + 10)
        report["rounds"].append(one)
    return report


def table(report: dict[str, Any]) -> str:
    """The cases as a Markdown table, round by round."""
    commits = ", ".join(f"{k} {v}" for k, v in report["commits"].items())
    lines = [
        f"commits: {commits}; {report['count']} publications per series",
        "",
        "| round | code | subscribers | awaited p50 ms | p99 | mean | awaited /s "
        "| pipelined /s | expected / delivered / duplicated / lost (each subscriber) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for n, one in enumerate(report["rounds"], 1):
        for code, cases in one.items():
            for case, r in cases.items():
                lat = r["latency_ms"]
                counts = (
                    ", ".join(
                        f"{r['expected']}/{c['delivered']}/{c['duplicates']}/{c['lost']}"
                        for c in r["counts"]
                    )
                    or "-"
                )
                lines.append(
                    f"| {n} | {code} | {case} | {lat['p50']:.2f} | {lat['p99']:.2f} "
                    f"| {lat['mean']:.2f} | {r['awaited_per_second']:,.0f} "
                    f"| {r['pipelined_per_second']:,.0f} | {counts} |"
                )
    return "\n".join(lines)


def breakdown(report: dict[str, Any]) -> str:
    """CPU µs per awaited publication, by process (the largest six, and the total), each
    case's median over the rounds."""
    lines = ["| code | subscribers | total CPU µs | largest (process: µs) |", "|---|---|---:|---|"]
    codes = report["rounds"][0]
    for code in codes:
        for case in codes[code]:
            per: dict[str, list[float]] = {}
            for one in report["rounds"]:
                for name, us in one[code][case]["awaited_cpu_us"].items():
                    per.setdefault(name, []).append(us)
            med = {name: sorted(v)[len(v) // 2] for name, v in per.items()}
            top = sorted(med.items(), key=lambda kv: -kv[1])[:6]
            largest = ", ".join(f"{name}: {us:,.0f}" for name, us in top)
            lines.append(f"| {code} | {case} | {sum(med.values()):,.0f} | {largest} |")
    return "\n".join(lines)


def _bad(report: dict[str, Any]) -> bool:
    return any(
        c["lost"] or c["duplicates"]
        for one in report["rounds"]
        for cases in one.values()
        for r in cases.values()
        for c in r["counts"]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="publications per series")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, each on a fresh fig2 per tree (default 3)"
    )
    parser.add_argument("--cases", default="none,one,six", help="of: " + ", ".join(CASES))
    parser.add_argument("--baseline", type=Path, help="source tree to compare with")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--subscribe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.subscribe:
        hosts, tag, endpoints = json.loads(args.subscribe)
        asyncio.run(_subscribers(hosts, tag, endpoints))
        return 0
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}: the cases are {list(CASES)}")
    report = run(args.count, args.rounds, cases, args.baseline)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(table(report))
    print()
    print(breakdown(report))
    return 1 if _bad(report) else 0


if __name__ == "__main__":
    sys.exit(main())
