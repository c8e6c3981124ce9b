"""The balancing experiment (issue 17, DESIGN §9): a skewed placement on paper75's broker
processes, and the balancer evening it out while the stock-quote stream flows.

    python -m bench.experiments balance --quick

One workload from the Spark job (real quotes), its subscribers then placed with a skew:
``skew`` of them dealt round-robin over five hot edge brokers (two clusters, so that
moves inside a cluster and across both have somewhere to go), the rest where the job put
them. One `octopis run` in DNR with ``--balance ldm``: the balancer reads every broker's
load analysis (a short load window, so that it sees its moves), orders moves round after
round, and the subscribers follow them make-before-break while notifications flow.
Written under ``--out`` (default ``bench/results``):

- ``balance/<profile>.json``: the run report, its ``balance`` part holding every decision,
  the load of every broker sampled over time, and the delay before and after;
- ``balance.md``: the table (load cov and mean before → after, p99 delay before →
  after, moves inside and across, expected / delivered / duplicated / lost);
- ``balance.png``: per-broker load over time (hot brokers in colour), cov over time,
  and notification delay over time, with the rounds that moved someone marked.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from octopis.balance.policy import BalanceOptions
from octopis.cluster.launcher import prepare_topology
from octopis.cluster.runner import RunOptions, WorkloadRun
from octopis.topology import Scot
from octopis.transport.settings import BrokerSettings
from octopis.workload import Workload

log = logging.getLogger("bench.balance")

HOT = ("i:0", "ii:0", "iii:0", "xi:1", "xii:1")
"""Five edge brokers of paper75, three in cluster 0 and two in cluster 1."""


@dataclass(frozen=True)
class BalanceProfile:
    """The workload's size, the skew, and the balancer's pace."""

    subscribers: int
    publishers: int
    notifications: int
    rate: float
    skew: float
    balance: BalanceOptions
    settings: BrokerSettings
    client_workers: int
    note: str


PROFILES = {
    "quick": BalanceProfile(
        1000,
        60,
        120,
        60.0,
        0.8,
        BalanceOptions("ldm", beta=5.0, interval=6.0, sample=1.0, max_moves=150, cooldown=20.0),
        BrokerSettings(load_window=4, down_after=3.0),
        2,
        "1,000 subscribers, 80% on five edge brokers; 60 publishers x 120 quotes at 60/min "
        "(two minutes of publishing); LDM (β 5/s) rounds every 6 s over a 4 s load window; "
        "links declared down after 3 s of silence (1 s by default: 75 brokers and the "
        "clients share two cores)",
    ),
    "full": BalanceProfile(
        2000,
        100,
        90,
        60.0,
        0.8,
        BalanceOptions("ldm", beta=5.0, interval=8.0, sample=1.0, max_moves=800, cooldown=25.0),
        BrokerSettings(load_window=5, down_after=3.0),
        2,
        "2,000 subscribers, 80% on five edge brokers (the issue's example); 100 publishers "
        "x 90 quotes at 60/min; LDM (β 5/s) rounds every 8 s over a 5 s load window; links "
        "declared down after 3 s of silence",
    ),
}


def skewed(workload: Workload, scot: Scot, skew: float, hot: tuple[str, ...] = HOT) -> Workload:
    """``workload`` with the first ``skew`` share of its subscribers (in its own order)
    dealt round-robin over ``hot``; the others stay where they were."""
    for broker in hot:
        if broker not in scot.brokers:
            raise ValueError(f"hot broker {broker} is not in {scot.name}")
    names = list(dict.fromkeys(s.subscriber for s in workload.subscriptions))
    moved = {name: hot[i % len(hot)] for i, name in enumerate(names[: int(len(names) * skew)])}
    subscriptions = [
        replace(s, broker=moved.get(s.subscriber, s.broker)) for s in workload.subscriptions
    ]
    meta = {**workload.meta, "skew": {"share": skew, "hot": list(hot)}}
    return Workload(meta, subscriptions, workload.publications)


def run(quick: bool, out: Path, seed: int) -> dict[str, Any]:
    """Build (or reuse) the workload, run it skewed with the balancer; returns the report
    and writes the JSON, the table and the plot."""
    from bench.experiments import Profile, build_workload

    name = "quick" if quick else "full"
    profile = PROFILES[name]
    base = out / "balance"
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"{name}.json"
    if path.is_file():
        report = json.loads(path.read_text())
    else:
        scot, topology = prepare_topology(base / "topology", preset="paper75")
        spark = Profile(
            profile.subscribers,
            profile.publishers,
            profile.notifications,
            profile.rate,
            ((profile.subscribers, profile.publishers),),
            profile.note,
        )
        workload = skewed(
            build_workload(spark, topology, base / "workload", seed), scot, profile.skew
        )
        options = RunOptions(
            mode="dnr",
            run_dir=base / "runs" / name,
            settings=profile.settings,
            progress=False,
            drain_timeout=90,
            sample_every=1.0,
            client_workers=profile.client_workers,
            balance=profile.balance,
        )
        report = WorkloadRun(scot, topology, workload, options).run()
        report |= {"experiment": "balance", "profile": name, "note": profile.note}
        report["balance"]["hot"] = list(HOT)
        path.write_text(json.dumps(report, indent=1))
    (out / "balance.md").write_text(table(report))
    plot(report, out / "balance.png")
    return report


def before_after(report: dict[str, Any]) -> dict[str, Any]:
    """Load cov and mean at the last sample before the first move was ordered (or the
    first with load, if none was) and over the last three; delay of the deliveries
    before the first move and after the last (plus the load window)."""
    balance = report["balance"]
    timeline = balance["timeline"]
    moved = [d["t"] for d in balance["decisions"] if not d["error"]]
    loaded = [t for t in timeline if t["mean"] > 0] or timeline
    first = [t for t in loaded if t["t"] < moved[0]][-1:] if moved else loaded[:1]
    before = (first or loaded)[0]
    last = timeline[-3:]
    return {
        "cov_before": before["cov"],
        "cov_after": sum(t["cov"] for t in last) / len(last),
        "mean_before": before["mean"],
        "mean_after": sum(t["mean"] for t in last) / len(last),
        "p99_before": balance.get("delay_before", {}).get("p99", float("nan")),
        "p99_after": balance.get("delay_after", {}).get("p99", float("nan")),
        "p50_before": balance.get("delay_before", {}).get("p50", float("nan")),
        "p50_after": balance.get("delay_after", {}).get("p50", float("nan")),
    }


def table(report: dict[str, Any]) -> str:
    """The figures of the run, as markdown."""
    balance = report["balance"]
    f = before_after(report)
    alpha = balance["options"]["alpha"]
    rows = [
        f"# Balancing a skewed placement ({report['profile']}: {report['note']})",
        "",
        "| figure | before | after |",
        "|---|---|---|",
        f"| load cov (α = {alpha:g}) | {f['cov_before']:.2f} | {f['cov_after']:.2f} |",
        f"| mean load (output/s per broker) | {f['mean_before']:.1f} | {f['mean_after']:.1f} |",
        f"| notification delay p50 (s) | {f['p50_before']:.3f} | {f['p50_after']:.3f} |",
        f"| notification delay p99 (s) | {f['p99_before']:.3f} | {f['p99_after']:.3f} |",
        "",
        f"Rounds {balance['rounds']}; moves ordered {balance['moves']} "
        f"({balance['moves_inside']} inside a cluster, {balance['moves_across']} across), "
        f"{balance['moves_failed']} failed; moves the subscribers made: "
        f"{balance.get('moves_made', 0)}. Deliveries before the first move "
        f"{balance.get('deliveries_before', 0)}, after the last "
        f"{balance.get('deliveries_after', 0)}.",
        "",
        f"Exactly once: expected {report['expected_deliveries']}, delivered "
        f"{report['delivered']}, duplicated {report['duplicates']}, lost {report['lost']}; "
        f"repeats the SDK dropped during moves: {report.get('sdk_duplicates_absorbed', 0)}.",
    ]
    return "\n".join(rows) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Per-broker load, cov and delay over time through the rebalancing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    balance = report["balance"]
    timeline = balance["timeline"]
    t = [s["t"] for s in timeline]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    hot = report["balance"].get("hot", list(HOT))
    for broker in sorted(timeline[0]["loads"]):
        loads = [s["loads"].get(broker, 0.0) for s in timeline]
        if broker in hot:
            axes[0].plot(t, loads, lw=1.6, label=broker)
        else:
            axes[0].plot(t, loads, color="grey", alpha=0.35, lw=0.7)
    axes[1].plot(t, [s["cov"] for s in timeline], color="black")
    axes[1].axhline(balance["options"]["alpha"], color="red", ls=":", label="α")
    series = report.get("series", [])  # from the first publication: the balancer's start
    axes[2].plot([b["t"] for b in series], [b["delay_mean"] for b in series], label="mean")
    axes[2].plot([b["t"] for b in series], [b["delay_max"] for b in series], ":", label="max")
    for move_round in sorted({m["t"] for m in balance["decisions"] if not m["error"]}):
        for ax in axes:
            ax.axvline(move_round, color="tab:green", alpha=0.25, lw=1)
    titles = (
        ("load (output/s)", "(a) every broker's load (hot ones in colour, grey: the rest)"),
        ("coefficient of variation", "(b) spread of load (green: moves ordered)"),
        ("delay (s)", "(c) notification delay"),
    )
    for ax, (ylabel, title) in zip(axes, titles, strict=True):
        ax.set_xlabel("time since the balancer started (s)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
