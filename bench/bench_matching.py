"""Matcher throughput (DESIGN §5): publications per second at 1k, 10k and 100k stock
subscriptions of about 2% selectivity (paper §7), compiled and reference side by side.

Publications are real quotes (``../shared/data/stockquotes``, enriched to the paper's 10
attributes), drawn at random and passed through msgpack like a broker's input (so they are
freshly allocated, not scattered over the heap of all 245k parsed quotes); the
subscriptions come from :func:`octopis.quotes.stock_subscriptions` over another random
draw. Each round matches the same publications in batches of 256 (a broker draining its
input), results dropped.

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


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["compiled", "reference"])
def test_match_throughput(benchmark, workload: Workload, kind: str, size: int) -> None:
    matcher = Matcher() if kind == "compiled" else ReferenceMatcher()
    for key, subscription in enumerate(workload.subscriptions[size]):
        matcher.add(key, subscription)
    count, rounds = PLAN[kind, size]
    pubs = workload.publications[:count]
    batches = [pubs[i : i + BATCH] for i in range(0, count, BATCH)]
    matches = sum(len(keys) for keys in matcher.match_many(pubs))  # also builds the index

    def run() -> None:
        for batch in batches:
            matcher.match_many(batch)

    benchmark.group = f"matcher, {size:,} subscriptions"
    benchmark.pedantic(run, rounds=rounds, warmup_rounds=1 if kind == "compiled" else 0)
    benchmark.extra_info.update(
        kind=kind,
        subscriptions=size,
        publications=count,
        pubs_per_s=round(count / benchmark.stats.stats.min, 1),
        mean_selectivity=round(matches / (count * size), 5),
        sample_selectivity=round(workload.sample_selectivity[size], 5),
    )
    assert 0.016 <= workload.sample_selectivity[size] <= 0.024
