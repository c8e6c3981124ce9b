"""Composite subscriptions (DESIGN §12), after PADRES: atomic parts joined by AND and OR.

A *composite subscription* joins atomic parts in braces with ``&`` (all) and ``|``
(any), variables such as ``$S`` binding equal values across the parts of a match, and an
optional time window (:func:`parse_composite`, :class:`Composite`)::

    {[class,eq,'TRADE'],[symbol,eq,$S]} & {[class,eq,'QUOTE'],[symbol,eq,$S]}
      within 5s

Each part is a subscription of :mod:`octopis.filters.language` whose constants may be
variables. Every problem raises :class:`~octopis.filters.language.FilterError` naming
the position (text) or the part and attribute (dict form).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from octopis.filters.language import (
    ATTRIBUTE_NAME,
    EQUALITY_OPERATORS,
    IS_PRESENT,
    NUMBER,
    FilterError,
    Predicate,
    Scanner,
    Subscription,
    Value,
    as_subscription,
    dict_predicates,
    predicate_problem,
    read_predicate,
)

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
        if not isinstance(self.attr, str) or not ATTRIBUTE_NAME.fullmatch(self.attr):
            raise FilterError(f"binding on {self.attr!r}: invalid attribute name")
        if self.op not in EQUALITY_OPERATORS:
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
    sc = Scanner(text)
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


def _duration(sc: Scanner) -> float:
    m = _DURATION.match(sc.text, sc.pos)
    if m is None and NUMBER.match(sc.text, sc.pos):
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


def _join_expression(sc: Scanner, parts: list[Part], close: str | None) -> int | Join:
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


def _join_term(sc: Scanner, parts: list[Part]) -> int | Join:
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


def _part(sc: Scanner, number: int) -> Part:
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


def _term(sc: Scanner) -> Predicate | Binding:
    """A predicate ``[attr,op,value]`` at the cursor, consumed; one whose value is a
    variable (``$X``) is a :class:`Binding`."""
    return read_predicate(sc, _binding)


def _binding(sc: Scanner, attr: str, op: str) -> Binding | None:
    """The :class:`Binding` of ``attr`` by ``op`` to a variable at the cursor, consumed;
    None if the value there is no variable."""
    value_pos = sc.pos
    variable = _variable(sc)
    if variable is None:
        return None
    name, kind = variable
    if op not in EQUALITY_OPERATORS:
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
    return Binding(attr, op, name)


def _variable(sc: Scanner) -> tuple[str, str | None] | None:
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
    sc = Scanner(text)
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
    for attr, op, constant in dict_predicates(d, f"part {number}"):
        if isinstance(constant, Var):
            if op not in EQUALITY_OPERATORS:
                raise FilterError(
                    f"part {number}, attribute {attr!r}: variable ${constant.name} binds by "
                    f"equality: use it with eq (strings) or = (numbers), not {op!r}"
                )
            terms.append(Binding(attr, op, constant.name))
            continue
        problem = predicate_problem(op, constant)
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
        sc = Scanner(window.strip())
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
