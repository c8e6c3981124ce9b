"""``octopis run``, ``up``, ``down``, ``status``, ``restart`` and ``monitor``: broker
processes from a shell. Each command imports what it uses when it runs,
so that the others start fast."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from octopis.cli.errors import UsageError
from octopis.cli.options import add_overlay_options, cluster_of, keys_of, overlay_of
from octopis.overlay import DEFAULT_RUN_DIR, STATE_FILE, read_state

if TYPE_CHECKING:
    from octopis.cluster.launcher import LocalCluster
    from octopis.topology import Scot

DEFAULT_MODE = "dnr"


def default_client_workers() -> int:
    """``octopis run``'s client worker processes: one per core beyond the first two (at
    most 8), so that the clients, not one event loop, keep pace with the overlay; none on
    a machine of two cores or fewer, where the brokers need both (paper75 with one
    worker on two cores: 14 links falsely declared down during the subscription
    broadcast, against 1 with the clients in the run's process)."""
    return max(0, min(8, (os.cpu_count() or 2) - 2))


def _run(run: argparse.ArgumentParser) -> None:
    from octopis.balance.plans import PLACEMENTS
    from octopis.balance.policy import PLANS, BalanceOptions
    from octopis.cli.sim import add_failure_options, add_topology_options, add_workload_options
    from octopis.defaults import CLIENT_LIVENESS, DRAIN_TIMEOUT

    run.description = (
        "Start one broker process per node (ZeroMQ over TCP on this machine), "
        "attach the workload's subscribers and publishers, wait for the subscription "
        "broadcast to settle, replay publications at their times, wait for delivery, print "
        "the report (message counts, exactly-once accounting, delays) and stop every "
        "process, also on Ctrl-C or an error."
    )
    add_topology_options(run)
    _broker_options(run, None, "logs and generated files (default runs/<time>-<mode>)")
    add_workload_options(run)
    add_failure_options(run)
    run.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="multiply workload times by F (0.1 replays 10x faster; default 1)",
    )
    run.add_argument(
        "--drain-timeout",
        type=float,
        default=DRAIN_TIMEOUT,
        metavar="SECONDS",
        help="give up waiting for deliveries after this long without one (default %(default)g)",
    )
    run.add_argument(
        "--client-workers",
        type=int,
        default=default_client_workers(),
        metavar="N",
        help="spread the clients over N worker processes, by broker, so that one process's "
        "event loop does not set the pace of what is measured; 0: in this process "
        f"(default here {default_client_workers()}: one per core beyond the first two, at "
        "most 8)",
    )
    run.add_argument(
        "--client-liveness",
        type=float,
        default=CLIENT_LIVENESS,
        metavar="SECONDS",
        help="seconds of a broker's silence before a client connection fails over to the "
        "next broker (default %(default)g); raise it on a machine so loaded that client "
        "processes stall",
    )
    run.add_argument(
        "--attach",
        action="store_true",
        help="use the overlay already running (`octopis up`, on this machine or on several "
        "hosts) instead of starting brokers: needs --topology, and --keys DIR unless the "
        "brokers run --insecure; they are left running and the report counts only this run "
        "(--fail and --stall need brokers started here)",
    )
    run.add_argument("--json", action="store_true", help="print the report as JSON")
    run.add_argument(
        "--details",
        action="store_true",
        help="after the summary, every figure of the report as a table",
    )
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
    run.add_argument(
        "--balance",
        choices=PLANS,
        metavar="PLAN",
        help="run the balancer while publishing with this plan (ldm, shuffle, high-load, "
        "low-load; thresholds at their defaults, see `octopis balance run --help`): "
        "subscribers move make-before-break; the report gains 'balance' (every decision, "
        "the load of every broker over time, delay before the first move and after the "
        "last)",
    )
    run.add_argument(
        "--balance-interval",
        type=float,
        default=BalanceOptions().interval,
        metavar="SECONDS",
        help="with --balance: seconds between its rounds, at least the brokers' load window "
        "(default %(default)g)",
    )
    run.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="nearest",
        help="where subscribers attach (BAD §5.1): nearest = the workload's broker "
        "(default); round_robin and random over all brokers; least_loaded = the broker of "
        "the least delivery load inside the workload broker's cluster, read from the "
        "running brokers (each newcomer counted until loads are read again)",
    )
    run.set_defaults(func=cmd_run)


def _up(up: argparse.ArgumentParser) -> None:
    up.description = (
        "Start the brokers of a topology file in the background and record them in the run "
        "directory, where every other command finds them; `octopis down` stops them."
    )
    up.add_argument("topology", type=Path, metavar="FILE", help="topology JSON")
    _broker_options(
        up,
        DEFAULT_RUN_DIR,
        f"the run directory to write: state, keys and logs (default {DEFAULT_RUN_DIR})",
    )
    up.add_argument(
        "--host",
        metavar="NAME",
        help="start only the brokers the topology places on host NAME (`octopis-topology "
        "build --hosts`): run `octopis up --host NAME --keys DIR` on each machine; a host's "
        "brokers are ready once their neighbours on the other hosts are up, so start the "
        "hosts within --timeout of each other",
    )
    up.add_argument(
        "--stomp",
        action="store_true",
        help="the brokers also serve STOMP clients (TCP and WebSocket) on the topology's "
        "stomp endpoints (`octopis-topology build --stomp-base-port`); off by default",
    )
    _timeout_option(up, 180.0, "give up (and stop them) if the brokers are not all ready by then")
    up.set_defaults(func=cmd_up)


def _down(down: argparse.ArgumentParser) -> None:
    down.description = (
        "Stop every broker recorded in the run directory (their processes on this host); "
        "with --topology, ask every broker of the topology to stop over its control RPC "
        "(the admin key of --keys)."
    )
    add_overlay_options(down)
    down.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long the brokers have to exit after SIGTERM before they are killed "
        "(default 10); with --topology, how long each has to answer",
    )
    down.set_defaults(func=cmd_down)


def _status(status: argparse.ArgumentParser) -> None:
    status.description = (
        "Ask every broker (or one) of a running overlay over its control RPC: "
        "pid, incarnation, readiness, each link's state and queue, routing-table size, "
        "memory, load ratio, retention (kept, MB, oldest), durable records, client "
        "connections (SDK and STOMP alike; stomp: those over STOMP) and error counters. "
        "A broker that does not answer is shown as unreachable."
    )
    add_overlay_options(status)
    status.add_argument("--broker", metavar="ID", help="only this broker, with its links")
    status.add_argument(
        "--table", action="store_true", help="with --broker: list its routing-table entries"
    )
    status.add_argument("--json", action="store_true", help="print JSON (stats of each broker)")
    status.add_argument(
        "--timeout", type=float, default=2.0, metavar="SECONDS", help="per broker (default 2)"
    )
    status.set_defaults(func=cmd_status)


def _restart(restart: argparse.ArgumentParser) -> None:
    restart.description = (
        "Start broker ID again with the topology, mode and settings it had "
        "(stopping it first if it still runs) and wait until it is ready: its neighbours "
        "see a new incarnation and hand it their state."
    )
    restart.add_argument("broker", metavar="ID", help="the broker to restart")
    add_overlay_options(restart)
    _timeout_option(restart, 60.0, "give up if the broker is not ready by then")
    restart.set_defaults(func=cmd_restart)


def _monitor(monitor: argparse.ArgumentParser) -> None:
    monitor.description = (
        "Serve a web page that draws the SCOT (clusters x regions, aCOLs and "
        "iCOLs), colours each link by its state and shows each broker's rates, updated live "
        "from the brokers' metrics endpoints (no keys needed); /snapshot and /topology give "
        "the same data as JSON. Runs until interrupted."
    )
    add_overlay_options(monitor, keys_needed=False)
    monitor.add_argument("--host", default="127.0.0.1", help="address to serve on")
    monitor.add_argument("--port", type=int, default=8700, help="port to serve on (8700)")
    monitor.add_argument(
        "--interval", type=float, default=0.5, metavar="SECONDS", help="scrape period (0.5)"
    )
    monitor.set_defaults(func=cmd_monitor)


PARSERS = {
    "run": _run,
    "up": _up,
    "down": _down,
    "status": _status,
    "restart": _restart,
    "monitor": _monitor,
}
"""Each command of this module → what adds its description and arguments."""


def configure(command: str, parser: argparse.ArgumentParser) -> None:
    """Give ``command``'s parser its description and arguments."""
    PARSERS[command](parser)


def _broker_options(p: argparse.ArgumentParser, run_dir: Path | None, run_dir_help: str) -> None:
    """``--mode``, ``--config``, ``--run-dir``, ``--insecure`` and ``--keys``: how the
    brokers of an overlay run."""
    from octopis.core import MODES

    p.add_argument(
        "--mode",
        choices=MODES,
        help=f"routing algorithm (default {DEFAULT_MODE}; `run --attach`: the overlay's)",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="broker settings TOML (LST window, Q, least-loaded order, capacities, "
        "heartbeats, limits)",
    )
    p.add_argument("--run-dir", type=Path, default=run_dir, metavar="DIR", help=run_dir_help)
    p.add_argument(
        "--insecure",
        action="store_true",
        help="run the brokers without CurveZMQ: anyone who reaches their ports may publish, "
        "subscribe and stop them (default: key pairs in <run-dir>/keys, mode 0600, used by "
        "every octopis command on this run directory)",
    )
    p.add_argument(
        "--keys",
        type=Path,
        metavar="DIR",
        help="a deployment's keys directory (`octopis-topology keys`) to use instead of new "
        "pairs in <run-dir>/keys: brokers on several hosts must share one",
    )


def _security(args: argparse.Namespace) -> dict[str, Any]:
    """``secure`` and ``keys`` of an overlay command's ``--insecure`` and ``--keys``."""
    if args.keys is not None and args.insecure:
        raise UsageError("--keys and --insecure exclude each other")
    return {"secure": not args.insecure, "keys": args.keys.resolve() if args.keys else None}


def _timeout_option(p: argparse.ArgumentParser, default: float, what: str) -> None:
    p.add_argument(
        "--timeout",
        type=float,
        default=default,
        metavar="SECONDS",
        help=f"{what} (default {default:g})",
    )


def cmd_run(args: argparse.Namespace) -> int:
    """``octopis run``."""
    from octopis.balance.policy import BalanceOptions
    from octopis.cli.report import render_report, write_deliveries
    from octopis.cli.sim import failures_from_args, workload_from_args
    from octopis.cluster.launcher import prepare_topology
    from octopis.cluster.runner import RunOptions, WorkloadRun
    from octopis.settings import load_settings

    mode = args.mode or (None if args.attach else DEFAULT_MODE)
    run_dir = (
        args.run_dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{mode or 'attached'}"
    )
    if args.time_scale <= 0:
        raise UsageError("--time-scale must be positive")
    if args.client_workers < 0:
        raise UsageError("--client-workers must be 0 or more")
    if args.client_liveness <= 0:
        raise UsageError("--client-liveness must be positive")
    if args.attach and args.topology is None:
        raise UsageError("--attach needs the running overlay's --topology FILE")
    settings = load_settings(args.config)
    scot, path = prepare_topology(run_dir, topology=args.topology, preset=args.preset)
    workload = workload_from_args(args, scot)
    failures = failures_from_args(args, scot)
    if any(len(f.ends) == 2 for f in failures):
        raise UsageError(
            "octopis run kills and restarts broker processes (--fail) and stops and "
            "resumes them (--stall); cutting a link between processes is not supported "
            "(use octopis sim --fail-link)"
        )
    options = RunOptions(
        mode=mode,
        run_dir=run_dir,
        settings=settings,
        time_scale=args.time_scale,
        drain_timeout=args.drain_timeout,
        progress=not args.no_progress and sys.stderr.isatty(),
        sample_every=args.timeline,
        failures=failures,
        log_format=args.log_format,
        attach=args.attach,
        client_workers=args.client_workers,
        client_liveness=args.client_liveness,
        balance=None
        if args.balance is None
        else BalanceOptions(args.balance, interval=args.balance_interval),
        placement=args.placement,
        seed=args.seed,
        **_security(args),
    )

    run = WorkloadRun(scot, path, workload, options)
    report: dict[str, Any] = {"topology": scot.name, **run.run()}
    (run_dir / "report.json").write_text(json.dumps(report, indent=1))
    if args.deliveries is not None:
        write_deliveries(args.deliveries, run.ledger.deliveries())
    print(render_report(report, as_json=args.json, details=args.details))
    verdict = report["failures"].get("host_alive", report)
    return 0 if verdict["lost"] == verdict["duplicates"] == 0 else 1


def cmd_monitor(args: argparse.Namespace) -> int:
    """``octopis monitor``."""
    from octopis.monitor import serve_monitor

    if args.interval <= 0:
        raise UsageError(f"--interval must be positive, got {args.interval}")
    scot = overlay_of(args).scot
    if not any(b.metrics_endpoint for b in scot.brokers.values()):
        raise UsageError(f"topology {scot.name} names no metrics endpoint to read")
    serve_monitor(scot, args.host, args.port, args.interval)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """``octopis up``."""
    import asyncio

    from octopis.cluster.launcher import LocalCluster
    from octopis.settings import load_settings
    from octopis.topology import load_topology

    scot = load_topology(args.topology)
    state = args.run_dir / STATE_FILE
    if state.exists():
        raise UsageError(
            f"{state} exists: brokers may still run; `octopis down --run-dir {args.run_dir}` first"
        )
    security = _security(args)
    _refuse_held_ports(scot, scot.brokers_on(args.host) if args.host else list(scot.brokers))
    if args.host is not None and security["secure"] and security["keys"] is None:
        raise UsageError(
            "brokers on several hosts share one set of keys: make it with `octopis-topology "
            f"keys {args.topology} -o DIR`, copy DIR to every host and pass --keys DIR "
            "(or --insecure)"
        )
    mode = args.mode or DEFAULT_MODE
    cluster = LocalCluster(
        scot,
        args.topology.resolve(),
        mode,
        args.run_dir,
        load_settings(args.config),
        log_format=args.log_format,
        host=args.host,
        stomp=args.stomp,
        **security,
    )
    cluster.spawn()
    try:
        seconds = asyncio.run(_ready(cluster, args.timeout))
    except BaseException:
        cluster.stop()
        raise
    cluster.write_state()
    where = f" on host {args.host}" if args.host else ""
    print(
        f"{len(cluster.local)} brokers of {scot.name}{where} up ({mode}) in {seconds:.1f} s; "
        f"logs in {args.run_dir / 'logs'}; stop with `octopis down --run-dir {args.run_dir}`"
    )
    return 0


def _refuse_held_ports(scot: Scot, ids: list[str]) -> None:
    """:class:`UsageError` naming each port of brokers ``ids`` that another process holds
    (and that process), before any broker starts."""
    from octopis.cluster.launcher import held_ports

    if held := held_ports(scot, ids):
        shown = "; ".join(held[:5]) + (f"; and {len(held) - 5} more" if len(held) > 5 else "")
        raise UsageError(
            f"{len(held)} port(s) of topology {scot.name} are held: {shown}. Stop that "
            "process (`octopis down --run-dir DIR` if it is a broker of an earlier `octopis "
            "up`) or build the topology on other ports (`octopis-topology build --base-port`)"
        )


async def _ready(cluster: LocalCluster, timeout: float, ids: list[str] | None = None) -> float:
    try:
        return await cluster.wait_ready(timeout, ids)
    finally:
        await cluster.close_control()


def cmd_status(args: argparse.Namespace) -> int:
    """``octopis status``."""
    import asyncio

    cluster, pids = cluster_of(args)
    ids = list(cluster.scot.brokers)
    if args.broker is not None:
        if args.broker not in cluster.scot.brokers:
            raise UsageError(f"topology {cluster.scot.name} has no broker {args.broker!r}")
        ids = [args.broker]
    elif args.table:
        raise UsageError("--table needs --broker ID")
    method = "table" if args.table else "stats"
    answers = asyncio.run(cluster.ask(ids, method, args.timeout))
    if args.json:
        print(json.dumps({b: answers[b] for b in ids}, indent=1))
        return 0
    if args.table:
        entries = answers[args.broker]
        if entries is None:
            raise UsageError(f"broker {args.broker} does not answer")
        for sub_id, e in sorted(entries.items()):
            print(f"{sub_id}  {e['last_hop']}  cluster {e['cluster']}  {e['filter']}")
        print(f"{len(entries)} entries")
        return 0
    print(format_status(ids, answers, pids, detailed=args.broker is not None))
    return 0 if all(answers[b] is not None for b in ids) else 1


def _retention_columns(retention: dict[str, Any], now: float) -> str:
    """``kept keptMB oldest durable``: the store's publications, megabytes and the age of
    the oldest (``-``: retention off), durable records kept (``/away`` whose client is
    away)."""
    durable = f"{retention.get('durable.kept', 0)}/{retention.get('durable.away', 0)}"
    if "retention.rows" not in retention:
        return f"{'-':>7} {'-':>6} {'-':>6} {durable:>7}"
    oldest = retention.get("retention.oldest")
    age = _age(now - oldest) if oldest is not None else "-"
    return (
        f"{retention['retention.rows']:>7} {retention['retention.bytes'] / 2**20:>6.1f} "
        f"{age:>6} {durable:>7}"
    )


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def format_status(
    ids: list[str], answers: dict[str, Any], pids: dict[str, int], *, detailed: bool
) -> str:
    """A table of brokers (and, ``detailed``, of each link) for people."""
    lines = [
        f"{'broker':<8} {'pid':>7} {'ready':<5} {'links':>5} {'table':>6} {'queued':>6} "
        f"{'MB':>5} {'LR':>5} {'kept':>7} {'keptMB':>6} {'oldest':>6} {'durable':>7} "
        f"{'clients':>7} {'stomp':>5}  notes"
    ]
    now = time.time()
    for b in ids:
        stats = answers[b]
        if stats is None:
            lines.append(
                f"{b:<8} {pids.get(b, 0):>7} {'-':<5} {'-':>5} {'-':>6} {'-':>6} {'-':>5} "
                f"{'-':>5} {'-':>7} {'-':>6} {'-':>6} {'-':>7} {'-':>7} {'-':>5}  unreachable"
            )
            continue
        links = stats["links"]
        down = sorted(n for n, link in links.items() if link["state"] != "up")
        errors = {k: v for k, v in stats["counters"].items() if k.endswith("errors") and v}
        notes = [f"down: {', '.join(down)}"] if down else []
        notes += [f"{k} {v}" for k, v in sorted(errors.items())]
        if stats["missing_shares"]:
            notes.append(f"waiting for the shares of {', '.join(stats['missing_shares'])}")
        queued = sum(link["queue_length"] for link in links.values())
        lines.append(
            f"{b:<8} {stats['pid']:>7} {'yes' if stats['ready'] else 'no':<5} "
            f"{stats['links_up']:>2}/{stats['neighbours']:<2} {stats['routing_table_size']:>6} "
            f"{queued:>6} {stats['memory_rss'] / 2**20:>5.0f} {stats['load']['load_ratio']:>5.2f} "
            f"{_retention_columns(stats['retention'], now)} {stats['client_connections']:>7} "
            f"{stats['stomp_connections']:>5}  {'; '.join(notes)}"
        )
        if detailed:
            lines.append(f"  incarnation {stats['incarnation']:x}, up {stats['uptime']:.0f} s")
            for name, link in links.items():
                lines.append(
                    f"  -> {name:<8} {link['state']:<4} queue {link['queue_length']:>5}  "
                    f"silent {link['silent']:.2f} s  restarts {link['restarts']}"
                )
            for d in stats.get("durables", ()):
                state = (
                    "attached"
                    if d["attached"]
                    else f"client away for {_age(now - (d['away_since'] or now))}"
                )
                lines.append(
                    f"  durable {d['name']} of {d['client']}: {state}, "
                    f"{d['publishers']} publishers acknowledged"
                )
    return "\n".join(lines)


def cmd_restart(args: argparse.Namespace) -> int:
    """``octopis restart``."""
    import asyncio

    from octopis.cluster.launcher import stop_pids

    cluster, pids = cluster_of(
        args, recorded="restart starts the broker with the mode and settings `octopis up` recorded"
    )
    if args.broker not in cluster.scot.brokers:
        raise UsageError(f"topology {cluster.scot.name} has no broker {args.broker!r}")
    if args.broker not in cluster.local:
        raise UsageError(
            f"{args.broker} runs on host {cluster.scot.brokers[args.broker].host}, not on "
            f"{cluster.host}: restart it there"
        )
    if args.broker in pids:
        stop_pids({args.broker: pids[args.broker]})
    started = time.monotonic()
    cluster.spawn_one(args.broker)
    cluster.write_state(pids)
    asyncio.run(_ready(cluster, args.timeout, [args.broker]))
    print(
        f"{args.broker} restarted (pid {cluster.processes[args.broker].pid}) and ready in "
        f"{time.monotonic() - started:.1f} s"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """``octopis down``."""
    if args.topology is not None:
        return _shut_down(args)
    from octopis.cluster.launcher import stop_pids

    keys_of(args)  # refuses --keys without --topology, as every command does
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    state = read_state(args.run_dir)
    killed = stop_pids(state["pids"], args.timeout)
    (args.run_dir / STATE_FILE).unlink()
    if killed:
        print(
            f"{', '.join(killed)} did not exit within {args.timeout:g} s of SIGTERM: killed",
            file=sys.stderr,
        )
    held = _ports_left(Path(state["topology"]), list(state["pids"]))
    print(f"stopped {len(state['pids'])} brokers: every process has exited")
    if held:
        print(f"ports still held: {'; '.join(held)}", file=sys.stderr)
    return 1 if held else 0


PORTS_FREED = 5.0
"""Seconds ``octopis down`` waits for the ports of brokers that have exited to bind again."""


def _ports_left(topology: Path, ids: list[str]) -> list[str]:
    """The ports of brokers ``ids`` still held :data:`PORTS_FREED` seconds after they
    exited (see :func:`held_ports`); empty at once when all are free, or when the
    topology file is gone."""
    from octopis.cluster.launcher import held_ports
    from octopis.topology import load_topology

    if not topology.exists():
        return []
    scot = load_topology(topology)
    ids = [b for b in ids if b in scot.brokers]
    deadline = time.monotonic() + PORTS_FREED
    while (held := held_ports(scot, ids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return held


def _shut_down(args: argparse.Namespace) -> int:
    """``octopis down --topology``: every broker asked to stop over its control RPC."""
    import asyncio

    cluster, _ = cluster_of(args)
    ids = list(cluster.scot.brokers)
    answers = asyncio.run(cluster.ask(ids, "shutdown", args.timeout))
    silent = [b for b in ids if answers[b] is None]
    print(f"asked {len(ids)} brokers of {cluster.scot.name} to stop: {len(ids) - len(silent)} will")
    if silent:
        print(f"no answer from {', '.join(silent)}", file=sys.stderr)
    return 1 if silent else 0
