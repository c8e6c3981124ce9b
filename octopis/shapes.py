"""Synthetic matcher workloads of distinct shapes, for the matcher benchmark and the
matcher's property tests (DESIGN §5: a matcher must hold on any workload, not only the
stock shapes it was tuned on).

Each shape is a function ``(count, seed) -> (subscriptions, publications)``, deterministic
by ``seed``, returning ``count`` subscriptions and :data:`PUBLICATIONS` publications.
Attributes are ``a0``, ``a1``, … with values uniform in [0, 1) unless the shape says
otherwise; a band is ``[a,>=,lo],[a,<=,hi]``. Target selectivities are over the shape's
own publication distribution (measure with :func:`selectivity`):

* ``uniform_bands`` — two of five attributes, a band on each, 2%;
* ``five_bands`` — a band on every one of five attributes, each keeping 0.021**(1/5)
  (about 46%) of the values, 2.1%: no attribute is selective and every word of
  subscriptions tests all five;
* ``ten_attributes`` — 1 to 6 predicates over ten attributes (one-sided ranges and
  bands), 2%;
* ``zipf_symbol`` — ``[symbol,eq,…]`` over 1,000 symbols drawn Zipf-skewed (s = 1) for
  subscriptions and publications alike, plus a band on ``price`` of 20%;
* ``wide_bands`` — four wide bands (about 21% each) that only together are selective:
  0.2%;
* ``broad`` — two of five attributes, a band on each, 10%;

and three the index was not designed for:

* ``small_groups`` — three of sixteen attributes, a band on each, 2%: 560 combinations of
  attributes, so many small groups of subscriptions testing the same ones;
* ``one_sided`` — a band beside a one-sided bound (``<`` or ``>=``, at a random point) on
  another of four attributes, 2%: half the key ranges open at one end;
* ``shared_equality`` — ``[class,eq,'STOCK']`` on every subscription (and publication),
  beside two bands over five attributes, 2%: one string lookup that holds everything.

The stock shapes (:func:`octopis.quotes.stock_subscriptions`) need the quote data and
live beside it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

from octopis.filters.language import Predicate, Publication, Subscription
from octopis.matching import Matcher

PUBLICATIONS = 4096
"""Publications each shape returns."""

Shape = Callable[[int, int], tuple[list[Subscription], list[Publication]]]


def _band(attr: str, width: float, rng: random.Random) -> tuple[Predicate, Predicate]:
    lo = round(rng.uniform(0.0, 1.0 - width), 6)
    return Predicate(attr, ">=", lo), Predicate(attr, "<=", round(lo + width, 6))


def _uniform_publications(attributes: int, rng: random.Random) -> list[Publication]:
    names = [f"a{i}" for i in range(attributes)]
    return [{name: rng.random() for name in names} for _ in range(PUBLICATIONS)]


def _bands(
    count: int, seed: int, per: int, of: int, selectivity: float
) -> tuple[list[Subscription], list[Publication]]:
    """``count`` subscriptions of ``per`` bands over ``of`` attributes, each band of
    width selectivity**(1/per)."""
    rng = random.Random(seed)
    width = selectivity ** (1 / per)
    names = [f"a{i}" for i in range(of)]
    subscriptions = [
        Subscription(
            tuple(
                itertools.chain.from_iterable(
                    _band(name, width, rng) for name in sorted(rng.sample(names, per))
                )
            )
        )
        for _ in range(count)
    ]
    return subscriptions, _uniform_publications(of, rng)


def uniform_bands(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """Two bands over five attributes, 2% selectivity."""
    return _bands(count, seed, per=2, of=5, selectivity=0.02)


def five_bands(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """A band on each of five attributes, 2.1% selectivity."""
    return _bands(count, seed, per=5, of=5, selectivity=0.021)


def wide_bands(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """Four wide bands over six attributes, 0.2% selectivity."""
    return _bands(count, seed, per=4, of=6, selectivity=0.002)


def broad(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """Two bands over five attributes, 10% selectivity."""
    return _bands(count, seed, per=2, of=5, selectivity=0.10)


def ten_attributes(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """1 to 6 predicates over ten attributes, 2% selectivity: each predicate is a
    one-sided range (``<`` or ``>=``) or a band keeping 0.02**(1/k) of the values."""
    rng = random.Random(seed)
    names = [f"a{i}" for i in range(10)]
    subscriptions = []
    for _ in range(count):
        k = rng.randint(1, 6)
        keep = 0.02 ** (1 / k)
        predicates: list[Predicate] = []
        for name in sorted(rng.sample(names, k)):
            form = rng.randrange(3)
            if form == 0:
                predicates.append(Predicate(name, "<", round(keep, 6)))
            elif form == 1:
                predicates.append(Predicate(name, ">=", round(1.0 - keep, 6)))
            else:
                predicates.extend(_band(name, keep, rng))
        subscriptions.append(Subscription(tuple(predicates)))
    return subscriptions, _uniform_publications(10, rng)


def zipf_symbol(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """A Zipf-skewed symbol equality plus a 20% band on ``price``."""
    rng = random.Random(seed)
    symbols = [f"S{i:04d}" for i in range(1000)]
    weights = [1 / (rank + 1) for rank in range(len(symbols))]
    chosen = rng.choices(symbols, weights, k=count)
    subscriptions = [
        Subscription((Predicate("symbol", "eq", symbol), *_band("price", 0.2, rng)))
        for symbol in chosen
    ]
    publications: list[Publication] = [
        {"symbol": symbol, "price": rng.random(), "volume": rng.randrange(1, 10**6)}
        for symbol in rng.choices(symbols, weights, k=PUBLICATIONS)
    ]
    return subscriptions, publications


def small_groups(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """Three bands over sixteen attributes, 2% selectivity."""
    return _bands(count, seed, per=3, of=16, selectivity=0.02)


def one_sided(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """A band of width 0.1 on one of four attributes and a one-sided bound keeping
    0.1 to 0.3 of the values (0.2 on average) on another, 2% selectivity."""
    rng = random.Random(seed)
    names = [f"a{i}" for i in range(4)]
    subscriptions = []
    for _ in range(count):
        band, bound = rng.sample(names, 2)
        keep = round(rng.uniform(0.1, 0.3), 6)
        one = (
            Predicate(bound, "<", keep)
            if rng.random() < 0.5
            else Predicate(bound, ">=", round(1.0 - keep, 6))
        )
        predicates = sorted((*_band(band, 0.1, rng), one), key=lambda p: p.attr)
        subscriptions.append(Subscription(tuple(predicates)))
    return subscriptions, _uniform_publications(4, rng)


def shared_equality(count: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """``[class,eq,'STOCK']`` and two bands over five attributes, 2% selectivity."""
    subscriptions, publications = _bands(count, seed, per=2, of=5, selectivity=0.02)
    stock = Predicate("class", "eq", "STOCK")
    return (
        [Subscription((stock, *s.predicates)) for s in subscriptions],
        [{"class": "STOCK", **p} for p in publications],
    )


SHAPES: dict[str, Shape] = {
    "uniform_bands": uniform_bands,
    "five_bands": five_bands,
    "ten_attributes": ten_attributes,
    "zipf_symbol": zipf_symbol,
    "wide_bands": wide_bands,
    "broad": broad,
    "small_groups": small_groups,
    "one_sided": one_sided,
    "shared_equality": shared_equality,
}
"""Every synthetic shape by name."""


def selectivity(
    subscriptions: Sequence[Subscription], publications: Sequence[Publication]
) -> float:
    """The share of (subscription, publication) pairs that match, counted by the compiled
    matcher (which returns the reference semantics' keys: ``tests/test_matching.py``)."""
    if not subscriptions or not publications:
        return 0.0
    matcher = Matcher()
    for key, subscription in enumerate(subscriptions):
        matcher.add(key, subscription)
    matcher.rebuild()
    hits = sum(len(keys) for keys in matcher.match_many(publications))
    return hits / (len(subscriptions) * len(publications))
