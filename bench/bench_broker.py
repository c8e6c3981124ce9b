"""Broker hop: one broker process holding 10,000 subscriptions against a bare pyzmq relay,
measured side by side (issue 6 target: the broker reaches ≥ 50% of the relay's rate).
See :mod:`bench.hop` for the set-up.

The machine is shared and noisy (runs of the same code differ by 2×), so each round pumps
60,000 notifications through the relay and then through the broker, back to back, and
the figure of merit is the median of the per-round ratios. Run with
``pytest bench/bench_broker.py --benchmark-only``; rates and ratios are in each
benchmark's ``extra_info``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench.hop import HopBench

SUBSCRIPTIONS = 10_000
NOTIFICATIONS = 60_000
ROUNDS = 3


@pytest.fixture(scope="module")
def hop() -> HopBench:
    return HopBench(subscriptions=SUBSCRIPTIONS, notifications=NOTIFICATIONS)


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_broker_hop_against_relay(
    benchmark: pytest.FixtureRequest, hop: HopBench, tmp_path: Path, mode: str
) -> None:
    """Paired rounds: relay frames/s, then broker notifications/s; their ratio."""
    pairs: list[tuple[float, float]] = []

    def one_round() -> None:
        pairs.append((hop.run_relay(), hop.run_broker(tmp_path, mode)))

    benchmark.group = "broker hop: 60,000 notifications, 10k subscriptions"
    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    ratios = [broker / relay for relay, broker in pairs]
    benchmark.extra_info.update(
        relay_per_second=[round(r) for r, _ in pairs],
        broker_per_second=[round(b) for _, b in pairs],
        ratios=[round(x, 3) for x in ratios],
        median_ratio=round(statistics.median(ratios), 3),
    )
