"""The client protocol's cost per message (DESIGN §4): a publication's request as the SDK
builds and encodes it, and the ``published`` reply as the broker builds it and the SDK
reads it back, once with the declared structs of :mod:`octopis.wire.client` and once as
untyped maps (how both sides spelled them before the protocol was declared), side by side
on the same machine in the same minute.

``python -m bench.bench_client_wire`` prints nanoseconds per message of each, the best of
``ROUNDS``, and the declared-to-map ratio; ``pytest bench/bench_client_wire.py
--benchmark-only`` runs the same work under pytest-benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from msgspec.structs import replace

from octopis.quotes import random_quotes
from octopis.wire import pack, unpack
from octopis.wire.client import PublishedReply, PublishRequest, decode_reply

MESSAGES = 20_000
ROUNDS = 7
QUOTES = random_quotes(MESSAGES, seed=5)


def _publish_declared() -> int:
    size = 0
    for seq, quote in enumerate(QUOTES):
        request = PublishRequest(
            client="p", seq=seq, session=5, published_at=1.7e9, publication=quote
        )
        size += len(pack(replace(request, req=seq)))
    return size


def _publish_map() -> int:
    size = 0
    for seq, quote in enumerate(QUOTES):
        request = {"op": "publish", "client": "p", "seq": seq, "session": 5}
        size += len(pack({**request, "published_at": 1.7e9, "publication": quote, "req": seq}))
    return size


def _published_declared() -> int:
    return sum(
        decode_reply(pack(replace(PublishedReply(seq=seq), req=seq))).seq for seq in range(MESSAGES)
    )


def _published_map() -> int:
    return sum(
        unpack(pack({**{"op": "published", "seq": seq}, "req": seq}))["seq"]
        for seq in range(MESSAGES)
    )


WORK: dict[str, Callable[[], int]] = {
    "publish request, declared": _publish_declared,
    "publish request, map": _publish_map,
    "published reply, declared": _published_declared,
    "published reply, map": _published_map,
}


def per_message() -> dict[str, float]:
    """Nanoseconds per message of each kind of work, the best of ``ROUNDS``."""
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name, run in WORK.items():
            start = time.perf_counter()
            run()
            ns = (time.perf_counter() - start) / MESSAGES * 1e9
            best[name] = min(best.get(name, ns), ns)
    return best


@pytest.mark.parametrize("kind", list(WORK))
def test_client_wire(benchmark: pytest.FixtureRequest, kind: str) -> None:
    benchmark(WORK[kind])


if __name__ == "__main__":
    figures = per_message()
    for name, ns in figures.items():
        print(f"{name:28} {ns:7.0f} ns")
    for what in ("publish request", "published reply"):
        ratio = figures[f"{what}, declared"] / figures[f"{what}, map"]
        print(f"{what}: declared / map = {ratio:.2f}")
