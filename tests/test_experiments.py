"""The experiment harness's bookkeeping: subsets, ratios, recovery time, tables, plots."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from bench.calibrate import fit
from bench.experiments import (
    change,
    delivered_as_promised,
    plot,
    recovery,
    table,
)
from bench.profiles import PROFILES, subset
from bench.stats import median_interval, verdict
from octopis.topology import build_preset
from octopis.workload import HighRatePublisher, generate_workload


def _report(
    mode: str, subscribers: int, sbp: int, delay: float, queue: float, **extra: object
) -> dict:
    return {
        "mode": mode,
        "profile": "quick",
        "point": {"subscribers": subscribers, "publishers": 100},
        "sbp_messages": sbp,
        "avg_subscription_tree_length": 5.9,
        "subscription_delay": {"mean": delay * 10},
        "notification_delay": {
            "mean": delay,
            "p50": delay / 2,
            "p99": 3 * delay,
            "max": 4 * delay,
            "under_1s": 0.9,
        },
        "matching_delay": {"mean_per_operation": 3e-5},
        "notification_messages": 1000,
        "target_queue_length": {"mean": queue, "max": int(5 * queue)},
        "expected_deliveries": 50,
        "delivered": 50,
        "duplicates": 0,
        "lost": 0,
        "timings": {"start": 9.0, "subscribe": 4.0},
        **extra,
    }


def test_subset_keeps_the_first_clients_and_the_hrp() -> None:
    scot = build_preset("fig2")
    workload = generate_workload(
        scot,
        subscribers=40,
        publishers=6,
        notifications=3,
        seed=2,
        hrp=HighRatePublisher(10, interest=0.05),
    )
    part = subset(workload, 10, 2)
    followers = {s.subscriber for s in workload.subscriptions if "HRP" in s.subscription.to_text()}
    assert {s.subscriber for s in part.subscriptions} == {f"S{i}" for i in range(10)} | followers
    assert {p.publisher for p in part.publications} == {"P0", "P1", "HRP"}
    assert part.meta["subset"] == {"subscribers": 10, "publishers": 2}


def test_scalability_table_states_our_ratios_beside_the_papers(tmp_path: Path) -> None:
    reports = [_report("snr", n, 74 * n, 0.1, 1.0) for n in (500, 1500)]
    reports += [_report("dnr", n, 74 * n, 0.1, 1.0) for n in (500, 1500)]
    reports += [_report("bid", n, 366 * n, 0.2, 2.0) for n in (500, 1500)]
    text = table("subscribers", PROFILES["subscribers"]["quick"], reports)
    sbp = f"{change(74, 366):+.0%}"
    assert f"| SBP messages, SNR vs BID | {sbp} [{sbp}, {sbp}] | -89% | inconclusive |" in text
    assert "| notification delay, SNR vs BID | -50% [-50%, -50%] | -47% | inconclusive |" in text
    assert "| 1500 | 100 | bid | 549,000 |" in text
    plot("subscribers", reports, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_burst_recovery_and_table(tmp_path: Path) -> None:
    hrp = {"start": 5.0, "notifications": 100, "rate_per_minute": 600.0}  # stops at 15 s
    busy = [
        {"t": t, "total": q} for t, q in [(0, 0), (10, 80), (15, 100), (16, 40), (18, 1), (20, 0)]
    ]
    calm = [{"t": t, "total": 0} for t in range(0, 21, 5)]
    stuck = [{"t": t, "total": 50} for t in range(0, 21, 5)]
    assert recovery({"timeline": busy, "hrp": hrp}) == (100, 3.0)
    assert recovery({"timeline": calm, "hrp": hrp}) == (0, 0.0)
    assert math.isnan(recovery({"timeline": stuck, "hrp": hrp})[1])
    reports = [
        _report(
            "snr", 1000, 74_000, 1.0, 20.0, timeline=busy, hrp=hrp, max_delay_per_1000=[0.2, 1.5]
        ),
        _report(
            "dnr", 1000, 74_000, 0.1, 2.0, timeline=calm, hrp=hrp, max_delay_per_1000=[0.1, 0.1]
        ),
        _report(
            "bid", 1000, 366_000, 2.0, 40.0, timeline=stuck, hrp=hrp, max_delay_per_1000=[0.3, 2.5]
        ),
    ]
    text = table("burst", PROFILES["burst"]["quick"], reports)
    assert "DNR order" not in text  # one order only: no comparison
    reports.append(
        _report(
            "dnr-bluedove",
            1000,
            74_000,
            0.05,
            1.0,
            routing="dnr",
            order="bluedove",
            timeline=calm,
            hrp=hrp,
            max_delay_per_1000=[0.1, 0.1],
            dnr_case_1=7,
        )
    )
    text = table("burst", PROFILES["burst"]["quick"], reports)
    assert "| ce | 1 | 2.00 / 10 | 0.100 / 0.050 / 0.300 / 0.400 | 0 / 0 / 0 | 0 |" in text
    assert "| bluedove | 1 | 1.00 / 5 | 0.050 / 0.025 / 0.150 / 0.200 | 7 / 0 / 0 | 0 |" in text
    assert "| target-link queue, DNR-BLUEDOVE vs DNR | -50% [-50%, -50%] | – | – |" in text
    assert "| target-link queue, DNR vs SNR | -90% [-90%, -90%] | -48% | inconclusive |" in text
    assert "| notification delay, DNR vs BID | -95% [-95%, -95%] | -58% | inconclusive |" in text
    assert (
        "| snr | 1 | 100 | 3.0 s | – |" in text and "| bid | 1 | 50 | did not settle | – |" in text
    )
    plot("burst", reports, tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 10_000


def _failure_report(mode: str, alive_lost: int, back_lost: int, away_lost: int = 0) -> dict:
    def group(expected: int, lost: int) -> dict:
        return {
            "expected_deliveries": expected,
            "delivered": expected - lost,
            "duplicates": 0,
            "lost": lost,
            "unexpected": 0,
        }

    series = [
        {
            "t": 0.5 * i,
            "published": 10,
            "delivered": 30,
            "lost": int(4 <= i < 8) * alive_lost,
            "delay_mean": 0.02,
            "delay_max": 0.1,
        }
        for i in range(20)
    ]
    return {
        "mode": mode,
        "profile": "quick",
        "notifications": 200,
        "notification_delay": {"mean": 0.05, "p99": 0.2},
        "lost": alive_lost + back_lost + away_lost,
        "duplicates": 0,
        "series": series,
        "failure_schedule": [{"brokers": ["viii:2"], "at": 2.0, "until": 6.0}],
        "failures": {
            "links_down": 8,
            "resync_entries_sent": 990,
            "predecessor_entries_withdrawn": 56,
            "tunnel.started": 0 if mode == "snr" else 955,
            "undeliverable.link_down": 962 if mode == "snr" else 0,
            "detection.viii:2": {"neighbours": 8, "first_s": 0.8, "last_s": 1.01},
            "restart.viii:2": {
                "serving_after_s": 2.1,
                "entries": 1000,
                "missing": 0,
                "extra": 0,
                "changed": 0,
            },
            "failover.viii:2.away_s": 2.3,
            "host_alive": group(30_000, alive_lost),
            "host_dead": group(300, back_lost + away_lost),
            "host_dead_after_back": group(180, back_lost),
        },
    }


def test_failure_table_and_plot_show_both_modes_and_the_promise(tmp_path: Path) -> None:
    reports = [_failure_report("snr", 1292, 111), _failure_report("dnr", 0, 0)]
    text = table("failure", PROFILES["failure"]["quick"], reports)
    assert "| | SNR | DNR |" in text
    assert (
        "| subscribers on live brokers: expected / delivered / duplicated / lost | "
        "30,000 / 28,708 / 0 / 1292 | 30,000 / 30,000 / 0 / 0 |" in text
    )
    assert "| detection (first–last neighbour) | 0.80–1.01 s | 0.80–1.01 s |" in text
    assert "| undeliverable copies, by reason | link_down 962 | 0 |" in text
    assert [delivered_as_promised(r) for r in reports] == [False, True]
    assert delivered_as_promised(_failure_report("bid", 1292, 111))  # static: counted
    assert not delivered_as_promised(_failure_report("dnr", 0, 2))
    assert not delivered_as_promised(_failure_report("dnr", 0, 0, away_lost=3))  # no replay
    plot("failure", reports, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_a_false_detection_breaks_the_promise() -> None:
    calm = _report("dnr", 500, 37_000, 0.1, 1.0, failures={"links_down": 0})
    jumpy = _report("dnr", 500, 37_000, 0.1, 1.0, failures={"links_down": 2})
    assert delivered_as_promised(calm) and not delivered_as_promised(jumpy)


def test_a_skewed_placement_deals_the_share_over_the_hot_brokers() -> None:
    """``bench.balance.skewed``: the first 80% of the subscribers go round-robin to the
    five hot brokers, every subscription of one subscriber to the same one; the rest
    and the publications stay as the workload had them."""
    from bench.balance import HOT, skewed

    scot = build_preset("paper75")
    workload = generate_workload(scot, subscribers=100, publishers=5, notifications=3, seed=2)
    placed = skewed(workload, scot, 0.8)
    hosts: dict[str, set[str]] = {}
    for s in placed.subscriptions:
        hosts.setdefault(s.subscriber, set()).add(s.broker)
    names = list(hosts)
    assert all(len(h) == 1 for h in hosts.values())
    assert [next(iter(hosts[n])) for n in names[:80]] == [HOT[i % 5] for i in range(80)]
    original = {s.subscriber: s.broker for s in workload.subscriptions}
    assert all(hosts[n] == {original[n]} for n in names[80:])
    assert placed.publications == workload.publications
    assert placed.meta["skew"] == {"share": 0.8, "hot": list(HOT)}


def test_repeated_runs_give_medians_intervals_and_a_verdict_on_each_claim() -> None:
    """Five runs per mode and point: a delay clearly half BID's is the paper's −47%
    reproduced; one the same as BID's is not; one whose runs scatter from far below to
    above BID's is inconclusive. The table gives each group's median and interval."""
    rng = random.Random(3)

    def runs(mode: str, delay: float, spread: float) -> list[dict]:
        return [
            {
                **_report(mode, n, 74 * n, delay * rng.uniform(1 - spread, 1 + spread), 1.0),
                "repeat": r,
            }
            for n in (500, 1500)
            for r in range(5)
        ]

    def verdict_of(snr_delay: float, spread: float) -> str:
        reports = runs("snr", snr_delay, spread) + runs("bid", 0.2, 0.05)
        text = table("subscribers", PROFILES["subscribers"]["quick"], reports)
        row = next(line for line in text.splitlines() if "notification delay, SNR vs BID" in line)
        assert "| 500 | 100 | snr | 5 |" in text
        return row.rsplit("|", 2)[1].strip()

    assert verdict_of(0.1, 0.05) == "reproduced"
    assert verdict_of(0.2, 0.05) == "not reproduced"
    assert verdict_of(0.15, 0.9) == "inconclusive"


def test_a_median_interval_holds_the_median_and_narrows_with_agreement() -> None:
    m, low, high = median_interval([1.0, 2.0, 3.0, 4.0, 100.0])
    assert m == 3.0 and low <= m <= high and high <= 100.0
    assert median_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    assert verdict(-0.47, -0.6, -0.3, 5) == "reproduced"
    assert verdict(-0.47, 0.1, 0.3, 5) == "not reproduced"
    assert verdict(-0.47, -0.2, 0.2, 5) == "not reproduced"
    assert verdict(-0.47, -0.5, 0.2, 5) == "inconclusive"
    assert verdict(-0.47, -0.6, -0.3, 1) == "inconclusive"


def test_the_cost_fit_recovers_known_costs_and_drops_a_negative_one() -> None:
    """Rows made from known costs (plus 1% noise) give those costs back; a column whose
    least-squares cost comes out negative is dropped, the rest refitted, none negative."""
    rng = random.Random(5)
    truth = {"per_message": 4e-4, "per_entry": 0.0, "per_copy": 1.2e-4, "per_delivery": 5e-5}
    rows = []
    for _ in range(60):
        taken, copies, deliveries = (
            rng.randint(100, 2000),
            rng.randint(0, 3000),
            rng.randint(0, 9000),
        )
        entries = taken * rng.randint(10, 1200)
        cpu = (
            truth["per_message"] * taken
            + truth["per_copy"] * copies
            + truth["per_delivery"] * deliveries
        )
        rows.append(
            {
                "cpu": cpu * rng.uniform(0.99, 1.01) - 1e-9 * entries,
                "taken_in": taken,
                "entries": entries,
                "copies": copies,
                "deliveries": deliveries,
            }
        )
    costs, residual = fit(rows)
    assert costs["per_entry"] == 0.0
    for name in ("per_message", "per_copy", "per_delivery"):
        assert abs(costs[name] - truth[name]) < 0.05 * truth[name], (name, costs)
    assert residual < 0.05


def test_simulated_profiles_run_repeats_and_judge_the_claims(tmp_path: Path) -> None:
    """A small publishers-style profile and a small burst in the calibrated simulator:
    every run exactly once and on disk, medians and verdict rows in the table, the plot's
    data from the runs (repeat 0's delays and queue timeline for the burst)."""
    from bench.sim_experiments import SimPoint, SimProfile, plot_data, run

    service = tmp_path / "service.json"
    service.write_text('{"per_message": 0.0004, "per_copy": 0.0001, "per_delivery": 0.00005}')
    scaling = SimProfile(
        "small",
        "publishers",
        tuple(SimPoint(f"{p} publishers", p, 50, p, 4, 120.0) for p in (4, 8)),
        (("notification delay", "notification_delay", "snr", "bid", "notification_delay"),),
    )
    reports = run("sim-small", tmp_path, repeats=2, jobs=1, service=service, profile=scaling)
    assert len(reports) == 2 * 2 * 3 and len(list((tmp_path / "sim-small").glob("*.json"))) == 12
    for r in reports:
        assert r["delivered"] == r["expected_deliveries"] > 0 and not r["lost"] + r["duplicates"]
    text = (tmp_path / "sim-small.md").read_text()
    assert "Medians of 2 runs" in text and "mean over the points" in text
    assert "| notification delay, SNR vs BID |" in text
    assert any(word in text for word in ("reproduced", "inconclusive"))
    data = plot_data(scaling, reports)
    assert sorted(x for x, _ in data["notification messages"]["BID"]) == [4, 8]
    again = run("sim-small", tmp_path, repeats=2, jobs=1, service=service, profile=scaling)
    assert again == reports  # reused from disk, not run again
    other = tmp_path / "other.json"
    other.write_text('{"per_message": 0.0005}')
    with pytest.raises(ValueError, match="another seed or service model"):
        run("sim-small", tmp_path, repeats=2, jobs=1, service=other, profile=scaling)
    with pytest.raises(ValueError, match="another seed or service model"):
        run("sim-small", tmp_path, repeats=2, seed=7, service=service, profile=scaling)

    burst = SimProfile(
        "burst",
        "inside",
        (SimPoint("across", 0.0, 150, 4, 4, 60.0, HighRatePublisher(300, 6000.0, 0.05, 1.0)),),
        (("target-link queue", "queue", "dnr", "snr", "burst_queue_vs_snr"),),
        per_point=True,
    )
    reports = run("sim-tiny-burst", tmp_path, repeats=1, jobs=2, service=service, profile=burst)
    data = plot_data(burst, reports)
    delays = data["across: max delay of 1,000 deliveries (s)"]["DNR"]
    dnr = next(r for r in reports if r["mode"] == "dnr")
    assert [d for _, d in delays] == dnr["max_delay_per_1000"]
    assert max(dnr["max_delay_per_1000"]) == dnr["notification_delay"]["max"]
    timeline = data["across: messages queued"]["SNR"]
    assert timeline[0][0] == 0 and timeline[-1][0] >= 1.0 + 300 / 100
    assert (
        "| target-link queue, DNR vs SNR | across |" in (tmp_path / "sim-tiny-burst.md").read_text()
    )


def test_the_calibration_check_runs_again_without_processes(tmp_path: Path) -> None:
    """``bench.calibrate --recheck``: the stored model and processes' delays, the
    simulator's side recomputed on the same seeded workload; the error is against the
    stored overlay delay, and a second recheck gives the same figures."""
    import json

    from bench.calibrate import main

    model = {"per_message": 0.0004, "per_copy": 0.0001, "per_delivery": 0.00005, "idle": 0.0}
    model["source"] = {"preset": "fig2", "rate": 40.0, "publishers": 2, "notifications": 10}
    model["source"] |= {"rows": 9, "relative_rms_residual": 0.1}
    check = {
        "subscribers": 40,
        "processes_overlay_ms": {"mean": 2.0, "p99": 5.0},
        "processes_total_ms": {"mean": 3.0, "p99": 6.0},
    }
    (tmp_path / "calibration.json").write_text(
        json.dumps({"model": model, "latency": 0.0001, "checks": [check], "rows": []})
    )
    assert main(["--recheck", "--out", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "calibration.json").read_text())["checks"][0]
    assert first["sim_ms"]["mean"] > 0.4  # at least one notification's charge
    assert first["error_of_mean"] == (first["sim_ms"]["mean"] - 2.0) / 2.0
    assert main(["--recheck", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "calibration.json").read_text())["checks"][0] == first
    assert "| 40 | 2.00 / 5.00 |" in (tmp_path / "calibration.md").read_text()


def test_the_simulator_scale_table_carries_the_line_to_the_goal() -> None:
    """``bench.sim_scale``: per covering setting the fitted cost per 1,000 subscriptions
    and the estimate at the target, judged against the goal (< 300 s, < 8 GiB)."""
    from bench.sim_scale import markdown

    def row(covering: str, n: int, seconds: float, mib: float) -> dict:
        counts = {"expected_deliveries": n, "delivered": n, "duplicates": 0, "lost": 0}
        return {"covering": covering, "subscriptions": n, "sbp_messages": n * 999,
                "notification_messages": n, "run_time": seconds,
                "peak_memory": mib * 2**20, **counts}  # fmt: skip

    rows = [row("off", n, 10 + n / 100, 100 + n / 10) for n in (1000, 2000, 4000)]
    rows += [row("active", n, 1 + n / 1000, 50 + n / 1000) for n in (1000, 2000)]
    lines = markdown(rows, 100_000).splitlines()
    assert "| off | 10.0 | 100 | 1,010 | 10,100 | not met |" in lines
    assert "| active | 1.0 | 1 | 101 | 150 | met |" in lines
    assert "| off | 4,000 | 3,996,000 | 4,000 | 4,000 | 4,000 | 0 | 0 | 50.0 | 500 |" in lines
