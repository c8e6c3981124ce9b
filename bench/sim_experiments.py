"""The paper's profiles at full size in the calibrated simulator (issue 20): what two
cores cannot run as 75 broker processes.

    python -m bench.experiments sim-subscribers --jobs 2   # Fig. 9, 500 → 10,000 subscribers
    python -m bench.experiments sim-publishers --jobs 2    # Fig. 10(b)-(d), 3,000 subscribers
    python -m bench.experiments sim-burst --jobs 2         # Fig. 11, three follower placements
    python -m bench.experiments sim-burst --quick          # the same with a 12 s burst

Every run is `octopis sim`'s simulator on paper75 with each broker's CPU charged the
costs measured on the broker processes (``bench/results/service.json``, written by
``python -m bench.calibrate``): a notification waits for its broker's CPU, and a copy
counts in its sender's output queue until the receiver's CPU takes it, so DNR sees a
busy broker as the processes' LSTs do. Links add 100 µs plus exponential jitter of mean
200 µs. Workloads are generated (synthetic quotes: the shared data has 100 symbols,
the publishers profile needs 500 feeds). Repeat r uses seed ``seed + r``: another
placement, other quotes, other latency draws. Results: ``<out>/<experiment>/*.json``,
``<out>/<experiment>.md`` (medians, 95% bootstrap intervals, verdicts on the paper's
ratios, :mod:`bench.stats`) and ``<out>/<experiment>.png``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.profiles import CLAIMS, MODES, PAPER
from bench.stats import change_interval, median, median_interval, verdict
from octopis.sim import LatencyModel, Simulator
from octopis.sim.service import ServiceModel
from octopis.topology import build_preset
from octopis.workload import HighRatePublisher, generate_workload

log = logging.getLogger("bench.sim_experiments")
REPO = Path(__file__).resolve().parents[1]
SERVICE = REPO / "bench" / "results" / "service.json"
LATENCY, JITTER = 1e-4, 2e-4
SAMPLE_EVERY = 0.5
"""Seconds between samples of everything queued (the burst's queue plot)."""


@dataclass(frozen=True)
class SimPoint:
    """One point of a simulated profile: its label and workload."""

    label: str
    x: float
    """Where the point sits on the plots' x axis."""
    subscribers: int
    publishers: int
    notifications: int
    rate: float
    hrp: HighRatePublisher | None = None


@dataclass(frozen=True)
class SimProfile:
    note: str
    x_label: str
    points: tuple[SimPoint, ...]
    claims: tuple[tuple[str, str, str, str, str], ...]
    """Ratio rows as :data:`bench.profiles.CLAIMS`; judged per point when
    :attr:`per_point`, else as the mean over the points."""
    per_point: bool = False


def _burst(hrp_notifications: int, note: str) -> SimProfile:
    """The burst at three placements of the HRP's followers (paper §7.3 and the mixed
    regime), the HRP at 100,000/min from 10 s."""
    return SimProfile(
        "paper75, 5,000 subscribers, 100 publishers × 60 at 60/min, an HRP publishing "
        f"{hrp_notifications:,} at 100,000/min (1,667/s) from 10 s {note} to 0.2% of the "
        "subscribers (10): all in other clusters (every HRP iCOL a target link), half of "
        "them in its own cluster (mixed), or all in it",
        "followers in the HRP's cluster",
        tuple(
            SimPoint(
                label,
                inside,
                5000,
                100,
                60,
                60.0,
                HighRatePublisher(hrp_notifications, 100_000.0, 0.002, 10.0, inside=inside),
            )
            for label, inside in (("across", 0.0), ("mixed", 0.5), ("inside", 1.0))
        ),
        (
            *(c for c in CLAIMS["burst"] if c[4]),
            ("peak queued (links and CPUs)", "peak_queued", "dnr", "snr", ""),
            ("peak queued (links and CPUs)", "peak_queued", "dnr", "bid", ""),
        ),
        per_point=True,
    )


_SCALING_CLAIMS = tuple(
    c
    for c in CLAIMS["scaling"]
    if c[1] in ("sbp_messages", "subscription_delay", "notification_delay", "notification_messages")
)
SIM_PROFILES: dict[str, dict[str, SimProfile]] = {
    "sim-subscribers": {
        "full": SimProfile(
            "paper75, 500 → 10,000 subscribers as in the paper, 100 publishers × 60 "
            "notifications at 60/min (paper: × 1,000)",
            "subscribers",
            tuple(
                SimPoint(f"{n} subscribers", n, n, 100, 60, 60.0)
                for n in (500, 1000, 2500, 5000, 10_000)
            ),
            _SCALING_CLAIMS,
        ),
        "quick": SimProfile(
            "paper75, 500 and 1,500 subscribers, 100 publishers × 15 at 60/min (the "
            "processes' quick profile)",
            "subscribers",
            tuple(SimPoint(f"{n} subscribers", n, n, 100, 15, 60.0) for n in (500, 1500)),
            _SCALING_CLAIMS,
        ),
    },
    "sim-publishers": {
        "full": SimProfile(
            "paper75, 3,000 subscribers, 100 → 500 publishers at 100 notifications/min as "
            "in the paper, 60 notifications each (paper: 500)",
            "publishers",
            tuple(SimPoint(f"{p} publishers", p, 3000, p, 60, 100.0) for p in range(100, 600, 100)),
            _SCALING_CLAIMS,
        ),
        "quick": SimProfile(
            "paper75, 1,000 subscribers, 100 and 300 publishers × 20 at 100/min",
            "publishers",
            tuple(SimPoint(f"{p} publishers", p, 1000, p, 20, 100.0) for p in (100, 300)),
            _SCALING_CLAIMS,
        ),
    },
    "sim-burst": {
        "full": _burst(100_000, "(the paper's size: 60 s of burst)"),
        "quick": _burst(20_000, "(paper: 100,000)"),
    },
}
"""Each simulated experiment's full profile (the paper's sizes) and its quick one."""


def simulate(point: SimPoint, mode: str, seed: int, service: ServiceModel) -> dict[str, Any]:
    """One run: the point's workload (seeded) on paper75 in ``mode``; the simulator's
    report with the delay per 1,000 deliveries and the queue timeline."""
    scot = build_preset("paper75")
    workload = generate_workload(
        scot,
        subscribers=point.subscribers,
        publishers=point.publishers,
        notifications=point.notifications,
        seed=seed,
        rate_per_minute=point.rate,
        hrp=point.hrp,
    )
    sim = Simulator(
        scot,
        mode,
        seed=seed,
        latency=LatencyModel(LATENCY, JITTER),
        service=service,
        covering="off",  # the paper's SBP
    )
    sim.replay(workload, sample_every=SAMPLE_EVERY if point.hrp else None)
    report = sim.report()
    delays = sim.ledger.delays
    report["max_delay_per_1000"] = [max(delays[i : i + 1000]) for i in range(0, len(delays), 1000)]
    return report


def _task(args: tuple[str, SimPoint, str, int, int, str, str]) -> str:
    name, point, mode, repeat, seed, service_path, path = args
    model = ServiceModel.load(service_path)
    report = simulate(point, mode, seed, model)
    report.update(
        {
            "experiment": name,
            "mode": mode,
            "point": point.label,
            "x": point.x,
            "repeat": repeat,
            "seed": seed,
            "service": service_path,
            "service_model": model.to_json(),
        }
    )
    Path(path).write_text(json.dumps(report))
    return path


def run(
    name: str,
    out: Path,
    *,
    quick: bool = False,
    repeats: int = 5,
    seed: int = 1,
    jobs: int = 1,
    service: Path = SERVICE,
    profile: SimProfile | None = None,
    modes: tuple[str, ...] = MODES,
) -> list[dict[str, Any]]:
    """Every point × mode × repeat of ``name``'s full or quick profile (``<name>`` or
    ``<name>-quick`` under ``out``; a run already on disk is reused), in ``jobs``
    processes, in ``modes``; writes the table and the plot; returns the reports. A run on
    disk made with another seed or service model is an error, not mixed in."""
    profile = profile or SIM_PROFILES[name]["quick" if quick else "full"]
    name = f"{name}-quick" if quick else name
    model = ServiceModel.load(service).to_json()  # a bad model file fails before any run
    base = out / name
    base.mkdir(parents=True, exist_ok=True)
    tasks = []
    for point in profile.points:
        for repeat in range(repeats):
            for mode in modes:
                path = base / f"{point.label.replace(' ', '-')}-{mode}-r{repeat}.json"
                if not path.is_file():
                    task = (name, point, mode, repeat, seed + repeat, str(service), str(path))
                    tasks.append(task)
                    continue
                made = json.loads(path.read_text())
                if made.get("seed") != seed + repeat or made.get("service_model") != model:
                    raise ValueError(
                        f"{path} was made with another seed or service model: "
                        "remove it or choose another --out"
                    )
    log.info("%s: %d runs to make in %d process(es)", name, len(tasks), jobs)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for done, path in enumerate(pool.map(_task, tasks), 1):
            log.info("%s: %d of %d done (%s)", name, done, len(tasks), Path(path).name)
    reports = [
        json.loads((base / f"{p.label.replace(' ', '-')}-{m}-r{r}.json").read_text())
        for p in profile.points
        for r in range(repeats)
        for m in modes
    ]
    (out / f"{name}.md").write_text(table(name, profile, reports))
    plot(name, profile, reports, out / f"{name}.png")
    return reports


# -- tables --------------------------------------------------------------------------------


def metrics(report: dict[str, Any]) -> dict[str, float]:
    """The per-run figures the tables and plots use."""
    delay, queue = report["notification_delay"], report.get("target_queue_length", {})
    return {
        "subscription_delay": report["subscription_delay"]["mean"],
        "notification_delay": delay["mean"],
        "notification_delay_p99": delay["p99"],
        "under_1s": delay["under_1s"],
        "queue": queue.get("mean", 0.0),
        "queue_p99": queue.get("p99", 0),
        "queue_max": queue.get("max", 0),
        "sbp_messages": report["sbp_messages"],
        "notification_messages": report["notification_messages"],
        "busiest": report["cpu_busy"]["busiest_share"],
        "peak_queued": max((n for _, n in report.get("queue_timeline", [])), default=math.nan),
        "kept_off": report.get("dnr_kept_off", 0),
        "expected": report["expected_deliveries"],
        "delivered": report["delivered"],
        "duplicates": report["duplicates"],
        "lost": report["lost"],
    }


def grouped(reports: list[dict[str, Any]]) -> dict[tuple[float, str, str], list[dict[str, float]]]:
    """:func:`metrics` of each run by (x, point label, mode)."""
    groups: dict[tuple[float, str, str], list[dict[str, float]]] = {}
    for r in reports:
        groups.setdefault((r["x"], r["point"], r["mode"]), []).append(metrics(r))
    return groups


def table(name: str, profile: SimProfile, reports: list[dict[str, Any]]) -> str:
    """Markdown: medians per point and mode, delay intervals, the paper's ratios judged."""
    groups = grouped(reports)
    runs = max(len(g) for g in groups.values())
    lines = [
        f"### {name} (calibrated simulator)",
        "",
        profile.note + ".",
        "",
        f"Medians of {runs} runs per point and mode (seeds differ); expected, delivered, "
        "duplicated and lost summed over the runs.",
        "",
        "| point | mode | delay mean s [95% interval] | p99 s | <1 s | queue mean / p99 | "
        "peak queued | SBP msgs | notification msgs | busiest CPU | kept off | expected | "
        "delivered | dup | lost |",
        "|" + "---|" * 15,
    ]
    for (_, label, mode), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        m = {k: median([g[k] for g in group]) for k in group[0]}
        mid, low, high = median_interval([g["notification_delay"] for g in group])
        total = {k: sum(int(g[k]) for g in group) for k in ("expected", "delivered")}
        lines.append(
            f"| {label} | {mode.upper()} | {mid:.4f} [{low:.4f}, {high:.4f}] | "
            f"{m['notification_delay_p99']:.4f} | {m['under_1s']:.1%} | "
            f"{m['queue']:.2f} / {m['queue_p99']:.0f} | {_count(m['peak_queued'])} | "
            f"{m['sbp_messages']:,.0f} | "
            f"{m['notification_messages']:,.0f} | {m['busiest']:.0%} | {m['kept_off']:,.0f} | "
            f"{total['expected']:,} | {total['delivered']:,} | "
            f"{sum(int(g['duplicates']) for g in group)} | {sum(int(g['lost']) for g in group)} |"
        )
    lines += [
        "",
        "| ratio | point | ours [95% interval] | paper | verdict |",
        "|---|---|---|---|---|",
    ]
    for label, point, (ours, low, high), paper, said in ratios(profile, groups):
        lines.append(
            f"| {label} | {point} | {_pct(ours)} [{_pct(low)}, {_pct(high)}] | "
            f"{_pct(paper)} | {said} |"
        )
    return "\n".join(lines) + "\n"


def ratios(
    profile: SimProfile, groups: dict[tuple[float, str, str], list[dict[str, float]]]
) -> Iterator[tuple[str, str, tuple[float, float, float], float, str]]:
    """(label, point, our change with its 95% interval, the paper's, the verdict) for
    each claim, per point or as the mean over the points (:mod:`bench.stats`)."""
    points = sorted({(x, label) for x, label, _ in groups})
    scopes = [[p] for p in points] if profile.per_point else [points]
    for label, key, mode, base, claim in profile.claims:
        for scope in scopes:
            pairs = [
                ((x, p, mode), (x, p, base))
                for x, p in scope
                if (x, p, mode) in groups and (x, p, base) in groups
            ]
            if not pairs:
                continue
            values = {k: [run[key] for run in groups[k]] for pair in pairs for k in pair}
            estimate = change_interval(values, pairs)
            runs = min(len(v) for v in values.values())
            paper = PAPER.get(claim, math.nan)
            where = scope[0][1] if len(scope) == 1 else "mean over the points"
            yield (
                f"{label}, {mode.upper()} vs {base.upper()}",
                where,
                estimate,
                paper,
                verdict(paper, estimate[1], estimate[2], runs),
            )


def _count(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:,.0f}"


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:+.0%}"


# -- plots ---------------------------------------------------------------------------------


def plot_data(
    profile: SimProfile, reports: list[dict[str, Any]]
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """What :func:`plot` draws, per panel and mode: (x, y) points. Scaling profiles: the
    median delay mean and p99 and the notification messages against x; the burst: for
    each placement, repeat 0's max delay per 1,000 deliveries and its queued timeline."""
    data: dict[str, dict[str, list[tuple[float, float]]]] = {}
    if not profile.per_point:
        groups = grouped(reports)
        for key, title in (
            ("notification_delay", "mean notification delay (s)"),
            ("notification_delay_p99", "p99 notification delay (s)"),
            ("notification_messages", "notification messages"),
        ):
            panel = data.setdefault(title, {})
            for (x, _, mode), group in sorted(groups.items()):
                panel.setdefault(mode.upper(), []).append((x, median([g[key] for g in group])))
        return data
    for r in sorted(reports, key=lambda r: (r["x"], r["mode"])):
        if r["repeat"]:
            continue
        series = r["max_delay_per_1000"]
        data.setdefault(f"{r['point']}: max delay of 1,000 deliveries (s)", {})[
            r["mode"].upper()
        ] = [(i + 1, d) for i, d in enumerate(series)]
        data.setdefault(f"{r['point']}: messages queued", {})[r["mode"].upper()] = [
            (t, n) for t, n in r.get("queue_timeline", [])
        ]
    return data


def plot(name: str, profile: SimProfile, reports: list[dict[str, Any]], path: Path) -> None:
    """The panels of :func:`plot_data`, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = plot_data(profile, reports)
    columns = 3
    rows = math.ceil(len(data) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.8 * rows), squeeze=False)
    order = sorted(data, key=lambda t: ("queued" in t, t)) if profile.per_point else list(data)
    for ax, title in zip(axes.flat, order, strict=False):
        for mode in sorted(data[title], key=lambda m: m == "DNR"):  # DNR dashed, on top
            points = data[title][mode]
            if points:
                ax.plot(
                    *zip(*points, strict=True),
                    marker=None if profile.per_point else ".",
                    linestyle="--" if mode == "DNR" else "-",
                    label=mode,
                    lw=1,
                )
        ax.set_title(title, fontsize=9)
        if profile.per_point:
            since = "time since publishing started (s)"
            ax.set_xlabel("deliveries (thousands)" if "delay" in title else since)
        else:
            ax.set_xlabel(profile.x_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(data) :]:
        ax.set_visible(False)
    fig.suptitle(f"OctopiS on paper75, calibrated simulator: {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
