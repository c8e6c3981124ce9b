"""``octopis sim``: replay a workload on the in-memory simulator and report."""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from octopis.cli.errors import UsageError
from octopis.cli.report import render_report, write_deliveries
from octopis.core import COVERING, DEFAULT_COVERING, MODES
from octopis.core.lst import DEFAULT_LST_WINDOW, DEFAULT_ORDER, DEFAULT_QUEUE_THRESHOLD, ORDERS
from octopis.defaults import DOWN_AFTER, RETAIN
from octopis.failure_schedule import Failure, FailureSpecError, parse_failure, read_schedule
from octopis.sim import InjectedCongestion, LatencyModel, LinkModel, Simulator, TimedLinks
from octopis.sim.service import ServiceModel
from octopis.topology import Scot, build_preset, load_topology, preset_names
from octopis.workload import (
    RATE_PER_MINUTE,
    HighRatePublisher,
    Workload,
    generate_workload,
    read_workload,
)


def configure(command: str, p: argparse.ArgumentParser) -> None:
    """Give ``sim`` its description and arguments."""
    p.description = (
        "Run one routing core per broker of a SCOT, wired by in-memory links with "
        "seeded latencies; replay a workload directory or a generated stock workload; report "
        "message counts and exactly-once delivery (expected, delivered, duplicates, lost)."
    )
    add_topology_options(p)
    p.add_argument("--mode", required=True, choices=MODES, help="routing algorithm")
    p.add_argument(
        "--covering",
        choices=COVERING,
        default=DEFAULT_COVERING,
        help="'active' (default): a subscription is not passed over a link a covering one "
        "went over; 'off': the paper's SBP, N-1 messages per subscription (BID ignores it)",
    )
    add_workload_options(p)
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
    p.add_argument(
        "--service",
        type=Path,
        metavar="FILE",
        help="charge each broker's CPU per notification with the costs measured on the broker "
        "processes (`python -m bench.calibrate` writes FILE), so delays queue as theirs do; a "
        "copy then counts in its sender's output queue until the receiver's CPU takes it, "
        "so DNR sees a busy broker (not with failures)",
    )
    add_congestion_options(p)
    add_failure_options(p)
    failures = p.add_argument_group("failures")
    failures.add_argument(
        "--detection",
        type=float,
        default=DOWN_AFTER,
        metavar="SECONDS",
        help=f"time until a neighbour notices a failure (default {DOWN_AFTER})",
    )
    failures.add_argument(
        "--retain",
        type=float,
        default=RETAIN,
        metavar="SECONDS",
        help="how long a sender keeps a copy after its neighbour acknowledged it, for "
        f"re-routing if the neighbour fails before passing it on (default {RETAIN})",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--details",
        action="store_true",
        help="after the summary, every figure of the report as a table",
    )
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


def add_workload_options(p: argparse.ArgumentParser) -> None:
    """``--workload DIR``, or the options of a generated stock workload (no Spark)."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workload", type=Path, metavar="DIR", help="workload directory")
    source.add_argument(
        "--subscribers",
        type=int,
        metavar="N",
        help="generate a stock workload with N subscribers (no Spark)",
    )
    gen = p.add_argument_group("generated workload", "used with --subscribers")
    gen.add_argument("--publishers", type=int, metavar="M", help="publishers")
    gen.add_argument("--notifications", type=int, metavar="K", help="notifications per publisher")
    gen.add_argument(
        "--rate",
        type=float,
        default=RATE_PER_MINUTE,
        metavar="NPM",
        help="notifications per minute per publisher (default %(default)g)",
    )
    gen.add_argument(
        "--quotes",
        type=Path,
        metavar="DIR",
        help="real quotes: each publisher replays one symbol's PADRES quote "
        "file from DIR; default synthetic",
    )
    gen.add_argument("--seed", type=int, default=0, help="seed (workload, placement, latency)")
    hrp = p.add_argument_group(
        "high-rate publisher", "burst scenario of paper §7.3 (generated workloads only)"
    )
    hrp.add_argument(
        "--hrp-notifications",
        type=int,
        metavar="N",
        help="add a high-rate publisher HRP publishing N notifications",
    )
    hrp.add_argument(
        "--hrp-rate",
        type=float,
        default=HighRatePublisher.rate_per_minute,
        metavar="NPM",
        help="HRP notifications per minute (default %(default)g)",
    )
    hrp.add_argument(
        "--hrp-interest",
        type=float,
        default=HighRatePublisher.interest,
        metavar="F",
        help="fraction of subscribers following the HRP (default %(default)g)",
    )
    hrp.add_argument(
        "--hrp-start",
        type=float,
        default=HighRatePublisher.start,
        metavar="SECONDS",
        help="when the HRP starts (default %(default)g)",
    )
    hrp.add_argument(
        "--burst-placement",
        action="store_true",
        help="place the HRP's followers in clusters other than the HRP's, spread over all "
        "of them (the paper's burst set-up)",
    )
    hrp.add_argument(
        "--burst-inside",
        type=float,
        default=HighRatePublisher.inside,
        metavar="F",
        help="with --burst-placement: this fraction of the followers sits instead in the "
        "HRP's own cluster (the mixed regime; default %(default)g)",
    )


def add_congestion_options(p: argparse.ArgumentParser) -> None:
    """Injected or timed link congestion (DNR reacts to it, paper §6.3)."""
    congestion = p.add_argument_group("congestion", "links the simulator congests")
    pattern = congestion.add_mutually_exclusive_group()
    pattern.add_argument(
        "--overload",
        type=float,
        metavar="FRACTION",
        help="declare this fraction of directed iCOLs overloaded (seeded; "
        "no real queueing; dnr only)",
    )
    pattern.add_argument(
        "--overload-schedule",
        type=Path,
        metavar="FILE",
        help='JSON list of {"link": "src>dst", "from": t0, "until": t1} '
        "overload windows (dnr only)",
    )
    congestion.add_argument(
        "--capacity",
        type=float,
        metavar="MSGS_PER_S",
        help="timed: every link sends at most this many messages/s through a real output "
        "queue feeding the LST (limited bandwidth)",
    )
    congestion.add_argument(
        "--broker-capacity",
        type=float,
        metavar="MSGS_PER_S",
        help="timed: every broker sends at most this many messages/s over all its links "
        "together (an overwhelmed broker)",
    )
    congestion.add_argument(
        "--window",
        type=float,
        default=DEFAULT_LST_WINDOW,
        metavar="SECONDS",
        help=f"LST window Δt (default {DEFAULT_LST_WINDOW})",
    )
    congestion.add_argument(
        "--queue-threshold",
        type=int,
        default=DEFAULT_QUEUE_THRESHOLD,
        metavar="Q",
        help=f"queue length that marks a link overloaded (default {DEFAULT_QUEUE_THRESHOLD})",
    )
    congestion.add_argument(
        "--order",
        choices=ORDERS,
        default=DEFAULT_ORDER,
        help='timed: DNR\'s "least loaded" order: ce = CE, then queue length (the '
        "paper's); bluedove = estimated processing time (q + 1)/μ, q extrapolated between "
        f"LST windows (default {DEFAULT_ORDER})",
    )


def add_failure_options(p: argparse.ArgumentParser) -> None:
    """``--fail``, ``--fail-link``, ``--stall`` and ``--fail-schedule`` (DESIGN §7)."""
    group = p.add_argument_group(
        "failures", "times in seconds from the first publication; RESTART_T / UP_T optional"
    )
    group.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="BROKER@T[:RESTART_T]",
        help="kill BROKER at T (and restart it empty at RESTART_T); repeatable",
    )
    group.add_argument(
        "--fail-link",
        action="append",
        default=[],
        metavar="A-B@T[:UP_T]",
        help="cut the link between neighbours A and B at T (until UP_T); repeatable",
    )
    group.add_argument(
        "--stall",
        action="append",
        default=[],
        metavar="BROKER@T:RESUME_T",
        help="stop BROKER's process at T and resume it at RESUME_T, as a long GC pause or "
        "VM hiccup would (in the simulator it runs nothing meanwhile); repeatable",
    )
    group.add_argument(
        "--fail-schedule",
        type=Path,
        metavar="FILE",
        help="failures, one per line: 'broker BROKER@T[:RESTART_T]', 'link A-B@T[:UP_T]' "
        "or 'stall BROKER@T:RESUME_T'",
    )


def failures_from_args(args: argparse.Namespace, scot: Scot) -> list[Failure]:
    """The failures ``--fail``, ``--fail-link``, ``--stall`` and ``--fail-schedule``
    describe, checked against ``scot``."""
    try:
        failures = [parse_failure(text, link=False) for text in args.fail]
        failures += [parse_failure(text, link=True) for text in args.fail_link]
        failures += [parse_failure(text, link=False, stall=True) for text in args.stall]
        if args.fail_schedule is not None:
            failures += read_schedule(args.fail_schedule)
    except OSError as exc:
        raise UsageError(f"cannot read {args.fail_schedule}: {exc.strerror}") from None
    except FailureSpecError as exc:
        raise UsageError(str(exc)) from None
    for failure in failures:
        for end in failure.ends:
            if end not in scot.brokers:
                raise UsageError(f"failure names {end!r}, which is not a broker of {scot.name}")
        if len(failure.ends) == 2 and not scot.graph.has_edge(*failure.ends):
            raise UsageError(f"{failure.ends[0]} and {failure.ends[1]} are not neighbours")
    return failures


def load_scot(args: argparse.Namespace) -> Scot:
    """The topology named by ``--topology`` or ``--preset``."""
    return load_topology(args.topology) if args.topology else build_preset(args.preset)


def workload_from_args(args: argparse.Namespace, scot: Scot) -> Workload:
    """Read ``--workload`` or generate one from ``--subscribers/--publishers/...``."""
    if args.workload is not None:
        for name in ("publishers", "notifications", "hrp_notifications", "quotes"):
            if getattr(args, name) is not None:
                raise UsageError(
                    f"--{name.replace('_', '-')} only applies to a generated "
                    "workload, not with --workload"
                )
        workload = read_workload(args.workload)
    else:
        if args.publishers is None or args.notifications is None:
            raise UsageError(
                "a generated workload needs --subscribers, --publishers and --notifications"
            )
        hrp = None
        if args.hrp_notifications is not None:
            hrp = HighRatePublisher(
                args.hrp_notifications,
                args.hrp_rate,
                args.hrp_interest,
                args.hrp_start,
                burst_placement=args.burst_placement,
                inside=args.burst_inside,
            )
        workload = generate_workload(
            scot,
            subscribers=args.subscribers,
            publishers=args.publishers,
            notifications=args.notifications,
            seed=args.seed,
            rate_per_minute=args.rate,
            hrp=hrp,
            quotes_from=args.quotes,
        )

    workload.check_topology(scot)
    return workload


def link_model(args: argparse.Namespace, scot: Scot) -> LinkModel | None:
    """The simulated links the congestion options ask for (None: free links)."""
    if args.window <= 0 or args.queue_threshold < 1:
        raise UsageError("--window must be > 0 and --queue-threshold ≥ 1")
    if (args.overload is not None or args.overload_schedule) and args.mode != "dnr":
        raise UsageError("--overload and --overload-schedule only affect --mode dnr")
    service = getattr(args, "service", None) is not None
    timed = args.capacity is not None or args.broker_capacity is not None or service
    if timed and (args.overload is not None or args.overload_schedule):
        raise UsageError(
            "choose injected (--overload*) or timed (--*capacity, --service) congestion"
        )
    if args.order != DEFAULT_ORDER and not timed:
        raise UsageError(
            f"--order {args.order} needs timed links (--capacity, --broker-capacity or "
            "--service): only they have queues to measure"
        )
    if args.overload is not None:
        if not 0 <= args.overload <= 1:
            raise UsageError(f"--overload must be within 0..1, got {args.overload}")
        return InjectedCongestion.random_icols(scot, args.overload, args.seed)
    if args.overload_schedule is not None:
        try:
            entries = json.loads(args.overload_schedule.read_text())
            return InjectedCongestion.from_schedule(entries, scot, args.seed)
        except OSError as exc:
            raise UsageError(f"cannot read {args.overload_schedule}: {exc.strerror}") from None
        except (json.JSONDecodeError, ValueError) as exc:
            raise UsageError(f"{args.overload_schedule}: {exc}") from None
    if timed:
        for name in ("capacity", "broker_capacity"):
            value = getattr(args, name)
            if value is not None and value <= 0:
                raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
        return TimedLinks.uniform(
            scot,
            args.capacity,
            args.broker_capacity,
            window=args.window,
            queue_threshold=args.queue_threshold,
            order=args.order,
            receiver_paced=service,
        )
    return None


def cmd_sim(args: argparse.Namespace) -> int:
    """Validate everything, run the simulation, print the report (with the run's time
    and the process's peak memory)."""
    started = time.perf_counter()
    scot = load_scot(args)
    workload = workload_from_args(args, scot)
    if args.latency < 0 or args.jitter < 0:
        raise UsageError("latency and jitter must be ≥ 0")
    failures = failures_from_args(args, scot)
    if args.detection < 0 or args.retain < 0:
        raise UsageError("--detection and --retain must be ≥ 0")
    try:
        service = ServiceModel.load(args.service) if args.service is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if service is not None and failures:
        raise UsageError("failures are not simulated with --service")
    sim = Simulator(
        scot,
        args.mode,
        seed=args.seed,
        links=link_model(args, scot),
        latency=LatencyModel(args.latency, args.jitter),
        service=service,
        covering=args.covering,
    )
    sim.replay(workload, failures, detection=args.detection, retain=args.retain)
    report: dict[str, Any] = {"topology": scot.name, **sim.report()}
    report["run_time"] = time.perf_counter() - started
    report["peak_memory"] = peak_memory()
    if args.deliveries is not None:
        write_deliveries(args.deliveries, sim.ledger.deliveries())
    print(render_report(report, as_json=args.json, details=args.details))
    return 0


def peak_memory() -> int:
    """Peak resident memory of this process so far, bytes (``getrusage``'s max RSS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
