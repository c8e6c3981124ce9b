"""The SDK's cost per delivery: every delivery is checked against the connection group's
record of the last 30 s (DESIGN §9: a repeat during a move or fail-over is dropped), at
the price of a set lookup, a set insert and a deque append. Measured side by side with a
baseline that decodes each delivery and calls its handler without the check, on frames
of the broker's own encoding; the figure of merit is the median of the per-round ratios
(``extra_info``). Run with ``pytest bench/bench_client.py --benchmark-only``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest

from octopis.client import Connection, ConnectionGroup
from octopis.core import Notification
from octopis.core.codec import encode_body
from octopis.wire import LEFT_AT, pack, unpack
from octopis.wire.client import delivery_fields

DELIVERIES = 200_000
BATCH = 32
ROUNDS = 5
SUBSCRIBERS = 16


def _frames() -> list[list[bytes]]:
    """Delivery frames as a broker sends them: ``[names, body, ..., stamp]``, ``BATCH`` per frame,
    each notification to one of ``SUBSCRIBERS`` clients."""
    frames, parts = [], []
    for seq in range(1, DELIVERIES + 1):
        notification = Notification("p", seq, 0.0, {"class": "STOCK", "price": 1.0}, session=1)
        parts += [pack([f"s{seq % SUBSCRIBERS}"]), encode_body(notification)]
        if len(parts) == 2 * BATCH:
            frames.append([*parts, LEFT_AT.pack(0.0)])
            parts = []
    return frames


def _baseline(frames: list[list[bytes]], handlers: dict[str, Any]) -> None:
    """Decode each delivery and hand it to its client: the work without the repeat check."""
    for parts in frames:
        now = time.time()
        left = LEFT_AT.unpack(parts[-1])[0]
        for i in range(0, len(parts) - 1, 2):
            publisher, seq, published_at, publication, _, body = delivery_fields(parts[i + 1])
            for name in unpack(parts[i]):
                size = len(parts[i + 1])
                handlers[name](
                    name, publisher, seq, published_at, publication, now, left, size, 0, body
                )


def test_delivery_with_repeat_check_beside_without(benchmark: pytest.FixtureRequest) -> None:
    """Rounds of the baseline and the SDK's delivery path (order alternating); ratio."""
    frames = _frames()
    received = [0]

    def handler(*_: object) -> None:
        received[0] += 1

    handlers = {f"s{i}": handler for i in range(SUBSCRIBERS)}
    rounds: list[dict[str, float]] = []

    def sdk_round() -> float:
        connection = Connection("tcp://127.0.0.1:1", group=ConnectionGroup())
        for name in handlers:
            connection.register(name, handler)
        started = time.perf_counter()
        for parts in frames:
            connection._on_frame(parts)
        seconds = time.perf_counter() - started
        connection.socket.close()
        assert connection.duplicates_absorbed == 0 and connection.unclaimed == 0
        return DELIVERIES / seconds

    def baseline_round() -> float:
        started = time.perf_counter()
        _baseline(frames, handlers)
        return DELIVERIES / (time.perf_counter() - started)

    def one_round() -> None:
        runs = [("baseline", baseline_round), ("sdk", sdk_round)]
        if len(rounds) % 2:
            runs.reverse()
        rounds.append({name: run() for name, run in runs})

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    assert received[0] == 2 * ROUNDS * DELIVERIES
    ratios = [r["sdk"] / r["baseline"] for r in rounds]
    benchmark.extra_info.update(
        {
            "baseline_deliveries_per_s": statistics.median(r["baseline"] for r in rounds),
            "sdk_deliveries_per_s": statistics.median(r["sdk"] for r in rounds),
            "ratio_sdk_to_baseline": statistics.median(ratios),
        }
    )
    print(benchmark.extra_info)
