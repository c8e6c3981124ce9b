"""``octopis sim``: replay a workload on the in-memory simulator and report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from octopis.cli.errors import UsageError
from octopis.cli.report import print_report, write_deliveries
from octopis.core import MODES
from octopis.sim import LatencyModel, Simulator
from octopis.topology import Scot, build_preset, load_topology, preset_names
from octopis.workload import Workload, generate_workload, read_workload


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``sim`` subcommand."""
    p = commands.add_parser(
        "sim",
        help="simulate SBP and notification routing (snr, dnr, bid) in memory",
        description="Run one routing core per broker of a SCOT, wired by in-memory links with "
        "seeded latencies; replay a workload directory or a generated stock workload; report "
        "message counts and exactly-once delivery (expected, delivered, duplicates, lost).",
    )
    add_topology_options(p)
    p.add_argument("--mode", required=True, choices=MODES, help="routing algorithm")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workload", type=Path, metavar="DIR", help="workload directory")
    source.add_argument(
        "--subscribers",
        type=int,
        metavar="N",
        help="generate a stock workload with N subscribers (no Spark)",
    )
    p.add_argument("--publishers", type=int, metavar="M", help="generated publishers")
    p.add_argument(
        "--notifications", type=int, metavar="K", help="generated notifications per publisher"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=60.0,
        metavar="NPM",
        help="generated notifications per minute per publisher (default 60)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for workload and latencies")
    p.add_argument(
        "--latency",
        type=float,
        default=0.001,
        metavar="SECONDS",
        help="base link latency (default 0.001)",
    )
    p.add_argument(
        "--jitter",
        type=float,
        default=0.001,
        metavar="SECONDS",
        help="mean exponential latency jitter (default 0.001)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--deliveries",
        type=Path,
        metavar="FILE",
        help="write one JSON line per delivery (subscriber, publisher, seq)",
    )
    p.set_defaults(func=cmd_sim)


def add_topology_options(p: argparse.ArgumentParser) -> None:
    """``--topology FILE`` or ``--preset NAME``."""
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--topology", type=Path, metavar="FILE", help="topology JSON from `octopis-topology build`"
    )
    group.add_argument("--preset", choices=preset_names(), help="a shipped topology")


def load_scot(args: argparse.Namespace) -> Scot:
    """The topology named by ``--topology`` or ``--preset``."""
    return load_topology(args.topology) if args.topology else build_preset(args.preset)


def workload_from_args(args: argparse.Namespace, scot: Scot) -> Workload:
    """Read ``--workload`` or generate one from ``--subscribers/--publishers/...``."""
    if args.workload is not None:
        for name in ("publishers", "notifications"):
            if getattr(args, name) is not None:
                raise UsageError(
                    f"--{name} only applies to a generated workload, not with --workload"
                )
        workload = read_workload(args.workload)
    else:
        if args.publishers is None or args.notifications is None:
            raise UsageError(
                "a generated workload needs --subscribers, --publishers and --notifications"
            )
        workload = generate_workload(
            scot,
            subscribers=args.subscribers,
            publishers=args.publishers,
            notifications=args.notifications,
            seed=args.seed,
            rate_per_minute=args.rate,
        )
    workload.check_topology(scot)
    return workload


def cmd_sim(args: argparse.Namespace) -> int:
    """Validate everything, run the simulation, print the report."""
    scot = load_scot(args)
    workload = workload_from_args(args, scot)
    if args.latency < 0 or args.jitter < 0:
        raise UsageError("latency and jitter must be ≥ 0")
    sim = Simulator(
        scot, args.mode, seed=args.seed, latency=LatencyModel(args.latency, args.jitter)
    )
    sim.replay(workload)
    report: dict[str, Any] = {"topology": scot.name, **sim.report()}
    if args.deliveries is not None:
        write_deliveries(args.deliveries, sim.deliveries())
    print(json.dumps(report, indent=1) if args.json else print_report(report))
    return 0
