"""The experiments' profiles and claims, shared by the process runs (:mod:`bench.experiments`),
the simulated ones (:mod:`bench.sim_experiments`) and the balancer's (:mod:`bench.balance`):
what each experiment runs at each size, the paper's headline ratios, and the Spark-built
workload with its nested subsets."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octopis.failure_schedule import Failure
from octopis.quotes import quotes_dir
from octopis.settings import BrokerSettings, Links, Routing
from octopis.workload import Workload, read_workload

log = logging.getLogger("bench.profiles")
MODES = ("snr", "dnr", "bid")
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "dnr-bluedove": ("dnr", {"lst": {"order": "bluedove"}}),
}
"""Runs beyond the three modes: label → (routing mode, settings it changes by section)."""
RUNS = (*MODES, *VARIANTS)
SIMULATED = ("sim-burst", "sim-publishers", "sim-subscribers")
"""Profiles run in the calibrated simulator (:mod:`bench.sim_experiments`)."""
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Profile:
    """One experiment at one size: the workload to build and the points to run."""

    subscribers: int
    publishers: int
    notifications: int
    rate: float
    points: tuple[tuple[int, int], ...]
    """(subscribers, publishers) of each point, subsets of the built workload."""
    note: str
    hrp: dict[str, Any] = field(default_factory=dict)
    settings: BrokerSettings = field(
        default_factory=lambda: BrokerSettings(routing=Routing(covering="off"))
    )
    """The brokers' settings; covering off throughout: the paper's SBP."""
    sample_every: float | None = None
    selectivity: float | None = None
    """Mean subscription selectivity for the Spark job (None: its default, 2%)."""
    failures: tuple[Failure, ...] = ()
    modes: tuple[str, ...] = ("snr", "dnr", "bid")


PROFILES: dict[str, dict[str, Profile]] = {
    "subscribers": {
        "quick": Profile(
            1500,
            100,
            15,
            60.0,
            ((500, 100), (1500, 100)),
            "500 and 1,500 subscribers (paper: 500 → 10,000); 100 publishers "
            "× 15 notifications at 60/min (paper: × 1,000)",
        ),
        "full": Profile(
            10_000,
            100,
            100,
            60.0,
            ((500, 100), (1000, 100), (2500, 100), (5000, 100), (10_000, 100)),
            "500 → 10,000 subscribers as in the paper; 100 publishers × 100 "
            "notifications at 60/min (paper: × 1,000)",
        ),
    },
    "publishers": {
        "quick": Profile(
            1000,
            300,
            10,
            30.0,
            ((1000, 100), (1000, 300)),
            "100 and 300 publishers × 10 notifications at 30/min with 1,000 "
            "subscribers (paper: 100 → 500 publishers × 500 at 100/min, "
            "3,000 subscribers)",
        ),
        "full": Profile(
            3000,
            500,
            60,
            30.0,
            ((3000, 100), (3000, 200), (3000, 300), (3000, 400), (3000, 500)),
            "100 → 500 publishers × 60 notifications with 3,000 subscribers as "
            "in the paper, at 30/min (paper: 500 at 100/min; two cores)",
        ),
    },
    "burst": {
        "quick": Profile(
            1000,
            20,
            40,
            60.0,
            ((1000, 20),),
            "1,000 subscribers, 20 publishers × 40 at 60/min, an HRP sending "
            "3,000 at 12,000/min to 0.2% followers in other clusters, every "
            "broker limited to 300 sends/s (paper: 5,000 subscribers, 100 "
            "publishers, HRP 100,000 at 60,000–100,000/min)",
            hrp={"notifications": 3000, "rate": 12000.0, "interest": 0.002, "start": 5.0},
            settings=BrokerSettings(
                links=Links(broker_capacity=300.0), routing=Routing(covering="off")
            ),
            sample_every=0.5,
            modes=RUNS,
        ),
        "full": Profile(
            5000,
            100,
            120,
            60.0,
            ((5000, 100),),
            "5,000 subscribers and 100 publishers × 120 at 60/min as in the "
            "paper; HRP 12,000 at 24,000/min (paper: 100,000 at 100,000/min), "
            "every broker limited to 800 sends/s",
            hrp={"notifications": 12000, "rate": 24000.0, "interest": 0.002, "start": 10.0},
            settings=BrokerSettings(
                links=Links(broker_capacity=800.0), routing=Routing(covering="off")
            ),
            sample_every=0.5,
            modes=RUNS,
        ),
    },
}

FAILURE_VICTIM = "viii:2"
"""An inner broker of paper75: five regions on its tree path, eight neighbours."""


def _failure_profile(
    subscribers: int, publishers: int, notifications: int, rate: float, kill: float, back: float
) -> Profile:
    """``kill -9`` of :data:`FAILURE_VICTIM` at ``kill`` s, restarted at ``back`` s, while
    ``publishers`` publish ``notifications`` each at ``rate`` per minute (SNR, DNR)."""
    per_second = publishers * rate / 60
    return Profile(
        subscribers,
        publishers,
        notifications,
        rate,
        ((subscribers, publishers),),
        f"{subscribers:,} subscribers, {publishers} publishers × {notifications:,} at "
        f"{rate:.0f}/min ({per_second:.0f} notifications/s for "
        f"{notifications * 60 / rate:.0f} s), selectivity 0.2%; kill -9 of "
        f"{FAILURE_VICTIM} (hosting subscribers) at {kill:.0f} s, restarted at {back:.0f} s",
        sample_every=0.5,
        selectivity=0.002,
        failures=(Failure((FAILURE_VICTIM,), kill, back),),
        modes=("snr", "dnr"),
    )


PROFILES["failure"] = {
    "quick": _failure_profile(1000, 20, 600, 900.0, 10.0, 25.0),
    "full": _failure_profile(3000, 30, 1200, 600.0, 30.0, 70.0),
}

PAPER = {
    "sbp_messages": -0.89,
    "subscription_delay": -0.77,
    "notification_delay": -0.47,
    "notification_messages": -0.12,
    "matching_delay_bid": -0.25,
    "burst_queue_vs_snr": -0.48,
    "burst_queue_vs_bid": -0.59,
    "burst_delay_vs_snr": -0.13,
    "burst_delay_vs_bid": -0.58,
}
"""The paper's headline ratios (§7.3, abstract): negative = OctopiS lower."""

CLAIMS: dict[str, list[tuple[str, str, str, str, str]]] = {
    "scaling": [
        ("SBP messages", "sbp_messages", "snr", "bid", "sbp_messages"),
        ("subscription delay", "subscription_delay", "snr", "bid", "subscription_delay"),
        ("notification delay", "notification_delay", "snr", "bid", "notification_delay"),
        ("notification delay", "notification_delay", "dnr", "bid", "notification_delay"),
        ("overlay delay", "overlay_delay", "snr", "bid", "notification_delay"),
        ("overlay delay", "overlay_delay", "dnr", "bid", "notification_delay"),
        ("notification messages", "notification_messages", "snr", "bid", "notification_messages"),
        ("matching delay", "matching_delay", "bid", "snr", "matching_delay_bid"),
    ],
    "burst": [
        ("target-link queue", "queue", "dnr", "snr", "burst_queue_vs_snr"),
        ("target-link queue", "queue", "dnr", "bid", "burst_queue_vs_bid"),
        ("notification delay", "notification_delay", "dnr", "snr", "burst_delay_vs_snr"),
        ("notification delay", "notification_delay", "dnr", "bid", "burst_delay_vs_bid"),
        ("target-link queue", "queue", "dnr-bluedove", "dnr", ""),
        ("notification delay", "notification_delay", "dnr-bluedove", "dnr", ""),
    ],
}
"""Each table row: (label, metric, mode, baseline, PAPER key); ``ratios`` reports the mean
change of ``metric`` from ``baseline`` to ``mode`` over the experiment's points (no PAPER
key: the paper has no such figure). *Overlay delay* is the notification delay up to the
last broker's stamp (processes only), held against the paper's notification delay: the
share of the delay that routing can change."""


def build_workload(profile: Profile, topology: Path, out: Path, seed: int) -> Workload:
    """Run the Spark job once for the largest point of ``profile``; a workload already in
    ``out`` is used only if it was built with the same sizes, rate and seed."""
    wanted = {
        "subscribers": profile.subscribers,
        "publishers": profile.publishers,
        "notifications_per_publisher": profile.notifications,
        "rate_per_minute": profile.rate,
        "seed": seed,
    }
    meta = out / "meta.json"
    built = json.loads(meta.read_text()) if meta.is_file() else {}
    if any(built.get(k) != v for k, v in wanted.items()):
        if built:
            log.info("rebuilding the workload in %s: it was built for another profile", out)
            shutil.rmtree(out)
        args = [
            sys.executable,
            "-m",
            "spark_workloads.stock_workload",
            "--topology",
            str(topology),
            "--out",
            str(out),
            "--quotes",
            str(quotes_dir()),
            "--subscribers",
            str(profile.subscribers),
            "--publishers",
            str(profile.publishers),
            "--notifications",
            str(profile.notifications),
            "--rate",
            str(profile.rate),
            "--seed",
            str(seed),
            "--master",
            "local[2]",
            "--log-level",
            "WARNING",
        ]
        if profile.selectivity is not None:
            args += ["--selectivity", str(profile.selectivity)]
        if profile.hrp:
            args += [
                "--hrp-notifications",
                str(profile.hrp["notifications"]),
                "--hrp-rate",
                str(profile.hrp["rate"]),
                "--hrp-interest",
                str(profile.hrp["interest"]),
                "--hrp-start",
                str(profile.hrp["start"]),
                "--burst-placement",
            ]
        started = time.monotonic()
        subprocess.run(args, check=True, cwd=REPO)
        log.info("workload built in %.0f s", time.monotonic() - started)
    return read_workload(out)


def subset(workload: Workload, subscribers: int, publishers: int) -> Workload:
    """The first ``subscribers`` subscribers (the HRP's followers kept) and the first
    ``publishers`` publishers (the HRP kept), in the workload's own numbering."""
    hrp_followers = {
        s.subscriber for s in workload.subscriptions if "HRP" in s.subscription.to_text()
    }
    keep_subs = [
        s
        for s in workload.subscriptions
        if s.subscriber in hrp_followers or _index(s.subscriber) < subscribers
    ]
    keep_pubs = [
        p for p in workload.publications if p.publisher == "HRP" or _index(p.publisher) < publishers
    ]
    meta = {**workload.meta, "subset": {"subscribers": subscribers, "publishers": publishers}}
    return Workload(meta, keep_subs, keep_pubs)


def _index(name: str) -> int:
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else 0
