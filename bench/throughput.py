"""End-to-end throughput (issue 16): the highest publication rate paper75's 75 broker
processes carry with 1,000 subscribers, exactly once and with bounded queues, in SNR, DNR
and BID; reported as notifications delivered per second per core of this machine.

For each mode one overlay is started (``octopis up``, in the clear as the paper75 process
tests run) and workloads of rising rate are run on it (``octopis run --attach``'s
:class:`WorkloadRun`): the rate doubles while a run *holds*, then is bisected between the
last rate that held and the first that did not. A run holds when every expected delivery
arrived exactly once (0 lost, 0 duplicated), the harness kept the schedule (no
publication sent more than ``--late`` seconds late), the longest output queue a copy met
stayed under ``--queue-bound`` frames and the p99 notification delay under
``--delay-bound`` seconds. With ``--baseline DIR`` (an earlier commit checked out and
built in place) the same search runs on brokers from that tree, mode by mode beside this
one, and the report gives the ratio.

``python -m bench.throughput`` writes ``bench/results/throughput.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from octopis.cluster.launcher import find_free_base_port
from octopis.cluster.runner import RunOptions, WorkloadRun
from octopis.quotes import quotes_dir
from octopis.settings import BrokerSettings
from octopis.topology import build_preset
from octopis.workload import generate_workload

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _octopis(tree: Path, *args: str) -> subprocess.CompletedProcess:
    """The ``octopis`` command line of source tree ``tree``."""
    return subprocess.run(
        [sys.executable, "-m", "octopis.cli.main", *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


class Overlay:
    """paper75 in one mode, started by ``octopis up`` from a source tree."""

    def __init__(self, tree: Path, mode: str, work: Path) -> None:
        self.tree, self.mode, self.work = tree, mode, work
        scot = build_preset("paper75")
        self.scot = build_preset("paper75", base_port=find_free_base_port(len(scot.brokers)))
        self.topology = work / "paper75.json"
        self.topology.write_text(json.dumps(self.scot.to_json()))
        self.run_dir = work / "overlay"

    def __enter__(self) -> Overlay:
        up = _octopis(
            self.tree, "up", str(self.topology), "--mode", self.mode, "--insecure",
            "--run-dir", str(self.run_dir),
        )  # fmt: skip
        if up.returncode != 0:
            raise RuntimeError(f"octopis up failed in {self.tree}: {up.stderr[-2000:]}")
        return self

    def __exit__(self, *exc: object) -> None:
        _octopis(self.tree, "down", "--run-dir", str(self.run_dir))


def measure(overlay: Overlay, rate: float, args: argparse.Namespace, run: int) -> dict[str, Any]:
    """One attached run at ``rate`` publications per second in total."""
    per_publisher = args.seconds * rate / args.publishers
    workload = generate_workload(
        overlay.scot,
        subscribers=args.subscribers,
        publishers=args.publishers,
        notifications=max(1, round(per_publisher)),
        seed=run,
        rate_per_minute=60 * rate / args.publishers,
        start_window=0.5,
        quotes_from=quotes_dir(),
    )
    options = RunOptions(
        mode=None,
        run_dir=overlay.work / f"run-{run}",
        settings=BrokerSettings(),
        progress=False,
        secure=False,
        attach=True,
        drain_timeout=20.0,
        client_workers=args.client_workers,
    )
    started = time.monotonic()
    report = WorkloadRun(overlay.scot, overlay.topology, workload, options).run()
    timings = report["timings"]
    busy = timings["publish"] + timings["drain"]
    delivered = report["delivered"]
    failed_on = [
        name
        for name, ok in (
            ("exactly-once", report["lost"] == report["duplicates"] == report["unexpected"] == 0),
            ("harness late", report["publish_late_max_s"] <= args.late),
            ("queue bound", report["target_queue_length"]["max"] <= args.queue_bound),
            ("p99 delay", report["notification_delay"]["p99"] <= args.delay_bound),
        )
        if not ok
    ]
    return {
        "rate": rate,
        "holds": not failed_on,
        "failed_on": failed_on,
        "expected": report["expected_deliveries"],
        "delivered": delivered,
        "duplicates": report["duplicates"],
        "lost": report["lost"],
        "delivered_per_s": delivered / busy if busy else 0.0,
        "delivered_per_s_per_core": delivered / busy / (os.cpu_count() or 1) if busy else 0.0,
        "publish_late_max_s": report["publish_late_max_s"],
        "queue_max": report["target_queue_length"]["max"],
        "delay_p50_s": report["notification_delay"]["p50"],
        "delay_p99_s": report["notification_delay"]["p99"],
        "wall_s": time.monotonic() - started,
    }


def search(overlay: Overlay, args: argparse.Namespace) -> dict[str, Any]:
    """Double the rate while runs hold, then bisect ``args.bisect`` times."""
    runs: list[dict[str, Any]] = []
    good: dict[str, Any] | None = None
    bad: float | None = None
    rate = args.start_rate
    while bad is None and rate <= args.max_rate:
        runs.append(measure(overlay, rate, args, len(runs)))
        print(json.dumps({"mode": overlay.mode, "tree": str(overlay.tree), **runs[-1]}), flush=True)
        if runs[-1]["holds"]:
            good, rate = runs[-1], rate * 2
        else:
            bad = rate
    low = good["rate"] if good else 0.0
    for _ in range(args.bisect if bad is not None else 0):
        rate = (low + bad) / 2
        runs.append(measure(overlay, rate, args, len(runs)))
        print(json.dumps({"mode": overlay.mode, "tree": str(overlay.tree), **runs[-1]}), flush=True)
        if runs[-1]["holds"]:
            good, low = runs[-1], rate
        else:
            bad = rate
    return {"best": good, "first_failing_rate": bad, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    """Run the search for each mode (and baseline tree) and write the report."""
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__)
    p.add_argument("--modes", default="snr,dnr,bid", help="comma-separated (default all three)")
    p.add_argument("--subscribers", type=int, default=1000, help="in all")
    p.add_argument("--publishers", type=int, default=20, help="in all; they share the rate")
    p.add_argument("--seconds", type=float, default=10.0, help="publishing time of a run")
    p.add_argument("--start-rate", type=float, default=50.0, help="publications/s, first run")
    p.add_argument(
        "--max-rate", type=float, default=64_000.0, help="publications/s the doubling stops at"
    )
    p.add_argument("--bisect", type=int, default=3, help="bisection steps after doubling")
    p.add_argument("--late", type=float, default=1.0, help="seconds a publication may be late")
    p.add_argument("--queue-bound", type=int, default=1000, help="longest output queue, frames")
    p.add_argument("--delay-bound", type=float, default=2.0, help="p99 delay, seconds")
    p.add_argument(
        "--client-workers",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="processes the clients are spread over (default: one per core)",
    )
    p.add_argument("--baseline", type=Path, metavar="DIR", help="an earlier built checkout")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "throughput.json",
        help="where the report goes as JSON (its table beside it, .md)",
    )
    args = p.parse_args(argv)
    trees = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    results: dict[str, dict[str, Any]] = {}
    for mode in args.modes.split(","):
        for name, tree in trees.items():
            with tempfile.TemporaryDirectory() as tmp, Overlay(tree, mode, Path(tmp)) as overlay:
                results.setdefault(mode, {})[name] = search(overlay, args)
    report = {"settings": {k: str(v) for k, v in vars(args).items()}, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(table(results))
    print(table(results))
    return 0


def table(results: dict[str, dict[str, Any]]) -> str:
    """The report as a Markdown table: per mode and tree, the best rate that held."""
    lines = [
        "| mode | tree | publications/s | delivered/s | per core | exactly once | "
        "queue max | p99 delay | first failing rate (why) |",
        "|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for mode, trees in results.items():
        for name, found in trees.items():
            best = found["best"]
            if best is None:
                lines.append(f"| {mode} | {name} | none held | | | | | | |")
                continue
            lines.append(
                f"| {mode} | {name} | {best['rate']:,.0f} | {best['delivered_per_s']:,.0f} | "
                f"{best['delivered_per_s_per_core']:,.0f} | {best['delivered']:,}/"
                f"{best['expected']:,}, {best['duplicates']} dup, {best['lost']} lost | "
                f"{best['queue_max']} | {best['delay_p99_s'] * 1000:.0f} ms | "
                f"{_failing(found)} |"
            )
        if "baseline" in trees and trees["baseline"]["best"] and trees["this"]["best"]:
            ratio = trees["this"]["best"]["rate"] / trees["baseline"]["best"]["rate"]
            lines.append(f"| {mode} | this / baseline | {ratio:.2f}× | | | | | | |")
    return "\n".join(lines) + "\n"


def _failing(found: dict[str, Any]) -> str:
    """The first rate that did not hold and which criteria it failed."""
    rate = found["first_failing_rate"]
    if rate is None:
        return "-"
    why = next(r["failed_on"] for r in found["runs"] if r["rate"] == rate)
    return f"{rate:,.0f} ({', '.join(why)})"


if __name__ == "__main__":
    sys.exit(main())
