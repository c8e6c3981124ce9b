"""The compiled matcher against the reference matcher, the API contract, and real quotes."""

from __future__ import annotations

import math
import random
from collections import Counter
from itertools import islice

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, rule
from laws import sized

from octopis.filters.language import (
    NUMERIC_OPERATORS,
    STRING_OPERATORS,
    Predicate,
    Subscription,
    parse_subscription,
)
from octopis.matching import MATCH_BUCKETS, MatchClock, Matcher, ReferenceMatcher
from octopis.quotes import (
    enrich,
    measure_selectivity,
    quotes_dir,
    random_quotes,
    read_quote_file,
    stock_subscriptions,
)
from octopis.shapes import SHAPES, selectivity

# ---- property: compiled ≡ reference through churn ---------------------------------------

SHAPE_EXAMPLES, MIXED_EXAMPLES = sized((1, 3), (5, 10))
"""Examples per shape and of the mixed workload."""
LARGE_PUBLICATIONS = sized(10, 60)
"""Publications the large workload matches at each step (its 10,300 subscriptions stay)."""
ATTRS = ["a", "b", "c"]
STRINGS = ["", "a", "ab", "abc", "b", "ba", "B", "é", "\ud800", "ab\x00"]
NUMBERS = [-2, -1, 0, 1, 2, -0.0, 0.5, 1.0, 2.5, 1e-300, -1e300]
# publication values: the constants, their neighbours, specials and unsupported types
PUB_VALUES = [
    *STRINGS,
    "abd",
    "zz",
    *NUMBERS,
    math.nextafter(0.5, 1),
    math.nextafter(0.5, 0),
    math.nextafter(2, 3),
    math.nextafter(-1, -2),
    math.nan,
    math.inf,
    -math.inf,
    True,
    None,
    b"ab",
]

predicates = st.one_of(
    st.builds(Predicate, st.sampled_from(ATTRS), st.sampled_from(NUMERIC_OPERATORS),
              st.sampled_from(NUMBERS)),
    st.builds(Predicate, st.sampled_from(ATTRS), st.sampled_from(STRING_OPERATORS),
              st.sampled_from(STRINGS)),
    st.builds(Predicate, st.sampled_from(ATTRS), st.just("isPresent"), st.none()),
)  # fmt: skip
subscriptions = st.lists(predicates, min_size=1, max_size=3).map(lambda ps: Subscription(tuple(ps)))


@st.composite
def publications(draw: st.DrawFn) -> dict:
    """Each attribute (and one no subscription names) present with probability 3/4."""
    return {
        attr: draw(st.sampled_from(PUB_VALUES))
        for attr in [*ATTRS, "zz"]
        if draw(st.integers(0, 3))
    }


class Both:
    """A compiled and a reference matcher given the same subscriptions."""

    def __init__(self, **options: int) -> None:
        self.compiled = Matcher(**options)
        self.reference = ReferenceMatcher()
        self.group: dict[object, int | None] = {}

    def add(self, key: object, subscription: Subscription, group: int | None) -> None:
        self.compiled.add(key, subscription, group)
        self.reference.add(key, subscription, group)
        self.group[key] = group

    def remove(self, key: object) -> None:
        self.compiled.remove(key)
        self.reference.remove(key)
        del self.group[key]

    def agree(self, pubs: list[dict]) -> None:
        """Same keys from ``match_many``, and from ``match_groups`` the same groups, each
        with a key that matches and is of that group; ``match_values`` names those groups
        (the reference's ``match_values`` is its ``match_groups`` renamed: checked once, in
        :func:`test_match_values_needs_a_value_for_every_group`)."""
        assert len(self.compiled) == len(self.reference)
        for pub, got in zip(pubs, self.compiled.match_many(pubs), strict=True):
            want = self.reference.match(pub)
            assert Counter(got) == Counter(want)
            groups = self.compiled.match_groups(pub)
            assert groups.keys() == {self.group[k] for k in want} - {None}
            assert all(key in want and self.group[key] == g for g, key in groups.items())
            top = max((g for g in self.group.values() if g is not None), default=0)
            names = [f"hop{g}" for g in range(top + 1)]
            assert self.compiled.match_values(pub, names) == {names[g] for g in groups}


class Churn(RuleBasedStateMachine):
    """Random add/remove/match/rebuild; both matchers must agree on every match."""

    keys = Bundle("keys")

    def __init__(self) -> None:
        super().__init__()
        self.both = Both(pending_limit=2)
        self.copies: dict[int, int] = {}

    @rule(target=keys, subscription=subscriptions, many=st.integers(1, 12))
    def add(self, subscription: Subscription, many: int) -> int:
        # several copies under different keys make the index worth building
        key = len(self.copies)
        group = None if key % 7 == 3 else key % 5  # a next hop, or none
        for i in range(many):
            self.both.add((key, i), subscription, group)
        self.copies[key] = many
        return key

    @rule(key=consumes(keys))
    def remove(self, key: int) -> None:
        for i in range(self.copies[key]):
            self.both.remove((key, i))

    @rule()
    def rebuild(self) -> None:
        self.both.compiled.rebuild()

    @rule(pubs=st.lists(publications(), min_size=1, max_size=4))
    def match(self, pubs: list[dict]) -> None:
        self.both.agree(pubs)


TestChurn = Churn.TestCase
TestChurn.settings = settings(
    max_examples=sized(40, 150),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("seed", [1, 2])
def test_stock_workload_agrees_with_reference(seed: int) -> None:
    quotes = random_quotes(600, seed=seed, symbols=12)
    subs = stock_subscriptions(quotes[:300], 400, seed=seed)
    compiled, reference = Matcher(), ReferenceMatcher()
    for i, s in enumerate(subs):
        compiled.add(i, s)
        reference.add(i, s)
    for quote in quotes[300:]:
        assert sorted(compiled.match(quote)) == sorted(reference.match(quote))
    for i in range(0, 400, 3):
        compiled.remove(i)
        reference.remove(i)
    for quote in quotes[:300]:
        assert sorted(compiled.match(quote)) == sorted(reference.match(quote))


def _workload(shape: str, count: int, seed: int) -> tuple[list[Subscription], list[dict]]:
    """A synthetic shape, or ``stock``: stock subscriptions over random quotes."""
    if shape != "stock":
        return SHAPES[shape](count, seed)
    quotes = random_quotes(3000, seed=seed, symbols=60)
    return stock_subscriptions(quotes[:2000], count, seed=seed), quotes[2000:]


def _on_boundaries(subs: list[Subscription], pubs: list[dict], seed: int) -> list[dict]:
    """Copies of ``pubs`` whose numbers are mostly replaced by constants of the
    subscriptions on the same attribute or their neighbours (uniform random values
    never fall exactly on a boundary)."""
    rng = random.Random(seed)
    constants: dict[str, list[float]] = {}
    for sub in subs:
        for p in sub.predicates:
            if isinstance(p.value, (int, float)):
                constants.setdefault(p.attr, []).append(p.value)
    out = []
    for pub in pubs:
        pub = dict(pub)
        for attr in pub:
            if attr in constants and rng.random() < 0.8:
                c = rng.choice(constants[attr])
                up, down = math.nextafter(c, math.inf), math.nextafter(c, -math.inf)
                pub[attr] = rng.choice([c, c, up, down])
        out.append(pub)
    return out


def _group(key: int) -> int:
    """A next hop: five common ones and a rare one (so that match_groups seldom finds
    every group and must often scan everything)."""
    return 5 if key % 97 == 0 else key % 5


@pytest.mark.parametrize("shape", ["stock", *sorted(SHAPES)])
@settings(max_examples=SHAPE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), stride=st.integers(2, 7), first=st.integers(0, 2500))
def test_every_shape_agrees_with_reference(shape: str, seed: int, stride: int, first: int) -> None:
    """On each shape at 2,500 subscriptions (many chunks of bitmaps), with adds and
    removes interleaved between matches — removed ones still in the index, added ones
    pending, then rebuilt — the compiled matcher returns exactly the reference's keys
    and groups, for the shape's publications and for ones on its constants."""
    subs, pubs = _workload(shape, 2500, seed)
    pubs = pubs[:15] + _on_boundaries(subs, pubs[15:30], seed)
    both = Both()
    for key, sub in enumerate(subs[:first]):
        both.add(key, sub, _group(key))
    both.agree(pubs)
    for key in range(0, first, stride):
        both.remove(key)
    both.agree(pubs)
    for key, sub in enumerate(subs[first:], start=first):
        both.add(key, sub, _group(key))
    both.agree(pubs)
    for key in range(1, len(subs), stride + 1):
        if key in both.group:
            both.remove(key)
    both.agree(pubs)


@pytest.mark.parametrize("shape", ["small_groups", "one_sided", "shared_equality"])
def test_new_shapes_agree_at_scale(shape: str) -> None:
    """The shapes the index was not designed for, at 6,000 subscriptions: past the size
    where a cell is laid out by key ranges in slices and a group testing the same
    attributes gets words of its own within a slice; with removes (still in the index)
    and adds (pending) between matches, then rebuilt."""
    subs, pubs = SHAPES[shape](6_000, 11)
    pubs = pubs[:6] + _on_boundaries(subs, pubs[6:12], 11)
    both = Both()
    for key, sub in enumerate(subs[:5_400]):
        both.add(key, sub, _group(key))
    both.agree(pubs)
    for key in range(0, 5_400, 3):
        both.remove(key)
    for key, sub in enumerate(subs[5_400:], start=5_400):
        both.add(key, sub, _group(key))
    both.agree(pubs)
    both.compiled.rebuild()
    assert both.compiled.stats()["pending"] == 0
    both.agree(pubs)


def _large_subscription(rng: random.Random) -> Subscription:
    """Mostly bands on five attributes over the integers 0–199, the first the widest and
    the last the narrowest (so that a group's key range is not its first); sometimes
    one-sided, with a string test, or with no range at all."""
    form = rng.random()
    if form < 0.05:
        return Subscription((Predicate("a1", "isPresent", None),))
    predicates: list[Predicate] = []
    for i, width in enumerate((180, 140, 100, 60, 30)):
        lo = rng.randrange(-10, 200 - width)
        if form < 0.15 and i == 2:
            predicates.append(Predicate(f"a{i}", "<", lo + width))
        else:
            predicates += [Predicate(f"a{i}", ">=", lo), Predicate(f"a{i}", "<=", lo + width)]
    if form > 0.9:
        predicates.append(Predicate("kind", "eq", rng.choice(["x", "y"])))
    return Subscription(tuple(predicates))


def _large_publication(rng: random.Random) -> dict:
    """Integers 0–199 (the bands' ends among them), now and then half-way between two,
    NaN, an infinity, a string, or nothing."""
    pub: dict = {"kind": rng.choice(["x", "y", "z"])}
    for i in range(5):
        roll = rng.random()
        if roll < 0.03:
            continue
        if roll < 0.06:
            pub[f"a{i}"] = rng.choice([math.nan, math.inf, -math.inf, "50"])
        else:
            pub[f"a{i}"] = rng.randrange(200) + (0.5 if roll > 0.9 else 0)
    return pub


def test_large_workload_agrees_with_reference() -> None:
    """Over 8,192 subscriptions ordered by one key range attribute (so that the index cuts
    them in slices), groups of over 1,024 testing the same attributes, the key range on
    another attribute than the first, chunks skipped by the hull of their key ranges:
    the compiled matcher returns the reference's keys and groups, before and after
    removals, with some added since the last build, and after a rebuild."""
    rng = random.Random(11)
    subs = [_large_subscription(rng) for _ in range(10_300)]
    pubs = [_large_publication(rng) for _ in range(LARGE_PUBLICATIONS)]
    both = Both()
    for key in range(10_000):
        both.add(key, subs[key], key % 16)
    both.agree(pubs)
    for key in range(0, 10_000, 5):
        both.remove(key)
    for key in range(10_000, 10_300):
        both.add(key, subs[key], key % 16)
    both.agree(pubs)
    both.compiled.rebuild()
    both.agree(pubs)


# Mixed random workload: many attributes (more than 64, so that the attribute masks that
# order subscriptions collide), every operator, more distinct eq/neq constants than get
# string buckets of their own, constants and values on a shared grid finer than the
# numeric buckets (so that values fall on the boundaries inside them), NaN, infinities,
# absent and unsupported values.
MIXED_ATTRS = [f"x{i}" for i in range(80)]
MIXED_STRINGS = [f"s{i:03d}" for i in range(100)] + ["", "s", "s0", "s00", "t"]
GRID = [i / 256 for i in range(-8, 265)]


def _mixed_attr(rng: random.Random) -> str:
    """Mostly one of the first eight attributes, sometimes any."""
    return rng.choice(MIXED_ATTRS[:8] if rng.random() < 0.8 else MIXED_ATTRS)


def _mixed_string(rng: random.Random) -> str:
    return MIXED_STRINGS[min(int(rng.expovariate(1 / 12)), len(MIXED_STRINGS) - 1)]


def _mixed_predicates(rng: random.Random, attr: str) -> list[Predicate]:
    kind = rng.random()
    if kind < 0.5:
        lo, hi = sorted(rng.sample(GRID, 2))
        forms = [
            [Predicate(attr, ">=", lo), Predicate(attr, "<=", hi)],
            [Predicate(attr, ">", lo), Predicate(attr, "<", hi)],
            [Predicate(attr, "<", lo)],
            [Predicate(attr, ">=", hi)],
            [Predicate(attr, "=", lo)],
            [Predicate(attr, "<>", lo)],
            [Predicate(attr, ">=", lo), Predicate(attr, "<=", hi), Predicate(attr, "<>", hi)],
        ]
        return rng.choice(forms)
    if kind < 0.9:
        ops = rng.sample(STRING_OPERATORS, rng.choice([1, 1, 1, 2]))
        return [Predicate(attr, op, _mixed_string(rng)) for op in ops]
    return [Predicate(attr, "isPresent", None)]


def _mixed_subscription(rng: random.Random) -> Subscription:
    attrs = {_mixed_attr(rng) for _ in range(rng.choice([1, 1, 2, 2, 3, 5]))}
    return Subscription(tuple(p for a in sorted(attrs) for p in _mixed_predicates(rng, a)))


def _mixed_value(rng: random.Random) -> object:
    kind = rng.random()
    if kind < 0.45:
        x = rng.choice(GRID)
        return rng.choice([x, x, math.nextafter(x, 2), math.nextafter(x, -2), int(x * 4)])
    if kind < 0.9:
        return _mixed_string(rng) if rng.random() < 0.9 else "zz" + _mixed_string(rng)
    return rng.choice([math.nan, math.inf, -math.inf, True, None])


def _mixed_publication(rng: random.Random) -> dict:
    pub = {a: _mixed_value(rng) for a in MIXED_ATTRS[:8] if rng.random() < 0.85}
    pub.update((_mixed_attr(rng), _mixed_value(rng)) for _ in range(rng.randrange(4)))
    return pub


@settings(max_examples=MIXED_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), batch=st.integers(200, 1500))
def test_mixed_workload_agrees_with_reference(seed: int, batch: int) -> None:
    """Subscriptions of every kind added and removed in batches between matches (index
    rebuilt, then dead and pending subscriptions beside it): always the reference's
    keys and groups."""
    rng = random.Random(seed)
    pubs = [_mixed_publication(rng) for _ in range(25)]
    both = Both()
    key = 0
    for _round in range(4):
        for _ in range(batch):
            both.add(key, _mixed_subscription(rng), _group(key))
            key += 1
        both.agree(pubs)
        for gone in rng.sample(sorted(both.group), len(both.group) // 3):
            both.remove(gone)
        both.agree(pubs)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_has_its_selectivity(shape: str) -> None:
    """Each shape is as selective as it says (the benchmark's workloads are what they
    claim): within a quarter of its target over its own publications (800,000 pairs;
    five_bands over more publications, since how many of its bands a value falls in
    depends most on the value)."""
    target = {"wide_bands": 0.002, "broad": 0.10, "zipf_symbol": 0.006, "five_bands": 0.021}
    subs, pubs = SHAPES[shape](2000, 3)
    count = 1600 if shape == "five_bands" else 400
    measured = selectivity(subs[: 800_000 // count], pubs[:count])
    assert target.get(shape, 0.02) * 0.75 <= measured <= target.get(shape, 0.02) * 1.25


@pytest.mark.parametrize("groups", [1, 3, 40])
def test_match_groups_stops_early_yet_finds_every_group(groups: int) -> None:
    """match_groups stops once each live group has a match: same groups as the reference
    (through removals that empty whole groups), each key a real match of its group."""
    quotes = random_quotes(500, seed=3, symbols=12)
    subs = stock_subscriptions(quotes[:250], 600, seed=3)
    compiled, reference = Matcher(), ReferenceMatcher()
    for i, s in enumerate(subs):
        compiled.add(i, s, i % groups)
        reference.add(i, s, i % groups)
    compiled.rebuild()
    for round_ in range(2):
        found = 0
        for quote in quotes[250:]:
            got = compiled.match_groups(quote)
            assert got.keys() == reference.match_groups(quote).keys()
            matching = set(reference.match(quote))
            assert all(key in matching and key % groups == g for g, key in got.items())
            found += len(got)
        assert found > 0
        if round_ == 0:  # empty group 0 (unless it is the only one) and thin the rest
            for i in range(600):
                if (groups > 1 and i % groups == 0) or i % 5 == 1:
                    compiled.remove(i)
                    reference.remove(i)
        assert len(compiled) == len(reference)


# ---- boundaries ------------------------------------------------------------------------


@pytest.mark.parametrize("matcher_type", [Matcher, ReferenceMatcher])
def test_range_boundaries(matcher_type: type) -> None:
    m = matcher_type()
    for text in ["[x,<,1]", "[x,<=,1]", "[x,>,1]", "[x,>=,1]", "[x,=,1]", "[x,<>,1]",
                 "[x,>,0],[x,<,2]", "[x,>=,1],[x,<=,1]", "[x,>,1],[x,<,1]"]:  # fmt: skip
        m.add(text, parse_subscription(text))
    m.rebuild() if isinstance(m, Matcher) else None

    def hits(value: object) -> set[str]:
        return set(m.match({"x": value}))

    assert hits(1) == {"[x,<=,1]", "[x,>=,1]", "[x,=,1]", "[x,>,0],[x,<,2]", "[x,>=,1],[x,<=,1]"}
    assert hits(1.0) == hits(1)
    below = math.nextafter(1, 0)
    assert hits(below) == {"[x,<,1]", "[x,<=,1]", "[x,<>,1]", "[x,>,0],[x,<,2]"}
    above = math.nextafter(1, 2)
    assert hits(above) == {"[x,>,1]", "[x,>=,1]", "[x,<>,1]", "[x,>,0],[x,<,2]"}
    assert hits(math.inf) == {"[x,>,1]", "[x,>=,1]", "[x,<>,1]"}
    assert hits(-math.inf) == {"[x,<,1]", "[x,<=,1]", "[x,<>,1]"}
    assert hits(math.nan) == {"[x,<>,1]"}
    assert hits("1") == set()
    assert hits(True) == set()


def test_contradictions_never_match() -> None:
    m = Matcher()
    m.add("empty", parse_subscription("[x,>,1],[x,<,1]"))
    m.add("mixed", parse_subscription("[x,>,1],[x,eq,'a']"))
    m.add("ok", parse_subscription("[x,>,1]"))
    m.rebuild()
    assert m.stats()["never"] == 2
    assert m.match({"x": 2}) == ["ok"]
    assert m.match({"x": "a"}) == []


def test_prefix_postfix_index() -> None:
    m, r = Matcher(), ReferenceMatcher()
    texts = [
        "[date,str-postfix,'-04']",
        "[date,str-postfix,'Dec-04']",
        "[date,str-prefix,'28-']",
        "[date,str-prefix,'']",
        "[date,str-postfix,'-04'],[close,>,60]",
        "[date,eq,'28-Dec-04']",
        "[date,str-contains,'Dec']",
    ]
    for t in texts:
        m.add(t, parse_subscription(t))
        r.add(t, parse_subscription(t))
    m.rebuild()
    assert m.stats()["postfix"] + m.stats()["prefix"] >= 4
    for pub in [
        {"date": "28-Dec-04", "close": 64.18},
        {"date": "28-Dec-03", "close": 64.18},
        {"date": "4", "close": 1},
        {"date": "-04"},
        {"date": 4},
        {"close": 70},
    ]:
        assert sorted(m.match(pub)) == sorted(r.match(pub))
    assert sorted(m.match({"date": "28-Dec-04", "close": 64.18})) == sorted(texts)


# ---- API -------------------------------------------------------------------------------


@pytest.mark.parametrize("matcher_type", [Matcher, ReferenceMatcher])
def test_api_contract(matcher_type: type) -> None:
    m = matcher_type()
    s = parse_subscription("[symbol,eq,'MSFT'],[close,<,30]")
    m.add("k1", s)
    m.add(("tuple", 2), parse_subscription("[close,<,30]"))
    with pytest.raises(KeyError):
        m.add("k1", s)
    with pytest.raises(TypeError):
        m.add("k3", "[close,<,30]")
    with pytest.raises(KeyError):
        m.remove("nope")
    assert len(m) == 2
    assert "k1" in m and "k2" not in m
    assert m["k1"] is s
    pub = {"symbol": "MSFT", "close": 27}
    assert sorted(m.match(pub), key=str) == sorted(["k1", ("tuple", 2)], key=str)
    assert m.match_many([pub, {"symbol": "MSFT"}, {}]) == [m.match(pub), [], []]
    assert sorted(m.match(tuple(pub.items()) and dict(pub)), key=str) == sorted(
        m.match(pub), key=str
    )
    m.remove("k1")
    assert len(m) == 1 and "k1" not in m
    assert m.match(pub) == [("tuple", 2)]
    m.add("k1", s)
    assert len(m.match(pub)) == 2


def test_match_returns_equal_keys_of_their_type() -> None:
    """``match`` answers from copies of int and tuple keys laid out in slot order: each
    key it returns equals the one added, is of its type and hashes alike, for every kind
    of key, through removes and rebuilds."""
    keys: list = [7, 300, -10**6, 2**62, 2**70, -(2**70), ("t", 1), (), "s", 1.5,
                  frozenset({1}), None, True, (("nested", 2**40), 5)]  # fmt: skip
    m = Matcher()
    for key in keys:
        m.add(key, parse_subscription("[a,<,3]"))
    m.rebuild()
    got = m.match({"a": 1})
    assert Counter(got) == Counter(keys)
    by_key = {k: k for k in keys}
    assert all(type(k) is type(by_key[k]) and hash(k) == hash(by_key[k]) for k in got)
    m.remove(300)
    m.remove(("t", 1))
    m.add(301, parse_subscription("[a,<,3]"))
    assert Counter(m.match({"a": 1})) == Counter([*keys, 301]) - Counter([300, ("t", 1)])
    m.rebuild()
    assert Counter(m.match({"a": 1})) == Counter([*keys, 301]) - Counter([300, ("t", 1)])


def test_compiled_accepts_any_mapping() -> None:
    from types import MappingProxyType

    m = Matcher()
    m.add(1, parse_subscription("[a,=,1]"))
    assert m.match(MappingProxyType({"a": 1})) == [1]
    assert m.match_many([MappingProxyType({"a": 1}), {"a": 2}]) == [[1], []]


def test_rebuild_is_amortised() -> None:
    m = Matcher(pending_limit=8)
    for i in range(1000):
        m.add(i, parse_subscription(f"[x,>=,{i}]"))
        assert m.match({"x": i}) == list(range(i + 1)) or sorted(m.match({"x": i})) == list(
            range(i + 1)
        )
    stats = m.stats()
    assert 5 < stats["rebuilds"] < 150
    assert stats["pending"] <= 8 + 1000 // 32 + 1000 // 4
    for i in range(0, 1000, 2):
        m.remove(i)
    assert sorted(m.match({"x": 999})) == list(range(1, 1000, 2))
    assert len(m) == 500


def test_stock_subscriptions_are_well_indexed() -> None:
    quotes = random_quotes(4000, seed=5)
    subs = stock_subscriptions(quotes[:2000], 2000, seed=5)
    m = Matcher()
    for i, s in enumerate(subs):
        m.add(i, s)
    m.rebuild()
    matches = sum(len(keys) for keys in m.match_many(quotes[2000:]))
    stats = m.stats()
    assert stats["never"] == 0 and stats["root"] == 0
    # watch subscriptions sit in their symbol's cell, year ones in their year's
    assert stats["equality"] > 1500 and stats["postfix"] > 200
    # the bitmaps decide nearly every subscription: few are checked one by one
    assert stats["candidates"] < 0.1 * matches
    assert 0 < stats["memory"] < 1_000_000


# ---- real quotes -----------------------------------------------------------------------

HAND_CHECKED = {
    # counted over the first 300 lines of AAPL and of MSFT (newest first: Dec 2004 back into
    # 2003) with awk on the raw files, independently of octopis
    "aapl": "[class,eq,'STOCK'],[symbol,eq,'AAPL']",
    "aapl_over_40": "[class,eq,'STOCK'],[symbol,eq,'AAPL'],[close,>,40]",
    "msft_band": "[symbol,eq,'MSFT'],[close,>=,26],[close,<=,27]",
    "heavy": "[volume,>,60000000]",
    "dec_04": "[date,str-postfix,'Dec-04']",
    "day_29": "[date,str-prefix,'29-']",
    "not_msft": "[symbol,neq,'MSFT'],[low,<,20]",
    "wide_day": "[highLow%Diff,>=,0.05]",
    "up_day": "[openClose%Diff,>,0.03],[symbol,str-lt,'B']",
}
EXPECTED = {
    "aapl": 300,
    "aapl_over_40": 53,
    "msft_band": 65,
    "heavy": 163,
    "dec_04": 34,
    "day_29": 20,
    "not_msft": 8,
    "wide_day": 31,
    "up_day": 27,
}


def test_hand_checked_subscriptions_on_real_quotes() -> None:
    directory = quotes_dir()
    quotes = [
        enrich(q)
        for symbol in ("AAPL", "MSFT")
        for q in islice(read_quote_file(directory / symbol), 300)
    ]
    assert len(quotes) == 600
    compiled, reference = Matcher(), ReferenceMatcher()
    for key, text in HAND_CHECKED.items():
        compiled.add(key, parse_subscription(text))
        reference.add(key, parse_subscription(text))
    got = Counter(k for keys in compiled.match_many(quotes) for k in keys)
    want = Counter(k for keys in reference.match_many(quotes) for k in keys)
    assert got == want
    assert {k: got[k] for k in HAND_CHECKED} == EXPECTED
    assert sorted(compiled.match(quotes[0])) == sorted(["aapl", "aapl_over_40", "dec_04"])
    assert measure_selectivity([parse_subscription(HAND_CHECKED["aapl"])], quotes) == [0.5]


def test_clock_records_every_group_match() -> None:
    """A matcher built with a clock counts each match_groups and match_values call once,
    in exactly one histogram bucket, with its time; one clock serves several matchers;
    plain match does not count, nor does a matcher without a clock."""
    clock = MatchClock()
    quotes = random_quotes(60, seed=4, symbols=6)
    subs = stock_subscriptions(quotes[:30], 200, seed=4)
    timed = [Matcher(clock=clock), Matcher(clock=clock)]
    untimed = Matcher()
    for i, s in enumerate(subs):
        timed[i % 2].add(i, s, i % 3)
        untimed.add(i, s, i % 3)
    assert timed[0].clock is clock and untimed.clock is None
    for quote in quotes[30:]:
        timed[0].match_groups(quote)
        timed[1].match_values(quote, ["x", "y", "z"])
        timed[0].match(quote)
        untimed.match_groups(quote)
    assert clock.calls == 60
    assert sum(clock.histogram) == 60 and len(clock.histogram) == len(MATCH_BUCKETS) + 1
    assert clock.seconds > 0
    clock.observe(1.0)
    assert clock.calls == 61 and clock.histogram[-1] == 1


def test_match_values_needs_a_value_for_every_group() -> None:
    """A values list too short for a matching group is an IndexError, not a read past it."""
    matcher = Matcher()
    matcher.add("k", parse_subscription("[x,>,0]"), 4)
    with pytest.raises(IndexError, match="group 4"):
        matcher.match_values({"x": 1}, ["a", "b"])
    assert matcher.match_values({"x": 1}, ["a", "b", "c", "d", "e"]) == {"e"}


def test_the_reference_names_the_groups_the_compiled_matcher_names() -> None:
    """The reference's ``match_values`` names the same groups as the compiled matcher's
    (the agreement checks compare the compiled one against the reference's keys)."""
    quotes = random_quotes(200, seed=5, symbols=8)
    both = Both()
    for i, s in enumerate(stock_subscriptions(quotes[:100], 300, seed=5)):
        both.add(i, s, i % 7)
    names = [f"hop{g}" for g in range(7)]
    named = 0
    for quote in quotes[100:]:
        want = both.compiled.match_values(quote, names)
        assert both.reference.match_values(quote, names) == want
        named += len(want)
    assert named > 0
