"""One routing step of the sans-IO core (DESIGN §5), side by side with the bare matcher.

Broker vii:0 of paper75 holds 10,000 stock subscriptions of ~2% selectivity installed by
SBP from random neighbours, as it would after the broadcast. Each round routes a batch of
notifications arriving from neighbour vi:0 (SNR, DNR with no congestion, and DNR with every
iCOL overloaded), a batch published by a local publisher (which also crosses iCOLs), and
BID's publisher-side step. The baseline is the matcher alone over the same entries, so the
ratio is the cost of routing on top of matching.

Run with ``pytest bench/bench_core.py --benchmark-only``.
"""

from __future__ import annotations

import random

import pytest
from bitarray import frozenbitarray

from octopis.core import BrokerCore, NoCongestion, Notification, Subscribe, SubState, make_broker
from octopis.matching import Matcher
from octopis.quotes import random_quotes, stock_subscriptions
from octopis.sim import InjectedCongestion
from octopis.topology import build_preset

SUBSCRIPTIONS = 10_000
BATCH = 1_000
SCOT = build_preset("paper75")
HOST = "vii:0"
QUOTES = random_quotes(5_000, seed=3)
FILTERS = stock_subscriptions(QUOTES, SUBSCRIPTIONS, seed=3)
BATCH_IN = [Notification("P", i, 0.0, q) for i, q in enumerate(QUOTES[:BATCH])]


def _loaded_core(mode: str) -> BrokerCore:
    core = make_broker(SCOT, HOST, mode)
    rng = random.Random(3)
    neighbours = SCOT.brokers[HOST].neighbours
    for i, f in enumerate(FILTERS):
        n = rng.choice(neighbours)
        if mode == "bid":
            message = Subscribe(f"{n.id}#{i}", n.id, f, SubState.PRIMARY, None, 0.0)
        else:
            bits = ["0"] * SCOT.clusters
            bits[n.cluster] = "1"
            state = SubState.PRIMARY if n.cluster == 0 else SubState.SECONDARY
            message = Subscribe(f"{n.id}#{i}", n.id, f, state, frozenbitarray("".join(bits)), 0.0)
        core.receive(n.id, message, NoCongestion())
    return core


CORES = {mode: _loaded_core(mode) for mode in ("snr", "dnr", "bid")}
ALL_ICOLS_BUSY = InjectedCongestion(
    [(HOST, n.id) for n in SCOT.brokers[HOST].neighbours if n.cluster != 0], SCOT, seed=3
)


def test_matcher_alone(benchmark: pytest.FixtureRequest) -> None:
    """Baseline: the compiled matcher over all 10,000 entries, one call per notification."""
    matcher = Matcher()
    for i, f in enumerate(FILTERS):
        matcher.add(i, f)
    benchmark.group = "core routing step (1,000 notifications, 10k subscriptions)"
    benchmark(lambda: [matcher.match(n.publication) for n in BATCH_IN])


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_forwarded_notification(benchmark: pytest.FixtureRequest, mode: str) -> None:
    """A notification arriving over an aCOL: match own-cluster entries, pick aCOLs."""
    core = CORES[mode]
    links = NoCongestion()
    benchmark.group = "core routing step (1,000 notifications, 10k subscriptions)"
    benchmark(lambda: [core.receive("vi:0", n, links) for n in BATCH_IN])


@pytest.mark.parametrize("mode", ["snr", "dnr", "bid"])
def test_published_notification(benchmark: pytest.FixtureRequest, mode: str) -> None:
    """A notification from a local publisher: all entries, iCOL targets (or BID lists)."""
    core = CORES[mode]
    links = NoCongestion()
    benchmark.group = "core routing step (1,000 notifications, 10k subscriptions)"
    benchmark(lambda: [core.publish(n, links) for n in BATCH_IN])


def test_published_notification_dnr_all_icols_overloaded(benchmark: pytest.FixtureRequest) -> None:
    """DNR at a publisher's host whose every iCOL is overloaded (Cases II and III)."""
    core = CORES["dnr"]
    links = ALL_ICOLS_BUSY.view(HOST, 0.0)
    benchmark.group = "core routing step (1,000 notifications, 10k subscriptions)"
    benchmark(lambda: [core.publish(n, links) for n in BATCH_IN])
