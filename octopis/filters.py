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

A *composite subscription* joins atomic parts in braces with ``&`` (all) and ``|``
(any), variables such as ``$S`` binding equal values across the parts of a match, and an
optional time window (:func:`parse_composite`, :class:`Composite`)::

    {[class,eq,'TRADE'],[symbol,eq,$S]} & {[class,eq,'QUOTE'],[symbol,eq,$S]}
      within 5s

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
from typing import Any, TypeAlias, cast

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
_EQUALITY = ("eq", "=")
OPERATORS = frozenset((*NUMERIC_OPERATORS, *STRING_OPERATORS, IS_PRESENT))
MAX_INTEGER = 2**53
"""Largest magnitude of an integer value (exactly representable as a double)."""

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

_ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_%.\-]*")
_WORD = re.compile(r"[^,\[\]\s'\"]+")
_SPACE = re.compile(r"[ \t\r\n]*")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
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


@dataclass(frozen=True)
class InputLimits:
    """Sizes accepted in any filter or publication, at whichever entry it comes in —
    client, peer or file — so a copy is never accepted at one broker and refused at the
    next (DESIGN §8). A broker sets them from ``[limits]`` (:func:`set_limits`)."""

    attributes: int = 64
    """Attributes in one publication."""
    predicates: int = 64
    """Predicates in one subscription."""
    string_length: int = 1024
    """Characters in one string value or constant."""
    name_length: int = 128
    """Characters in one attribute name."""


LIMITS = InputLimits()
"""The limits in force in this process."""


def set_limits(limits: InputLimits) -> None:
    """Put ``limits`` in force in this process (a broker does at start)."""
    global LIMITS
    LIMITS = limits
    VALID_ATTRIBUTES.clear()  # names checked under the old limits are checked again


def _too_long(text: str, what: str, limit: str) -> str | None:
    """Why ``text`` (a ``what``) is over ``limits.<limit>``, or None."""
    most = getattr(LIMITS, limit)
    if len(text) > most:
        return f"{what} of {len(text)} characters is over limits.{limit} ({most})"
    return None


def _string_problem(value: str) -> str | None:
    return _too_long(value, "a string", "string_length")


def _name_problem(attr: str) -> str | None:
    return _too_long(attr, "attribute name", "name_length")


def _value_problem(value: object) -> str | None:
    """Why ``value`` is not a valid string or number constant (None if it is)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return f"value {value!r} is not a string or a number"
    if isinstance(value, int) and abs(value) > MAX_INTEGER:
        return f"integer {value} is out of range (at most ±2**53)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"number {value!r} is not finite"
    if isinstance(value, str):
        return _string_problem(value)
    return None


def _predicate_problem(op: str, value: object) -> str | None:
    """Why ``op`` with constant ``value`` is not a valid predicate (None if it is)."""
    if op not in OPERATORS:
        return f"unknown operator {op!r}"
    if op == IS_PRESENT:
        return None if value is None else f"operator 'isPresent' takes no value, got {value!r}"
    if value is None:
        return f"operator {op!r} needs a value"
    problem = _value_problem(value)
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
        if not isinstance(self.attr, str) or not _ATTRIBUTE.fullmatch(self.attr):
            raise FilterError(f"predicate on {self.attr!r}: invalid attribute name")
        problem = _name_problem(self.attr)
        if problem:
            raise FilterError(f"predicate on {self.attr[:40]!r}…: {problem}")
        problem = _predicate_problem(self.op, self.value)
        if problem:
            raise FilterError(f"predicate on {self.attr!r}: {problem}")

    def test(self, value: object) -> bool:
        """Whether a publication value (``None`` when absent) satisfies the predicate."""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return False
        if self.op == IS_PRESENT:
            return True
        if isinstance(value, str) != (self.op in STRING_OPERATORS):
            return False
        return _TESTS[self.op](value, self.value)

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
        if len(predicates) > LIMITS.predicates:
            raise FilterError(
                f"a subscription of {len(predicates)} predicates is over "
                f"limits.predicates ({LIMITS.predicates})"
            )
        for p in predicates:
            if not isinstance(p, Predicate):
                raise FilterError(f"subscription element {p!r} is not a Predicate")
        object.__setattr__(self, "predicates", predicates)

    def matches(self, publication: Mapping[str, object]) -> bool:
        """Whether every predicate holds for ``publication`` (the reference semantics)."""
        get = publication.get
        return all(p.test(get(p.attr)) for p in self.predicates)

    def interests(self) -> frozenset[str]:
        """Its equality predicates (``eq``, ``=``) as ``attr=value`` texts: what it shares
        with another subscription the way BAD's subscriptions share a channel (two
        subscriptions of ``[symbol,eq,'IBM']`` want one stream); the balancer's SDM ranks
        brokers by it."""
        return frozenset(f"{p.attr}={p.value!r}" for p in self.predicates if p.op in _EQUALITY)

    def to_text(self) -> str:
        """Canonical PADRES text; :func:`parse_subscription` reads it back to an equal value."""
        return ",".join(p.to_text() for p in self.predicates)

    def __str__(self) -> str:
        return self.to_text()


class _Scanner:
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
        if not _ATTRIBUTE.fullmatch(name):
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
        if not _NUMBER.fullmatch(token):
            raise self.error(start, f"invalid value {token!r} (strings must be quoted)")
        number = float(token) if any(c in token for c in ".eE") else int(token)
        if isinstance(number, float) and not math.isfinite(number):
            raise self.error(start, f"number {token!r} is out of range")
        problem = _value_problem(number)
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


def parse_subscription(text: str) -> Subscription:
    """Parse ``[attr,op,value],...``; raises :class:`FilterError` naming the position."""
    if not isinstance(text, str):
        raise FilterError(f"a subscription text must be a str, got {type(text).__name__}")
    sc = _Scanner(text)

    def predicate() -> Predicate:
        return cast(Predicate, _term(sc, bindings=False))

    return Subscription(tuple(sc.items(predicate, "subscription", "predicates")))


def _parse_publication_text(text: str) -> Publication:
    sc = _Scanner(text)
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
    if len(p) > LIMITS.attributes:
        raise FilterError(
            f"a publication of {len(p)} attributes is over limits.attributes ({LIMITS.attributes})"
        )


def _within_limits(p: Publication) -> Publication:
    """``p`` (parsed from text) if it is within :data:`LIMITS`, else :class:`FilterError`."""
    _check_attribute_count(p)
    for attr, value in p.items():
        problem = _name_problem(attr) or (type(value) is str and _string_problem(value))
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
    limits = LIMITS
    known = VALID_ATTRIBUTES
    for attr, value in p.items():
        if attr not in known:
            if not isinstance(attr, str) or not _ATTRIBUTE.fullmatch(attr):
                raise FilterError(f"attribute {attr!r}: invalid attribute name")
            problem = _name_problem(attr)
            if problem:
                raise FilterError(f"attribute {attr[:40]!r}…: {problem}")
            if len(known) < _VALID_ATTRIBUTES_CACHED:
                known.add(attr)
        kind = type(value)
        if (
            (kind is str and len(value) <= limits.string_length)
            or (kind is float and math.isfinite(value))
            or (kind is int and -MAX_INTEGER <= value <= MAX_INTEGER)
        ):
            continue
        problem = _value_problem(value)
        if problem:
            raise FilterError(f"attribute {attr!r}: {problem}")
    return p


VALID_ATTRIBUTES: set[str] = set()
"""Attribute names already checked against the grammar: every broker validates every
publication it receives, so the regular expression runs once per name, not per hop."""
_VALID_ATTRIBUTES_CACHED = 4096


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
    for attr, op, constant in _dict_triples(d, "a subscription dict"):
        problem = _predicate_problem(op, constant)
        if problem:
            raise FilterError(f"attribute {attr!r}: {problem}")
        predicates.append(Predicate(attr, op, constant))
    return Subscription(tuple(predicates))


def _dict_triples(d: Mapping[str, Any], what: str) -> Iterator[tuple[str, str, Any]]:
    """``(attr, op, constant)`` of each predicate of a dict form, in order (the constant
    None for ``isPresent``); raises :class:`FilterError` for a malformed entry."""
    if not isinstance(d, Mapping):
        raise FilterError(f"{what} must be a mapping, got {type(d).__name__}")
    for attr, spec in d.items():
        if not isinstance(attr, str) or not _ATTRIBUTE.fullmatch(attr):
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


# -- composite subscriptions (DESIGN §12) -------------------------------------------------

MAX_PARTS = 16
"""Atomic parts of one composite subscription at most."""
JOIN_OPERATORS = ("&", "|")
"""AND (``&``, also ``&&``) and OR (``|``, also PADRES's ``||``)."""
_VARIABLE = re.compile(r"\$(?:([SIF])\$)?([A-Za-z_][A-Za-z0-9_\-]*)")
"""``$S`` (a variable named ``S``) or PADRES's typed ``$S$name``, ``$I$name``,
``$F$name`` (string, integer and float variables)."""
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_VARIABLE_KIND = {"S": "eq", "I": "=", "F": "="}
"""The operator each PADRES variable type is compared with."""
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)[ \t]*(ms|s|m|h)(?![A-Za-z0-9_])")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_WITHIN = re.compile(r"within(?![A-Za-z0-9_])")


@dataclass(frozen=True)
class Var:
    """A join variable in the dict form of a composite part: ``{"symbol": ("eq",
    Var("S"))}`` is ``[symbol,eq,$S]``."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _VARIABLE_NAME.fullmatch(self.name):
            raise FilterError(f"invalid variable name {self.name!r}")


@dataclass(frozen=True)
class Binding:
    """``[attr,op,$X]`` in a composite part: the publication's ``attr`` binds variable
    ``X``, a string with ``eq``, a number with ``=``; parts of one match bind each
    variable to equal values."""

    attr: str
    op: str
    variable: str

    def __post_init__(self) -> None:
        if not isinstance(self.attr, str) or not _ATTRIBUTE.fullmatch(self.attr):
            raise FilterError(f"binding on {self.attr!r}: invalid attribute name")
        if self.op not in _EQUALITY:
            raise FilterError(
                f"variable ${self.variable} binds by equality: use it with eq (strings) "
                f"or = (numbers), not {self.op!r}"
            )
        Var(self.variable)

    def value(self, publication: Mapping[str, object]) -> Value | None:
        """The value ``publication`` binds (None: absent, or of the other type)."""
        value = publication.get(self.attr)
        if isinstance(value, str):
            return value if self.op == "eq" else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value if self.op == "=" else None
        return None

    def to_text(self) -> str:
        return f"[{self.attr},{self.op},${self.variable}]"


@dataclass(frozen=True)
class Part:
    """One atomic part of a composite subscription: predicates and bindings, in the
    order given. :attr:`routing` is what travels the overlay: the part with each binding
    replaced by ``[attr,isPresent]``, so it matches a superset of what the part joins."""

    terms: tuple[Predicate | Binding, ...]

    def __post_init__(self) -> None:
        terms = tuple(self.terms)
        for t in terms:
            if not isinstance(t, (Predicate, Binding)):
                raise FilterError(f"composite part element {t!r} is not a Predicate or Binding")
        object.__setattr__(self, "terms", terms)
        routing = tuple(
            Predicate(t.attr, IS_PRESENT, None) if isinstance(t, Binding) else t for t in terms
        )
        object.__setattr__(self, "_routing", Subscription(routing))

    @property
    def routing(self) -> Subscription:
        """The atomic subscription this part routes as."""
        return self._routing  # type: ignore[attr-defined]

    @property
    def bindings(self) -> tuple[Binding, ...]:
        return tuple(t for t in self.terms if isinstance(t, Binding))

    def bind(self, publication: Mapping[str, object]) -> dict[str, Value] | None:
        """The variables ``publication`` binds if it matches this part (every predicate
        holds, every bound attribute has a value of its operator's type, a variable named
        twice has one value), else None."""
        if not self.routing.matches(publication):
            return None
        bound: dict[str, Value] = {}
        for b in self.bindings:
            value = b.value(publication)
            if value is None or bound.setdefault(b.variable, value) != value:
                return None
        return bound

    def to_text(self) -> str:
        return ",".join(t.to_text() for t in self.terms)


@dataclass(frozen=True)
class Join:
    """``terms`` joined by ``op``: ``&`` (all of them) or ``|`` (any of them). A term is
    a part's index in :attr:`Composite.parts` or a nested join."""

    op: str
    terms: tuple[int | Join, ...]

    def __post_init__(self) -> None:
        if self.op not in JOIN_OPERATORS:
            raise FilterError(f"unknown join operator {self.op!r}; expected '&' or '|'")
        object.__setattr__(self, "terms", tuple(self.terms))
        if len(self.terms) < 2:
            raise FilterError(f"a join {self.op!r} needs at least two terms")

    def leaves(self) -> Iterator[int]:
        """The part indices under this join, left to right."""
        for t in self.terms:
            if isinstance(t, Join):
                yield from t.leaves()
            else:
                yield t


@dataclass(frozen=True)
class Composite:
    """A composite subscription (PADRES): atomic :attr:`parts` joined by AND and OR
    (:attr:`expression`), variables binding equal values across the parts of a match,
    and an optional time window.

    **What a match is.** A set of publications *satisfies* a part when it is one
    publication that matches the part; it satisfies ``E1 & E2`` when it is the union
    of a set satisfying E1 and one satisfying E2 whose variables are bound to equal
    values; it satisfies ``E1 | E2`` when it satisfies either. A *match* is a set
    that satisfies the whole expression and whose publication times
    (``published_at``) lie within :attr:`window` seconds of each other (max − min ≤
    window; no window: any times). Each match is delivered once, carrying its
    publications, each with the parts it fills. So for a trade part and a quote part
    that share ``$S``, every (trade, quote) pair of one symbol published at most
    ``window`` apart is one match; a publication matching both parts of an AND is a
    match by itself; under ``|`` a publication matching both sides is one match."""

    parts: tuple[Part, ...]
    expression: Join
    window: float | None = None

    def __post_init__(self) -> None:
        parts = tuple(self.parts)
        object.__setattr__(self, "parts", parts)
        if not isinstance(self.expression, Join):
            raise FilterError("a composite subscription's expression must be a Join")
        leaves = list(self.expression.leaves())
        if sorted(leaves) != list(range(len(parts))):
            raise FilterError(
                f"the expression must name each of the {len(parts)} parts once, named {leaves}"
            )
        if len(parts) > MAX_PARTS:
            raise FilterError(
                f"a composite subscription of {len(parts)} parts is over the limit of "
                f"{MAX_PARTS}; split it"
            )
        if self.window is not None and (
            isinstance(self.window, bool)
            or not isinstance(self.window, (int, float))
            or not 0 < self.window < math.inf
        ):
            raise FilterError(
                f"the window must be a positive number of seconds, got {self.window!r}"
            )
        if self.window is not None:
            object.__setattr__(self, "window", float(self.window))
        _check_variables(parts)

    @property
    def variables(self) -> frozenset[str]:
        return frozenset(b.variable for part in self.parts for b in part.bindings)

    def to_text(self) -> str:
        """Canonical text; :func:`parse_composite` reads it back to an equal value."""
        text = self._text(self.expression)
        return text if self.window is None else f"{text} within {self.window!r}s"

    def _text(self, node: int | Join) -> str:
        if isinstance(node, int):
            return "{" + self.parts[node].to_text() + "}"
        return f" {node.op} ".join(
            "{" + self._text(t) + "}" if isinstance(t, Join) else self._text(t) for t in node.terms
        )

    def __str__(self) -> str:
        return self.to_text()


def _check_variables(parts: tuple[Part, ...]) -> None:
    """Each variable is named at least twice and compared as one type everywhere."""
    seen: dict[str, list[tuple[int, str]]] = {}
    for i, part in enumerate(parts, 1):
        for b in part.bindings:
            seen.setdefault(b.variable, []).append((i, b.op))
    for name, uses in seen.items():
        if len(uses) < 2:
            raise FilterError(
                f"variable ${name} appears once (part {uses[0][0]}): a variable joins parts "
                f"by equal values; name it in two places, or use [attr,isPresent]"
            )
        ops = {op for _, op in uses}
        if len(ops) > 1:
            string = next(i for i, op in uses if op == "eq")
            number = next(i for i, op in uses if op == "=")
            raise FilterError(
                f"variable ${name} is compared as a string (eq) in part {string} and as a "
                f"number (=) in part {number}: such values are never equal"
            )


def parse_composite(text: str) -> Composite:
    """Parse a composite subscription::

        {[class,eq,'TRADE'],[symbol,eq,$S]} &
        {[class,eq,'QUOTE'],[symbol,eq,$S],[bid,>,100]} within 5s

    Each part is an atomic subscription in braces whose constants may be variables
    (``$S``, or PADRES's ``$S$name``, ``$I$name``, ``$F$name``, also quoted), with
    ``eq`` (strings) or ``=`` (numbers). Parts join with ``&`` (``&&``) or ``|``
    (``||``); one operator per level, grouped with braces (PADRES) or parentheses:
    ``{{A} & {B}} | {C}``; an outer pair of braces around the whole is allowed. An
    optional ``within D`` ends the text, D a number with ``ms``, ``s``, ``m`` or ``h``.
    Raises :class:`FilterError` naming the position and the problem.
    """
    if not isinstance(text, str):
        raise FilterError(f"a composite subscription must be a str, got {type(text).__name__}")
    sc = _Scanner(text)
    parts: list[Part] = []
    sc.space()
    node = _join_expression(sc, parts, None)
    window = None
    sc.space()
    if _WITHIN.match(text, sc.pos):
        sc.pos += len("within")
        sc.space()
        window = _duration(sc)
        sc.space()
    if not sc.at_end():
        after = "the window" if window is not None else "a part"
        expected = "the end" if window is not None else "'&', '|' or 'within'"
        raise sc.error(sc.pos, f"expected {expected} after {after}, found {sc.found()}")
    if not isinstance(node, Join):
        raise FilterError(
            "position 1: a composite subscription joins at least two parts with & or |; "
            "for one part, subscribe to it as a plain subscription"
        )
    try:
        return Composite(tuple(parts), node, window)
    except FilterError as exc:
        raise FilterError(f"composite subscription: {exc}") from None


def _duration(sc: _Scanner) -> float:
    m = _DURATION.match(sc.text, sc.pos)
    if m is None and _NUMBER.match(sc.text, sc.pos):
        raise sc.error(sc.pos, "a duration needs a unit: ms, s, m or h (e.g. within 5s)")
    if m is None:
        raise sc.error(
            sc.pos, f"expected a duration after 'within' (5s, 500ms, 2m, 1h), found {sc.found()}"
        )
    number, unit = m.groups()
    seconds = float(number) * _UNIT_SECONDS[unit] if unit != "ms" else float(number) / 1000
    if not 0 < seconds < math.inf:
        raise sc.error(m.start(), f"the window must be longer than zero, got {m.group()!r}")
    sc.pos = m.end()
    return seconds


_CLOSING = {"{": "}", "(": ")"}


def _join_expression(sc: _Scanner, parts: list[Part], close: str | None) -> int | Join:
    """``term (op term)*`` up to ``close`` (or the end / ``within`` at the top)."""
    terms = [_join_term(sc, parts)]
    op = None
    while True:
        sc.space()
        if sc.at_end() or (close is not None and sc.text.startswith(close, sc.pos)):
            break
        if _WITHIN.match(sc.text, sc.pos):
            if close is not None:
                raise sc.error(sc.pos, "'within' applies to the whole composite: put it at the end")
            break
        pos = sc.pos
        char = sc.text[pos]
        if char not in JOIN_OPERATORS:
            expected = f"'&', '|' or '{close}'" if close else "'&', '|' or 'within'"
            raise sc.error(pos, f"expected {expected} after a part, found {sc.found()}")
        sc.pos += 2 if sc.text.startswith(char * 2, pos) else 1
        if op is not None and char != op:
            raise sc.error(
                pos,
                f"'{char}' after '{op}': group to say which joins first, "
                f"e.g. {{{{A}} {op} {{B}}}} {char} {{C}}",
            )
        op = char
        sc.space()
        terms.append(_join_term(sc, parts))
    if op is None:
        return terms[0]
    return Join(op, tuple(terms))


def _join_term(sc: _Scanner, parts: list[Part]) -> int | Join:
    """A part ``{[...],...}`` or a group ``{...}`` / ``(...)``."""
    sc.space()
    opening = sc.text[sc.pos : sc.pos + 1]
    if opening not in _CLOSING:
        raise sc.error(sc.pos, f"expected '{{' to open a part or a group, found {sc.found()}")
    start = sc.pos
    sc.pos += 1
    sc.space()
    close = _CLOSING[opening]
    if opening == "{" and sc.text.startswith("[", sc.pos):
        parts.append(_part(sc, len(parts) + 1))
        node: int | Join = len(parts) - 1
    elif sc.text.startswith(close, sc.pos):
        raise sc.error(start, f"empty {'part' if opening == '{' else 'group'} '{opening}{close}'")
    else:
        node = _join_expression(sc, parts, close)
    sc.space()
    if not sc.text.startswith(close, sc.pos):
        raise sc.error(
            sc.pos,
            f"expected '{close}' to close '{opening}' of position {start + 1}, found {sc.found()}",
        )
    sc.pos += 1
    return node


def _part(sc: _Scanner, number: int) -> Part:
    """``[attr,op,value-or-variable],...`` up to (not past) the part's ``}``."""
    start = sc.pos
    terms: list[Predicate | Binding] = [_term(sc)]
    while True:
        sc.space()
        if sc.text.startswith("}", sc.pos) or sc.at_end():
            break
        sc.expect(",", "between predicates")
        terms.append(_term(sc))
    try:
        return Part(tuple(terms))
    except FilterError as exc:
        raise sc.error(start, f"part {number}: {exc}") from None


def _term(sc: _Scanner, bindings: bool = True) -> Predicate | Binding:
    """A predicate ``[attr,op,value]`` at the cursor, consumed; with ``bindings``, one
    whose value is a variable (``$X``) is a :class:`Binding` (composite parts)."""
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
        variable = _variable(sc) if bindings else None
        if variable is not None:
            name, kind = variable
            if op not in _EQUALITY:
                raise sc.error(
                    value_pos,
                    f"variable ${name} binds by equality: use it with eq (strings) or = "
                    f"(numbers), not {op!r}",
                )
            if kind is not None and _VARIABLE_KIND[kind] != op:
                raise sc.error(
                    value_pos,
                    f"variable ${kind}${name} is {'a string' if kind == 'S' else 'a number'}"
                    f" variable: use it with {_VARIABLE_KIND[kind]}, not {op!r}",
                )
            sc.expect("]", "to close the predicate")
            return Binding(attr, op, name)
        value = sc.value()
    elif op != IS_PRESENT:
        raise sc.error(sc.pos, f"expected ',' and a value after {op!r}, found {sc.found()}")
    sc.expect("]", "to close the predicate")
    if op == IS_PRESENT:
        value = None
    problem = _predicate_problem(op, value)
    if problem:
        raise sc.error(value_pos, problem)
    return Predicate(attr, op, value)


def _variable(sc: _Scanner) -> tuple[str, str | None] | None:
    """A variable at the cursor (``$X``, ``$S$X``, or a typed one quoted as PADRES
    prints it), consumed: (name, type letter or None); None if there is none."""
    text, pos = sc.text, sc.pos
    quote = text[pos : pos + 1]
    if quote in ("'", '"'):
        m = _VARIABLE.match(text, pos + 1)
        if m is None or m.group(1) is None or not text.startswith(quote, m.end()):
            return None
        sc.pos = m.end() + 1
        return m.group(2), m.group(1)
    if quote != "$":
        return None
    m = _VARIABLE.match(text, pos)
    if m is None:
        raise sc.error(pos, "expected a variable name after '$' (e.g. $S or $S$symbol)")
    sc.pos = m.end()
    return m.group(2), m.group(1)


def _composite_term(spec: object, parts: list[Part], where: str) -> int | Join:
    if isinstance(spec, Mapping) and len(spec) == 1 and next(iter(spec)) in ("and", "or"):
        return _composite_join(spec, parts, where)
    if isinstance(spec, str):
        parts.append(_part_from_text(spec, len(parts) + 1))
    elif isinstance(spec, Mapping):
        parts.append(_part_from_dict(spec, len(parts) + 1))
    else:
        raise FilterError(
            f"{where}: a term must be a part (a dict or PADRES text) or "
            f"{{'and'|'or': [...]}}, got {type(spec).__name__}"
        )
    return len(parts) - 1


def _composite_join(d: Mapping[str, Any], parts: list[Part], where: str) -> Join:
    ((key, terms),) = d.items()
    if not isinstance(terms, (list, tuple)) or len(terms) < 2:
        raise FilterError(f"{where}: {key!r} needs a list of at least two terms, got {terms!r}")
    op = "&" if key == "and" else "|"
    return Join(
        op, tuple(_composite_term(t, parts, f"{where}.{key}[{i}]") for i, t in enumerate(terms))
    )


def _part_from_text(text: str, number: int) -> Part:
    sc = _Scanner(text)
    sc.space()
    part = _part(sc, number)
    sc.space()
    if not sc.at_end():
        raise sc.error(
            sc.pos, f"part {number}: expected ',' between predicates, found {sc.found()}"
        )
    return part


def _part_from_dict(d: Mapping[str, Any], number: int) -> Part:
    terms: list[Predicate | Binding] = []
    for attr, op, constant in _dict_triples(d, f"part {number}"):
        if isinstance(constant, Var):
            if op not in _EQUALITY:
                raise FilterError(
                    f"part {number}, attribute {attr!r}: variable ${constant.name} binds by "
                    f"equality: use it with eq (strings) or = (numbers), not {op!r}"
                )
            terms.append(Binding(attr, op, constant.name))
            continue
        problem = _predicate_problem(op, constant)
        if problem:
            raise FilterError(f"part {number}, attribute {attr!r}: {problem}")
        terms.append(Predicate(attr, op, constant))
    if not terms:
        raise FilterError(f"part {number}: a part needs at least one predicate")
    return Part(tuple(terms))


def composite_from_dict(d: Mapping[str, Any]) -> Composite:
    """The dict form of a composite subscription, for the SDK::

        {"and": [{"class": ("eq", "TRADE"), "symbol": ("eq", Var("S"))},
                 {"class": ("eq", "QUOTE"), "symbol": ("eq", Var("S")),
                  "bid": (">", 100)}],
         "within": 5}

    ``"and"`` or ``"or"`` maps to a list of terms: parts (the dict form of a
    subscription, whose constants may be :class:`Var`, or a part's PADRES text) or
    nested ``{"and"|"or": [...]}``. ``"within"`` is seconds, or a text such as
    ``"500ms"``. Equals the composite parsed from the same subscription's text.
    """
    if not isinstance(d, Mapping):
        raise FilterError(f"a composite dict must be a mapping, got {type(d).__name__}")
    joins = [k for k in d if k in ("and", "or")]
    unknown = [k for k in d if k not in ("and", "or", "within")]
    if unknown or len(joins) != 1:
        raise FilterError(
            "a composite dict has one of 'and' or 'or' and, optionally, 'within'; got "
            f"keys {list(d)}"
        )
    parts: list[Part] = []
    node = _composite_join({joins[0]: d[joins[0]]}, parts, "composite")
    window = d.get("within")
    if isinstance(window, str):
        sc = _Scanner(window.strip())
        window = _duration(sc)
        if not sc.at_end():
            raise FilterError(f"'within': expected a duration such as 5s, got {d['within']!r}")
    return Composite(tuple(parts), node, window)


def is_composite(x: object) -> bool:
    """Whether ``x`` (text, dict form or value) is a composite subscription rather than
    an atomic one: text starting with ``{`` or ``(``, a dict with ``and`` or ``or``."""
    if isinstance(x, Composite):
        return True
    if isinstance(x, str):
        return x.lstrip()[:1] in ("{", "(")
    return isinstance(x, Mapping) and ("and" in x or "or" in x)


def as_filter(x: str | Mapping[str, Any] | Subscription | Composite) -> Subscription | Composite:
    """A :class:`Subscription` or a :class:`Composite` from its text, its dict form, or
    itself (:func:`is_composite` tells which)."""
    if isinstance(x, (Subscription, Composite)):
        return x
    if is_composite(x):
        return parse_composite(x) if isinstance(x, str) else composite_from_dict(x)  # type: ignore[arg-type]
    return as_subscription(x)  # type: ignore[arg-type]


# -- covering ------------------------------------------------------------------------------

_LOWER = (">", ">=")
_UPPER = ("<", "<=")


class Constraint:
    """What the predicates of one subscription on one attribute allow, summarised for
    implication (:meth:`implies`): the numeric interval they leave with the points
    ``<>`` excludes, and the string predicates with the value ``eq`` pins, if any.

    ``unsatisfiable`` is set when no value can pass them all (a number and a string at
    once, an empty interval, two different ``eq`` constants): such a subscription matches
    nothing, so every subscription covers it on this attribute."""

    __slots__ = (
        "excluded",
        "hi",
        "hi_open",
        "lo",
        "lo_open",
        "numeric",
        "pinned",
        "strings",
        "unsatisfiable",
    )

    def __init__(self, predicates: list[Predicate]) -> None:
        self.lo, self.lo_open = -math.inf, False
        self.hi, self.hi_open = math.inf, False
        self.excluded: set[Value] = set()
        self.numeric = False
        self.strings: list[Predicate] = []
        self.pinned: str | None = None
        self.unsatisfiable = False
        for p in predicates:
            if p.op == IS_PRESENT:
                continue
            if p.op in STRING_OPERATORS:
                self.strings.append(p)
                continue
            self.numeric = True
            c = p.value
            if p.op == "<>":
                self.excluded.add(c)
            if p.op in ("<", "<=", "="):
                self._below(c, p.op == "<")
            if p.op in (">", ">=", "="):
                self._above(c, p.op == ">")
        if self.numeric and self.strings:
            self.unsatisfiable = True  # a value is a number or a string, never both
        elif self.numeric:
            lo, hi = self.lo, self.hi
            self.unsatisfiable = lo > hi or (
                lo == hi and (self.lo_open or self.hi_open or lo in self.excluded)
            )
        else:
            pins = {p.value for p in self.strings if p.op == "eq"}
            if len(pins) > 1:
                self.unsatisfiable = True
            elif pins:
                pinned = pins.pop()
                self.unsatisfiable = not all(p.test(pinned) for p in self.strings)
                self.pinned = pinned  # type: ignore[assignment]

    def _below(self, c: Any, strict: bool) -> None:
        if c < self.hi or (c == self.hi and strict):
            self.hi, self.hi_open = c, strict

    def _above(self, c: Any, strict: bool) -> None:
        if c > self.lo or (c == self.lo and strict):
            self.lo, self.lo_open = c, strict

    def implies(self, p: Predicate) -> bool:
        """Whether every value these predicates allow satisfies ``p``. Conservative: False
        when in doubt (only the cases worked out below are recognised)."""
        if self.unsatisfiable or p.op == IS_PRESENT:
            return True
        if p.op in STRING_OPERATORS:
            return bool(self.strings) and self._implies_string(p)
        if not self.numeric:
            return False
        c, lo, hi = p.value, self.lo, self.hi
        # An interval unbounded on both sides also lets NaN through; only "<>" of an
        # excluded constant holds for it, and that is the only case it passes below.
        op = p.op
        if op == "<":
            return hi < c or (hi == c and (self.hi_open or c in self.excluded))
        if op == "<=":
            return hi <= c
        if op == ">":
            return lo > c or (lo == c and (self.lo_open or c in self.excluded))
        if op == ">=":
            return lo >= c
        if op == "=":
            return lo == hi == c
        return (  # "<>"
            c in self.excluded
            or c < lo
            or c > hi
            or (c == lo and self.lo_open)
            or (c == hi and self.hi_open)
        )

    def _implies_string(self, p: Predicate) -> bool:
        if self.pinned is not None:
            return p.test(self.pinned)
        return any(_string_implies(q, p) for q in self.strings)


def _string_implies(q: Predicate, p: Predicate) -> bool:
    """Whether every string satisfying string predicate ``q`` satisfies string predicate
    ``p`` (as far as the two alone tell; conservative)."""
    c, d, op = p.value, q.value, p.op
    assert isinstance(c, str) and isinstance(d, str)
    if op == "neq":
        return not q.test(c)
    if op == "str-prefix":
        return q.op == "str-prefix" and d.startswith(c)
    if op == "str-postfix":
        return q.op == "str-postfix" and d.endswith(c)
    if op == "str-contains":
        return q.op in ("str-prefix", "str-postfix", "str-contains") and c in d
    inclusive = op in ("str-le", "str-ge")
    if op in ("str-lt", "str-le"):
        # below d; or starting with a d that sorts before c where they first differ (so
        # does every string that starts with d)
        return (
            (q.op == "str-lt" and d <= c)
            or (q.op == "str-le" and (d < c or (d == c and inclusive)))
            or (q.op == "str-prefix" and d < c and not c.startswith(d))
        )
    if op in ("str-gt", "str-ge"):  # above d, or starting with it
        return (q.op == "str-gt" and d >= c) or (
            q.op in ("str-ge", "str-prefix") and (d > c or (d == c and inclusive))
        )
    return False  # "eq": only a pinned value implies it


class CoverForm:
    """A subscription compiled for covering tests (:func:`covers`): its predicates and, per
    attribute it constrains, a :class:`Constraint`. Its *equalities* are the ``eq`` and
    ``=`` predicates as ``(attr, kind, constant)``, numbers as floats (``1 == 1.0``);
    ``attributes`` are the attributes it constrains (:class:`octopis.matching.CoverIndex`
    files subscriptions by both)."""

    __slots__ = ("attributes", "constraints", "equalities", "subscription")

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        by_attr: dict[str, list[Predicate]] = {}
        for p in subscription.predicates:
            by_attr.setdefault(p.attr, []).append(p)
        self.constraints = {attr: Constraint(ps) for attr, ps in by_attr.items()}
        self.attributes = frozenset(by_attr)
        self.equalities = frozenset(
            (p.attr, "s", p.value) if p.op == "eq" else (p.attr, "n", float(p.value))  # type: ignore[arg-type]
            for p in subscription.predicates
            if p.op in _EQUALITY
        )

    def covers(self, other: CoverForm) -> bool:
        """Whether every publication ``other`` matches also matches this subscription."""
        constraints = other.constraints
        for p in self.subscription.predicates:
            constraint = constraints.get(p.attr)
            if constraint is None or not constraint.implies(p):
                return False
        return True


def cover_form(subscription: Subscription) -> CoverForm:
    """The :class:`CoverForm` of ``subscription``, compiled once per subscription object
    (kept on it, outside its fields: equality, hashing and text are unchanged), so that
    the brokers of a simulation, which share subscription objects, share forms too."""
    form = subscription.__dict__.get("_cover_form")
    if form is None:
        form = CoverForm(subscription)
        object.__setattr__(subscription, "_cover_form", form)
    return form


def covers(a: Subscription, b: Subscription) -> bool:
    """Whether ``a`` *covers* ``b``: every publication matching ``b`` matches ``a``.

    Conservative: True only when that follows from the predicates attribute by attribute
    (numeric ranges and exclusions, string equality, order, prefixes, suffixes and
    substrings, ``isPresent``); when in doubt, False. Every subscription covers itself
    and one that matches nothing."""
    return cover_form(a).covers(cover_form(b))


def intersects(a: Subscription, b: Subscription) -> bool:
    """Whether some publication may match both ``a`` and ``b`` (an advertisement and a
    subscription, say).

    Conservative the other way round from :func:`covers`: False only when the predicates
    of both on one attribute leave no value (a number and a string at once, an empty
    numeric interval, two different ``eq`` constants, a pinned string another predicate
    refuses); when in doubt, True. So whenever a publication matches both, it is True."""
    by_attr: dict[str, list[Predicate]] = {}
    for p in (*a.predicates, *b.predicates):
        by_attr.setdefault(p.attr, []).append(p)
    return not any(Constraint(ps).unsatisfiable for ps in by_attr.values())
