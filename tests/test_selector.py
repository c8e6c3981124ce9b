"""JMS selectors: parsing, the reference semantics, and the exact translation into
PADRES subscriptions (octopis.gateway.selector), checked against the reference on random
selectors and random messages."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from laws import sized

from octopis.filters.language import parse_subscription
from octopis.gateway.selector import (
    SelectorError,
    parse,
    selects,
    translate,
)
from octopis.matching import Matcher

STOCK = {"class": "STOCK", "symbol": "MSFT", "close": 27.9, "volume": 1200, "venue": "NYSE"}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ("symbol = 'MSFT' AND close > 27.5", True),
        ("symbol = 'MSFT' and close > 28", False),
        ("close BETWEEN 27 AND 28", True),
        ("close NOT BETWEEN 27 AND 28", False),
        ("symbol IN ('IBM', 'MSFT')", True),
        ("symbol NOT IN ('IBM', 'MSFT')", False),
        ("symbol LIKE 'MS%'", True),
        ("symbol LIKE 'M_FT'", True),
        ("venue LIKE 'N!%%' ESCAPE '!'", False),
        ("missing IS NULL", True),
        ("symbol IS NOT NULL", True),
        ("NOT (volume < 1000)", True),
        ("missing = 3", False),
        ("NOT missing = 3", False),  # unknown stays unknown
        ("missing = 3 OR volume = 1200", True),
        ("symbol = 3", False),  # a string compared with a number is false ...
        ("NOT symbol = 3", True),  # ... so its negation is true
        ("symbol <> 3", True),  # <> is NOT =
        ("volume IN ('1200')", False),
        ("NOT volume IN ('1200')", False),  # IN on a number is unknown
        ("1 = 1", True),
        ("27.5 < close", True),
        ("FALSE OR TRUE", True),
        ("symbol = 'it''s'", False),
    ],
)
def test_reference_semantics(selector: str, selected: bool) -> None:
    assert selects(selector, STOCK) is selected


@pytest.mark.parametrize(
    ("selector", "problem"),
    [
        ("", "empty selector"),
        ("symbol = ", "position 10 (at the end): expected an attribute name or a constant"),
        ("symbol == 'x'", "position 9"),
        ("(close > 1", "expected ')'"),
        ("close > 1 close", "expected AND, OR or the end"),
        ("close + 1 > 2", "arithmetic is not supported"),
        ("flag", "used as a condition"),
        ("a = b", "compares two attributes"),
        ("x IN (1, 2)", "expected a quoted string in IN"),
        ("x LIKE 'a' ESCAPE 'ab'", "ESCAPE takes one character"),
        ("x NOT = 3", "expected BETWEEN, IN or LIKE after NOT"),
        ("$x = 3", "attribute name '$x' is not one the overlay allows"),
        ("x = 99999999999999999999", "out of range"),
        ("x = 'a' #", "unexpected character '#'"),
        ("(" * 40 + "x = 1" + ")" * 40, "nesting deeper than 32"),
        ("x > 1" + " OR x > 1" * 1000, "over the limit"),
    ],
)
def test_a_selector_that_does_not_parse_names_the_problem(selector: str, problem: str) -> None:
    with pytest.raises(SelectorError, match=re.escape(problem)):
        parse(selector)


@pytest.mark.parametrize(
    ("selector", "subscriptions"),
    [
        (None, ["[class,eq,'STOCK']"]),
        (
            "symbol = 'MSFT' AND close > 27.5",
            ["[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,>,27.5]"],
        ),
        (
            "symbol IN ('IBM','MSFT')",
            ["[class,eq,'STOCK'],[symbol,eq,'IBM']", "[class,eq,'STOCK'],[symbol,eq,'MSFT']"],
        ),
        ("symbol LIKE 'MS%'", ["[class,eq,'STOCK'],[symbol,str-prefix,'MS']"]),
        ("symbol LIKE '%FT'", ["[class,eq,'STOCK'],[symbol,str-postfix,'FT']"]),
        ("symbol LIKE '%SF%'", ["[class,eq,'STOCK'],[symbol,str-contains,'SF']"]),
        (
            "symbol LIKE 'M%T'",
            ["[class,eq,'STOCK'],[symbol,str-prefix,'M'],[symbol,str-postfix,'T']"],
        ),
        ("x LIKE 'a\\%' ESCAPE '\\'", ["[class,eq,'STOCK'],[x,eq,'a%']"]),
        ("symbol IS NOT NULL", ["[class,eq,'STOCK'],[symbol,isPresent]"]),
        (
            "NOT symbol = 'IBM'",
            [
                "[class,eq,'STOCK'],[symbol,neq,'IBM']",
                "[class,eq,'STOCK'],[symbol,>=,-1.7976931348623157e+308]",
            ],
        ),
        (
            "NOT symbol LIKE 'IB%'",
            [
                "[class,eq,'STOCK'],[symbol,str-lt,'IB']",
                "[class,eq,'STOCK'],[symbol,str-ge,'IC']",
                "[class,eq,'STOCK'],[symbol,>=,-1.7976931348623157e+308]",
            ],
        ),
        ("FALSE", []),
    ],
)
def test_translation(selector: str | None, subscriptions: list[str]) -> None:
    assert [s.to_text() for s in translate(selector, "STOCK")] == [
        parse_subscription(t).to_text() for t in subscriptions
    ]


@pytest.mark.parametrize(
    ("selector", "problem"),
    [
        ("x IS NULL", '"x IS NULL": the overlay\'s language cannot select on an absent'),
        ("NOT x IS NOT NULL", "cannot select on an absent attribute"),
        ("x LIKE 'a_c'", "\"x LIKE 'a_c'\": the overlay's language has no exact form"),
        ("x LIKE '%a%b%'", "no exact form of this LIKE pattern"),
        ("x LIKE 'ab%b'", "no exact form"),  # 'ab%b' needs length >= 3: 'ab' has both ends
        ("NOT x LIKE '%abc'", "NOT \"x LIKE '%abc'\": the overlay's language has no exact form"),
        ("y = 1 AND NOT (x LIKE '%a%')", "NOT \"x LIKE '%a%'\""),
        (
            " AND ".join(f"(a{i} = 1 OR a{i} = 2)" for i in range(5)),
            "needs more than 16 subscriptions",
        ),
    ],
)
def test_what_has_no_exact_form_is_refused_naming_the_part(selector: str, problem: str) -> None:
    with pytest.raises(SelectorError, match=re.escape(problem)):
        translate(selector, "STOCK")


def test_the_bound_is_a_setting() -> None:
    selector = " AND ".join(f"(a{i} = 1 OR a{i} = 2)" for i in range(5))
    assert len(translate(selector, "T", max_subscriptions=32)) == 32


# ----------------------------------------------------------------------------------------
# The translation against the reference semantics, on random selectors and messages

ATTRS = ("a", "b", "c")
STRINGS = ("", "a", "ab", "abc", "b", "ba", "bab", "A%", "%", "_x", "a_c")
NUMBERS = (-2, -1, 0, 0.5, 1, 1.0, 2, 3.25)
values = st.sampled_from(STRINGS) | st.sampled_from(NUMBERS)
messages = st.fixed_dictionaries(
    {"class": st.just("T")}, optional={a: values for a in ATTRS}
) | st.fixed_dictionaries({"class": st.just("U")}, optional={"a": values})


def _string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _constant(v: str | float) -> str:
    return _string(v) if isinstance(v, str) else repr(v)


patterns = st.lists(
    st.sampled_from(["a", "b", "ab", "%", "_", "!%", "!_"]), min_size=0, max_size=4
).map("".join)


def _tests() -> st.SearchStrategy[str]:
    attr = st.sampled_from(ATTRS)
    op = st.sampled_from(["=", "<>", "<", ">", "<=", ">="])
    return st.one_of(
        st.builds(lambda a, o, v: f"{a} {o} {_constant(v)}", attr, op, values),
        st.builds(lambda a, o, v: f"{_constant(v)} {o} {a}", attr, op, values),
        st.builds(
            lambda a, n, lo, hi: f"{a} {n}BETWEEN {lo} AND {hi}",
            attr,
            st.sampled_from(["", "NOT "]),
            st.sampled_from(NUMBERS),
            st.sampled_from(NUMBERS),
        ),
        st.builds(
            lambda a, n, vs: f"{a} {n}IN ({', '.join(map(_string, vs))})",
            attr,
            st.sampled_from(["", "NOT "]),
            st.lists(st.sampled_from(STRINGS), min_size=1, max_size=3),
        ),
        st.builds(
            lambda a, n, p: f"{a} {n}LIKE {_string(p)} ESCAPE '!'",
            attr,
            st.sampled_from(["", "NOT "]),
            patterns,
        ),
        st.builds(lambda a, n: f"{a} IS {n}NULL", attr, st.sampled_from(["", "NOT "])),
        st.sampled_from(["TRUE", "FALSE"]),
    )


selectors = st.recursive(
    _tests(),
    lambda inner: st.one_of(
        st.builds(lambda x: f"NOT ({x})", inner),
        st.builds(lambda x, y: f"({x}) AND ({y})", inner, inner),
        st.builds(lambda x, y: f"({x}) OR ({y})", inner, inner),
    ),
    max_leaves=6,
)


@settings(max_examples=sized(150, 600))
@given(selectors, st.lists(messages, min_size=1, max_size=25))
def test_the_subscriptions_select_exactly_what_the_selector_selects(
    selector: str, batch: list[dict]
) -> None:
    try:
        subscriptions = translate(selector, "T", max_subscriptions=64)
    except SelectorError:
        assume(False)
        return
    matcher = Matcher()
    for i, s in enumerate(subscriptions):
        matcher.add(str(i), s)
    for message in batch:
        expected = message["class"] == "T" and selects(selector, message)
        assert any(s.matches(message) for s in subscriptions) is expected, message
        assert bool(matcher.match(message)) is expected, message


def test_most_random_selectors_have_an_exact_form() -> None:
    """The law above is not vacuous: most generated selectors are translated."""
    accepted = refused = 0

    @settings(max_examples=sized(100, 400), database=None)
    @given(selectors)
    def count(selector: str) -> None:
        nonlocal accepted, refused
        try:
            translate(selector, "T", max_subscriptions=64)
            accepted += 1
        except SelectorError:
            refused += 1

    count()
    assert accepted > refused
