"""The balancing experiment (issue 17, DESIGN §9): a skewed placement on paper75's broker
processes, and the balancer evening it out while the stock-quote stream flows.

    python -m bench.experiments balance --quick

One workload from the Spark job (real quotes), its subscribers then placed with a skew:
``skew`` of them dealt round-robin over five hot edge brokers (two clusters, so that
moves inside a cluster and across both have somewhere to go), the rest where the job put
them. Two `octopis run`s of it in DNR: the balancer only observing (``static``), then
acting (``balanced``, LDM): it reads every broker's load analysis (a short load window,
so that it sees its moves), orders moves round after round, and the subscribers follow
them make-before-break while notifications flow. Written under ``--out`` (default
``bench/results``; the full profile goes to ``bench/results/full`` by convention):

- ``balance/<profile>-{static,balanced}.json``: the run reports, their ``balance`` part
  holding every decision, the load of every broker sampled over time, and the delay
  before the first move and in the run's last quarter;
- ``balance.md``: the table (load cov and mean, p50 and p99 delay: before the first
  move, and both runs' last quarters; moves inside and across; expected / delivered /
  duplicated / lost for both runs);
- ``balance.png``: every broker's load over time in the balanced run (hot brokers in
  colour), the spread of load and the delay over time in both, rounds that moved marked.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from octopis.balance.plans import ALPHA, TARGET
from octopis.balance.policy import BalanceOptions, coefficient_of_variation
from octopis.cluster.launcher import prepare_topology
from octopis.cluster.runner import RunOptions, WorkloadRun
from octopis.settings import BrokerSettings, Clients, Links, Load, Routing
from octopis.topology import Scot
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
        240,
        60.0,
        0.8,
        BalanceOptions("ldm", beta=5.0, interval=10.0, sample=1.0, max_moves=300, cooldown=30.0),
        BrokerSettings(
            load=Load(window=8),
            links=Links(down_after=3.0),
            clients=Clients(capacity=150.0, queue_limit=50_000),
            routing=Routing(covering="off"),
        ),
        2,
        "1,000 subscribers, 80% on five edge brokers; 60 publishers x 240 quotes at 60/min "
        "(four minutes of publishing); every broker delivers at most 150/s (clients.capacity: "
        "the hot ones are offered ~200/s); dynamic migration (β 5/s; --plan) on delivery "
        "load, rounds every 10 s over an 8 s load window, at most 300 moves a round; links "
        "declared down after 3 s of silence (1 s by default: 75 brokers and the clients share "
        "two cores)",
    ),
    "full": BalanceProfile(
        2000,
        100,
        150,
        60.0,
        0.8,
        BalanceOptions("ldm", beta=5.0, interval=8.0, sample=1.0, max_moves=800, cooldown=25.0),
        BrokerSettings(
            load=Load(window=5),
            links=Links(down_after=3.0),
            clients=Clients(capacity=400.0, queue_limit=50_000),
            routing=Routing(covering="off"),
        ),
        2,
        "2,000 subscribers, 80% on five edge brokers (the issue's example); 100 publishers "
        "x 150 quotes at 60/min; every broker delivers at most 400/s (clients.capacity: the "
        "hot ones are offered ~650/s); dynamic migration (β 5/s; --plan) on delivery load, "
        "rounds every 8 s over a 5 s load window; links declared down after 3 s of silence",
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


def run(quick: bool, out: Path, seed: int, plan: str = "ldm") -> dict[str, Any]:
    """Build (or reuse) the workload and run it skewed twice, the balancer observing only
    (the baseline: loads and delays as placed) and acting with ``plan`` (``ldm`` or
    ``sdm``); returns the acting run's report and writes both JSONs, the table and the
    plot."""
    from bench.profiles import Profile, build_workload

    name = "quick" if quick else "full"
    profile = PROFILES[name]
    base = out / "balance"
    base.mkdir(parents=True, exist_ok=True)
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
        build_workload(spark, topology, base / f"workload-{name}", seed), scot, profile.skew
    )
    reports = {}
    for variant, act in (("static", False), ("balanced", True)):
        path = base / f"{name}-{variant}.json"
        if path.is_file():
            reports[variant] = json.loads(path.read_text())
            continue
        log.info("balance %s: %s", name, variant)
        options = RunOptions(
            mode="dnr",
            run_dir=base / "runs" / f"{name}-{variant}",
            settings=profile.settings,
            progress=False,
            drain_timeout=240,  # the static run's hot brokers drain a queue at capacity
            sample_every=1.0,
            client_workers=profile.client_workers,
            balance=replace(profile.balance, plan=plan, act=act),
        )
        report = WorkloadRun(scot, topology, workload, options).run()
        report |= {"experiment": "balance", "profile": name, "note": profile.note}
        report["balance"]["hot"] = list(HOT)
        path.write_text(json.dumps(report, indent=1))
        reports[variant] = report
    (out / "balance.md").write_text(table(reports["static"], reports["balanced"]))
    plot(reports["static"], reports["balanced"], out / "balance.png")
    return reports["balanced"]


def before_after(report: dict[str, Any]) -> dict[str, Any]:
    """Load cov and mean (delivery load and output) at the last sample before the first
    move was ordered (or the first with load, if none was); delay of the deliveries
    before the first move and in the run's last quarter."""
    balance = report["balance"]
    timeline = balance["timeline"]
    moved = [d["t"] for d in balance["decisions"] if not d["error"]]
    loaded = [t for t in timeline if t["mean"] > 0] or timeline
    first = [t for t in loaded if t["t"] < moved[0]][-1:] if moved else loaded[:1]
    before = (first or loaded)[0]
    return {
        "cov_before": before["cov"],
        "cov_output_before": before["cov_output"],
        "mean_before": before["mean"],
        "mean_output_before": before["mean_output"],
        "p99_before": balance.get("delay_before", {}).get("p99", float("nan")),
        "p99_after": balance.get("delay_after", {}).get("p99", float("nan")),
        "p50_before": balance.get("delay_before", {}).get("p50", float("nan")),
        "p50_after": balance.get("delay_after", {}).get("p50", float("nan")),
    }


def last_quarter(report: dict[str, Any]) -> dict[str, float]:
    """Load cov and mean (delivery load and output) averaged over the balancer's samples
    of the run's last quarter, and the cov of each broker's load averaged over that
    quarter (``cov_quarter``, ``cov_output_quarter``: the spread of load over a minute
    rather than of the short windows the balancer reads, whose counts of ~20 deliveries/s
    vary by about ±10% on their own); the most deliveries waiting for
    ``clients.capacity`` at one broker in the run's queue samples of that quarter."""
    timeline = report["balance"]["timeline"]
    tail = timeline[-1]["t"] * 3 / 4
    last = [t for t in timeline if t["t"] >= tail] or timeline[-1:]
    queues = report.get("timeline", [])
    queue_tail = queues[-1]["t"] * 3 / 4 if queues else 0.0
    figures = {k: sum(t[k] for t in last) / len(last) for k in FIGURES}
    figures["cov_quarter"] = spread_of_means(last, "loads")
    figures["cov_output_quarter"] = spread_of_means(last, "outputs")
    figures["waiting"] = max(
        (q["deliveries_waiting_max"] for q in queues if q["t"] >= queue_tail), default=0
    )
    figures["waiting_peak"] = max((q["deliveries_waiting_max"] for q in queues), default=0)
    return figures


def spread_of_means(samples: list[dict[str, Any]], measure: str) -> float:
    """The coefficient of variation of each broker's ``measure`` (``loads`` or
    ``outputs``) averaged over ``samples``: the spread of load over their whole span,
    free of most of the noise of a single short window."""
    brokers = samples[0][measure]
    return coefficient_of_variation(
        sum(t[measure][b] for t in samples) / len(samples) for b in brokers
    )


FIGURES = ("cov", "mean", "cov_output", "mean_output")
"""What the balancer's timeline holds per sample, averaged over a quarter."""


def table(static: dict[str, Any], balanced: dict[str, Any]) -> str:
    """The figures of both runs, as markdown."""
    balance = balanced["balance"]
    f = before_after(balanced)
    s, b = last_quarter(static), last_quarter(balanced)
    sd = static["balance"]["delay_after"]
    alpha = balance["options"]["alpha"]
    rows = [
        f"# Balancing a skewed placement ({balanced['profile']}: {balanced['note']})",
        "",
        "Two runs of the same skewed workload: the balancer only observing (`static`) and "
        "acting (`balanced`). 'Before' is the balanced run before its first move; the "
        "other columns are the runs' last quarters.",
        "",
        "| figure | balanced, before | static, last quarter | balanced, last quarter |",
        "|---|---|---|---|",
        f"| delivery load cov (α = {alpha:g}), mean of the balancer's samples | "
        f"{f['cov_before']:.2f} | {s['cov']:.2f} | {b['cov']:.2f} |",
        f"| delivery load cov of the quarter's mean loads | | {s['cov_quarter']:.2f} | "
        f"{b['cov_quarter']:.2f} |",
        f"| mean delivery load (deliveries/s per broker) | {f['mean_before']:.1f} | "
        f"{s['mean']:.1f} | {b['mean']:.1f} |",
        f"| output cov (relaying included) | {f['cov_output_before']:.2f} | "
        f"{s['cov_output']:.2f} | {b['cov_output']:.2f} |",
        f"| output cov of the quarter's mean loads | | {s['cov_output_quarter']:.2f} | "
        f"{b['cov_output_quarter']:.2f} |",
        f"| mean output (copies + deliveries/s per broker) | {f['mean_output_before']:.1f} | "
        f"{s['mean_output']:.1f} | {b['mean_output']:.1f} |",
        f"| most deliveries waiting at one broker (whole run) | | {s['waiting_peak']} | "
        f"{b['waiting_peak']} |",
        f"| most deliveries waiting at one broker (last quarter) | | {s['waiting']} | "
        f"{b['waiting']} |",
        f"| notification delay p50 (s) | {f['p50_before']:.3f} | {sd['p50']:.3f} | "
        f"{f['p50_after']:.3f} |",
        f"| notification delay p99 (s) | {f['p99_before']:.3f} | {sd['p99']:.3f} | "
        f"{f['p99_after']:.3f} |",
        "",
        f"Balanced run, plan {balance['options']['plan']}, target "
        f"{balance['options'].get('target', balance['options']['alpha'])}: "
        f"rounds {balance['rounds']} (skipped for a load report that did "
        f"not come in time: {balance.get('reads_failed', 'not recorded')}; stopped early: "
        f"{balance.get('stopped_early') or 'no'}); moves ordered {balance['moves']} "
        f"({balance['moves_inside']} inside a cluster, {balance['moves_across']} across), "
        f"{balance['moves_failed']} failed; moves the subscribers made: "
        f"{balance.get('moves_made', 0)}, {balance.get('moves_in_last_quarter', 0)} of them "
        f"ordered in the run's last quarter. Delay 'before': the "
        f"{balance.get('deliveries_before', 0)} deliveries before the first move.",
        "",
    ]
    for label, r in (("static", static), ("balanced", balanced)):
        rows.append(
            f"Exactly once, {label}: expected {r['expected_deliveries']}, delivered "
            f"{r['delivered']}, duplicated {r['duplicates']}, lost {r['lost']}; false link "
            f"detections {r['failures'].get('links_down', 0)}; repeats the SDK dropped: "
            f"{r['balance'].get('sdk_duplicates_absorbed', 'not recorded')}; SDK fail-overs "
            f"{r['balance'].get('sdk_failovers', 'not recorded')}; stale move orders "
            f"ignored {r['balance'].get('stale_move_orders_ignored', 'not recorded')}; "
            f"deliveries for a subscriber that had moved on "
            f"{r['balance'].get('sdk_unclaimed_deliveries', 'not recorded')}."
        )
    return "\n".join(rows) + "\n"


def plot(static: dict[str, Any], balanced: dict[str, Any], path: Path) -> None:
    """(a) every broker's load over time in the balanced run, (b) the spread of load
    and (c) the notification delay over time in both runs, the rounds that moved
    someone marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    timeline = balanced["balance"]["timeline"]
    t = [s["t"] for s in timeline]
    hot = balanced["balance"].get("hot", list(HOT))
    for broker in sorted(timeline[-1]["loads"]):
        loads = [s["loads"].get(broker, 0.0) for s in timeline]
        if broker in hot:
            axes[0].plot(t, loads, lw=1.6, label=broker)
        else:
            axes[0].plot(t, loads, color="grey", alpha=0.35, lw=0.7)
    for label, report, style in (("static", static, ":"), ("balanced", balanced, "-")):
        samples = report["balance"]["timeline"]
        times = [s["t"] for s in samples]
        axes[1].plot(times, [s["cov"] for s in samples], style, label=f"{label}: deliveries")
        axes[1].plot(
            times, [s["cov_output"] for s in samples], style, alpha=0.5, label=f"{label}: output"
        )
        series = report.get("series", [])  # from the first publication: the balancer's start
        axes[2].plot(
            [b["t"] for b in series], [b["delay_mean"] for b in series], style, label=label
        )
    axes[1].axhline(balanced["balance"]["options"]["alpha"], color="red", lw=0.8, label="α")
    for moved in sorted({m["t"] for m in balanced["balance"]["decisions"] if not m["error"]}):
        for ax in axes:
            ax.axvline(moved, color="tab:green", alpha=0.25, lw=1)
    titles = (
        ("deliveries/s", "(a) balanced: every broker's delivery load (hot ones in colour)"),
        ("coefficient of variation", "(b) spread of load (green: rounds that moved)"),
        ("mean delay per second (s)", "(c) notification delay"),
    )
    for ax, (ylabel, title) in zip(axes, titles, strict=True):
        ax.set_xlabel("time since publishing started (s)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SIM_RUNS = (
    ("uniform", 0.0, "deliveries", False, TARGET),
    ("skewed, observed", 0.8, "deliveries", False, TARGET),
    ("skewed, LDM on deliveries", 0.8, "deliveries", True, TARGET),
    ("skewed, LDM on deliveries, planned to α (BAD)", 0.8, "deliveries", True, ALPHA),
    ("skewed, SDM on deliveries", 0.8, "deliveries", True, TARGET),
    ("skewed, LDM on output", 0.8, "output", True, TARGET),
)
"""The simulator's runs: (label, skew, load measure, whether the balancer acts, the
cov its plans move down to); LDM unless the label says SDM."""


def simulate(out: Path, seed: int) -> str:
    """The same balancer in the simulator on paper75 (``python -m bench.experiments
    balance-sim``): a generated stock workload of 2,000 subscribers and 100 publishers
    × 180 notifications at 60/min, placed uniformly at random or 80% on the five hot
    brokers; LDM on delivery load beside LDM on output. Shows where relaying puts the
    floor of the output spread. Writes ``balance-sim.md`` (``out`` made if missing);
    returns the table."""
    from octopis.sim import LatencyModel, Simulator
    from octopis.sim.balancing import LOAD_WINDOW
    from octopis.topology import build_preset
    from octopis.workload import generate_workload

    out.mkdir(parents=True, exist_ok=True)
    scot = build_preset("paper75")
    base = generate_workload(scot, subscribers=2000, publishers=100, notifications=180, seed=seed)
    template = BalanceOptions("ldm", beta=5.0, interval=8.0, max_moves=800, cooldown=25.0)
    rows = [
        "# The balancer in the simulator: paper75, 2,000 subscribers, 100 publishers x 180",
        "",
        "Coefficient of variation of per-broker load over the last 60 s of publishing, as "
        "deliveries to each broker's own subscribers and as output (copies to neighbours "
        "too): the mean of the balancer's samples (one every "
        f"{template.sample:g} s, each broker's load over its {LOAD_WINDOW:g} s load window, "
        "as `octopis balance` reads it), and of each broker's mean load over the "
        f"60 s; LDM (α {template.alpha:g}, target {template.target:g}, β {template.beta:g}/s, "
        f"rounds every {template.interval:g} s, cooldown {template.cooldown:g} s).",
        "",
        "| run | delivery cov: samples / mean loads | output cov: samples / mean loads "
        "| moves (inside / across) | exactly once |",
        "|---|---|---|---|---|",
    ]
    for label, skew, measure, act, target in SIM_RUNS:
        workload = skewed(base, scot, skew) if skew else base
        sim = Simulator(scot, "dnr", seed=seed, latency=LatencyModel(0.001, 0.004), covering="off")
        for s in workload.subscriptions:
            sim.at(s.time, sim.subscribe, s.subscriber, s.broker, s.subscription)
        sim.run()
        start = sim.now
        for p in workload.publications:
            sim.at(start + p.time, sim.publish, p.publisher, p.broker, p.publication, p.seq)
        plan = "sdm" if "SDM" in label else "ldm"
        options = replace(template, plan=plan, measure=measure, act=act, target=target)
        sim.balance(options, until=start + 180)
        sim.run()
        report = sim.report()
        tail = [t for t in report["balance"]["timeline"] if t["t"] >= start + 120]
        deliveries_cov = sum(t["cov"] for t in tail) / len(tail)
        output_cov = sum(t["cov_output"] for t in tail) / len(tail)
        moves = report.get("moves", {})
        once = (
            report["delivered"] == report["expected_deliveries"]
            and report["duplicates"] == report["lost"] == 0
        )
        rows.append(
            f"| {label} | {deliveries_cov:.2f} / {spread_of_means(tail, 'loads'):.2f} "
            f"| {output_cov:.2f} / {spread_of_means(tail, 'outputs'):.2f} | "
            f"{moves.get('inside', 0)} / {moves.get('across', 0)} | "
            f"{'yes' if once else 'NO'} ({report['delivered']:,}) |"
        )
    text = "\n".join(rows) + "\n"
    (out / "balance-sim.md").write_text(text)
    return text
