"""The peer codec's cost per body (DESIGN §4, §5): what a broker pays to read and write
the frames it relays, body by body.

Six kinds of work, each over ``BODIES`` bodies: reading a plain NOTIFY (the compiled
path), reading a DNR copy (a CBV: the full decoding), reading a SUBSCRIBE and a
HEARTBEAT, and writing a plain NOTIFY and a DNR copy. The figure of merit is the time per
body of each, to be compared side by side with another version of the codec run on the
same machine in the same minute (``python -m bench.bench_codec`` prints one line per
kind, in nanoseconds per body, the best of ``ROUNDS``). Run the suite with
``pytest bench/bench_codec.py --benchmark-only``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from bitarray import frozenbitarray

from octopis.core import Notification, Subscribe, SubState
from octopis.core.codec import Heartbeat, decode_body, encode_body
from octopis.filters.language import parse_subscription
from octopis.quotes import random_quotes

BODIES = 20_000
ROUNDS = 7
QUOTES = random_quotes(BODIES, seed=3)
PLAIN = [Notification("P", i, 1.7e9, q, session=5) for i, q in enumerate(QUOTES)]
DNR = [n._replace(cbv=frozenbitarray("0110")) for n in PLAIN]
SUBSCRIBE = Subscribe(
    "a:0#7", "a:0", parse_subscription("[class,eq,'STOCK'],[close,>,27.5]"), SubState.PRIMARY,
    frozenbitarray("100"), 3.25, 2,
)  # fmt: skip
HEARTBEAT = Heartbeat(12345, 678, 9, True)


def _work() -> dict[str, Callable[[], object]]:
    """Each kind of work, as a call over its bodies."""
    plain = [encode_body(n) for n in PLAIN]
    dnr = [encode_body(n) for n in DNR]
    subscribe = [encode_body(SUBSCRIBE)] * (BODIES // 10)
    heartbeat = [encode_body(HEARTBEAT)] * BODIES
    return {
        "read plain NOTIFY": lambda: [decode_body("a:0", b) for b in plain],
        "read DNR NOTIFY": lambda: [decode_body("a:0", b) for b in dnr],
        "read SUBSCRIBE": lambda: [decode_body("a:0", b) for b in subscribe],
        "read HEARTBEAT": lambda: [decode_body("a:0", b) for b in heartbeat],
        "write plain NOTIFY": lambda: [encode_body(n) for n in PLAIN],
        "write DNR NOTIFY": lambda: [encode_body(n) for n in DNR],
    }


def per_body() -> dict[str, float]:
    """Nanoseconds per body of each kind of work, the best of ``ROUNDS``."""
    best: dict[str, float] = {}
    work = _work()
    for _ in range(ROUNDS):
        for name, run in work.items():
            start = time.perf_counter()
            done = len(run())
            spent = (time.perf_counter() - start) * 1e9 / done
            best[name] = min(best.get(name, spent), spent)
    return best


@pytest.mark.parametrize("kind", list(_work()))
def test_codec(benchmark: pytest.FixtureRequest, kind: str) -> None:
    """One kind of work over its bodies."""
    run = _work()[kind]
    assert len(benchmark(run)) > 0


if __name__ == "__main__":
    for name, ns in per_body().items():
        print(f"{name}\t{ns:.0f}")
