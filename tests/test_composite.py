"""Composite subscriptions (DESIGN §12): the syntax (text and dict forms, every error
named), the join at the host against a brute-force reference over the whole published
stream, its bounds, and a process test on fig2 with trades and quotes derived from the
real quote data."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conditions import closing_control, tables_hold, until
from conftest import secure_fig2
from hypothesis import assume, given
from hypothesis import strategies as st

from octopis.client import Publisher, Received, Subscriber
from octopis.client.composite import CompositeNotification
from octopis.client.streams import CompositeStream, SubscriptionStream
from octopis.cluster.launcher import LocalCluster
from octopis.core.composite import CompositeJoin
from octopis.filters.composite import (
    Binding,
    Composite,
    Join,
    Part,
    Var,
    as_filter,
    composite_from_dict,
    parse_composite,
)
from octopis.filters.language import FilterError, Predicate, parse_subscription
from octopis.keys import KEYS_ENV
from octopis.nemesis.checks import brute_force_matches
from octopis.quotes import quotes_dir, read_quote_file
from octopis.settings import BrokerSettings, settings_from_data

TRADES_AND_QUOTES = (
    "{[class,eq,'TRADE'],[symbol,eq,$S]} & "
    "{[class,eq,'QUOTE'],[symbol,eq,$S],[bid,>,100]} within 5s"
)

# -- syntax ------------------------------------------------------------------------------


def test_the_trades_and_quotes_example_parses_into_parts_that_route_as_supersets() -> None:
    c = parse_composite(TRADES_AND_QUOTES)
    assert c.window == 5.0 and c.expression == Join("&", (0, 1)) and c.variables == {"S"}
    trade, quote = c.parts
    assert trade.terms == (Predicate("class", "eq", "TRADE"), Binding("symbol", "eq", "S"))
    assert trade.routing == parse_subscription("[class,eq,'TRADE'],[symbol,isPresent]")
    assert quote.routing == parse_subscription("[class,eq,'QUOTE'],[symbol,isPresent],[bid,>,100]")
    assert quote.bind({"class": "QUOTE", "symbol": "IBM", "bid": 101.5}) == {"S": "IBM"}
    assert quote.bind({"class": "QUOTE", "symbol": "IBM", "bid": 99}) is None
    assert quote.bind({"class": "QUOTE", "symbol": 7, "bid": 101}) is None  # eq binds strings
    assert parse_composite(c.to_text()) == c
    assert c.to_text() == (
        "{[class,eq,'TRADE'],[symbol,eq,$S]} & "
        "{[class,eq,'QUOTE'],[symbol,eq,$S],[bid,>,100]} within 5.0s"
    )


def test_padres_spelling_typed_variables_double_operators_and_outer_braces() -> None:
    padres = parse_composite(
        "{{[class,eq,'audit'],[reading,=,$I$X0]}&&{[class,eq,'reading'],[reading,=,'$I$X0']}}"
    )
    plain = parse_composite(
        "{[class,eq,'audit'],[reading,=,$X0]} & {[class,eq,'reading'],[reading,=,$X0]}"
    )
    assert padres == plain and padres.window is None
    assert parse_composite("{[a,eq,'x']} || {[b,eq,'y']}").expression.op == "|"
    assert parse_composite("({[a,eq,'x']} | {[b,eq,'y']}) & {[c,eq,'z']}") == parse_composite(
        "{{[a,eq,'x']} | {[b,eq,'y']}} & {[c,eq,'z']}"
    )
    # in a part a quoted text that is not a typed PADRES variable is a string constant
    quoted = parse_composite("{[a,eq,'$X']} & {[b,eq,'y']}")
    assert quoted.parts[0].terms == (Predicate("a", "eq", "$X"),)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("500ms", 0.5), ("1.5 s", 1.5), ("2m", 120.0), ("1h", 3600.0), (".25s", 0.25)],
)
def test_windows(text: str, seconds: float) -> None:
    assert parse_composite(f"{{[a,eq,'x']}} & {{[b,eq,'y']}} within {text}").window == seconds


def test_the_dict_form_equals_the_text() -> None:
    from_dict = composite_from_dict(
        {
            "and": [
                {"class": ("eq", "TRADE"), "symbol": ("eq", Var("S"))},
                "[class,eq,'QUOTE'],[symbol,eq,$S],[bid,>,100]",
            ],
            "within": "5s",
        }
    )
    assert from_dict == parse_composite(TRADES_AND_QUOTES)
    nested = composite_from_dict(
        {"or": [{"and": [{"a": ("eq", "x")}, {"b": "isPresent"}]}, {"c": ("=", 1)}], "within": 2}
    )
    assert nested == parse_composite("{{[a,eq,'x']} & {[b,isPresent]}} | {[c,=,1]} within 2s")
    assert as_filter({"or": [{"a": ("eq", "x")}, {"b": ("eq", "y")}]}) == parse_composite(
        "{[a,eq,'x']} | {[b,eq,'y']}"
    )


def test_atomic_filters_are_read_as_before() -> None:
    text = "[class,eq,'STOCK'],[close,>,27.5]"
    assert as_filter(text) == parse_subscription(text)
    assert as_filter({"close": (">", 27.5)}) == parse_subscription("[close,>,27.5]")
    with pytest.raises(FilterError, match=r"position 12: invalid value '\$S'"):
        parse_subscription("[symbol,eq,$S]")  # a variable is a composite's only


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{[a,eq,'x']}", "position 1: a composite subscription joins at least two parts"),
        ("{[a,eq,'x']} {[b,eq,'y']}", "position 14: expected '&', '|' or 'within' after a part"),
        ("{[a,eq,'x']} & {[b,eq,'y']} | {[c,eq,'z']}", "position 29: '|' after '&': group"),
        ("{[a,eq,'x']} & {}", "position 16: empty part '{}'"),
        ("{[a,eq,'x']} & ()", "position 16: empty group '()'"),
        ("{[a,eq,'x']} & {[b,eq,'y']", "position 27: expected '}' to close '{' of position 16"),
        ("{[a,eq,'x']} & [b,eq,'y']", "position 16: expected '{' to open a part or a group"),
        ("{[a,eq,'x'] & {[b,eq,'y']}", "position 13: expected ',' between predicates"),
        ("{[a,eq,$X]} & {[b,>,$X]}", "position 21: variable $X binds by equality"),
        ("{[a,eq,$S$X]} & {[b,=,$S$X]}", "position 23: variable $S$X is a string variable"),
        ("{[a,eq,$]} & {[b,eq,'y']}", "position 8: expected a variable name after '$'"),
        ("{[a,eq,$X]} & {[b,eq,$Y]}", "variable $X appears once (part 1)"),
        ("{[a,eq,$X]} & {[b,=,$X]}", "variable $X is compared as a string (eq) in part 1"),
        ("{[a,eq,'x']} & {[b,eq,'y']} within 5", "position 36: a duration needs a unit"),
        ("{[a,eq,'x']} & {[b,eq,'y']} within soon", "position 36: expected a duration"),
        ("{[a,eq,'x']} & {[b,eq,'y']} within 0s", "position 36: the window must be longer"),
        ("{[a,eq,'x']} & {[b,eq,'y']} within 5s or so", "position 39: expected the end after"),
        ("({[a,eq,'x']} & {[b,eq,'y']} within 5s)", "position 30: 'within' applies to the whole"),
        ("{[a,eqq,'x']} & {[b,eq,'y']}", "position 5: unknown operator 'eqq'"),
        ("{[a,eq,1]} & {[b,eq,'y']}", "position 8: string operator 'eq' needs a quoted string"),
        (" & ".join(["{[a,eq,'x']}"] * 17), "17 parts is over the limit of 16"),
    ],
)
def test_malformed_composites_are_refused_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(FilterError, match=re.escape(message)):
        parse_composite(text)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"and": [{"a": ("eq", "x")}]}, "'and' needs a list of at least two terms"),
        ({"and": [{"a": ("eq", "x")}, {"b": ("eq", "y")}], "or": []}, "one of 'and' or 'or'"),
        ({"and": [{"a": ("eq", "x")}, 5]}, "composite.and[1]: a term must be a part"),
        ({"and": [{"a": (">", Var("X"))}, {"b": ("eq", Var("X"))}]}, "binds by equality"),
        ({"and": [{"a": ("eq", "x")}, {"b": ("eq", "y")}], "within": -1}, "positive number"),
        ({"and": [{"a": ("eq", "x")}, {"b": ("eq", "y")}], "within": "5"}, "needs a unit"),
    ],
)
def test_malformed_dict_forms_are_refused_naming_the_problem(
    spec: Mapping[str, Any], message: str
) -> None:
    with pytest.raises(FilterError, match=re.escape(message)):
        composite_from_dict(spec)


def test_a_variable_name_is_checked() -> None:
    with pytest.raises(FilterError, match="invalid variable name '1x'"):
        Var("1x")


ATTRS = ("a", "b", "n")
IS_PRESENT = "isPresent"


@st.composite
def composites(draw: st.DrawFn, max_held: int = 4) -> Composite:
    """A composite over attributes a, b (strings) and n (numbers): random predicates,
    bindings of $S (strings) and $N (numbers), a random AND/OR tree, maybe a window."""
    count = draw(st.integers(2, max_held))
    parts = []
    for _ in range(count):
        terms: list[Predicate | Binding] = []
        if draw(st.booleans()):
            terms.append(Predicate("a", "eq", draw(st.sampled_from("xy"))))
        if draw(st.booleans()):
            terms.append(Predicate("n", draw(st.sampled_from(("<", ">=", "<>"))), 1))
        if draw(st.booleans()):
            terms.append(Binding("b", "eq", "S"))
        if draw(st.booleans()):
            terms.append(Binding("n", "=", "N"))
        if not terms:
            terms.append(Predicate("a", IS_PRESENT, None))
        parts.append(Part(tuple(terms)))
    window = draw(st.sampled_from((None, 0.5, 1.0, 2.5)))
    try:
        return Composite(tuple(parts), draw(trees(list(range(count)))), window)
    except FilterError:  # a variable named once
        assume(False)
        raise


@st.composite
def trees(draw: st.DrawFn, leaves: list[int]) -> int | Join:
    if len(leaves) == 1:
        return leaves[0]
    cut = draw(st.integers(1, len(leaves) - 1))
    op = draw(st.sampled_from("&|"))
    return Join(op, (draw(trees(leaves[:cut])), draw(trees(leaves[cut:]))))


@given(composites())
def test_text_round_trips(c: Composite) -> None:
    assert parse_composite(c.to_text()) == c


# -- the join ------------------------------------------------------------------------------


Stream = list[tuple[tuple[str, int, int], float, dict[str, Any]]]
"""(key, published_at, publication) in publication order."""


def joined(
    join: CompositeJoin, stream: Stream, delays: list[float]
) -> list[tuple[frozenset, dict[tuple, frozenset[int]]]]:
    """Offer ``stream`` to ``join`` in order of arrival (publication time + delay)."""
    arrivals = sorted(
        ((t + d, key, t, pub) for (key, t, pub), d in zip(stream, delays, strict=True)),
        key=lambda a: (a[0], a[1]),
    )
    out = []
    for now, key, t, pub in arrivals:
        for match in join.offer(key, t, pub, now):
            out.append((match.keys, {held.key: frozenset(parts) for held, parts in match.parts}))
    return out


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    size = draw(st.integers(0, 8))
    stream = []
    for i in range(size):
        pub: dict[str, Any] = {}
        for attr in ATTRS:
            if draw(st.integers(0, 4)):  # mostly present
                pub[attr] = draw(st.integers(0, 2)) if attr == "n" else draw(st.sampled_from("xy"))
        if not pub:
            pub["a"] = "x"
        t = draw(st.integers(0, 10)) * 0.25  # ties and exact window edges are common
        stream.append((("p", 0, i), t, pub))
    return stream


@given(composites(), streams(), st.data())
def test_the_join_delivers_every_match_once_whatever_the_arrival_order(
    c: Composite, stream: Stream, data: st.DataObject
) -> None:
    """Publications reach the host in any order, each within ``lateness`` of its
    publication: every match of the reference is delivered exactly once, with the
    parts each publication fills, and nothing else."""
    lateness = 2.0
    delays = data.draw(
        st.lists(
            st.sampled_from((0.0, 0.3, 1.0, lateness)), min_size=len(stream), max_size=len(stream)
        )
    )
    join = CompositeJoin(c, max_held=1000, lateness=lateness)
    got = joined(join, stream, delays)
    expected = brute_force_matches(c, stream)
    sets = [keys for keys, _ in got]
    assert len(sets) == len(set(sets)), "a match delivered twice"
    assert dict(got) == expected
    assert join.dropped == join.late == join.cut == 0
    if c.window is not None:  # nothing is kept past window + lateness of the last arrival
        last = max((t + d for (_, t, _), d in zip(stream, delays, strict=True)), default=0)
        assert all(h.published_at >= last - c.window - lateness for h in join.held.values())


@given(composites(), streams(), st.data())
def test_bounds_only_ever_lose_matches_and_say_so(
    c: Composite, stream: Stream, data: st.DataObject
) -> None:
    """With a tiny ``max_held`` and delays past ``lateness``, what is delivered is still
    a set of true matches, each once; a match is missing only when the join counted a
    publication dropped, late or an arrival cut."""
    delays = data.draw(
        st.lists(st.sampled_from((0.0, 0.5, 3.0)), min_size=len(stream), max_size=len(stream))
    )
    join = CompositeJoin(c, max_held=data.draw(st.integers(1, 3)), lateness=1.0)
    got = joined(join, stream, delays)
    expected = brute_force_matches(c, stream)
    sets = [keys for keys, _ in got]
    assert len(sets) == len(set(sets))
    assert set(sets) <= set(expected)
    assert len(join.held) <= join.max_held
    if set(sets) != set(expected):
        assert join.dropped + join.late + join.cut > 0


def trade(i: int, symbol: str, price: float) -> dict[str, Any]:
    return {"class": "TRADE", "symbol": symbol, "price": price}


def quote(i: int, symbol: str, bid: float) -> dict[str, Any]:
    return {"class": "QUOTE", "symbol": symbol, "bid": bid, "ask": bid + 0.5}


def test_each_trade_and_quote_pair_of_a_symbol_within_the_window_once() -> None:
    join = CompositeJoin(parse_composite(TRADES_AND_QUOTES))
    offers = [
        (("t", 0, 1), 0.0, trade(1, "IBM", 101.0)),
        (("q", 0, 1), 1.0, quote(1, "IBM", 100.5)),  # joins trade 1
        (("q", 0, 2), 2.0, quote(2, "MSFT", 120.0)),  # another symbol
        (("q", 0, 3), 3.0, quote(3, "IBM", 99.0)),  # bid too low
        (("t", 0, 2), 4.0, trade(2, "IBM", 100.0)),  # joins quote 1
        (("q", 0, 4), 5.0, quote(4, "IBM", 101.0)),  # joins trade 1 (5 s: the edge) and 2
        (("q", 0, 5), 5.5, quote(5, "IBM", 101.0)),  # trade 1 is 5.5 s away: only trade 2
    ]
    got = [
        sorted(held.key[0] + str(held.key[2]) for held, _ in match.parts)
        for key, t, pub in offers
        for match in join.offer(key, t, pub, t + 0.01)
    ]
    assert got == [["q1", "t1"], ["q1", "t2"], ["q4", "t1"], ["q4", "t2"], ["q5", "t2"]]


def test_a_publication_filling_both_sides_of_an_or_is_one_match() -> None:
    join = CompositeJoin(parse_composite("{[bid,>,100]} | {[symbol,eq,'IBM']}"))
    [match] = join.offer(("q", 0, 1), 0.0, quote(1, "IBM", 120), 0.0)
    assert [roles for _, roles in match.parts] == [(0, 1)]
    assert join.held == {}  # under OR alone nothing waits for a partner
    assert join.offer(("q", 0, 2), 0.0, quote(2, "MSFT", 10), 0.0) == []


def test_a_publication_filling_both_parts_of_an_and_is_a_match_by_itself() -> None:
    join = CompositeJoin(parse_composite("{[bid,>,100]} & {[symbol,eq,'IBM']} within 1s"))
    [alone] = join.offer(("q", 0, 1), 0.0, quote(1, "IBM", 120), 0.0)
    assert [roles for _, roles in alone.parts] == [(0, 1)]
    matches = join.offer(("q", 0, 2), 0.5, quote(2, "MSFT", 130), 0.5)
    # {quote 1, quote 2}: quote 2 fills the bid part, quote 1 the IBM one (the set in
    # which quote 1 fills both is quote 1 alone, delivered before)
    assert [[roles for _, roles in m.parts] for m in matches] == [[(1,), (0,)]]


def test_what_is_kept_is_bounded_and_what_is_let_go_is_counted() -> None:
    join = CompositeJoin(parse_composite(TRADES_AND_QUOTES), max_held=3, lateness=1.0)
    for i in range(5):
        assert join.offer(("t", 0, i), float(i) / 10, trade(i, "IBM", 1.0), 1.0) == []
    assert len(join.held) == 3 and join.dropped == 2
    matches = join.offer(("q", 0, 1), 0.5, quote(1, "IBM", 101), 1.0)
    assert sorted(m.parts[0][0].key[2] for m in matches) == [2, 3, 4]  # the 3 trades kept
    assert join.dropped == 3 and len(join.held) == 3  # then trade 2 went
    # late: offered 2 s after publication with lateness 1 s; its partners may be gone
    join.offer(("q", 0, 2), 0.4, quote(2, "IBM", 101), 2.4)
    assert join.late == 1 and join.dropped == 4
    # past window + lateness everything is let go, not counted as dropped
    join.offer(("t", 0, 9), 100.0, trade(9, "MSFT", 1.0), 100.0)
    assert list(join.held) == [("t", 0, 9)] and join.dropped == 4


def test_an_arrival_completing_too_many_matches_is_cut_and_counted() -> None:
    two_trades_and_a_quote = "{[class,eq,'TRADE']} & {[class,eq,'TRADE']} & {[class,eq,'QUOTE']}"
    join = CompositeJoin(parse_composite(two_trades_and_a_quote), max_held=4)
    for i in range(3):
        join.offer(("t", 0, i), 0.0, trade(i, "IBM", 1.0), 0.0)
    assert join.cut == 0
    matches = join.offer(("q", 0, 1), 0.0, quote(1, "IBM", 1.0), 0.0)
    # {t, q} for each trade (one trade filling both trade parts) and {t, t', q} for each
    # pair: 6 sets, more than max_held
    assert len(matches) == 4 and join.cut == 1


def test_a_repeat_completes_nothing() -> None:
    join = CompositeJoin(parse_composite(TRADES_AND_QUOTES))
    join.offer(("t", 0, 1), 0.0, trade(1, "IBM", 1.0), 0.0)
    assert len(join.offer(("q", 0, 1), 0.0, quote(1, "IBM", 101), 0.0)) == 1
    assert join.offer(("q", 0, 1), 0.0, quote(1, "IBM", 101), 0.0) == []


def test_the_settings() -> None:
    s = settings_from_data({"composite": {"max_held": 50, "lateness": 0.5}})
    assert (s.composite.max_held, s.composite.lateness) == (50, 0.5)
    assert "[composite]\nmax_held = 50\nlateness = 0.5\n" in s.to_toml(changed_only=True)


# -- on an overlay: trades and quotes from the real quote data ------------------------------

SYMBOLS = ("AAPL", "AMZN", "COMS", "INTC", "MSFT", "ORCL", "SNDK", "SUNW")
"""Eight real series whose closes in March 2000 lie on both sides of 100."""
MONTH = "-Mar-00"
WINDOW = 0.4
"""The window of the AND composite, seconds: a trade meets the quotes published around
it, not all of them (the two publishers take about three seconds)."""
PAIRS = (
    "{[class,eq,'TRADE'],[symbol,eq,$S]} & "
    "{[class,eq,'QUOTE'],[symbol,eq,$S],[bid,>,100]} within 400ms"
)
EITHER = {
    "or": [
        {"class": ("eq", "TRADE"), "price": (">", 120)},
        {"class": ("eq", "QUOTE"), "ask": ("<", 70)},
    ]
}
SHARED = pytest.mark.xdist_group("composite-fig2")


def trades_and_quotes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A trade and a quote per real daily row of :data:`SYMBOLS` in March 2000, by day
    then symbol: the trade at the close, the quote's bid and ask 0.2 % either side."""
    rows = [
        row
        for symbol in SYMBOLS
        for row in read_quote_file(quotes_dir() / symbol)
        if str(row["date"]).endswith(MONTH)
    ]
    rows.sort(key=lambda row: (int(str(row["date"]).split("-")[0]), row["symbol"]))
    trades, quotes = [], []
    for row in rows:
        close = float(row["close"])
        spread = max(0.01, round(close * 0.002, 2))
        trades.append(
            {"class": "TRADE", "symbol": row["symbol"], "price": close, "volume": row["volume"]}
        )
        quotes.append(
            {
                "class": "QUOTE",
                "symbol": row["symbol"],
                "bid": round(close - spread, 2),
                "ask": round(close + spread, 2),
            }
        )
    return trades, quotes


Key = tuple[str, int, int]


def expected_pairs(published: dict[Key, tuple[float, dict[str, Any]]]) -> set[frozenset[Key]]:
    """The oracle of :data:`PAIRS` over the published stream: every (trade, quote) of one
    symbol, the quote's bid above 100, published at most :data:`WINDOW` apart."""
    trades = [(k, t, p) for k, (t, p) in published.items() if p["class"] == "TRADE"]
    quotes = [(k, t, p) for k, (t, p) in published.items() if p["class"] == "QUOTE"]
    return {
        frozenset((kt, kq))
        for kt, tt, pt in trades
        for kq, tq, pq in quotes
        if pt["symbol"] == pq["symbol"] and pq["bid"] > 100 and abs(tt - tq) <= WINDOW
    }


def expected_either(published: dict[Key, tuple[float, dict[str, Any]]]) -> set[frozenset[Key]]:
    """The oracle of :data:`EITHER`: each trade above 120 and each quote asking below 70."""
    return {
        frozenset((k,))
        for k, (_, p) in published.items()
        if (p["class"] == "TRADE" and p["price"] > 120) or (p["class"] == "QUOTE" and p["ask"] < 70)
    }


def tally(expected: set[frozenset[Key]], got: Counter[frozenset[Key]]) -> dict[str, int]:
    return {
        "expected": len(expected),
        "delivered": sum(got[k] > 0 for k in expected),
        "duplicated": sum(n - 1 for n in got.values()),
        "lost": len(expected - set(got)),
        "spurious": len(set(got) - expected),
    }


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield from secure_fig2(tmp_path_factory.mktemp("composite"), monkeypatch, BrokerSettings())


@SHARED
@pytest.mark.processes
@pytest.mark.timeout(180)
def test_trades_and_quotes_join_once_per_match_across_the_overlay(overlay: LocalCluster) -> None:
    """Trades published at a:0 and quotes at c:1 (another region and cluster), the
    composite subscriber at f:2, a tap of every publication at d:0. Each match the oracle
    finds over the published stream (the tap's copy of it: every publication with its
    publication time) is delivered once, none is missed and none is spurious: an AND
    with ``$S`` and a window (text form) and an OR (dict form). When the subscriber
    leaves, every part is withdrawn everywhere."""
    cluster = overlay
    scot = cluster.scot
    trades, quotes = trades_and_quotes()
    published: dict[Key, tuple[float, dict[str, Any]]] = {}
    tapped: Counter[Key] = Counter()
    got: dict[str, Counter[frozenset[Key]]] = {"pairs": Counter(), "either": Counter()}
    roles_seen: set[tuple[tuple[int, ...], ...]] = set()

    def tap(n: Received) -> None:
        key = (n.publisher, n.session, n.seq)
        tapped[key] += 1
        published[key] = (n.published_at, n.publication)

    async def collect(name: str, stream: SubscriptionStream) -> None:
        async for match in stream:
            assert isinstance(match, CompositeNotification)
            got[name][frozenset((r.publisher, r.session, r.seq) for r in match.parts)] += 1
            if name == "pairs":
                roles_seen.add(match.roles)

    async def publish(publisher: Publisher, items: list[dict[str, Any]]) -> None:
        for item in items:
            await publisher.publish(item, wait=False)
            await asyncio.sleep(0.012)
        await publisher.flush()

    async def scenario() -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        joiner = await Subscriber.connect(scot.client_endpoints("f:2"), "joiner")
        pairs = await joiner.subscribe(PAIRS)
        either = await joiner.subscribe(EITHER)
        assert isinstance(pairs, CompositeStream) and isinstance(either, CompositeStream)
        watcher = await Subscriber.connect(scot.client_endpoints("d:0"), "tap", on_notification=tap)
        await watcher.subscribe("[class,isPresent]")
        await until(lambda: tables_hold(cluster, 2 + 2 + 1), "the parts everywhere", 30)
        tasks = [
            asyncio.create_task(collect("pairs", pairs)),
            asyncio.create_task(collect("either", either)),
        ]
        trader = await Publisher.connect(scot.client_endpoints("a:0"), "trades")
        quoter = await Publisher.connect(scot.client_endpoints("c:1"), "quotes")
        await asyncio.gather(publish(trader, trades), publish(quoter, quotes))
        count = len(trades) + len(quotes)
        await until(lambda: len(tapped) == count, "the tap has every publication", 30)
        oracle = {"pairs": expected_pairs(published), "either": expected_either(published)}
        with contextlib.suppress(AssertionError):  # what is missing is reported below
            await until(lambda: all(oracle[k] <= set(got[k]) for k in oracle), "every match", 30)
        stats = (await cluster.ask(["f:2"], "stats", 10))["f:2"]["counters"]
        for task in tasks:
            task.cancel()
        for client in (joiner, watcher, trader, quoter):
            await client.close()
        await until(lambda: tables_hold(cluster, 0), "every part withdrawn", 30)
        report = {name: tally(oracle[name], got[name]) for name in oracle}
        report["tap"] = {
            "published": count,
            "tapped": len(tapped),
            "repeats": tapped.total() - len(tapped),
        }
        return report, {k: v for k, v in stats.items() if k.startswith("composite.")}

    report, counters = asyncio.run(closing_control(cluster, scenario()))
    print(json.dumps({**report, "f:2 counters": counters}))
    assert report["tap"]["tapped"] == report["tap"]["published"] and not report["tap"]["repeats"]
    for name in ("pairs", "either"):
        counts = report[name]
        assert counts["expected"] > 50, (name, counts)  # the window and predicates matter...
        assert counts["lost"] == counts["spurious"] == counts["duplicated"] == 0, (name, counts)
        assert counts["delivered"] == counts["expected"]
    total = len(trades) * len(quotes)
    assert report["pairs"]["expected"] < total // len(SYMBOLS)  # ...and leave pairs out
    assert roles_seen == {((0,), (1,)), ((1,), (0,))}  # the trade fills part 0, the quote 1
    assert counters.get("composite.dropped", 0) == counters.get("composite.cut", 0) == 0
    assert (
        counters["composite.matches"] == report["pairs"]["expected"] + report["either"]["expected"]
    )


PAGE = Path(__file__).resolve().parents[1] / "docs" / "composite.md"


def python_blocks(page: Path) -> list[str]:
    """The code of each ```python block of ``page``, in order."""
    blocks, current = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.strip() == "```python":
            current = []
        elif line.strip() == "```" and current is not None:
            blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return blocks


@SHARED
@pytest.mark.processes
@pytest.mark.timeout(120)
def test_the_pages_python_examples_print_what_the_page_says(
    overlay: LocalCluster, tmp_path: Path
) -> None:
    """docs/composite.md's Python examples, as written, in a directory laid out as
    `octopis up t.json` leaves it (``t.json``, ``.octopis/keys``), against fig2."""
    (tmp_path / "t.json").write_text(overlay.topology_path.read_text())
    (tmp_path / ".octopis").mkdir()
    assert overlay.keys_dir is not None
    (tmp_path / ".octopis" / "keys").symlink_to(overlay.keys_dir.resolve())
    env = {k: v for k, v in os.environ.items() if k != KEYS_ENV}
    first, second = python_blocks(PAGE)
    printed = []
    for code in (first, second):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"{code}\n{done.stdout}{done.stderr}"
        printed.append(done.stdout.splitlines())
    assert printed[0][0] == "IBM 101.5 101.25"
    assert re.fullmatch(r"\d\.\d{3} s apart", printed[0][1]) and float(printed[0][1][:5]) < 5
    assert printed[1] == ["2 ['ORCL', 'ORCL'] ((1,), (2,))", "1 ['AAPL'] ((0,),)"]
    # the same join from the shell: `octopis sub` prints one line per match, with its parts
    octopis = [sys.executable, "-m", "octopis.cli.main"]
    where = ["--topology", "t.json", "--keys", ".octopis/keys", "--broker", "f:2"]
    pairs = "{[class,eq,'TRADE'],[symbol,eq,$S]} & {[class,eq,'QUOTE'],[symbol,eq,$S]} within 5s"
    sub = subprocess.Popen(
        [*octopis, "sub", *where, pairs, "--count", "1", "--timeout", "30"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sub.stdout is not None and "subscribed" in sub.stdout.readline()
    published = subprocess.run(
        [*octopis, "pub", *where, "[class,'TRADE'],[symbol,'SUNW'],[price,4.5]",
         "[class,'QUOTE'],[symbol,'SUNW'],[bid,4.4]"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    match = json.loads(sub.stdout.readline())
    assert sub.wait(30) == 0
    assert [p["publication"]["class"] for p in match["composite"]] == ["TRADE", "QUOTE"]
    assert match["roles"] == [[0], [1]]
    page = PAGE.read_text(encoding="utf-8")
    assert "It prints `IBM 101.5 101.25`" in page
    assert "It prints `2 ['ORCL', 'ORCL'] ((1,), (2,))`" in page
    assert "and `1 ['AAPL'] ((0,),)`" in page
