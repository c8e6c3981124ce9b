"""Matcher throughput (DESIGN §5): publications per second at 1k, 10k and 100k
subscriptions on every workload shape, compiled and reference side by side.

Shapes: ``stock`` — real quotes (``../shared/data/stockquotes``, enriched to the paper's 10
attributes) against :func:`octopis.quotes.stock_subscriptions` of about 2% selectivity
(paper §7) built over another random draw — and the synthetic shapes of
:mod:`octopis.shapes` (uniform bands, bands on all five attributes, ten attributes, Zipf
symbols, wide bands, 10% selectivity). Publications pass through msgpack like a broker's
input (freshly allocated, not scattered over the heap of all parsed quotes).

Calls, each a test parameter:

* ``match_groups`` — what the broker calls (``octopis.core.table``): subscriptions in
  :data:`GROUPS` groups (a broker's neighbours and local clients), the distinct groups
  with a match, stopping once every group has one;
* ``match_groups_full`` — the same plus one more group whose only subscription never
  matches, so the search can never stop early: the worst case of ``match_groups``;
* ``match`` — every matching key, as a list, one ``match`` call per publication;
* ``reference`` — :meth:`ReferenceMatcher.match` likewise (its ``match_groups`` calls
  ``match``, so it is never faster).

Every test records in ``extra_info``: ``pubs_per_s`` (from the fastest round), the mean
selectivity over the publications it matched, the compiled index's bytes, and for
``stock`` the selectivity over the subscriptions' own sample. ``test_build`` times, per
shape at :data:`BUILD_SIZE` subscriptions, adding them all (each with a group) and then
building their index (``rebuild``), fastest of three, and records the index's bytes. Run
``pytest bench/bench_matching.py --benchmark-only`` (``--benchmark-json=FILE``, then
``python -m bench.matching_table FILE`` for the table of ``bench/RESULTS.md``; on a shared
machine ``--benchmark-timer=time.process_time`` counts the CPU time the matcher gets).
"""

from __future__ import annotations

import importlib
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import pytest

from octopis.filters.language import Publication, Subscription, parse_subscription
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
CALLS = ("match_groups", "match_groups_full", "match", "reference")
GROUPS = 16
"""Groups of ``match_groups``: about the neighbours and local clients of a broker."""
BUILD_SIZE = 100_000
"""Subscriptions of ``test_build``."""
# publications per round and rounds, chosen to keep every test to a few seconds
PLAN = {
    ("compiled", 1_000): (4096, 10),
    ("compiled", 10_000): (4096, 10),
    ("compiled", 100_000): (2048, 5),
    ("reference", 1_000): (512, 3),
    ("reference", 10_000): (128, 3),
    ("reference", 100_000): (16, 3),
}


@dataclass
class Workload:
    subscriptions: list[Subscription]
    publications: list[Publication]
    sample_selectivity: float | None = None
    """``stock``: the subscriptions' mean selectivity over their own sample."""


@pytest.fixture(scope="module")
def workloads() -> Callable[[str, int], Workload]:
    """The workload of a shape and size, generated once."""
    cache: dict[tuple[str, int], Workload] = {}

    def get(shape: str, size: int) -> Workload:
        if (shape, size) not in cache:
            cache[shape, size] = _stock(size) if shape == "stock" else _shape(shape, size)
        return cache[shape, size]

    return get


def _shape(shape: str, size: int) -> Workload:
    subscriptions, publications = SHAPES[shape](size, seed=size)
    return Workload(subscriptions, msgpack.unpackb(msgpack.packb(publications)))


def _stock(size: int) -> Workload:
    if not quotes_dir().is_dir():
        pytest.skip(f"no quote data at {quotes_dir()}")
    quotes = [enrich(q) for q in read_quote_dir()]
    rng = random.Random(7)
    sample = rng.sample(quotes, 20_000)
    publications = msgpack.unpackb(msgpack.packb(rng.sample(quotes, 4096)))
    subscriptions = stock_subscriptions(sample, size, seed=size)
    selectivity = statistics.mean(measure_selectivity(subscriptions, sample))
    return Workload(subscriptions, publications, selectivity)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("shape", ["stock", *sorted(SHAPES)])
def test_shape_throughput(benchmark, workloads, shape: str, call: str, size: int) -> None:
    workload = workloads(shape, size)
    subscriptions, publications = workload.subscriptions, workload.publications
    kind = "reference" if call == "reference" else "compiled"
    matcher = ReferenceMatcher() if kind == "reference" else Matcher()
    for key, subscription in enumerate(subscriptions):
        matcher.add(key, subscription, None if call in ("match", "reference") else key % GROUPS)
    if call == "match_groups_full":
        matcher.add("never", parse_subscription("[never_present,isPresent]"), GROUPS)
    count, rounds = PLAN[kind, size]
    pubs = publications[:count]
    matches = sum(len(keys) for keys in matcher.match_many(pubs))  # also builds the index
    find = matcher.match_groups if call.startswith("match_groups") else matcher.match

    def run() -> None:
        for pub in pubs:
            find(pub)

    benchmark.group = f"matcher, {shape}, {size:,} subscriptions"
    benchmark.pedantic(run, rounds=rounds, warmup_rounds=1 if kind == "compiled" else 0)
    benchmark.extra_info.update(
        shape=shape,
        call=call,
        subscriptions=size,
        publications=count,
        pubs_per_s=round(count / benchmark.stats.stats.min, 1),
        mean_selectivity=round(matches / (count * size), 5),
    )
    if kind == "compiled":
        benchmark.extra_info.update(index_bytes=matcher.stats()["memory"])
    if workload.sample_selectivity is not None:
        benchmark.extra_info.update(sample_selectivity=round(workload.sample_selectivity, 5))
        assert 0.016 <= workload.sample_selectivity <= 0.024
    assert matches > 0


@pytest.mark.parametrize("shape", ["stock", *sorted(SHAPES)])
def test_build(benchmark, workloads, request, shape: str) -> None:
    subscriptions = workloads(shape, BUILD_SIZE).subscriptions
    module, _, name = request.config.getoption("benchmark_timer").rpartition(".")
    timer = getattr(importlib.import_module(module), name)
    adds: list[float] = []
    built: list[Matcher] = []

    def fill() -> tuple[tuple[Matcher], dict]:
        matcher = Matcher()
        started = timer()
        for key, subscription in enumerate(subscriptions):
            matcher.add(key, subscription, key % GROUPS)
        adds.append(timer() - started)
        built.append(matcher)
        return (matcher,), {}

    benchmark.group = f"matcher build, {BUILD_SIZE:,} subscriptions"
    benchmark.pedantic(Matcher.rebuild, setup=fill, rounds=3)
    memory = built[-1].stats()["memory"]
    benchmark.extra_info.update(
        shape=shape,
        call="build",
        subscriptions=BUILD_SIZE,
        add_us=round(min(adds) / BUILD_SIZE * 1e6, 2),
        rebuild_s=round(benchmark.stats.stats.min, 3),
        index_bytes=memory,
        bytes_per_subscription=round(memory / BUILD_SIZE),
    )
    assert built[-1].stats()["pending"] == 0 and len(built[-1]) == BUILD_SIZE
