"""``octopis balance``: load-balancing plans for a running overlay (DESIGN §9)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from octopis.cli.errors import UsageError
from octopis.cli.options import add_overlay_options, cluster_of

if TYPE_CHECKING:
    from octopis.balance.plans import LoadState, Plan
    from octopis.balance.policy import BalanceOptions
    from octopis.cluster.launcher import LocalCluster


def configure(command: str, balance: argparse.ArgumentParser) -> None:
    """Give ``balance`` its description, actions and arguments."""
    from octopis.balance.policy import BalanceOptions, Elasticity

    balance.description = (
        "Read every broker's load analysis over the control RPC and decide "
        "which subscribers to move where, with the reason for each move: BAD's "
        "load-based dynamic migration (ldm: once the coefficient of variation of broker "
        "loads exceeds --alpha and the mean exceeds --beta, until it is down to --target) "
        "or its similarity-based one (sdm: the same, each subscriber moving to the broker "
        "under the mean load whose subscribers share most of what it asks for by "
        "equality, e.g. its symbol), BAD's greedy shuffle (above "
        "--gamma), Dynamoth's high-load plan (brokers over --lr-high relieved to under "
        "--lr-safe) or its low-load plan (mean LR under --lr-low: drain the least loaded "
        "broker). Except for sdm, destinations inside the subscriber's cluster come first: "
        "such a move touches only the cluster tree's path between the two hosts. `plan` "
        "prints the "
        "plan; `run` carries plans out round after round (the subscribers move "
        "make-before-break, nothing lost or duplicated) and logs every decision."
    )
    sub = balance.add_subparsers(dest="action", required=True, metavar="ACTION")
    plan = sub.add_parser("plan", help="print the plan (nothing is moved)")
    _common(plan)
    plan.add_argument("--json", action="store_true", help="print the loads and plan as JSON")
    plan.set_defaults(func=cmd_plan)
    run = sub.add_parser(
        "run",
        help="carry plans out, a round every --interval seconds, until stopped (Ctrl-C)",
    )
    _common(run)
    defaults, elastic = BalanceOptions(), Elasticity()
    pace: tuple[tuple[str, type, float, str], ...] = (
        ("--interval", float, defaults.interval,
         "seconds between rounds; at least the brokers' load window"),
        ("--sample", float, defaults.sample, "seconds between load samples between rounds"),
        ("--max-moves", int, defaults.max_moves, "moves one round orders at most"),
        ("--cooldown", float, defaults.cooldown,
         "seconds a moved subscriber is left where it went"),
        ("--smoothing", float, defaults.smoothing,
         "seconds over which each subscriber's delivery rate is averaged for the plans (it "
         "follows the subscriber when it moves; 0: as read)"),
        ("--t-wait", float, elastic.t_wait,
         "--elastic: seconds a load ratio must last, and between changes"),
        ("--min-clusters", int, elastic.min_clusters, "--elastic: clusters kept at least"),
        ("--max-clusters", int, elastic.max_clusters, "--elastic: clusters at most"),
    )  # fmt: skip
    for name, kind, default, what in pace:
        run.add_argument(name, type=kind, default=default, help=f"{what} (default {default:g})")
    run.add_argument(
        "--elastic",
        action="store_true",
        help="also grow and shrink the overlay (`octopis up`'s, by --run-dir) by a cluster: "
        "one more once the mean load ratio has stayed above --lr-high for --t-wait "
        "seconds, the last one fewer once it has stayed below --lr-low as long "
        "(Dynamoth's rule; `octopis scale` carries it out)",
    )
    run.add_argument("--rounds", type=int, default=0, help="stop after N rounds (0: never)")
    run.add_argument("--dry-run", action="store_true", help="plan and log each round, move nothing")
    run.add_argument(
        "--report", type=Path, metavar="FILE", help="write what it saw and did here as JSON"
    )
    run.set_defaults(func=cmd_run)


def _common(parser: argparse.ArgumentParser) -> None:
    from octopis.balance.policy import MEASURES, PLANS, BalanceOptions

    add_overlay_options(parser)
    parser.add_argument("--plan", choices=PLANS, default="ldm", help="which plan (default ldm)")
    parser.add_argument(
        "--measure",
        choices=MEASURES,
        default="",
        help="a broker's load: deliveries/s to its own subscribers (all of it moves with "
        "them; default for ldm, sdm and shuffle) or output/s, copies to neighbours included "
        "(relaying stays; high-load and low-load take only this)",
    )
    d = BalanceOptions()
    for name, default, what in (
        ("--alpha", d.alpha, "ldm, sdm: coefficient of variation that triggers migration"),
        (
            "--target",
            d.target,
            "ldm, sdm: coefficient of variation a triggered plan moves down to (α if above it; "
            "below α so that the measured spread, which carries sampling noise, lands "
            "under α)",
        ),
        (
            "--beta",
            d.beta,
            "ldm, sdm, shuffle: mean load (/s, --measure) under which nothing moves",
        ),
        ("--gamma", d.gamma, "shuffle: coefficient of variation that triggers it"),
        ("--lr-high", d.lr_high, "high-load: load ratio that makes a broker overloaded"),
        ("--lr-safe", d.lr_safe, "high-load: load ratio an overloaded broker is brought under"),
        ("--lr-low", d.lr_low, "low-load: mean load ratio under which a broker is drained"),
    ):
        parser.add_argument(name, type=float, default=default, help=f"{what} (default {default:g})")


def _options(args: argparse.Namespace, **pace: Any) -> BalanceOptions:
    from octopis.balance.policy import BalanceOptions

    try:
        return BalanceOptions(
            args.plan,
            args.alpha,
            args.beta,
            args.gamma,
            args.lr_high,
            args.lr_safe,
            args.lr_low,
            measure=args.measure,
            target=args.target,
            **pace,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_plan(args: argparse.Namespace) -> int:
    """``octopis balance plan``."""
    from octopis.balance.observe import observe
    from octopis.balance.policy import make_plan

    cluster, _ = cluster_of(args)
    options = _options(args)
    state, reports = asyncio.run(
        observe(
            cluster.scot,
            cluster.ask,
            measure=options.load_measure,
            interests=options.plan == "sdm",
        )
    )
    plan = make_plan(options, state)
    if args.json:
        print(json.dumps(as_json(state, plan, reports), indent=1))
    else:
        print(format_plan(options, state, plan, reports))
    return 0


async def _closing(cluster: LocalCluster, work: Coroutine[Any, Any, None]) -> None:
    try:
        await work
    finally:
        await cluster.close_control()


def cmd_run(args: argparse.Namespace) -> int:
    """``octopis balance run``."""
    from octopis.balance.loop import Balancer
    from octopis.balance.policy import Elasticity
    from octopis.cluster.scale import elastic_balancer

    cluster, pids = cluster_of(
        args,
        recorded="--elastic starts and stops brokers with the settings `octopis up` recorded"
        if args.elastic
        else None,
    )
    options = _options(
        args,
        interval=args.interval,
        sample=args.sample,
        max_moves=args.max_moves,
        cooldown=args.cooldown,
        smoothing=args.smoothing,
        rounds=args.rounds,
        act=not args.dry_run,
    )
    if args.elastic:
        try:
            elastic = Elasticity(
                args.lr_high, args.lr_low, args.t_wait, args.min_clusters, args.max_clusters
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        balancer = elastic_balancer(cluster, options, elastic, pids)
    else:
        balancer = Balancer(cluster.scot, cluster.ask, options, call=cluster.call)
    try:
        asyncio.run(_closing(cluster, balancer.run()))
    except KeyboardInterrupt:
        pass
    finally:
        report = balancer.report()
        changes = ", ".join(f"{c['change']} at {c['t']:.0f} s" for c in report["changes"])
        print(
            f"{report['rounds']} rounds, {report['moves']} moves ({report['moves_inside']} "
            f"inside a cluster, {report['moves_across']} across, {report['moves_failed']} "
            "failed)" + (f"; {changes}" if changes else "")
        )
        if args.report is not None:
            args.report.write_text(json.dumps(report, indent=1))
    return 0


def format_plan(
    options: BalanceOptions, state: LoadState, plan: Plan, reports: dict[str, dict[str, Any]]
) -> str:
    """The brokers' loads (in the plan's measure), output, capacity and LR, their spread,
    and the moves with their reasons."""
    from octopis.balance.plans import coefficient_of_variation

    name, measure = options.plan, options.load_measure
    lines = [
        f"{'broker':<10}{'cluster':>8}{measure + '/s':>14}{'output/s':>10}{'capacity/s':>12}"
        f"{'LR':>7}{'clients':>9}"
    ]
    for broker, b in sorted(state.brokers.items()):
        clients = sum(h == broker for h in state.hosts.values())
        report = reports[broker]
        lines.append(
            f"{broker:<10}{b.cluster:>8}{b.load:>14.1f}{report['output_per_s']:>10.1f}"
            f"{b.capacity:>12.0f}{report['load_ratio']:>7.2f}{clients:>9}"
        )
    loads = [b.load for b in state.brokers.values()]
    lines.append(
        f"cov {coefficient_of_variation(loads):.2f}, mean {sum(loads) / len(loads):.1f}/s of "
        f"{measure} over {len(loads)} brokers"
    )
    inside = sum(m.inside_cluster for m in plan.moves)
    lines.append(
        f"plan {name}: {len(plan.moves)} moves ({inside} inside a cluster, "
        f"{len(plan.moves) - inside} across)" + (f"; {plan.note}" if plan.note else "")
    )
    for m in plan.moves:
        where = "inside" if m.inside_cluster else "across"
        lines.append(f"  {m.subscriber}: {m.source} -> {m.target} ({where}): {m.reason}")
    if plan.moves and plan.state is not None:
        after = [b.load for b in plan.state.brokers.values()]
        lines.append(f"estimated cov after the plan {coefficient_of_variation(after):.2f}")
    return "\n".join(lines)


def as_json(state: LoadState, plan: Plan, reports: dict[str, Any]) -> dict[str, Any]:
    """The loads, the plan and each broker's load report, for tools."""
    from octopis.balance.plans import coefficient_of_variation

    return {
        "cov": coefficient_of_variation(b.load for b in state.brokers.values()),
        "moves": [vars(m) for m in plan.moves],
        "note": plan.note,
        "cov_after": coefficient_of_variation(b.load for b in plan.state.brokers.values())
        if plan.state
        else None,
        "load": reports,
    }
