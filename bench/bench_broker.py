"""Broker hop: one broker process holding 10,000 subscriptions against bare relays,
measured side by side (issue 6 target: the broker reaches ≥ 50% of the pyzmq relay's
rate), the same broker with custody off, so the cost of custody (numbered frames,
acknowledgements, the custody buffer; DESIGN §7) is a ratio too, and the broker with
CurveZMQ on every socket of the hop (DESIGN §8), whose cost is the ratio to the broker
in the clear. See :mod:`bench.hop`
for the set-up and the two relay styles.

The machine is shared and noisy (runs of the same code differ by 2×, and the machine's
speed drifts by as much within minutes), so each round pumps 60,000 notifications
through the textbook pyzmq relay, the broker and the relay built from the broker's own
transport primitives, in an order that rotates from round to round; the figures of merit
are the medians of the per-round ratios, over :data:`RELAY_ROUNDS` rounds (a median of
five moved by ±0.07 from run to run). Beside the rates, each run reports the hop
process's CPU time per notification (:class:`bench.hop.HopRun`): what a change saves in
the hop itself, of which the rate shows about half (the harness shares the cores). Run with
``pytest bench/bench_broker.py --benchmark-only``; rates and ratios are in each
benchmark's ``extra_info``.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

import pytest

from bench.hop import NO_CUSTODY, HopBench, HopRun

SUBSCRIPTIONS = 10_000
NOTIFICATIONS = 60_000
ROUNDS = 5
RELAY_ROUNDS = 9
"""Rounds of :func:`test_broker_hop_against_relays`, whose ratios to the transport relay
spread over 0.6–1.35 round by round."""
RUNS = ("pyzmq", "broker", "transport", "broker_no_custody", "broker_curve")


@pytest.fixture(scope="module")
def hop() -> HopBench:
    return HopBench(subscriptions=SUBSCRIPTIONS, notifications=NOTIFICATIONS)


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_broker_hop_against_relays(
    benchmark: pytest.FixtureRequest, hop: HopBench, tmp_path: Path, mode: str
) -> None:
    """Rounds of pyzmq relay, broker and transport relay (order rotating); ratios of
    rates, and CPU per notification of each hop process."""
    rounds: list[dict[str, HopRun]] = []

    def one_round() -> None:
        shift = len(rounds) % len(RUNS)
        rates = {}
        for run in RUNS[shift:] + RUNS[:shift]:
            if run == "broker":
                rates[run] = hop.run_broker(tmp_path, mode)
            elif run == "broker_no_custody":
                rates[run] = hop.run_broker(tmp_path, mode, NO_CUSTODY)
            elif run == "broker_curve":
                rates[run] = hop.run_broker(tmp_path, mode, curve=True)
            else:
                rates[run] = hop.run_relay(run)
        rounds.append(rates)

    benchmark.group = "broker hop: 60,000 notifications, 10k subscriptions"
    benchmark.pedantic(one_round, rounds=RELAY_ROUNDS, iterations=1)
    info: dict[str, object] = {}
    for run in RUNS:
        info[f"{run}_per_second"] = [round(r[run].per_second) for r in rounds]
        info[f"{run}_cpu_us"] = [round(r[run].cpu_us, 2) for r in rounds]
        info[f"median_{run}_cpu_us"] = round(statistics.median(r[run].cpu_us for r in rounds), 2)
    for relay in ("pyzmq", "transport"):
        ratios = [r["broker"].per_second / r[relay].per_second for r in rounds]
        info[f"ratios_to_{relay}"] = [round(x, 3) for x in ratios]
        info[f"median_ratio_to_{relay}"] = round(statistics.median(ratios), 3)
    for cost, slower, faster in (
        ("custody", "broker", "broker_no_custody"),
        ("curve", "broker_curve", "broker"),
    ):
        costs = [1 - r[slower].per_second / r[faster].per_second for r in rounds]
        info[f"{cost}_cost"] = [round(x, 3) for x in costs]
        info[f"median_{cost}_cost"] = round(statistics.median(costs), 3)
    curve_ratios = [r["broker_curve"].per_second / r["pyzmq"].per_second for r in rounds]
    info["median_curve_ratio_to_pyzmq"] = round(statistics.median(curve_ratios), 3)
    benchmark.extra_info.update(info)


BASELINE_TREE = "OCTOPIS_BASELINE_TREE"
"""A source tree (an earlier commit checked out and built in place) to measure beside."""
LOW_RATE = (200.0, 1000)
"""Notifications per second and how many, for the hop delay at low rate."""


def _percentiles(delays: list[float]) -> dict[str, float]:
    ordered = sorted(delays)
    return {
        "p50_ms": round(1000 * ordered[len(ordered) // 2], 3),
        "p99_ms": round(1000 * ordered[int(len(ordered) * 0.99)], 3),
    }


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_broker_hop_beside_a_baseline_tree(
    benchmark: pytest.FixtureRequest, hop: HopBench, tmp_path: Path, mode: str
) -> None:
    """This tree's broker beside the one of ``$OCTOPIS_BASELINE_TREE`` (e.g. the commit
    before a change, `git worktree add` and `python setup.py build_ext --inplace`) and the
    pyzmq relay, rounds in rotating order: throughput ratios, and the hop delay of
    notifications sent one at a time at a low rate (p50, p99) for both brokers."""
    tree = os.environ.get(BASELINE_TREE)
    if not tree:
        pytest.skip(f"set {BASELINE_TREE} to a built checkout to compare with")
    runs = {
        "pyzmq": lambda: hop.run_relay("pyzmq"),
        "broker": lambda: hop.run_broker(tmp_path, mode),
        "baseline": lambda: hop.run_broker(tmp_path, mode, tree=Path(tree)),
        "broker_delays": lambda: hop.run_broker(tmp_path, mode, latency=LOW_RATE),
        "baseline_delays": lambda: hop.run_broker(
            tmp_path, mode, tree=Path(tree), latency=LOW_RATE
        ),
    }
    rounds: list[dict[str, Any]] = []

    def one_round() -> None:
        names = list(runs)
        shift = len(rounds) % len(names)
        rounds.append({name: runs[name]() for name in names[shift:] + names[:shift]})

    benchmark.group = "broker hop beside a baseline tree"
    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    info: dict[str, object] = {}
    for n in ("pyzmq", "broker", "baseline"):
        info[f"{n}_per_second"] = [round(r[n].per_second) for r in rounds]
        info[f"{n}_cpu_us"] = [round(r[n].cpu_us, 2) for r in rounds]
    for name in ("broker", "baseline"):
        ratios = [r[name].per_second / r["pyzmq"].per_second for r in rounds]
        info[f"{name}_median_ratio_to_pyzmq"] = round(statistics.median(ratios), 3)
        per_round = [_percentiles(r[f"{name}_delays"]) for r in rounds]
        info[f"{name}_low_rate_delay_per_round"] = per_round
        info[f"{name}_low_rate_delay"] = {
            q: round(statistics.median(p[q] for p in per_round), 3) for q in ("p50_ms", "p99_ms")
        }
    info["median_broker_over_baseline"] = round(
        statistics.median(r["broker"].per_second / r["baseline"].per_second for r in rounds), 3
    )
    info["median_broker_cpu_over_baseline"] = round(
        statistics.median(r["broker"].cpu_us / r["baseline"].cpu_us for r in rounds), 3
    )
    benchmark.extra_info.update(info)
