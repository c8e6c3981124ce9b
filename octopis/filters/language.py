"""The subscription and publication language, after PADRES (the system OctopiS was built on).

A *publication* is a flat record of attribute/value pairs. Its text form lists
``[attr,value]`` pairs, as in the PADRES stock-quote data the paper's §7 uses::

    [class,'STOCK'],[symbol,'AAPL'],[open,63.30],[high,64.25],[low,62.05],
    [close,64.18]

In code a publication is a plain ``dict`` (:data:`Publication`); it travels that way in
the msgpack envelopes between brokers.

A *subscription* is a conjunction of predicates ``[attr,op,value]``::

    [class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,>,27.5],[close,<,30]

Operators:

* numeric ``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=`` — the constant is a number;
* string ``eq``, ``neq``, ``str-lt``, ``str-le``, ``str-gt``, ``str-ge``,
  ``str-prefix``, ``str-postfix``, ``str-contains`` — the constant is a quoted string;
  comparisons order by code point;
* ``isPresent`` — the attribute is present with a string or number value. PADRES writes
  it with a type-hint constant (``[attr,isPresent,'x']``, ``[attr,isPresent,0]``); that
  constant is accepted and ignored, ``[attr,isPresent]`` is accepted too, and the
  canonical text is ``[attr,isPresent]``.

Semantics (:meth:`Subscription.matches` is the readable definition): every predicate
must hold; a predicate on an attribute the publication lacks is false (``<>`` and
``neq`` included); a numeric predicate against a string value, or a string predicate
against a number, is false; integers and floats compare numerically (``1 == 1.0``);
``value op constant`` is the reading (``[close,<,30]`` holds for close 29). Values of
any other type (``bool``, ``None``, ...) count as absent.

Values: quoted strings (single quotes as in PADRES, double quotes accepted; a backslash
escapes the quote character or a backslash, any other backslash is literal), integers
and floats (sign, decimal point, exponent). A number without ``.`` and exponent is an
integer. Integers are limited to ±2**53 and floats to finite values, so that every
number compares exactly as a C double (the compiled matcher relies on this).

Attribute names: letters, digits, ``_``, ``%``, ``.``, ``-``, starting with a letter or
``_`` (the paper's derived attributes are ``openClose%Diff`` and ``highLow%Diff``).
Whitespace between tokens is allowed.

A *composite subscription* joins such subscriptions (:mod:`octopis.filters.composite`);
what a subscription may hold at most is in :mod:`octopis.filters.limits`.

Every problem raises :class:`FilterError`. Messages of the text parsers name the
1-based character position and the problem (``position 9: unknown operator 'eqq'``);
those of the dict forms name the attribute.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeAlias, TypeVar

from octopis.filters.limits import (
    MAX_INTEGER,
    VALID_ATTRIBUTES,
    VALID_ATTRIBUTES_CACHED,
    attribute_count_problem,
    limits_in_force,
    name_problem,
    predicate_count_problem,
    string_problem,
    value_problem,
)

Value: TypeAlias = str | int | float
Publication: TypeAlias = dict[str, str | int | float]
"""A publication: attribute name → string or number (never ``bool``)."""

NUMERIC_OPERATORS = ("=", "<>", "<", "<=", ">", ">=")
STRING_OPERATORS = (
    "eq",
    "neq",
    "str-lt",
    "str-le",
    "str-gt",
    "str-ge",
    "str-prefix",
    "str-postfix",
    "str-contains",
)
IS_PRESENT = "isPresent"
EQUALITY_OPERATORS = ("eq", "=")
"""The operators of equality: strings (``eq``) and numbers (``=``)."""
OPERATORS = frozenset((*NUMERIC_OPERATORS, *STRING_OPERATORS, IS_PRESENT))
_STRING_OPERATOR_SET = frozenset(STRING_OPERATORS)
"""For :meth:`Predicate.test`, the reference matcher's inner loop: a set, not a scan."""

_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "eq": operator.eq,
    "neq": operator.ne,
    "str-lt": operator.lt,
    "str-le": operator.le,
    "str-gt": operator.gt,
    "str-ge": operator.ge,
    "str-prefix": str.startswith,
    "str-postfix": str.endswith,
    "str-contains": operator.contains,
}

ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_%.\-]*")
_WORD = re.compile(r"[^,\[\]\s'\"]+")
_SPACE = re.compile(r"[ \t\r\n]*")
NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""A number's text."""
_STRING_REST = {
    "'": re.compile(r"(?:[^'\\]|\\.)*'", re.DOTALL),
    '"': re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL),
}
_UNESCAPE = {"'": re.compile(r"\\([\\'])"), '"': re.compile(r'\\([\\"])')}
# The common shape of a publication pair (no inner spaces, escapes or exponents); anything
# else goes through the full parser, which is the definition of the syntax.
_FAST_PAIR = re.compile(
    r"[ \t\r\n]*\[([A-Za-z_][A-Za-z0-9_%.\-]*),(?:'([^'\\]*)'|(-?[0-9]{1,15}(?:\.[0-9]{1,15})?))\]"
    r"[ \t\r\n]*(?:(,)|\Z)"
)


class FilterError(ValueError):
    """A subscription or publication is malformed; the message names where and what."""


def predicate_problem(op: str, value: object) -> str | None:
    """Why ``op`` with constant ``value`` is not a valid predicate (None if it is)."""
    if op not in OPERATORS:
        return f"unknown operator {op!r}"
    if op == IS_PRESENT:
        return None if value is None else f"operator 'isPresent' takes no value, got {value!r}"
    if value is None:
        return f"operator {op!r} needs a value"
    problem = value_problem(value)
    if problem:
        return problem
    if op in STRING_OPERATORS and not isinstance(value, str):
        return f"string operator {op!r} needs a quoted string, got {value!r}"
    if op in NUMERIC_OPERATORS and isinstance(value, str):
        return f"numeric operator {op!r} needs a number, got {value!r}"
    return None


def _format_value(value: Value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


@dataclass(frozen=True)
class Predicate:
    """One predicate ``[attr,op,value]``; ``value`` is None exactly for ``isPresent``."""

    attr: str
    op: str
    value: str | int | float | None

    def __post_init__(self) -> None:
        if not isinstance(self.attr, str) or not ATTRIBUTE_NAME.fullmatch(self.attr):
            raise FilterError(f"predicate on {self.attr!r}: invalid attribute name")
        problem = name_problem(self.attr)
        if problem:
            raise FilterError(f"predicate on {self.attr[:40]!r}…: {problem}")
        problem = predicate_problem(self.op, self.value)
        if problem:
            raise FilterError(f"predicate on {self.attr!r}: {problem}")

    def test(self, value: object) -> bool:
        """Whether a publication value (``None`` when absent) satisfies the predicate."""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return False
        op = self.op
        if op == IS_PRESENT:
            return True
        if isinstance(value, str) != (op in _STRING_OPERATOR_SET):
            return False
        return _TESTS[op](value, self.value)

    def to_text(self) -> str:
        """``[attr,op,value]`` (``[attr,isPresent]`` for ``isPresent``)."""
        if self.value is None:
            return f"[{self.attr},{self.op}]"
        return f"[{self.attr},{self.op},{_format_value(self.value)}]"


@dataclass(frozen=True)
class Subscription:
    """A non-empty conjunction of predicates, in the order given (order is part of ``==``)."""

    predicates: tuple[Predicate, ...]

    def __post_init__(self) -> None:
        predicates = tuple(self.predicates)
        if not predicates:
            raise FilterError("a subscription needs at least one predicate")
        problem = predicate_count_problem(len(predicates))
        if problem:
            raise FilterError(problem)
        for p in predicates:
            if not isinstance(p, Predicate):
                raise FilterError(f"subscription element {p!r} is not a Predicate")
        object.__setattr__(self, "predicates", predicates)

    def matches(self, publication: Mapping[str, object]) -> bool:
        """Whether every predicate holds for ``publication`` (the reference semantics)."""
        get = publication.get
        for p in self.predicates:  # noqa: SIM110 (the oracle's hot path: no generator)
            if not p.test(get(p.attr)):
                return False
        return True

    def interests(self) -> frozenset[str]:
        """Its equality predicates (``eq``, ``=``) as ``attr=value`` texts: what it shares
        with another subscription the way BAD's subscriptions share a channel (two
        subscriptions of ``[symbol,eq,'IBM']`` want one stream); the balancer's SDM ranks
        brokers by it."""
        return frozenset(
            f"{p.attr}={p.value!r}" for p in self.predicates if p.op in EQUALITY_OPERATORS
        )

    def to_text(self) -> str:
        """Canonical PADRES text; :func:`parse_subscription` reads it back to an equal value."""
        return ",".join(p.to_text() for p in self.predicates)

    def __str__(self) -> str:
        return self.to_text()


class Scanner:
    """A cursor over one text, with the token readers shared by both parsers."""

    __slots__ = ("pos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, pos: int, problem: str) -> FilterError:
        return FilterError(f"position {pos + 1}: {problem}")

    def found(self) -> str:
        return repr(self.text[self.pos]) if self.pos < len(self.text) else "end of text"

    def space(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def expect(self, char: str, where: str) -> None:
        self.space()
        if self.text.startswith(char, self.pos):
            self.pos += 1
            self.space()
            return
        raise self.error(self.pos, f"expected '{char}' {where}, found {self.found()}")

    def word(self, what: str) -> tuple[str, int]:
        m = _WORD.match(self.text, self.pos)
        if m is None:
            raise self.error(self.pos, f"expected {what}, found {self.found()}")
        self.pos = m.end()
        return m.group(), m.start()

    def attribute(self) -> str:
        name, start = self.word("an attribute name")
        if not ATTRIBUTE_NAME.fullmatch(name):
            raise self.error(start, f"invalid attribute name {name!r}")
        return name

    def value(self) -> Value:
        start = self.pos
        quote = self.text[start : start + 1]
        if quote in _STRING_REST:
            m = _STRING_REST[quote].match(self.text, start + 1)
            if m is None:
                raise self.error(start, "unterminated string")
            self.pos = m.end()
            return _UNESCAPE[quote].sub(r"\1", self.text[start + 1 : m.end() - 1])
        token, start = self.word("a value")
        if not NUMBER.fullmatch(token):
            raise self.error(start, f"invalid value {token!r} (strings must be quoted)")
        number = float(token) if any(c in token for c in ".eE") else int(token)
        if isinstance(number, float) and not math.isfinite(number):
            raise self.error(start, f"number {token!r} is out of range")
        problem = value_problem(number)
        if problem:
            raise self.error(start, problem)
        return number

    def items(self, read: Callable[[], Any], what: str, items_name: str) -> list[Any]:
        """``item (',' item)*`` surrounded by optional whitespace."""
        self.space()
        if self.at_end():
            raise self.error(self.pos, f"empty {what}")
        items = [read()]
        while not self.at_end():
            self.expect(",", f"between {items_name}")
            items.append(read())
        return items


T = TypeVar("T")


def read_predicate(
    sc: Scanner, variable: Callable[[Scanner, str, str], T | None] | None = None
) -> Predicate | T:
    """A predicate ``[attr,op,value]`` at the cursor, consumed. ``variable``, called with
    the cursor at the value, the attribute and the operator, may read the value as
    something else and return the term that is instead (a composite part's join
    variable, :mod:`octopis.filters.composite`); None: the value is a constant."""
    sc.expect("[", "to open a predicate")
    attr = sc.attribute()
    sc.expect(",", "after the attribute name")
    op, op_pos = sc.word("an operator")
    if op not in OPERATORS:
        raise sc.error(op_pos, f"unknown operator {op!r}")
    sc.space()
    value: Value | None = None
    value_pos = sc.pos
    if sc.text.startswith(",", sc.pos):
        sc.expect(",", "after the operator")
        value_pos = sc.pos
        term = None if variable is None else variable(sc, attr, op)
        if term is not None:
            sc.expect("]", "to close the predicate")
            return term
        value = sc.value()
    elif op != IS_PRESENT:
        raise sc.error(sc.pos, f"expected ',' and a value after {op!r}, found {sc.found()}")
    sc.expect("]", "to close the predicate")
    if op == IS_PRESENT:
        value = None
    problem = predicate_problem(op, value)
    if problem:
        raise sc.error(value_pos, problem)
    return Predicate(attr, op, value)


PARSED = 4096
"""Subscription texts whose parse is remembered (the ones parsed last): a
:class:`Subscription` is immutable, so a text parsed again is the same object."""


def parse_subscription(text: str) -> Subscription:
    """Parse ``[attr,op,value],...``; raises :class:`FilterError` naming the position.
    The same text gives an equal (here: the same) subscription: the last :data:`PARSED`
    texts are not parsed again."""
    if not isinstance(text, str):
        raise FilterError(f"a subscription text must be a str, got {type(text).__name__}")
    return _parse_subscription(text)


@lru_cache(maxsize=PARSED)
def _parse_subscription(text: str) -> Subscription:
    sc = Scanner(text)

    def predicate() -> Predicate:
        return read_predicate(sc)

    return Subscription(tuple(sc.items(predicate, "subscription", "predicates")))


def _parse_publication_text(text: str) -> Publication:
    sc = Scanner(text)
    publication: Publication = {}

    def pair() -> None:
        sc.expect("[", "to open an attribute/value pair")
        attr_pos = sc.pos
        attr = sc.attribute()
        if attr in publication:
            raise sc.error(attr_pos, f"attribute {attr!r} given twice")
        sc.expect(",", "after the attribute name")
        publication[attr] = sc.value()
        sc.expect("]", "to close the attribute/value pair")

    sc.items(pair, "publication", "pairs")
    return publication


def parse_publication(text: str) -> Publication:
    """Parse ``[attr,value],...`` (surrounding whitespace and CR/LF are ignored).

    Raises :class:`FilterError` naming the position, also when an attribute appears twice.
    """
    if not isinstance(text, str):
        raise FilterError(f"a publication text must be a str, got {type(text).__name__}")
    publication: Publication = {}
    match = _FAST_PAIR.match
    pos = 0
    while True:
        m = match(text, pos)
        if m is None:
            return _within_limits(_parse_publication_text(text))
        attr, string, number, comma = m.groups()
        if attr in publication:
            return _within_limits(_parse_publication_text(text))
        if string is not None:
            publication[attr] = string
        elif "." in number:
            publication[attr] = float(number)
        else:
            publication[attr] = int(number)
        if comma is None:
            return _within_limits(publication)
        pos = m.end()


def _check_attribute_count(p: Publication) -> None:
    problem = attribute_count_problem(len(p))
    if problem:
        raise FilterError(problem)


def _within_limits(p: Publication) -> Publication:
    """``p`` (parsed from text) if it is within the limits in force, else :class:`FilterError`."""
    _check_attribute_count(p)
    for attr, value in p.items():
        problem = name_problem(attr) or (type(value) is str and string_problem(value))
        if problem:
            raise FilterError(f"attribute {attr[:40]!r}: {problem}")
    return p


def validate_publication(p: object) -> Publication:
    """Check a publication that arrived as data (e.g. off the wire) and return it.

    It must be a non-empty dict of at most ``limits.attributes`` valid attribute names to
    strings (at most ``limits.string_length``), integers (±2**53) or finite floats;
    ``bool`` is rejected. Raises :class:`FilterError` naming the attribute or the limit.
    """
    if not isinstance(p, dict):
        raise FilterError(f"a publication must be a dict, got {type(p).__name__}")
    if not p:
        raise FilterError("empty publication")
    _check_attribute_count(p)
    string_length = limits_in_force().string_length
    known = VALID_ATTRIBUTES
    for attr, value in p.items():
        if attr not in known:
            if not isinstance(attr, str) or not ATTRIBUTE_NAME.fullmatch(attr):
                raise FilterError(f"attribute {attr!r}: invalid attribute name")
            problem = name_problem(attr)
            if problem:
                raise FilterError(f"attribute {attr[:40]!r}…: {problem}")
            if len(known) < VALID_ATTRIBUTES_CACHED:
                known.add(attr)
        kind = type(value)
        if (
            (kind is str and len(value) <= string_length)
            or (kind is float and math.isfinite(value))
            or (kind is int and -MAX_INTEGER <= value <= MAX_INTEGER)
        ):
            continue
        problem = value_problem(value)
        if problem:
            raise FilterError(f"attribute {attr!r}: {problem}")
    return p


def format_publication(p: Publication) -> str:
    """The text ``[attr,value],...`` of a valid publication (see :func:`validate_publication`)."""
    validate_publication(p)
    return ",".join(f"[{attr},{_format_value(value)}]" for attr, value in p.items())


def _is_pair(spec: object) -> bool:
    return isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str)


def subscription_from_dict(d: Mapping[str, Any]) -> Subscription:
    """The dict form of a subscription, for the SDK.

    Each attribute maps to an ``(op, constant)`` pair (tuple or list), a list of such pairs
    (several predicates on one attribute), or the string ``"isPresent"``; an
    ``("isPresent", constant)`` pair ignores the constant. Predicates keep the dict's
    order, so ``{"symbol": ("eq", "MSFT"), "close": [(">", 27.5), ("<", 30)]}`` equals
    ``parse_subscription("[symbol,eq,'MSFT'],[close,>,27.5],[close,<,30]")``.
    """
    predicates = []
    for attr, op, constant in dict_predicates(d, "a subscription dict"):
        problem = predicate_problem(op, constant)
        if problem:
            raise FilterError(f"attribute {attr!r}: {problem}")
        predicates.append(Predicate(attr, op, constant))
    return Subscription(tuple(predicates))


def dict_predicates(d: Mapping[str, Any], what: str) -> Iterator[tuple[str, str, Any]]:
    """``(attr, op, constant)`` of each predicate of a dict form, in order (the constant
    None for ``isPresent``); raises :class:`FilterError` for a malformed entry."""
    if not isinstance(d, Mapping):
        raise FilterError(f"{what} must be a mapping, got {type(d).__name__}")
    for attr, spec in d.items():
        if not isinstance(attr, str) or not ATTRIBUTE_NAME.fullmatch(attr):
            raise FilterError(f"attribute {attr!r}: invalid attribute name")
        if isinstance(spec, str) and spec == IS_PRESENT:
            pairs: list[Any] = [(IS_PRESENT, None)]
        elif _is_pair(spec):
            pairs = [spec]
        elif isinstance(spec, (tuple, list)) and spec and all(_is_pair(s) for s in spec):
            pairs = list(spec)
        else:
            raise FilterError(
                f"attribute {attr!r}: expected (op, value), a list of them or 'isPresent', "
                f"got {spec!r}"
            )
        for op, value in pairs:
            yield attr, op, None if op == IS_PRESENT else value


def as_subscription(x: str | Mapping[str, Any] | Subscription) -> Subscription:
    """A :class:`Subscription` from its text, its dict form, or itself."""
    if isinstance(x, Subscription):
        return x
    if isinstance(x, str):
        return parse_subscription(x)
    if isinstance(x, Mapping):
        return subscription_from_dict(x)
    raise FilterError(f"cannot make a subscription from {type(x).__name__}")
