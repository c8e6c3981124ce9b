"""Subscription and publication language: parsing, printing, semantics, every error."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopis.filters.language import (
    NUMERIC_OPERATORS,
    STRING_OPERATORS,
    FilterError,
    Predicate,
    Subscription,
    _parse_publication_text,
    as_subscription,
    format_publication,
    parse_publication,
    parse_subscription,
    subscription_from_dict,
    validate_publication,
)
from octopis.filters.limits import MAX_INTEGER, InputLimits, set_limits

QUOTE = "[class,'STOCK'],[symbol,'AAPL'],[open,63.30],[high,64.25],[low,62.05],[close,64.18],[volume,10924200],[date,'28-Dec-04']\r\n"  # noqa: E501


def sub(*predicates: tuple) -> Subscription:
    return Subscription(tuple(Predicate(*p) for p in predicates))


# ---- parsing and printing ------------------------------------------------------------


def test_parses_the_issue_example() -> None:
    s = parse_subscription("[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,>,27.5],[close,<,30]")
    assert s == sub(
        ("class", "eq", "STOCK"), ("symbol", "eq", "MSFT"), ("close", ">", 27.5), ("close", "<", 30)
    )
    assert type(s.predicates[3].value) is int
    assert s.to_text() == "[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,>,27.5],[close,<,30]"


def test_parses_a_quote_line_with_crlf() -> None:
    assert parse_publication(QUOTE) == {
        "class": "STOCK",
        "symbol": "AAPL",
        "open": 63.3,
        "high": 64.25,
        "low": 62.05,
        "close": 64.18,
        "volume": 10924200,
        "date": "28-Dec-04",
    }
    assert type(parse_publication(QUOTE)["volume"]) is int


@pytest.mark.parametrize("op", NUMERIC_OPERATORS)
def test_numeric_operators_parse(op: str) -> None:
    assert parse_subscription(f"[x,{op},-1.5e3]") == sub(("x", op, -1500.0))


@pytest.mark.parametrize("op", STRING_OPERATORS)
def test_string_operators_parse(op: str) -> None:
    assert parse_subscription(f"[x,{op},'ab']") == sub(("x", op, "ab"))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7", 7),
        ("-7", -7),
        ("+7", 7),
        ("007", 7),
        ("2.5", 2.5),
        ("-.5", -0.5),
        ("3.", 3.0),
        ("1e3", 1000.0),
        ("1E-2", 0.01),
        ("-2.5e+2", -250.0),
        (str(MAX_INTEGER), MAX_INTEGER),
        ("'O\\'Brien'", "O'Brien"),
        ("'back\\\\slash'", "back\\slash"),
        ("'a\\nb'", "a\\nb"),
        ('"double \\" quote"', 'double " quote'),
        ('"single \' inside"', "single ' inside"),
        ("''", ""),
        ("'with, comma ] and [ brackets'", "with, comma ] and [ brackets"),
    ],
)
def test_values(text: str, value: object) -> None:
    parsed = parse_publication(f"[attr,{text}]")["attr"]
    assert parsed == value
    assert type(parsed) is type(value)


def test_whitespace_between_tokens() -> None:
    s = parse_subscription(" [ close , >= , 2 ] ,\t[symbol,eq, 'X' ] \n")
    assert s == sub(("close", ">=", 2), ("symbol", "eq", "X"))
    assert parse_publication("  [a , 1 ] , [ b,'x']\r\n") == {"a": 1, "b": "x"}


def test_attribute_names_with_percent_dot_dash() -> None:
    p = parse_publication("[openClose%Diff,0.01],[highLow%Diff,-2],[a.b-c_d,1],[_x9,2]")
    assert list(p) == ["openClose%Diff", "highLow%Diff", "a.b-c_d", "_x9"]


@pytest.mark.parametrize(
    "text", ["[x,isPresent]", "[x,isPresent,'STRING']", "[x,isPresent,0]", "[ x , isPresent ]"]
)
def test_is_present_forms(text: str) -> None:
    s = parse_subscription(text)
    assert s == sub(("x", "isPresent", None))
    assert s.to_text() == "[x,isPresent]"


def test_canonical_text_escapes_quotes_and_backslashes() -> None:
    s = sub(("name", "eq", "O'Brien \\ co"), ("n", "=", 1.0), ("m", "<", -3))
    assert s.to_text() == "[name,eq,'O\\'Brien \\\\ co'],[n,=,1.0],[m,<,-3]"
    assert parse_subscription(s.to_text()) == s


def test_format_publication() -> None:
    p = {"class": "STOCK", "close": 64.18, "volume": 10924200, "note": "it's"}
    text = "[class,'STOCK'],[close,64.18],[volume,10924200],[note,'it\\'s']"
    assert format_publication(p) == text
    assert parse_publication(format_publication(p)) == p


attributes = st.from_regex(r"[A-Za-z_][A-Za-z0-9_%.\-]{0,8}", fullmatch=True)
strings = st.text(max_size=8)
numbers = st.one_of(
    st.integers(-MAX_INTEGER, MAX_INTEGER), st.floats(allow_nan=False, allow_infinity=False)
)


@st.composite
def predicates(draw: st.DrawFn) -> Predicate:
    op = draw(st.sampled_from([*NUMERIC_OPERATORS, *STRING_OPERATORS, "isPresent"]))
    if op == "isPresent":
        return Predicate(draw(attributes), op, None)
    return Predicate(draw(attributes), op, draw(strings if op in STRING_OPERATORS else numbers))


@given(st.lists(predicates(), min_size=1, max_size=5))
def test_subscription_text_round_trip(preds: list[Predicate]) -> None:
    s = Subscription(tuple(preds))
    back = parse_subscription(s.to_text())
    assert back == s
    assert [type(p.value) for p in back.predicates] == [type(p.value) for p in preds]
    assert hash(back) == hash(s)


@given(st.dictionaries(attributes, st.one_of(strings, numbers), min_size=1, max_size=6))
def test_publication_text_round_trip(p: dict) -> None:
    back = parse_publication(format_publication(p))
    assert back == p
    assert [type(v) for v in back.values()] == [type(v) for v in p.values()]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "close", "x%y"]),
            st.sampled_from(["1", "-2", "3.25", "007", "1e3", "'s'", "'it\\'s'", '"d"', "x"]),
            st.sampled_from(["", " ", "\r\n"]),
        ),
        max_size=4,
    )
)
def test_fast_and_full_publication_parsers_agree(pairs: list[tuple[str, str, str]]) -> None:
    text = ",".join(f"{pad}[{attr},{value}]{pad}" for attr, value, pad in pairs)
    try:
        expected = _parse_publication_text(text)
    except FilterError as exc:
        with pytest.raises(FilterError, match=re.escape(str(exc))):
            parse_publication(text)
    else:
        assert parse_publication(text) == expected


@settings(max_examples=300)
@given(st.text(alphabet="[],'\"\\ab1.-=<>eqisPrt \r\n", max_size=30))
def test_parsers_raise_only_filter_error(text: str) -> None:
    for parse in (parse_subscription, parse_publication):
        try:
            parse(text)
        except FilterError as exc:
            assert str(exc).startswith("position ")


# ---- dict form -----------------------------------------------------------------------


def test_dict_form_means_the_same_as_text() -> None:
    d = {
        "class": ("eq", "STOCK"),
        "symbol": ["eq", "MSFT"],
        "close": [(">", 27.5), ("<", 30)],
        "volume": "isPresent",
        "date": ("isPresent", "ignored"),
    }
    text = (
        "[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,>,27.5],[close,<,30],"
        "[volume,isPresent],[date,isPresent]"
    )
    assert subscription_from_dict(d) == parse_subscription(text)


def test_as_subscription_dispatch() -> None:
    s = parse_subscription("[a,=,1]")
    assert as_subscription(s) is s
    assert as_subscription("[a,=,1]") == s
    assert as_subscription({"a": ("=", 1)}) == s
    with pytest.raises(FilterError, match="cannot make a subscription from int"):
        as_subscription(5)  # type: ignore[arg-type]


# ---- semantics -----------------------------------------------------------------------

PUB = {"s": "abc", "i": 5, "f": 2.5, "one": 1.0}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[i,=,5]", True),
        ("[i,=,5.0]", True),
        ("[one,=,1]", True),
        ("[i,<>,5]", False),
        ("[i,<>,4]", True),
        ("[i,<,5]", False),
        ("[i,<=,5]", True),
        ("[i,>,4.99]", True),
        ("[i,>=,5.01]", False),
        ("[f,<,3]", True),
        ("[s,eq,'abc']", True),
        ("[s,neq,'abc']", False),
        ("[s,neq,'abd']", True),
        ("[s,str-lt,'abd']", True),
        ("[s,str-lt,'abc']", False),
        ("[s,str-le,'abc']", True),
        ("[s,str-gt,'ab']", True),
        ("[s,str-ge,'b']", False),
        ("[s,str-prefix,'ab']", True),
        ("[s,str-prefix,'bc']", False),
        ("[s,str-postfix,'bc']", True),
        ("[s,str-postfix,'abcd']", False),
        ("[s,str-contains,'b']", True),
        ("[s,str-contains,'']", True),
        ("[s,str-contains,'ca']", False),
        ("[s,isPresent]", True),
        ("[i,isPresent]", True),
        ("[missing,isPresent]", False),
        ("[missing,<>,1]", False),
        ("[missing,neq,'x']", False),
        ("[s,<>,1]", False),
        ("[s,=,1]", False),
        ("[i,eq,'5']", False),
        ("[i,neq,'5']", False),
        ("[i,str-prefix,'5']", False),
        ("[s,eq,'abc'],[i,>,4],[f,<=,2.5]", True),
        ("[s,eq,'abc'],[i,>,5]", False),
    ],
)
def test_matches(text: str, expected: bool) -> None:
    assert parse_subscription(text).matches(PUB) is expected


def test_unsupported_values_count_as_absent() -> None:
    pub = {"b": True, "n": None, "l": [1]}
    for attr in pub:
        assert not parse_subscription(f"[{attr},isPresent]").matches(pub)
        assert not parse_subscription(f"[{attr},<>,0]").matches(pub)
    assert not parse_subscription("[b,=,1]").matches(pub)


def test_string_order_is_by_code_point() -> None:
    assert parse_subscription("[s,str-lt,'a']").matches({"s": "Z"})
    assert parse_subscription("[s,str-gt,'z']").matches({"s": "é"})


# ---- errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[class,eq,'STOCK'],[symbol,eqq,'MSFT']", "position 28: unknown operator 'eqq'"),
        ("[a,=,'x']", "position 6: numeric operator '=' needs a number, got 'x'"),
        ("[a,eq,5]", "position 7: string operator 'eq' needs a quoted string, got 5"),
        ("[a,str-prefix,1.5]", "position 15: string operator 'str-prefix' needs a quoted string"),
        ("", "position 1: empty subscription"),
        ("   ", "position 4: empty subscription"),
        ("a,=,1]", "position 1: expected '[' to open a predicate, found 'a'"),
        ("[a,=,1", "position 7: expected ']' to close the predicate, found end of text"),
        ("[a,=,1],", "position 9: expected '[' to open a predicate, found end of text"),
        ("[a,=,1][b,=,2]", "position 8: expected ',' between predicates, found '['"),
        ("[a=1]", "position 2: invalid attribute name 'a=1'"),
        ("[1a,=,1]", "position 2: invalid attribute name '1a'"),
        ("[,=,1]", "position 2: expected an attribute name, found ','"),
        ("[a,,1]", "position 4: expected an operator, found ','"),
        ("[a,=]", "position 5: expected ',' and a value after '=', found ']'"),
        ("[a,=,]", "position 6: expected a value, found ']'"),
        ("[a,eq,'abc]", "position 7: unterminated string"),
        ("[a,eq,STOCK]", "position 7: invalid value 'STOCK' (strings must be quoted)"),
        ("[a,=,1.2.3]", "position 6: invalid value '1.2.3'"),
        ("[a,=,1e999]", "position 6: number '1e999' is out of range"),
        ("[a,=,9007199254740993]", "position 6: integer 9007199254740993 is out of range"),
        ("[a,=,1,2]", "position 7: expected ']' to close the predicate, found ','"),
    ],
)
def test_subscription_errors(text: str, message: str) -> None:
    with pytest.raises(FilterError) as err:
        parse_subscription(text)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[a,1],[b,2],[a,3]", "position 14: attribute 'a' given twice"),
        ("[class,'STOCK'],[class,'BOND']", "position 18: attribute 'class' given twice"),
        ("", "position 1: empty publication"),
        ("[a,=,1]", "position 4: invalid value '='"),
        ("[a,1", "position 5: expected ']' to close the attribute/value pair"),
        ("[a,'x'] junk", "position 9: expected ',' between pairs, found 'j'"),
        ("[a,x]", "position 4: invalid value 'x' (strings must be quoted)"),
        ("[a,'x]", "position 4: unterminated string"),
        ("[a,'it''s']", "position 8: expected ']' to close the attribute/value pair, found \"'\""),
        ("[a,99999999999999999]", "position 4: integer 99999999999999999 is out of range"),
    ],
)
def test_publication_errors(text: str, message: str) -> None:
    with pytest.raises(FilterError) as err:
        parse_publication(text)
    assert str(err.value).startswith(message)


def test_non_text_input() -> None:
    with pytest.raises(FilterError, match="must be a str, got bytes"):
        parse_subscription(b"[a,=,1]")  # type: ignore[arg-type]
    with pytest.raises(FilterError, match="must be a str, got NoneType"):
        parse_publication(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([("a", 1)], "a publication must be a dict, got list"),
        ({}, "empty publication"),
        ({"a": True}, "attribute 'a': value True is not a string or a number"),
        ({"a": None}, "attribute 'a': value None is not a string or a number"),
        ({"a": b"x"}, "attribute 'a': value b'x' is not a string or a number"),
        ({"a": math.nan}, "attribute 'a': number nan is not finite"),
        ({"a": -math.inf}, "attribute 'a': number -inf is not finite"),
        ({"a": 2**60}, "attribute 'a': integer 1152921504606846976 is out of range"),
        ({1: 1}, "attribute 1: invalid attribute name"),
        ({"9x": 1}, "attribute '9x': invalid attribute name"),
    ],
)
def test_validate_publication_errors(value: object, message: str) -> None:
    with pytest.raises(FilterError) as err:
        validate_publication(value)
    assert str(err.value).startswith(message)


def test_validate_publication_accepts_and_returns() -> None:
    p = {"a": 1, "b": -2.5, "c": "x"}
    assert validate_publication(p) is p
    with pytest.raises(FilterError, match="value True"):
        format_publication({"a": True})


@pytest.mark.parametrize(
    ("d", "message"),
    [
        ({}, "a subscription needs at least one predicate"),
        ({"a": ("eqq", "x")}, "attribute 'a': unknown operator 'eqq'"),
        ({"a": ("=", "x")}, "attribute 'a': numeric operator '=' needs a number, got 'x'"),
        ({"a": ("eq", 1)}, "attribute 'a': string operator 'eq' needs a quoted string, got 1"),
        ({"a": ("=", True)}, "attribute 'a': value True is not a string or a number"),
        ({"a": ("=", math.inf)}, "attribute 'a': number inf is not finite"),
        ({"a": "MSFT"}, "attribute 'a': expected (op, value), a list of them or 'isPresent'"),
        ({"a": []}, "attribute 'a': expected (op, value)"),
        ({"a": ("=", 1, 2)}, "attribute 'a': expected (op, value)"),
        ({"1a": ("=", 1)}, "attribute '1a': invalid attribute name"),
    ],
)
def test_dict_form_errors(d: dict, message: str) -> None:
    with pytest.raises(FilterError) as err:
        subscription_from_dict(d)
    assert str(err.value).startswith(message)
    with pytest.raises(FilterError, match="mapping"):
        subscription_from_dict([("a", ("=", 1))])  # type: ignore[arg-type]


def test_direct_construction_is_checked() -> None:
    with pytest.raises(FilterError, match="predicate on 'a': unknown operator 'like'"):
        Predicate("a", "like", "x")
    with pytest.raises(FilterError, match="operator 'isPresent' takes no value"):
        Predicate("a", "isPresent", 1)
    with pytest.raises(FilterError, match="operator '<' needs a value"):
        Predicate("a", "<", None)
    with pytest.raises(FilterError, match="invalid attribute name"):
        Predicate("a b", "=", 1)
    with pytest.raises(FilterError, match="at least one predicate"):
        Subscription(())
    with pytest.raises(FilterError, match="is not a Predicate"):
        Subscription(("[a,=,1]",))  # type: ignore[arg-type]


# ---- input limits (DESIGN §8) ----------------------------------------------------------


@pytest.fixture
def small_limits():
    set_limits(InputLimits(attributes=3, predicates=2, string_length=5, name_length=4))
    yield
    set_limits(InputLimits())


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize(
    ("make", "limit"),
    [
        (
            lambda: parse_subscription("[a,>,1],[b,>,1],[c,>,1]"),
            r"3 predicates .* limits.predicates \(2\)",
        ),
        (
            lambda: parse_subscription("[a,eq,'abcdef']"),
            r"6 characters .* limits.string_length \(5\)",
        ),
        (lambda: parse_subscription("[abcde,>,1]"), r"5 characters .* limits.name_length \(4\)"),
        (
            lambda: parse_publication("[a,1],[b,2],[c,3],[d,4]"),
            r"4 attributes .* limits.attributes \(3\)",
        ),
        (lambda: parse_publication("[a,'abcdef']"), r"6 characters .* limits.string_length \(5\)"),
        (lambda: parse_publication("[abcde,1]"), r"5 characters .* limits.name_length \(4\)"),
        (
            lambda: validate_publication({"a": 1, "b": 2, "c": 3, "d": 4}),
            r"limits.attributes \(3\)",
        ),
        (lambda: validate_publication({"a": "abcdef"}), r"limits.string_length \(5\)"),
        (lambda: validate_publication({"abcde": 1}), r"limits.name_length \(4\)"),
        (lambda: subscription_from_dict({"a": ["eq", "abcdef"]}), r"limits.string_length"),
    ],
)
def test_every_entry_refuses_what_is_over_a_limit_naming_it(make, limit: str) -> None:
    with pytest.raises(FilterError, match=limit):
        make()


@pytest.mark.usefixtures("small_limits")
def test_input_at_the_limits_is_accepted() -> None:
    assert len(parse_subscription("[a,eq,'abcde'],[abcd,>,1]").predicates) == 2
    assert parse_publication("[a,'abcde'],[b,2],[abcd,3]") == {"a": "abcde", "b": 2, "abcd": 3}
    assert validate_publication({"a": "abcde", "b": 2, "abcd": 3})


def test_interests_are_the_equality_predicates() -> None:
    sub = parse_subscription("[class,eq,'STOCK'],[symbol,eq,'IBM'],[low,<,20],[n,=,3]")
    assert sub.interests() == frozenset({"class='STOCK'", "symbol='IBM'", "n=3"})
    assert parse_subscription("[low,<,20],[symbol,isPresent]").interests() == frozenset()
