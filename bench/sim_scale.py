"""The simulator at scale (DESIGN §3): 1,000 brokers, rising subscription counts, SNR
with covering off and on; the time and memory each point takes, and the straight line
through them carried to the goal's size.

    python -m bench.sim_scale [--subscribers 1000 2000 4000] [--target 100000]
                              [--out bench/results/sim_scale.md]

Each point is one ``octopis sim`` process on the tree50x20 SCOT (50-vertex tree × K20:
every subscription becomes a routing entry at each of the 1,000 brokers, so ``N``
subscriptions are ``N`` × 1,000 entries with covering off), 100 publishers × 10
notifications, seeded: SBP messages, notification messages, expected, delivered,
duplicated and lost deliveries, the run's seconds and its peak resident memory. The
points run one after the other, so that their times compare; the fit (least squares,
seconds and MiB against subscriptions) gives the cost per subscription, the estimate at
``--target`` and the measured limit where the goal (< 5 min, < 8 GB) is out of reach.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import linear_regression
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "bench" / "topologies" / "tree50x20.toml"
GOAL_SECONDS, GOAL_MIB = 300.0, 8 * 1024
COUNTS = ("expected_deliveries", "delivered", "duplicates", "lost")


def point(topology: Path, subscribers: int, covering: str, seed: int = 1) -> dict[str, Any]:
    """One ``octopis sim`` run of ``subscribers`` on ``topology``: its JSON report."""
    argv = [sys.executable, "-m", "octopis.cli.main", "sim", "--topology", str(topology)]
    argv += ["--mode", "snr", "--covering", covering, "--subscribers", str(subscribers)]
    argv += ["--publishers", "100", "--notifications", "10", "--seed", str(seed), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"octopis sim failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def markdown(rows: list[dict[str, Any]], target: int) -> str:
    """The RESULTS table: one row per point, then per covering setting the estimate at
    ``target`` subscriptions against the goal."""
    lines = [
        "| covering | subscriptions | SBP messages | notification messages "
        "| expected | delivered | duplicated | lost | s | peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['covering']} | {r['subscriptions']:,} | {r['sbp_messages']:,} "
            f"| {r['notification_messages']:,} | {r['expected_deliveries']:,} "
            f"| {r['delivered']:,} | {r['duplicates']} | {r['lost']} "
            f"| {r['run_time']:.1f} | {r['peak_memory'] / 2**20:,.0f} |"
        )
    lines += ["", f"| covering | s per 1,000 subscriptions | MiB per 1,000 | at {target:,}: s "
              "| MiB | goal (< 300 s, < 8,192 MiB) |", "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for covering in dict.fromkeys(r["covering"] for r in rows):
        mine = [r for r in rows if r["covering"] == covering]
        xs = [float(r["subscriptions"]) for r in mine]
        t, t0 = linear_regression(xs, [r["run_time"] for r in mine])
        m, m0 = linear_regression(xs, [r["peak_memory"] / 2**20 for r in mine])
        seconds, mib = t0 + t * target, m0 + m * target
        met = "met" if seconds < GOAL_SECONDS and mib < GOAL_MIB else "not met"
        lines.append(
            f"| {covering} | {t * 1000:.1f} | {m * 1000:,.0f} | {seconds:,.0f} "
            f"| {mib:,.0f} | {met} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--subscribers",
        type=int,
        nargs="+",
        default=[1000, 2000, 4000],
        help="subscriptions of each point, at least two different (default 1000 2000 4000)",
    )
    parser.add_argument(
        "--target",
        type=int,
        default=100_000,
        help="subscriptions the fitted line is carried to (default 100,000)",
    )
    parser.add_argument(
        "--covering",
        choices=("off", "active"),
        action="append",
        help="covering setting; repeat it for both (default both)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench/results/sim_scale.md",
        help="where the Markdown table goes",
    )
    args = parser.parse_args(argv)
    if len(set(args.subscribers)) < 2:
        parser.error("--subscribers needs at least two different counts to fit a line")
    with tempfile.TemporaryDirectory() as tmp:
        topology = Path(tmp) / "t1000.json"
        subprocess.run(
            [sys.executable, "-m", "octopis.cli.topology", "build", "--acyclic", str(TOPOLOGY),
             "-o", str(topology)],
            check=True, capture_output=True,
        )  # fmt: skip
        rows = []
        for covering in args.covering or ["off", "active"]:
            for n in args.subscribers:
                report = point(topology, n, covering)
                rows.append({"covering": covering, **report})
                print(f"{covering} {n:,}: {report['run_time']:.1f} s", file=sys.stderr)
    table = markdown(rows, args.target)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table + "\n")
    print(table)
    return 0 if all(r[COUNTS[0]] == r["delivered"] and not r["duplicates"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
