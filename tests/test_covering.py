"""Covering (``octopis.filters.covering.covers``) and its index (``octopis.matching.CoverIndex``):
``covers(a, b)`` must imply that every publication matching ``b`` matches ``a`` (the
reference semantics decide), it must recognise the cases routing relies on, and the
index must find what a scan with ``covers`` finds."""

from __future__ import annotations

import math
import random
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st
from laws import sized

from octopis.filters.covering import CoverForm, covers
from octopis.filters.language import (
    NUMERIC_OPERATORS,
    STRING_OPERATORS,
    Predicate,
    Subscription,
    parse_subscription,
)
from octopis.matching import CoverIndex, ReferenceMatcher
from octopis.quotes import random_quotes, stock_subscriptions

ATTRS = ["a", "b"]
STRINGS = ["", "a", "ab", "abc", "b", "ba", "abd", "bab", "B", "é"]
NUMBERS = [-2, -1, 0, 1, 2, -0.0, 0.5, 1.0, 2.5, 1e300]

predicates = st.one_of(
    st.builds(Predicate, st.sampled_from(ATTRS), st.sampled_from(NUMERIC_OPERATORS),
              st.sampled_from(NUMBERS)),
    st.builds(Predicate, st.sampled_from(ATTRS), st.sampled_from(STRING_OPERATORS),
              st.sampled_from(STRINGS)),
    st.builds(Predicate, st.sampled_from(ATTRS), st.just("isPresent"), st.none()),
)  # fmt: skip
subscriptions = st.lists(predicates, min_size=1, max_size=4).map(lambda ps: Subscription(tuple(ps)))


def _values(*subs: Subscription) -> list[object]:
    """Every value that could tell two subscriptions apart on one attribute: their
    constants, each number's neighbours and points between, each string's neighbours in
    order and strings that start, end or contain it, specials, and unsupported types."""
    values: list[object] = [math.nan, math.inf, -math.inf, True, None, b"a", "", "zzz"]
    numbers = sorted({p.value for s in subs for p in s.predicates if _is_number(p.value)})
    for x in numbers:
        values += [x, math.nextafter(x, math.inf), math.nextafter(x, -math.inf)]
    values += [(x + y) / 2 for x, y in pairwise(numbers)]
    strings = {p.value for s in subs for p in s.predicates if isinstance(p.value, str)}
    for x in strings:
        values += [x, x + "\x00", x + "a", "a" + x, "z" + x, x + "z", "a" + x + "a"]
        if x:
            below = x[:-1] + chr(ord(x[-1]) - 1) if ord(x[-1]) else x[:-1]
            values += [below, below + "\U0010ffff", x[:-1], x[1:]]
    return values


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _counterexample(a: Subscription, b: Subscription) -> dict | None:
    """A publication matching ``b`` but not ``a``, if one exists among the publications
    made of :func:`_values` (attributes are independent in a conjunction, so one
    attribute at a time: the others take a value ``b`` accepts)."""
    values = _values(a, b)
    attrs = sorted({p.attr for s in (a, b) for p in s.predicates})
    ok: dict[str, list[object]] = {}
    for attr in attrs:
        ok[attr] = [v for v in [*values, "absent"] if _holds(b, attr, v)]
        if not ok[attr]:
            return None  # b matches nothing: a covers it
    for attr in attrs:
        for v in ok[attr]:
            pub = {x: (v if x == attr else ok[x][0]) for x in attrs}
            pub = {x: val for x, val in pub.items() if val != "absent"}
            if b.matches(pub) and not a.matches(pub):
                return pub
    return None


def _holds(s: Subscription, attr: str, value: object) -> bool:
    pub = {} if value == "absent" else {attr: value}
    return all(p.test(pub.get(attr)) for p in s.predicates if p.attr == attr)


@given(subscriptions, subscriptions)
def test_covers_never_claims_what_a_publication_refutes(a: Subscription, b: Subscription) -> None:
    if covers(a, b):
        assert _counterexample(a, b) is None, (a, b)


def _one_attribute_predicates() -> list[Predicate]:
    numbers = [-1, 0, 0.5, 1, 2]
    strings = ["", "a", "ab", "abc", "b", "ba"]
    return [
        *(Predicate("x", op, c) for op in NUMERIC_OPERATORS for c in numbers),
        *(Predicate("x", op, c) for op in STRING_OPERATORS for c in strings),
        Predicate("x", "isPresent", None),
    ]


def test_covers_is_sound_on_one_attribute() -> None:
    """Every predicate against every predicate, and against 20,000 pairs of predicates
    (4,000 outside the ``ci`` profile), on one attribute (where covering is decided;
    several attributes only conjoin): whenever ``covers`` says yes, no publication tells
    the two apart."""
    ps = _one_attribute_predicates()
    rng = random.Random(0)
    pairs = sized(4_000, 20_000)
    bs = [(q,) for q in ps] + [(rng.choice(ps), rng.choice(ps)) for _ in range(pairs)]
    claimed = 0
    for b in bs:
        sb = Subscription(b)
        form = CoverForm(sb)
        for p in ps if len(b) == 1 else rng.sample(ps, 8):
            sa = Subscription((p,))
            if CoverForm(sa).covers(form):
                claimed += 1
                assert _counterexample(sa, sb) is None, (sa, sb)
    assert claimed > pairs // 2, claimed


@given(subscriptions, st.lists(predicates, max_size=3), st.data())
def test_narrowing_a_subscription_keeps_it_covered(
    a: Subscription, extra: list[Predicate], data: st.DataObject
) -> None:
    """Adding predicates to a subscription narrows it: the original covers the narrowed
    one (recognised, not only sound), and the reference matcher agrees on publications."""
    narrowed = Subscription(a.predicates + tuple(extra))
    assert covers(a, narrowed)
    matcher = ReferenceMatcher()
    matcher.add("a", a)
    matcher.add("narrowed", narrowed)
    values = _values(a, narrowed)
    for _ in range(20):
        pub = {
            attr: data.draw(st.sampled_from(values)) for attr in ATTRS if data.draw(st.booleans())
        }
        if "narrowed" in matcher.match(pub):
            assert "a" in matcher.match(pub)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("[close,<,30]", "[close,<,20]"),
        ("[close,<=,30]", "[close,<,30]"),
        ("[close,<,30]", "[close,<=,30],[close,<>,30]"),
        ("[close,>,1]", "[close,=,2]"),
        ("[close,>=,1],[close,<=,5]", "[close,>,2],[close,<,3]"),
        ("[close,<>,7]", "[close,<,5]"),
        ("[close,<>,7]", "[close,<>,7],[close,>,0]"),
        ("[close,=,2]", "[close,>=,2],[close,<=,2]"),
        ("[x,isPresent]", "[x,str-prefix,'a']"),
        ("[x,isPresent]", "[x,<,1]"),
        ("[x,eq,'MSFT']", "[x,eq,'MSFT'],[y,>,1]"),
        ("[x,neq,'b']", "[x,str-prefix,'a']"),
        ("[x,neq,'b']", "[x,eq,'a']"),
        ("[x,str-prefix,'ab']", "[x,str-prefix,'abc']"),
        ("[x,str-prefix,'ab']", "[x,eq,'abz']"),
        ("[x,str-postfix,'-99']", "[x,str-postfix,'n-99']"),
        ("[x,str-contains,'b']", "[x,str-prefix,'abc']"),
        ("[x,str-contains,'b']", "[x,str-contains,'abc']"),
        ("[x,str-lt,'b']", "[x,str-prefix,'ab']"),
        ("[x,str-le,'b']", "[x,str-lt,'b']"),
        ("[x,str-gt,'a']", "[x,str-prefix,'b']"),
        ("[x,str-ge,'ab']", "[x,str-prefix,'ab']"),
        ("[x,str-ge,'a']", "[x,str-gt,'a']"),
        ("[x,<,1]", "[x,<,0],[x,eq,'a']"),  # b matches nothing
        ("[class,eq,'STOCK'],[close,<,30]", "[class,eq,'STOCK'],[symbol,eq,'X'],[close,<,20]"),
    ],
)
def test_covers_recognises(a: str, b: str) -> None:
    pa, pb = parse_subscription(a), parse_subscription(b)
    assert covers(pa, pb)
    assert _counterexample(pa, pb) is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("[close,<,20]", "[close,<,30]"),
        ("[close,<,30]", "[close,<=,30]"),
        ("[close,<,1]", "[other,<,1]"),  # b says nothing of close: absent passes b
        ("[x,isPresent]", "[y,isPresent]"),
        ("[x,<,1]", "[x,str-lt,'b']"),  # a string is no number
        ("[x,str-lt,'b']", "[x,<,1]"),
        ("[x,<>,7]", "[x,<>,8]"),
        ("[x,neq,'b']", "[x,isPresent]"),  # a number passes isPresent, never neq
        ("[x,str-lt,'ab']", "[x,str-prefix,'a']"),
        ("[x,str-prefix,'abc']", "[x,str-prefix,'ab']"),
        ("[x,eq,'a']", "[x,str-prefix,'a']"),
        ("[x,str-gt,'b']", "[x,str-prefix,'b']"),
        ("[class,eq,'STOCK'],[symbol,eq,'X']", "[class,eq,'STOCK'],[symbol,eq,'Y']"),
    ],
)
def test_covers_refuses(a: str, b: str) -> None:
    """Each refusal is right: a publication matches ``b`` and not ``a`` (which also shows
    that :func:`_counterexample`, the property's judge, finds one when there is one)."""
    pa, pb = parse_subscription(a), parse_subscription(b)
    assert not covers(pa, pb)
    assert _counterexample(pa, pb) is not None


def test_every_subscription_covers_itself_and_most_stock_ones_are_covered() -> None:
    """The paper's workload: most stock subscriptions are narrower versions of another."""
    subs = stock_subscriptions(random_quotes(2000, seed=1, symbols=20), 1000, seed=1)
    forms = [CoverForm(s) for s in subs]
    assert all(f.covers(f) for f in forms)
    index = CoverIndex()
    for i, f in enumerate(forms):
        index.add(i, f)
    covered = sum(any(k != i for k in index.covering(f)) for i, f in enumerate(forms))
    assert covered > 0.7 * len(forms), covered


def _scan(stored: dict[int, CoverForm], form: CoverForm, covering: bool) -> set[int]:
    if covering:
        return {k for k, f in stored.items() if f.covers(form)}
    return {k for k, f in stored.items() if form.covers(f)}


def _degenerate(form: CoverForm) -> bool:
    """Covering the index may miss: a constraint that matches nothing (vacuously
    covered), or a numeric point made of two bounds rather than ``=``."""
    return any(c.unsatisfiable or (c.numeric and c.lo == c.hi) for c in form.constraints.values())


@given(st.lists(subscriptions, min_size=1, max_size=30), st.lists(subscriptions, max_size=10))
def test_index_finds_what_a_scan_finds(stored: list[Subscription], queries: list) -> None:
    index = CoverIndex()
    forms = {i: index.add(i, s) for i, s in enumerate(stored)}
    for i in range(0, len(stored), 3):  # some come and go
        index.remove(i)
        del forms[i]
    for query in [*queries, *stored]:
        form = CoverForm(query)
        for covering in (True, False):
            found = set(index.covering(form) if covering else index.covered(form))
            scanned = _scan(forms, form, covering)
            assert found <= scanned
            missed = scanned - found
            assert all(_degenerate(form if covering else forms[k]) for k in missed), missed


def test_index_on_stock_subscriptions_finds_exactly_what_a_scan_finds() -> None:
    subs = stock_subscriptions(random_quotes(2000, seed=2, symbols=30), 600, seed=2)
    index = CoverIndex()
    forms = {i: index.add(i, s) for i, s in enumerate(subs)}
    rng = random.Random(2)
    for i in rng.sample(range(600), 200):
        index.remove(i)
        del forms[i]
    for s in subs[:150]:
        form = CoverForm(s)
        assert set(index.covering(form)) == _scan(forms, form, True)
        assert set(index.covered(form)) == _scan(forms, form, False)
    assert len(index) == 400 and all(k in index for k in forms)
    with pytest.raises(KeyError):
        index.add(next(iter(forms)), subs[0])
    with pytest.raises(KeyError):
        index.remove(-1)
