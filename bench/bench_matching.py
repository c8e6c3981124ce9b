"""Matcher throughput (DESIGN §5): publications per second at 1k, 10k and 100k stock
subscriptions of about 2% selectivity (paper §7), compiled and reference side by side.

Publications are real quotes (``../shared/data/stockquotes``, enriched to the paper's 10
attributes), drawn at random and passed through msgpack like a broker's input (so they are
freshly allocated, not scattered over the heap of all 245k parsed quotes); the
subscriptions come from :func:`octopis.quotes.stock_subscriptions` over another random
draw. Each round matches the same publications in batches of 256 (a broker draining its
input), results dropped.

``test_shape_throughput`` does the same on the synthetic shapes of :mod:`octopis.shapes`
(uniform bands, ten attributes, Zipf symbols, wide bands, 10% selectivity).

Every test records in ``extra_info``: ``pubs_per_s`` (from the fastest round), the mean
selectivity over the publications it matched and over the subscriptions' own sample
(:func:`octopis.quotes.measure_selectivity`). Run
``pytest bench/bench_matching.py --benchmark-only``.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

import msgpack
import pytest

from octopis.filters import Publication, Subscription
from octopis.matching import Matcher, ReferenceMatcher
from octopis.quotes import (
    enrich,
    measure_selectivity,
    quotes_dir,
    read_quote_dir,
    stock_subscriptions,
)
from octopis.shapes import SHAPES

SIZES = (1_000, 10_000, 100_000)
BATCH = 256
# publications per round and rounds, chosen to keep every test to a few seconds
PLAN = {
    ("compiled", 1_000): (4096, 20),
    ("compiled", 10_000): (4096, 20),
    ("compiled", 100_000): (2048, 8),
    ("reference", 1_000): (512, 3),
    ("reference", 10_000): (128, 3),
    ("reference", 100_000): (16, 3),
}


@dataclass
class Workload:
    publications: list[Publication]
    subscriptions: dict[int, list[Subscription]]
    sample_selectivity: dict[int, float]


@pytest.fixture(scope="module")
def workload() -> Workload:
    if not quotes_dir().is_dir():
        pytest.skip(f"no quote data at {quotes_dir()}")
    quotes = [enrich(q) for q in read_quote_dir()]
    rng = random.Random(7)
    sample = rng.sample(quotes, 20_000)
    publications = msgpack.unpackb(msgpack.packb(rng.sample(quotes, 4096)))
    subscriptions = {n: stock_subscriptions(sample, n, seed=n) for n in SIZES}
    selectivity = {
        n: statistics.mean(measure_selectivity(subs, sample)) for n, subs in subscriptions.items()
    }
    return Workload(publications, subscriptions, selectivity)


def _measure(
    benchmark, kind: str, size: int, subscriptions: list[Subscription], pubs: list[Publication]
) -> float:
    """Benchmark ``kind`` matching ``pubs`` (as many as :data:`PLAN` says) against
    ``subscriptions`` in batches; records the figures; returns the mean selectivity seen."""
    matcher = Matcher() if kind == "compiled" else ReferenceMatcher()
    for key, subscription in enumerate(subscriptions):
        matcher.add(key, subscription)
    count, rounds = PLAN[kind, size]
    pubs = pubs[:count]
    batches = [pubs[i : i + BATCH] for i in range(0, count, BATCH)]
    matches = sum(len(keys) for keys in matcher.match_many(pubs))  # also builds the index

    def run() -> None:
        for batch in batches:
            matcher.match_many(batch)

    benchmark.pedantic(run, rounds=rounds, warmup_rounds=1 if kind == "compiled" else 0)
    selectivity = matches / (count * size)
    benchmark.extra_info.update(
        kind=kind,
        subscriptions=size,
        publications=count,
        pubs_per_s=round(count / benchmark.stats.stats.min, 1),
        mean_selectivity=round(selectivity, 5),
    )
    return selectivity


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["compiled", "reference"])
def test_match_throughput(benchmark, workload: Workload, kind: str, size: int) -> None:
    benchmark.group = f"matcher, {size:,} subscriptions"
    _measure(benchmark, kind, size, workload.subscriptions[size], workload.publications)
    benchmark.extra_info.update(sample_selectivity=round(workload.sample_selectivity[size], 5))
    assert 0.016 <= workload.sample_selectivity[size] <= 0.024


@pytest.fixture(scope="module")
def shaped() -> dict[tuple[str, int], tuple[list[Subscription], list[Publication]]]:
    """Each synthetic shape at each size, generated once (lazily)."""
    return {}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["compiled", "reference"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_throughput(benchmark, shaped: dict, shape: str, kind: str, size: int) -> None:
    """The synthetic shapes of :mod:`octopis.shapes` (publications through msgpack, as
    for the stock shapes)."""
    if (shape, size) not in shaped:
        subscriptions, publications = SHAPES[shape](size, seed=size)
        shaped[shape, size] = subscriptions, msgpack.unpackb(msgpack.packb(publications))
    subscriptions, publications = shaped[shape, size]
    benchmark.group = f"matcher, {shape}, {size:,} subscriptions"
    selectivity = _measure(benchmark, kind, size, subscriptions, publications)
    benchmark.extra_info.update(shape=shape)
    assert selectivity > 0
