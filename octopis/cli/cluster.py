"""``octopis run``, ``up``, ``down``, ``pub`` and ``sub``: broker processes from a shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from octopis.cli.errors import UsageError
from octopis.cli.report import print_report, write_deliveries
from octopis.cli.sim import add_topology_options, add_workload_options, workload_from_args
from octopis.cluster.launcher import STATE_FILE, LocalCluster, prepare_topology, stop_pids
from octopis.core import MODES
from octopis.topology import load_topology
from octopis.transport.settings import load_settings

DEFAULT_CLUSTER_DIR = Path(".octopis")


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``run``, ``up``, ``down``, ``pub`` and ``sub``."""
    run = commands.add_parser(
        "run",
        help="run a workload on one broker process per SCOT node and report",
        description="Start one broker process per node (ZeroMQ over TCP on this machine), "
        "attach the workload's subscribers and publishers, wait for the subscription "
        "broadcast to settle, replay publications at their times, wait for delivery, print "
        "the report (message counts, exactly-once accounting, delays) and stop every "
        "process, also on Ctrl-C or an error.",
    )
    add_topology_options(run)
    run.add_argument("--mode", required=True, choices=MODES, help="routing algorithm")
    add_workload_options(run)
    run.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="multiply workload times by F (0.1 replays 10x faster; default 1)",
    )
    run.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="broker settings TOML (LST window, Q, link capacities)",
    )
    run.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="logs and generated files (default runs/<time>-<mode>)",
    )
    run.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="give up waiting for deliveries after this long without one",
    )
    run.add_argument("--json", action="store_true", help="print the report as JSON")
    run.add_argument(
        "--deliveries",
        type=Path,
        metavar="FILE",
        help="write one JSON line per delivery (subscriber, publisher, seq)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument(
        "--timeline",
        type=float,
        metavar="SECONDS",
        help="sample every broker's output queues this often while publishing; the report "
        "gains 'timeline' and 'max_delay_per_1000'",
    )
    run.set_defaults(func=cmd_run)

    up = commands.add_parser(
        "up",
        help="start one broker process per node and return when all are connected",
        description="Start the brokers of a topology file in the background; `octopis down` "
        "stops them.",
    )
    up.add_argument("topology", type=Path, metavar="FILE", help="topology JSON")
    up.add_argument("--mode", default="snr", choices=MODES)
    up.add_argument("--config", type=Path, metavar="FILE", help="broker settings TOML")
    up.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_CLUSTER_DIR,
        metavar="DIR",
        help=f"state and logs (default {DEFAULT_CLUSTER_DIR})",
    )
    up.add_argument("--timeout", type=float, default=180.0, metavar="SECONDS")
    up.set_defaults(func=cmd_up)

    down = commands.add_parser(
        "down",
        help="stop the brokers `octopis up` started",
        description="Stop every broker recorded in the run directory.",
    )
    down.add_argument("--run-dir", type=Path, default=DEFAULT_CLUSTER_DIR, metavar="DIR")
    down.set_defaults(func=cmd_down)

    sub = commands.add_parser(
        "sub",
        help="subscribe at a broker and print notifications",
        description="Print each matching notification as a JSON line.",
    )
    _client_options(sub)
    sub.add_argument("filter", help="subscription, e.g. \"[class,eq,'STOCK'],[close,>,20]\"")
    sub.add_argument("--count", type=int, metavar="N", help="exit after N notifications")
    sub.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="exit after this long without a notification",
    )
    sub.set_defaults(func=cmd_sub)

    pub = commands.add_parser(
        "pub",
        help="publish notifications at a broker",
        description="Publish each PUBLICATION argument, or each line of "
        "standard input when none is given (PADRES syntax).",
    )
    _client_options(pub)
    pub.add_argument(
        "publications",
        nargs="*",
        metavar="PUBLICATION",
        help="e.g. \"[class,'STOCK'],[symbol,'MSFT'],[close,27.9]\"",
    )
    pub.set_defaults(func=cmd_pub)


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--topology",
        type=Path,
        metavar="FILE",
        help=f"topology JSON (default: the one `octopis up` recorded in {DEFAULT_CLUSTER_DIR})",
    )
    p.add_argument("--broker", required=True, metavar="ID", help="broker to attach to")
    p.add_argument("--name", help="client name (default: a unique one)")


def cmd_run(args: argparse.Namespace) -> int:
    """``octopis run``."""
    from octopis.cluster.runner import RunOptions, WorkloadRun

    run_dir = args.run_dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{args.mode}"
    if args.time_scale <= 0:
        raise UsageError("--time-scale must be positive")
    settings = load_settings(args.config)
    scot, path = prepare_topology(run_dir, topology=args.topology, preset=args.preset)
    workload = workload_from_args(args, scot)
    options = RunOptions(
        mode=args.mode,
        run_dir=run_dir,
        settings=settings,
        time_scale=args.time_scale,
        drain_timeout=args.drain_timeout,
        progress=not args.no_progress and sys.stderr.isatty(),
        sample_every=args.timeline,
    )

    run = WorkloadRun(scot, path, workload, options)
    report: dict[str, Any] = {"topology": scot.name, **run.run()}
    (run_dir / "report.json").write_text(json.dumps(report, indent=1))
    if args.deliveries is not None:
        write_deliveries(
            args.deliveries,
            (
                {"subscriber": s, "publisher": p, "seq": q}
                for (s, p, q), count in sorted(run.ledger.received.items())
                for _ in range(count)
            ),
        )
    print(json.dumps(report, indent=1) if args.json else print_report(report))
    return 0 if report["lost"] == report["duplicates"] == 0 else 1


def cmd_up(args: argparse.Namespace) -> int:
    """``octopis up``."""
    scot = load_topology(args.topology)
    state = args.run_dir / STATE_FILE
    if state.exists():
        raise UsageError(
            f"{state} exists: brokers may still run; `octopis down --run-dir {args.run_dir}` first"
        )
    cluster = LocalCluster(
        scot, args.topology.resolve(), args.mode, args.run_dir, load_settings(args.config)
    )
    cluster.spawn()
    try:
        seconds = asyncio.run(_ready(cluster, args.timeout))
    except BaseException:
        cluster.stop()
        raise
    cluster.write_state()
    print(
        f"{len(scot.brokers)} brokers of {scot.name} up ({args.mode}) in {seconds:.1f} s; "
        f"logs in {args.run_dir / 'logs'}; stop with `octopis down --run-dir {args.run_dir}`"
    )
    return 0


async def _ready(cluster: LocalCluster, timeout: float) -> float:
    try:
        return await cluster.wait_ready(timeout)
    finally:
        await cluster.close_control()


def cmd_down(args: argparse.Namespace) -> int:
    """``octopis down``."""
    state_path = args.run_dir / STATE_FILE
    try:
        state = json.loads(state_path.read_text())
    except OSError:
        raise UsageError(f"no running cluster recorded in {state_path}") from None
    killed = stop_pids(state["pids"])
    state_path.unlink()
    note = f" ({len(killed)} killed after the grace period)" if killed else ""
    print(f"stopped {len(state['pids'])} brokers{note}")
    return 0


def _endpoint(args: argparse.Namespace) -> str:
    path = args.topology
    if path is None:
        try:
            path = Path(json.loads((DEFAULT_CLUSTER_DIR / STATE_FILE).read_text())["topology"])
        except OSError:
            raise UsageError("no --topology and no cluster started by `octopis up` here") from None
    scot = load_topology(path)
    if args.broker not in scot.brokers:
        raise UsageError(f"topology {scot.name} has no broker {args.broker!r}")
    return scot.brokers[args.broker].client_endpoint


def cmd_sub(args: argparse.Namespace) -> int:
    """``octopis sub``."""
    from octopis.client import Subscriber
    from octopis.filters import parse_subscription

    subscription = parse_subscription(args.filter)
    endpoint = _endpoint(args)

    async def go() -> None:
        sub = await Subscriber.connect(endpoint, args.name or f"sub-{time.time_ns()}")
        stream = await sub.subscribe(subscription)
        print(json.dumps({"subscribed": stream.sub_id}), flush=True)
        seen = 0
        try:
            while args.count is None or seen < args.count:
                try:
                    n = await stream.get(args.timeout)
                except TimeoutError:
                    break
                seen += 1
                print(
                    json.dumps(
                        {
                            "publisher": n.publisher,
                            "seq": n.seq,
                            "delay": n.received_at - n.published_at,
                            "publication": n.publication,
                        }
                    ),
                    flush=True,
                )
        finally:
            await sub.unsubscribe(stream)
            await sub.close()

    asyncio.run(go())
    return 0


def cmd_pub(args: argparse.Namespace) -> int:
    """``octopis pub``."""
    from octopis.client import Publisher
    from octopis.filters import parse_publication

    lines = args.publications or [line for line in sys.stdin if line.strip()]
    publications = [parse_publication(line) for line in lines]
    endpoint = _endpoint(args)

    async def go() -> None:
        pub = await Publisher.connect(endpoint, args.name or f"pub-{time.time_ns()}")
        try:
            for publication in publications:
                seq = await pub.publish(publication)
                print(json.dumps({"published": seq}), flush=True)
        finally:
            await pub.close()

    asyncio.run(go())
    return 0
