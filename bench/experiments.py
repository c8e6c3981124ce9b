"""The paper's experiments (§7.3) on real broker processes: SNR, DNR and BID side by side.

    python -m bench.experiments subscribers --quick     # Fig. 9 and Fig. 10(a)
    python -m bench.experiments publishers --quick      # Fig. 10(b)-(d)
    python -m bench.experiments burst --quick           # Fig. 11, the stability analysis
    python -m bench.experiments failure --quick         # kill -9 and restart, SNR beside DNR
    python -m bench.experiments balance --quick         # a skewed placement balanced
    python -m bench.experiments balance-sim             # the same balancer, simulated
    python -m bench.experiments elastic                 # clusters added and removed under a ramp
    python -m bench.experiments sim-subscribers --jobs 2 # full size, calibrated simulator
    python -m bench.experiments sim-publishers --jobs 2 # full size, calibrated simulator
    python -m bench.experiments sim-burst --jobs 2      # full size, three placements

Each experiment builds one workload with the Spark job (`spark_workloads.stock_workload`,
real quotes from ``../shared/data/stockquotes``) on paper75, takes nested subsets of it
for its size points (the first N subscribers, the first M publishers), runs every point
in every mode with `octopis run`'s machinery (75 broker processes on this machine), and
writes under ``--out`` (default ``bench/results``):

- ``<experiment>/<point>-<mode>.json``: the full run report;
- ``<experiment>.md``: the figures and our ratios beside the paper's claims;
- ``<experiment>.png``: plots laid out like the paper's figures.

``failure`` is not in the paper (its future work, DESIGN §7): one inner broker that hosts
subscribers is killed with ``kill -9`` mid-stream and restarted; the plot shows delivery
rate, delay and losses over time, SNR beside DNR, and the table the counts split by
whether the subscriber's host was killed.

``burst`` also runs DNR with BlueDove's "least loaded" order (``dnr-bluedove``: estimated
processing time (q̂ + 1)/μ instead of CE, DESIGN §9) and tabulates it beside the paper's CE
order; ``--modes dnr,dnr-bluedove`` runs just those two.

``--quick`` profiles finish in a few minutes; the full profiles are sized like the paper
where two cores allow, and scaled down where they do not (the profile says how).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.profiles import (
    CLAIMS,
    MODES,
    PAPER,
    PROFILES,
    REPO,
    RUNS,
    SIMULATED,
    VARIANTS,
    Profile,
    build_workload,
    subset,
)
from bench.stats import change_interval, median, median_interval, verdict
from octopis.cli.cluster import default_client_workers
from octopis.cluster.launcher import prepare_topology
from octopis.cluster.runner import RunOptions, WorkloadRun
from octopis.workload import read_workload, write_workload

log = logging.getLogger("bench.experiments")


def run_experiment(
    name: str,
    quick: bool,
    out: Path,
    modes: tuple[str, ...],
    seed: int,
    repeats: int = 1,
    client_workers: int = 0,
) -> list[dict[str, Any]]:
    """Every point of the profile in every mode, ``repeats`` times with the modes
    interleaved (SNR, DNR, BID, then DNR, BID, SNR, ...); the clients in
    ``client_workers`` processes; returns the reports (a report already on disk is
    reused)."""
    profile = PROFILES[name]["quick" if quick else "full"]
    base = out / name
    base.mkdir(parents=True, exist_ok=True)
    scot, topology = prepare_topology(base / "topology", preset="paper75")
    workload = build_workload(profile, topology, base / "workload", seed)
    reports = []
    for subscribers, publishers in profile.points:
        part = subset(workload, subscribers, publishers)
        part_dir = base / f"workload-{subscribers}s-{publishers}p"
        write_workload(part_dir, part)
        labels = [m for m in modes if m in profile.modes]
        for repeat, label in (
            (r, labels[(r + i) % len(labels)]) for r in range(repeats) for i in range(len(labels))
        ):
            suffix = f"-r{repeat}" if repeat else ""
            path = base / f"{subscribers}s-{publishers}p-{label}{suffix}.json"
            if path.is_file():
                reports.append(json.loads(path.read_text()))
                continue
            log.info(
                "%s: %d subscribers, %d publishers, %s, run %d of %d",
                name,
                subscribers,
                publishers,
                label,
                repeat + 1,
                repeats,
            )
            mode, changes = VARIANTS.get(label, (label, {}))
            settings = profile.settings.changed(changes)
            options = RunOptions(
                mode=mode,
                run_dir=base / "runs" / path.stem,
                settings=settings,
                progress=False,
                drain_timeout=60,
                sample_every=profile.sample_every,
                failures=list(profile.failures),
                client_workers=client_workers,
            )
            report = WorkloadRun(scot, topology, read_workload(part_dir), options).run()
            report.update(
                {
                    "mode": label,
                    "routing": mode,
                    "order": settings.lst.order,
                    "experiment": name,
                    "profile": "quick" if quick else "full",
                    "point": {"subscribers": subscribers, "publishers": publishers},
                    "repeat": repeat,
                    "client_workers": client_workers,
                    "hrp": part.meta.get("hrp"),
                    "failure_schedule": [
                        {"brokers": list(f.ends), "at": f.at, "until": f.until}
                        for f in profile.failures
                    ],
                }
            )
            path.write_text(json.dumps(report, indent=1))
            reports.append(report)
    (out / f"{name}.md").write_text(table(name, profile, reports))
    plot(name, reports, out / f"{name}.png")
    return reports


# -- tables --------------------------------------------------------------------------------


def metrics(report: dict[str, Any]) -> dict[str, float]:
    """The per-run figures the tables and plots use."""
    return {
        "sbp_messages": report["sbp_messages"],
        "tree": report["avg_subscription_tree_length"],
        "subscription_delay": report["subscription_delay"]["mean"],
        "notification_delay": report["notification_delay"]["mean"],
        "notification_delay_p99": report["notification_delay"]["p99"],
        "under_1s": report["notification_delay"]["under_1s"],
        "matching_delay": report["matching_delay"]["mean_per_operation"],
        "notification_messages": report["notification_messages"],
        "queue": report["target_queue_length"]["mean"],
        "queue_max": report["target_queue_length"]["max"],
        "notification_delay_p50": report["notification_delay"]["p50"],
        "overlay_delay": report.get("overlay_delay", {}).get("mean", math.nan),
        "client_delay": report.get("client_delay", {}).get("mean", math.nan),
        "notification_delay_max": report["notification_delay"]["max"],
        "expected": report["expected_deliveries"],
        "delivered": report["delivered"],
        "duplicates": report["duplicates"],
        "lost": report["lost"],
        "start": report["timings"]["start"],
        "subscribe": report["timings"]["subscribe"],
    }


def _split(m: dict[str, float]) -> str:
    """Mean overlay and client delay (processes), or – (a simulation has no split)."""
    if math.isnan(m["overlay_delay"]):
        return "–"
    return f"{m['overlay_delay']:.3f}, {m['client_delay']:.3f}"


def change(ours: float, base: float) -> float:
    """Relative change of ``ours`` against ``base`` (−0.25 = 25% lower)."""
    return (ours - base) / base if base else math.nan


def table(name: str, profile: Profile, reports: list[dict[str, Any]]) -> str:
    """Markdown: per-point figures, then our ratios beside the paper's."""
    if name == "failure":
        return failure_table(profile, reports)
    groups = grouped(reports)
    by = {key: medians(runs) for key, runs in groups.items()}
    most = max(len(runs) for runs in groups.values())
    lines = [
        f"### {name} ({reports[0]['profile']} profile)",
        "",
        profile.note,
        "",
        f"Medians of {most} run(s) per point and mode (modes interleaved); notification "
        "delay with its 95% bootstrap interval below the table.",
        "",
        "| subscribers | publishers | mode | SBP msgs | tree | sub delay s | notif delay "
        "s (p99) | overlay, client s | <1 s | match µs | notif msgs | queue | expected | "
        "delivered | dup | lost | start, subscribe s |",
        "|" + "---|" * 17,
    ]
    for (subs, pubs, mode), m in sorted(by.items()):
        lines.append(
            f"| {subs} | {pubs} | {mode} | {m['sbp_messages']:,} | {m['tree']:.2f} | "
            f"{m['subscription_delay']:.3f} | {m['notification_delay']:.3f} "
            f"({m['notification_delay_p99']:.3f}) | {_split(m)} | {m['under_1s']:.0%} | "
            f"{1e6 * m['matching_delay']:.1f} | {m['notification_messages']:,} | "
            f"{m['queue']:.1f} | {m['expected']:,} | {m['delivered']:,} | {m['duplicates']} | "
            f"{m['lost']} | {m['start']:.0f}, {m['subscribe']:.0f} |"
        )
    if name == "burst":
        lines += [
            "",
            "| mode | run | peak queued (all links) | back to normal after the HRP stops | "
            "links declared down (heartbeats, T = 1 s) |",
            "|---|---|---|---|---|",
        ]
        for r in sorted(reports, key=lambda r: (r["mode"], r.get("repeat", 0))):
            peak, after = recovery(r)
            down = r.get("failures", {}).get("links_down", "–")
            lines.append(
                f"| {r['mode']} | {r.get('repeat', 0) + 1} | {peak:,} | {_seconds(after)} | "
                f"{down} |"
            )
        lines += order_table(reports)
    lines += [
        "",
        "| subscribers | publishers | mode | runs | notification delay s: median [95% interval] "
        "| overlay s | client s |",
        "|---|---|---|---|---|---|---|",
    ]
    for (subs, pubs, mode), runs in sorted(groups.items()):
        m, low, high = median_interval([r["notification_delay"] for r in runs])
        overlay = median([r["overlay_delay"] for r in runs])
        client = median([r["client_delay"] for r in runs])
        lines.append(
            f"| {subs} | {pubs} | {mode} | {len(runs)} | {m:.4f} [{low:.4f}, {high:.4f}] | "
            f"{'–' if math.isnan(overlay) else f'{overlay:.4f}'} | "
            f"{'–' if math.isnan(client) else f'{client:.4f}'} |"
        )
    lines += [
        "",
        "| ratio | ours (mean over points) [95% interval] | paper | verdict |",
        "|---|---|---|---|",
    ]
    for label, (ours, low, high), paper, said in ratios(name, groups):
        lines.append(
            f"| {label} | {_pct(ours)} [{_pct(low)}, {_pct(high)}] | {_pct(paper)} | {said} |"
        )
    return "\n".join(lines) + "\n"


def grouped(reports: list[dict[str, Any]]) -> dict[tuple[int, int, str], list[dict[str, float]]]:
    """The :func:`metrics` of each run, by (subscribers, publishers, mode)."""
    groups: dict[tuple[int, int, str], list[dict[str, float]]] = {}
    for r in reports:
        key = (r["point"]["subscribers"], r["point"]["publishers"], r["mode"])
        groups.setdefault(key, []).append(metrics(r))
    return groups


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's median over ``runs``."""
    return {key: median([run[key] for run in runs]) for key in runs[0]}


FAILURE_ROWS: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("notifications published", lambda r: f"{r['notifications']:,}"),
    *(
        (
            f"{label}: expected / delivered / duplicated / lost",
            lambda r, key=key: (
                "{expected_deliveries:,} / {delivered:,} / {duplicates} / {lost}".format(
                    **r["failures"][key]
                )
            ),
        )
        for label, key in (
            ("subscribers on live brokers", "host_alive"),
            ("subscribers of the killed broker", "host_dead"),
            ("… published after they were back", "host_dead_after_back"),
        )
    ),
    (
        "detection (first–last neighbour)",
        lambda r: "{first_s:.2f}–{last_s:.2f} s".format(**_victim(r, "detection")),
    ),
    ("subscribers away (fail-over)", lambda r: _seconds(_victim(r, "failover", ".away_s"))),
    (
        "replays: requests / publications replayed (late) / repeats dropped / gaps reported",
        lambda r: "{requests} / {replayed} ({replayed_late}) / {repeats} / {gaps}".format(
            **{
                "requests": 0,
                "replayed": 0,
                "replayed_late": 0,
                "repeats": 0,
                "gaps": 0,
                **r["failures"].get("replays", {}),
            }
        ),
    ),
    (
        "restarted broker serving after",
        lambda r: _seconds(_victim(r, "restart")["serving_after_s"]),
    ),
    (
        "restarted table vs neighbours' view: entries, missing / extra / changed",
        lambda r: "{entries:,}: {missing} / {extra} / {changed}".format(**_victim(r, "restart")),
    ),
    (
        "tunnels started / fan-outs",
        lambda r: "{} / {}".format(
            r["failures"].get("tunnel.started", 0), r["failures"].get("tunnel.fanout", 0)
        ),
    ),
    (
        "subscription messages held for the dead broker, handed to its successor",
        lambda r: r["failures"].get("sbp_handed_late", 0),
    ),
    (
        "notifications the restarted broker routed while resyncing",
        lambda r: r["failures"].get("routed_while_resyncing", 0),
    ),
    ("custody: notifications routed again", lambda r: r["failures"].get("custody.rerouted", 0)),
    ("edge dedup absorbed", lambda r: r["failures"].get("dedup.absorbed", 0)),
    (
        "undeliverable copies, by reason",
        lambda r: (
            ", ".join(
                f"{k.split('.', 1)[1]} {n:,}"
                for k, n in r["failures"].items()
                if k.startswith("undeliverable.") and n
            )
            or "0"
        ),
    ),
    (
        "resync entries sent / predecessor entries withdrawn",
        lambda r: "{:,} / {:,}".format(
            r["failures"]["resync_entries_sent"], r["failures"]["predecessor_entries_withdrawn"]
        ),
    ),
    (
        "notification delay mean (p99)",
        lambda r: "{mean:.3f} s ({p99:.3f} s)".format(**r["notification_delay"]),
    ),
)
"""The failure table: (row label, value of one run's report)."""


def order_table(reports: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: DNR's "least loaded" orders side by side (CE, the paper's, and
    BlueDove's estimated processing time), when the runs include both."""
    runs = [r for r in reports if r.get("routing", r["mode"]) == "dnr"]
    if len({r.get("order", "ce") for r in runs}) < 2:
        return []
    lines = [
        "",
        "| DNR order | run | target-link queue mean / max | notification delay mean / p50 / "
        "p99 / max s | cases I / II / III | kept off |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["mode"], r.get("repeat", 0))):
        m, d = metrics(r), r["notification_delay"]
        lines.append(
            f"| {r.get('order', 'ce')} | {r.get('repeat', 0) + 1} | "
            f"{m['queue']:.2f} / {m['queue_max']:,} | "
            f"{d['mean']:.3f} / {d['p50']:.3f} / {d['p99']:.3f} / {d['max']:.3f} | "
            f"{r.get('dnr_case_1', 0):,} / {r.get('dnr_case_2', 0):,} / "
            f"{r.get('dnr_case_3', 0):,} | {r.get('dnr_kept_off', 0):,} |"
        )
    return lines


def _victim(report: dict[str, Any], prefix: str, suffix: str = "") -> Any:
    key = next(k for k in report["failures"] if k.startswith(prefix + ".") and k.endswith(suffix))
    return report["failures"][key]


def failure_table(profile: Profile, reports: list[dict[str, Any]]) -> str:
    """Markdown: one column per mode, the failure figures of each run."""
    runs = sorted(reports, key=lambda r: r["mode"], reverse=True)
    lines = [
        f"### failure ({runs[0]['profile']} profile)",
        "",
        profile.note,
        "",
        "| | " + " | ".join(r["mode"].upper() for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for label, value in FAILURE_ROWS:
        lines.append(f"| {label} | " + " | ".join(str(value(r)) for r in runs) + " |")
    return "\n".join(lines) + "\n"


def ratios(
    name: str, groups: dict[tuple[int, int, str], list[dict[str, float]]]
) -> list[tuple[str, tuple[float, float, float], float, str]]:
    """(label, our mean change over the points with its 95% bootstrap interval, the
    paper's, the verdict) for the experiment's headline claims (:mod:`bench.stats`)."""
    points = sorted({(s, p) for s, p, _ in groups})
    rows = []
    for label, key, mode, base, claim in CLAIMS["burst" if name == "burst" else "scaling"]:
        pairs = [
            ((s, p, mode), (s, p, base))
            for s, p in points
            if (s, p, mode) in groups and (s, p, base) in groups
        ]
        values = {k: [run[key] for run in groups[k]] for pair in pairs for k in pair}
        estimate = change_interval(values, pairs) if pairs else (math.nan,) * 3
        runs = min((len(v) for v in values.values()), default=0)
        paper = PAPER.get(claim, math.nan)
        rows.append(
            (
                f"{label}, {mode.upper()} vs {base.upper()}",
                estimate,
                paper,
                verdict(paper, estimate[1], estimate[2], runs),
            )
        )
    return rows


def recovery(report: dict[str, Any]) -> tuple[int, float]:
    """Peak of all output queues, and seconds from the HRP's last publication until they
    hold at most 2% of that peak (NaN if never, 0 if they never grew)."""
    timeline = report.get("timeline", [])
    hrp = report.get("hrp") or {}
    peak = max((s["total"] for s in timeline), default=0)
    if not timeline or not hrp or peak == 0:
        return peak, 0.0
    stops = hrp["start"] + hrp["notifications"] * 60.0 / hrp["rate_per_minute"]
    calm = max(2, 0.02 * peak)
    settled = [s["t"] for s in timeline if s["t"] >= stops and s["total"] <= calm]
    return peak, max(0.0, settled[0] - stops) if settled else math.nan


def _seconds(value: float) -> str:
    return "did not settle" if math.isnan(value) else f"{value:.1f} s"


def _pct(value: float) -> str:

    return "–" if math.isnan(value) else f"{value:+.0%}"


# -- plots ---------------------------------------------------------------------------------


def plot(name: str, reports: list[dict[str, Any]], path: Path) -> None:
    """Plots laid out like the paper's Figs. 9–11."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if name == "failure":
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        colours = {"snr": "tab:blue", "dnr": "tab:orange", "bid": "tab:green"}
        for r in sorted(reports, key=lambda r: r["mode"], reverse=True):
            series, colour = r["series"], colours[r["mode"]]
            width = series[1]["t"] - series[0]["t"] if len(series) > 1 else 1.0
            t = [b["t"] for b in series]
            label = r["mode"].upper()
            axes[0].plot(t, [b["delivered"] / width for b in series], color=colour, label=label)
            axes[1].plot(t, [b["delay_mean"] for b in series], color=colour, label=f"{label} mean")
            axes[1].plot(
                t, [b["delay_max"] for b in series], ":", color=colour, label=f"{label} max"
            )
            axes[2].plot(t, [b["lost"] for b in series], color=colour, label=label)
        for failure in reports[0]["failure_schedule"]:
            for ax in axes:
                ax.axvline(failure["at"], color="red", alpha=0.6, lw=1)
                if failure["until"] is not None:
                    ax.axvline(failure["until"], color="green", alpha=0.6, lw=1)
        since = "time since publishing started (s)"
        labels = (
            (since, "deliveries/s", "(a) delivery rate (red: kill -9, green: restart)"),
            (since, "delay (s)", "(b) notification delay"),
            ("publication time (s)", "deliveries lost", "(c) deliveries lost, by when published"),
        )
        for ax, (x, y, title) in zip(axes, labels, strict=True):
            ax.set(xlabel=x, ylabel=y, title=title)
    elif name == "burst":
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for r in reports:
            series = r.get("max_delay_per_1000", [])
            axes[0].plot(range(1, len(series) + 1), series, marker=".", label=r["mode"].upper())
            timeline = r.get("timeline", [])
            axes[1].plot(
                [s["t"] for s in timeline], [s["total"] for s in timeline], label=r["mode"].upper()
            )
        axes[0].set(
            xlabel="deliveries (thousands, in arrival order)",
            ylabel="max delay of 1,000 deliveries (s)",
            title="(a) delay (Fig. 11)",
        )
        axes[1].set(
            xlabel="time since publishing started (s)",
            ylabel="messages in all output queues",
            title="(b) output queues",
        )
    else:
        x_key = "subscribers" if name == "subscribers" else "publishers"
        panels: list[tuple[str, str, Callable[[dict], float]]] = [
            ("SBP messages", "messages", lambda m: m["sbp_messages"]),
            ("subscription delay", "s", lambda m: m["subscription_delay"]),
            ("notification delay", "s", lambda m: m["notification_delay"]),
            ("notification messages", "messages", lambda m: m["notification_messages"]),
            ("matching delay", "µs", lambda m: 1e6 * m["matching_delay"]),
        ]
        medians_by = {key: medians(runs) for key, runs in grouped(reports).items()}
        fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
        for ax, (title, unit, value) in zip(axes, panels, strict=True):
            for mode in MODES:
                runs = sorted(
                    (subs if x_key == "subscribers" else pubs, value(m))
                    for (subs, pubs, m_mode), m in medians_by.items()
                    if m_mode == mode
                )
                if runs:
                    ax.plot(*zip(*runs, strict=True), marker="o", label=mode.upper())
            ax.set(title=title, xlabel=x_key, ylabel=unit)
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"OctopiS on paper75, 75 broker processes: {name} ({reports[0]['profile']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def delivered_as_promised(report: dict[str, Any]) -> bool:
    """Exactly once, and no link declared down (a false detection). With failures the
    promise is SNR's and DNR's (BID stays static and counts what it loses, DESIGN §7): for
    every subscriber, those whose host stayed alive and those of a killed host, who fail
    over and replay what they missed (DESIGN §11)."""
    failures = report["failures"]
    if "host_alive" not in failures:
        return not (report["lost"] or report["duplicates"] or failures.get("links_down"))
    if report.get("routing", report["mode"]) == "bid":
        return True
    groups = [failures["host_alive"], failures.get("host_dead", {})]
    return not any(g.get("lost") or g.get("duplicates") or g.get("unexpected") for g in groups)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.experiments EXPERIMENT [--quick]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.experiments",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "experiment",
        choices=sorted([*PROFILES, "balance", "balance-sim", "elastic", *SIMULATED]),
        help="the experiment to run (see the list above)",
    )
    p.add_argument("--quick", action="store_true", help="the few-minute profile")
    p.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench" / "results",
        help="directory of the reports, tables and plots (default bench/results)",
    )
    p.add_argument(
        "--modes",
        default=",".join(RUNS),
        help=f"comma-separated among {', '.join(RUNS)} (default all the experiment has)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the workload (default 1)")
    p.add_argument(
        "--plan",
        choices=("ldm", "sdm"),
        default="ldm",
        help="balance: the balancer's dynamic migration, load-based or similarity-based "
        "(default ldm)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="runs of every point and mode, modes interleaved; figures are medians with "
        "95%% bootstrap intervals, ratios get a verdict (default 5)",
    )
    p.add_argument(
        "--client-workers",
        type=int,
        default=default_client_workers(),
        help="client worker processes per run (default: octopis run's, one per core beyond "
        "the first two)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="simulations run at once (sim-* experiments; default 1)",
    )
    p.add_argument(
        "--service",
        type=Path,
        default=REPO / "bench" / "results" / "service.json",
        help="the CPU cost model of the sim-* experiments (python -m bench.calibrate)",
    )
    args = p.parse_args(argv)
    if args.repeats < 1 or args.client_workers < 0 or args.jobs < 1:
        p.error("--repeats and --jobs must be ≥ 1 and --client-workers ≥ 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    modes = tuple(m for m in args.modes.split(",") if m)
    if not set(modes) <= set(RUNS):
        p.error(f"--modes must be among {', '.join(RUNS)}")
    started = time.monotonic()
    if args.experiment in SIMULATED:
        from bench import sim_experiments

        try:
            reports = sim_experiments.run(
                args.experiment,
                args.out,
                quick=args.quick,
                repeats=args.repeats,
                seed=args.seed,
                jobs=args.jobs,
                service=args.service,
                modes=tuple(m for m in modes if m in MODES),
            )
        except ValueError as exc:
            p.error(str(exc))
        written = args.out / (args.experiment + ("-quick" if args.quick else ""))
        print(written.with_suffix(".md").read_text())
        bad = [r for r in reports if r["lost"] or r["duplicates"] or r["unexpected"]]
        print(f"{len(reports)} runs in {time.monotonic() - started:.0f} s; {len(bad)} not "
              f"exactly once; plot: {written.with_suffix('.png')}")  # fmt: skip
        return 1 if bad else 0
    if args.experiment == "balance-sim":
        from bench import balance

        print(balance.simulate(args.out, args.seed))
        return 0
    if args.experiment == "elastic":
        from bench import elastic

        report = elastic.run(args.out)
        print((args.out / "elastic.md").read_text())
        print(f"in {time.monotonic() - started:.0f} s; plot: {args.out / 'elastic.png'}")
        counts = report["counts"]
        return 0 if counts["lost"] == counts["duplicated"] == 0 else 1
    if args.experiment == "balance":
        from bench import balance

        report = balance.run(args.quick, args.out, args.seed, args.plan)
        print((args.out / "balance.md").read_text())
        print(f"in {time.monotonic() - started:.0f} s; plot: {args.out / 'balance.png'}")
        return 0 if delivered_as_promised(report) else 1
    reports = run_experiment(
        args.experiment,
        args.quick,
        args.out,
        modes,
        args.seed,
        repeats=args.repeats,
        client_workers=args.client_workers,
    )
    bad = [r for r in reports if not delivered_as_promised(r)]
    print((args.out / f"{args.experiment}.md").read_text())
    print(
        f"{len(reports)} runs in {time.monotonic() - started:.0f} s; "
        f"{len(bad)} broke the promise (exactly once, no false detection; under failures, "
        f"for every subscriber in SNR and DNR, the killed hosts' ones too); plots: "
        f"{args.out / (args.experiment + '.png')}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
