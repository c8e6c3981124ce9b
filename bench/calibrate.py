"""The simulator's cost model, measured on broker processes, and its check (issue 20).

    python -m bench.calibrate                       # fig2, three sizes; ~5 minutes
    python -m bench.calibrate --recheck             # the simulator side again, no processes
    octopis sim --preset fig2 --mode dnr --service bench/results/service.json ...

For each size (subscribers) a fresh overlay of broker processes (DNR, in the clear) takes
the size's stock-quote workload (:func:`generate_workload`, real quotes), settles, idles
``IDLE`` seconds, then carries the publications at ``--rate`` per second under
:mod:`bench.peers`'s harness. Per broker and size the brokers' CPU time (psutil) and
their counters give one row: notifications taken in (from neighbours and clients),
their sum of routing-table sizes, copies forwarded, deliveries. A least-squares fit with
non-negative costs over all rows gives :class:`ServiceModel` (the idle CPU is measured
apart and taken off first); its residual is reported.

The check: the same workloads, on the same schedule, in the simulator with that model
(and a fixed ``--latency`` per hop, the loopback's share without the CPU), beside the
processes' *overlay* delay (publishing → leaving the last broker, DESIGN §4's stamp):
mean and p99, and the relative error of the mean at each size. The fit is of CPU time,
not of delay, so the delays are a genuine check of the queueing model.

Written: ``bench/results/service.json`` (the model) and ``calibration.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.peers import OctopisSystem, build_shape, run_phase, settle
from octopis.accounting import distribution
from octopis.quotes import quotes_dir
from octopis.sim import LatencyModel, Simulator
from octopis.sim.service import FIELDS, ServiceModel
from octopis.topology import Scot
from octopis.workload import Workload, generate_workload

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
IDLE = 5.0


async def _snapshot(system: OctopisSystem) -> dict[str, dict[str, float]]:
    """Per broker: CPU seconds so far and the counters the fit reads."""
    stats = await system.cluster.call_all("stats")
    rows = {}
    for broker, process in system.cluster.processes.items():
        s = stats[broker]
        times = psutil.Process(process.pid).cpu_times()
        rows[broker] = {
            "cpu": times.user + times.system,
            "taken_in": s["received"].get("notification", 0) + s["counters"].get("publications", 0),
            "copies": s["core"].get("sent.notification", 0),
            "deliveries": s["counters"].get("deliveries", 0),
            "table": s["routing_table_size"],
            "at": time.monotonic(),
        }
    return rows


def measure(scot: Scot, workload: Workload, rate: float) -> dict[str, Any]:
    """One size on fresh processes: per-broker rows (CPU net of the idle share measured
    just before), the phase's report."""
    system = OctopisSystem("dnr")

    async def session() -> tuple[dict, dict, dict, dict[str, Any]]:
        try:
            await system.subscribe(workload.subscriptions, None)
            publishing = sorted({e.broker for e in workload.publications})
            await settle(system, list(scot.brokers), publishing, 120)
            idle = await _snapshot(system)
            await asyncio.sleep(IDLE)
            before = await _snapshot(system)
            phase = await run_phase(system, workload, "calibrate", rate, 3.0, 600)
            return idle, before, await _snapshot(system), phase
        finally:
            await system.close_clients()
            await system.cluster.close_control()

    with tempfile.TemporaryDirectory(prefix="octopis-calibrate-") as tmp:
        try:
            system.start(scot, Path(tmp))
            idle0, before, after, phase = asyncio.run(session())
        finally:
            system.stop()
    rows = []
    for broker in before:
        b, a, i = before[broker], after[broker], idle0[broker]
        idle_share = (b["cpu"] - i["cpu"]) / (b["at"] - i["at"])
        seconds = a["at"] - b["at"]
        taken = a["taken_in"] - b["taken_in"]
        rows.append(
            {
                "broker": broker,
                "cpu": a["cpu"] - b["cpu"] - idle_share * seconds,
                "idle_share": idle_share,
                "taken_in": taken,
                "entries": taken * a["table"],
                "copies": a["copies"] - b["copies"],
                "deliveries": a["deliveries"] - b["deliveries"],
                "table": a["table"],
            }
        )
    return {"rows": rows, "phase": phase}


def fit(rows: list[dict[str, float]]) -> tuple[dict[str, float], float]:
    """Non-negative least squares (columns with a negative cost dropped in turn) of CPU
    on the four counts; returns the costs and the relative RMS residual."""
    columns = {"per_message": "taken_in", "per_entry": "entries", "per_copy": "copies"}
    columns["per_delivery"] = "deliveries"
    y = np.array([r["cpu"] for r in rows])
    kept = list(columns)
    while True:
        x = np.array([[r[columns[c]] for c in kept] for r in rows], dtype=float)
        costs, *_ = np.linalg.lstsq(x, y, rcond=None)
        if (costs >= 0).all() or len(kept) == 1:
            break
        kept.pop(int(np.argmin(costs)))
    result = dict.fromkeys(FIELDS, 0.0)
    result.update({c: max(0.0, float(v)) for c, v in zip(kept, costs, strict=True)})
    predicted = np.array([[r[columns[c]] for c in FIELDS] for r in rows]) @ np.array(
        [result[c] for c in FIELDS]
    )
    residual = float(np.sqrt(np.mean((predicted - y) ** 2)) / max(np.mean(np.abs(y)), 1e-12))
    return result, residual


def simulate(
    scot: Scot, workload: Workload, rate: float, model: ServiceModel, latency: float
) -> dict[str, float]:
    """The workload in the simulator on the harness's schedule (publication i at i/rate
    after the subscriptions settled): notification delay mean and p99, seconds."""
    sim = Simulator(scot, "dnr", latency=LatencyModel(latency, 0.0), service=model, covering="off")
    for event in workload.subscriptions:
        sim.subscribe(event.subscriber, event.broker, event.subscription)
    sim.run()
    start = sim.now + 1.0
    for i, event in enumerate(sorted(workload.publications, key=lambda e: e.time)):
        sim.at(start + i / rate, sim.publish, event.publisher, event.broker, event.publication)
    sim.run()
    report = sim.report()
    assert report["lost"] == report["duplicates"] == 0, report
    return {**distribution(sim.ledger.delays), "busiest_share": report["cpu_busy"]["busiest_share"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.calibrate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--preset", default="fig2", help="shape of the processes (default fig2)")
    parser.add_argument("--sizes", default="200,600,1200", help="subscribers per size")
    parser.add_argument("--publishers", type=int, default=10, help="publishers per size")
    parser.add_argument("--notifications", type=int, default=200, help="per publisher")
    parser.add_argument("--rate", type=float, default=80.0, help="publications/s in all")
    parser.add_argument(
        "--latency", type=float, default=0.0001, help="simulated seconds per hop besides CPU"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="directory of calibration.{json,md} and service.json (default bench/results)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="also check this model (e.g. the low-rate bench/results/service.json) against "
        "the processes: its error beside the fitted model's",
    )
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="no processes: the simulator side of the check again, with the model and the "
        "processes' delays already in --out (after a change to the simulator)",
    )
    args = parser.parse_args(argv)
    if args.recheck:
        try:
            report = json.loads((args.out / "calibration.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            parser.error(f"--recheck needs {args.out / 'calibration.json'}: {exc}")
        model = ServiceModel(**report["model"])
        report["model"] = model.to_json()
        source = model.source
        args.publishers = source.get("publishers", args.publishers)
        args.notifications = source.get("notifications", args.notifications)
        stored = report.get("other_model")
        other = ServiceModel(**{k: v for k, v in stored.items() if k != "path"}) if stored else None
        for check in report["checks"]:
            scot, workload = _sized(source["preset"], check["subscribers"], args)
            check.update(_check(scot, workload, source["rate"], model, report["latency"], check))
            if other is not None:
                check["other"] = _check(
                    scot, workload, source["rate"], other, report["latency"], check
                )
        _write(args.out, report)
        return 0
    try:
        other = ServiceModel.load(args.model) if args.model is not None else None
    except ValueError as exc:
        parser.error(str(exc))
    sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
    measured = []
    for size in sizes:
        scot, workload = _sized(args.preset, size, args)
        result = measure(scot, workload, args.rate)
        measured.append((size, scot, workload, result))
        print(
            f"{size} subscribers: measured ({result['phase']['delivered']:,} deliveries)",
            flush=True,
        )
    rows = [row for *_, result in measured for row in result["rows"]]
    costs, residual = fit(rows)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    ).stdout.strip()
    idle = float(np.mean([r["idle_share"] for r in rows]))
    model = ServiceModel(
        **costs,
        idle=idle,
        source={
            "commit": commit,
            "preset": args.preset,
            "sizes": sizes,
            "rate": args.rate,
            "publishers": args.publishers,
            "notifications": args.notifications,
            "rows": len(rows),
            "relative_rms_residual": residual,
        },
    )
    checks = []
    for size, scot, workload, result in measured:
        phase = result["phase"]
        overlay = phase["overlay_delay_ms"]
        check = {
            "subscribers": size,
            "processes_overlay_ms": {"mean": overlay["mean"], "p99": overlay["p99"]},
            "processes_total_ms": {
                "mean": phase["delay_ms"]["mean"],
                "p99": phase["delay_ms"]["p99"],
            },
            "exactly_once": {
                k: phase[k]
                for k in ("expected_deliveries", "delivered", "duplicates", "lost", "unexpected")
            },
        }
        check |= _check(scot, workload, args.rate, model, args.latency, check)
        if other is not None:
            check["other"] = _check(scot, workload, args.rate, other, args.latency, check)
        checks.append(check)
    report = {"model": model.to_json(), "latency": args.latency, "checks": checks, "rows": rows}
    if other is not None:
        report["other_model"] = {"path": str(args.model), **other.to_json()}
    _write(args.out, report)
    (args.out / "service.json").write_text(json.dumps(model.to_json(), indent=1))
    return 0


def _sized(preset: str, size: int, args: argparse.Namespace) -> tuple[Scot, Workload]:
    """The shape and the workload of one size (seeded by the size: the same every time)."""
    scot = build_shape(preset)
    workload = generate_workload(
        scot,
        subscribers=size,
        publishers=args.publishers,
        notifications=args.notifications,
        seed=size,
        quotes_from=quotes_dir(),
    )
    return scot, workload


def _check(
    scot: Scot,
    workload: Workload,
    rate: float,
    model: ServiceModel,
    latency: float,
    check: dict[str, Any],
) -> dict[str, Any]:
    """The simulator's figures of one size beside the processes' in ``check``."""
    sim = simulate(scot, workload, rate, model, latency)
    overlay = check["processes_overlay_ms"]["mean"]
    return {
        "sim_ms": {"mean": sim["mean"] * 1000, "p99": sim["p99"] * 1000},
        "error_of_mean": (sim["mean"] * 1000 - overlay) / overlay,
        "sim_busiest_share": sim["busiest_share"],
    }


def _write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(report, indent=1))
    (out / "calibration.md").write_text(table(report))
    print(table(report))


def table(report: dict[str, Any]) -> str:
    """The model and the check, as Markdown."""
    m = report["model"]
    other = "other_model" in report
    lines = [
        "# The simulator's cost model, measured and checked",
        "",
        f"Per notification {m['per_message'] * 1e6:.1f} µs + {m['per_entry'] * 1e9:.2f} ns per "
        f"routing-table entry + {m['per_copy'] * 1e6:.1f} µs per copy + "
        f"{m['per_delivery'] * 1e6:.1f} µs per delivery; idle {m['idle']:.1%} of a core "
        f"(not charged); fit over {m['source']['rows']} broker rows, relative RMS residual "
        f"{m['source']['relative_rms_residual']:.2f}; simulated hop latency "
        f"{report['latency'] * 1e6:.0f} µs besides CPU.",
        "",
        "| subscribers | processes: overlay delay mean / p99 ms | processes: total mean / "
        "p99 ms | simulator mean / p99 ms | error of the mean | busiest broker (sim) |"
        + (" with the other model: mean / p99 ms, error, busiest |" if other else ""),
        "|---:|---|---|---|---:|---:|" + ("---|" if other else ""),
    ]
    for c in report["checks"]:
        o, t, s = c["processes_overlay_ms"], c["processes_total_ms"], c["sim_ms"]
        line = (
            f"| {c['subscribers']:,} | {o['mean']:.2f} / {o['p99']:.2f} | {t['mean']:.2f} / "
            f"{t['p99']:.2f} | {s['mean']:.2f} / {s['p99']:.2f} | {c['error_of_mean']:+.0%} | "
            f"{c['sim_busiest_share']:.0%} |"
        )
        if "other" in c:
            x = c["other"]
            line += (
                f" {x['sim_ms']['mean']:.2f} / {x['sim_ms']['p99']:.2f}, "
                f"{x['error_of_mean']:+.0%}, {x['sim_busiest_share']:.0%} |"
            )
        lines.append(line)
    if "other_model" in report:
        x = report["other_model"]
        lines += [
            "",
            f"The other model ({x['path']}): {x['per_message'] * 1e6:.1f} µs per notification "
            f"+ {x['per_copy'] * 1e6:.1f} µs per copy + {x['per_delivery'] * 1e6:.1f} µs per "
            f"delivery, measured at {x['source'].get('rate', '?')} publications/s.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
