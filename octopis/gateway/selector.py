"""JMS message selectors (the SQL-92 subset ActiveMQ's STOMP ``selector`` header takes),
parsed and translated *exactly* into PADRES subscriptions (DESIGN §13).

Grammar (keywords in any case)::

    expr      := and ('OR' and)*
    and       := not ('AND' not)*
    not       := 'NOT' not | test
    test      := '(' expr ')' | 'TRUE' | 'FALSE'
               | operand ('=' | '<>' | '<' | '>' | '<=' | '>=') operand
               | name ['NOT'] 'BETWEEN' constant 'AND' constant
               | name ['NOT'] 'IN' '(' string (',' string)* ')'
               | name ['NOT'] 'LIKE' string ['ESCAPE' string]
               | name 'IS' ['NOT'] 'NULL'
    operand   := name | constant
    constant  := string | number          strings '...' with '' for a quote

Semantics (:func:`evaluate` is the readable definition; it follows ActiveMQ Classic's
selector engine): SQL's three-valued logic. A test on an absent attribute is *unknown*,
and so is ``NOT`` of unknown; ``AND`` is false when either side is false, ``OR`` true when
either side is true. A comparison of a string with a number is false (so ``NOT`` of it is
true); ``<>`` is ``NOT =``; ``LIKE`` on a number is false; ``IN`` on a number is unknown;
``BETWEEN a AND b`` is ``>= a AND <= b``; ``IS NULL`` is never unknown. A message is
selected when the selector is true.

Translation (:func:`translate`): the selector's *true* set is written as a union of
PADRES conjunctions (disjunctive form), each of which becomes one subscription with
``[class,eq,<topic>]`` first. ``NOT`` is pushed down by computing the *false* set of its
operand, so three-valued logic is kept exactly. Whatever has no exact PADRES form is
refused with a :class:`SelectorError` naming the part, never approximated:

* ``IS NULL`` (true) and ``IS NOT NULL`` under ``NOT`` — PADRES cannot test absence;
* ``LIKE`` patterns other than ``abc``, ``abc%``, ``%abc``, ``%abc%``, ``abc%xyz`` (when
  no string shorter than both parts together can have both), ``%``, ``%_%``; and under
  ``NOT`` those whose complement has no form either (``%abc``, ``%abc%``, ``abc%xyz``);
* a comparison of two attributes, arithmetic, a boolean attribute, an attribute name
  PADRES does not allow (``$`` in it), more than ``max_subscriptions`` disjuncts.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from octopis.defaults import SELECTOR_SUBSCRIPTIONS
from octopis.filters.language import ATTRIBUTE_NAME, FilterError, Predicate, Subscription
from octopis.filters.limits import MAX_INTEGER

MAX_SELECTOR_LENGTH = 4096
"""Characters in one selector."""
MAX_DEPTH = 32
"""Nesting of parentheses and ``NOT`` in one selector."""

FLOAT_MAX = sys.float_info.max


class SelectorError(ValueError):
    """A selector that does not parse, or has no exact PADRES form; names the part."""


def _quote(part: str) -> str:
    """A part of a selector as quoted in a message (selectors use single quotes)."""
    return f'"{part}"'


# ---------------------------------------------------------------------------------------
# Syntax tree


@dataclass(frozen=True)
class Node:
    """A part of a selector; ``text`` is its source, quoted in errors."""

    text: str


@dataclass(frozen=True)
class Const(Node):
    """``TRUE`` or ``FALSE`` (a comparison of two constants is folded to one)."""

    value: bool


@dataclass(frozen=True)
class Compare(Node):
    """``attr op value``; a constant on the left is turned around at parse time."""

    attr: str
    op: str
    value: str | int | float


@dataclass(frozen=True)
class Like(Node):
    """``attr LIKE pattern`` with ``%``/``_`` wildcards and an optional escape character."""

    attr: str
    pattern: str
    escape: str | None


@dataclass(frozen=True)
class In(Node):
    """``attr IN (s1, s2, ...)`` over strings."""

    attr: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class IsNull(Node):
    """``attr IS NULL``."""

    attr: str


@dataclass(frozen=True)
class Not(Node):
    """``NOT operand`` (``NOT BETWEEN``, ``NOT IN``, ``NOT LIKE``, ``IS NOT NULL`` too)."""

    operand: Node


@dataclass(frozen=True)
class Junction(Node):
    """``AND`` (``any_of`` False) or ``OR`` (``any_of`` True) of two or more operands."""

    any_of: bool
    operands: tuple[Node, ...]


# ---------------------------------------------------------------------------------------
# Tokens and parser

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<string>'(?:[^']|'')*')
      | (?P<number>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
      | (?P<name>[A-Za-z_$][A-Za-z0-9_$.]*)
      | (?P<op><>|<=|>=|=|<|>|\(|\)|,|[-+*/])
    """,
    re.VERBOSE,
)
_KEYWORDS = frozenset(
    ("AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE")
)
_FLIP = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_COMPARISONS = frozenset(_FLIP)


@dataclass(frozen=True)
class _Token:
    kind: str  # "string", "number", "name", "keyword", "op", "end"
    value: str
    pos: int


def _tokens(text: str) -> list[_Token]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SelectorError(f"position {pos + 1}: unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind != "space":
            value = m.group()
            if kind == "name" and value.upper() in _KEYWORDS:
                kind, value = "keyword", value.upper()
            out.append(_Token(kind, value, pos))
        pos = m.end()
    out.append(_Token("end", "", len(text)))
    return out


def _number(text: str, where: str) -> int | float:
    if re.fullmatch(r"[0-9]+", text):
        value = int(text)
        if value > MAX_INTEGER:
            raise SelectorError(f"{where}: integer {text} is out of range (at most 2**53)")
        return value
    value = float(text)
    if value > FLOAT_MAX:
        raise SelectorError(f"{where}: number {text} is not finite")
    return value


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def error(self, problem: str, tok: _Token | None = None) -> SelectorError:
        tok = tok or self.tok
        found = "the end" if tok.kind == "end" else repr(tok.value)
        return SelectorError(f"position {tok.pos + 1} (at {found}): {problem}")

    def take(self, kind: str, value: str | None = None) -> _Token | None:
        tok = self.tok
        if tok.kind == kind and (value is None or tok.value == value):
            self.i += 1
            return tok
        return None

    def need(self, kind: str, value: str | None, what: str) -> _Token:
        tok = self.take(kind, value)
        if tok is None:
            raise self.error(f"expected {what}")
        return tok

    def span(self, start: _Token) -> str:
        end = self.tokens[self.i - 1]
        return self.text[start.pos : end.pos + len(end.value)].strip()

    def parse(self) -> Node:
        node = self.expression()
        if self.tok.kind != "end":
            raise self.error("expected AND, OR or the end of the selector")
        return node

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nesting deeper than {MAX_DEPTH}")

    def expression(self) -> Node:
        return self.junction("OR", self.conjunction)

    def conjunction(self) -> Node:
        return self.junction("AND", self.negation)

    def junction(self, word: str, operand: Callable[[], Node]) -> Node:
        start = self.tok
        items = [operand()]
        while self.take("keyword", word):
            items.append(operand())
        if len(items) == 1:
            return items[0]
        return Junction(self.span(start), word == "OR", tuple(items))

    def negation(self) -> Node:
        start = self.tok
        if self.take("keyword", "NOT"):
            self.enter()
            operand = self.negation()
            self.depth -= 1
            return Not(self.span(start), operand)
        return self.test()

    def test(self) -> Node:
        start = self.tok
        if self.take("op", "("):
            self.enter()
            node = self.expression()
            self.depth -= 1
            self.need("op", ")", "')'")
            return node
        if self.take("keyword", "TRUE") or self.take("keyword", "FALSE"):
            return Const(start.value, start.value == "TRUE")
        left = self.operand()
        tok = self.tok
        if tok.kind == "op" and tok.value in _COMPARISONS:
            self.i += 1
            right = self.operand()
            return self.comparison(start, left, tok.value, right)
        if tok.kind == "op" and tok.value in "+-*/":
            raise self.error("arithmetic is not supported in selectors")
        name = self.attribute(left, start)
        if self.take("keyword", "IS"):
            negated = self.take("keyword", "NOT") is not None
            self.need("keyword", "NULL", "NULL")
            node: Node = IsNull(self.span(start), name)
            return Not(self.span(start), node) if negated else node
        negated = self.take("keyword", "NOT") is not None
        if self.take("keyword", "BETWEEN"):
            low = self.constant("a constant after BETWEEN")
            self.need("keyword", "AND", "AND in BETWEEN")
            high = self.constant("a constant after BETWEEN ... AND")
            text = self.span(start)
            node = Junction(
                text, False, (Compare(text, name, ">=", low), Compare(text, name, "<=", high))
            )
        elif self.take("keyword", "IN"):
            node = In("", name, self.string_list())
        elif self.take("keyword", "LIKE"):
            pattern = self.string("a quoted pattern after LIKE")
            escape = None
            if self.take("keyword", "ESCAPE"):
                escape = self.string("a quoted escape character")
                if len(escape) != 1:
                    raise self.error(f"ESCAPE takes one character, got {escape!r}")
            node = Like("", name, pattern, escape)
        elif negated:
            raise self.error("expected BETWEEN, IN or LIKE after NOT")
        else:
            raise self.error(
                f"attribute {name!r} used as a condition: expected a comparison, BETWEEN, "
                "IN, LIKE or IS [NOT] NULL (the overlay has no boolean attributes)"
            )
        text = self.span(start)
        node = _with_text(node, text)
        return Not(text, node) if negated else node

    def operand(self) -> tuple[str, str | int | float]:
        tok = self.tok
        if tok.kind == "name":
            self.i += 1
            return ("name", tok.value)
        return ("constant", self.constant("an attribute name or a constant"))

    def attribute(self, operand: tuple[str, str | int | float], start: _Token) -> str:
        kind, value = operand
        if kind != "name":
            raise self.error(f"expected a comparison after the constant {value!r}")
        assert isinstance(value, str)
        if not ATTRIBUTE_NAME.fullmatch(value):
            raise self.error(
                f"attribute name {value!r} is not one the overlay allows (letters, digits, "
                "_, %, ., - starting with a letter or _)",
                start,
            )
        return value

    def constant(self, what: str) -> str | int | float:
        tok = self.tok
        sign = ""
        if tok.kind == "op" and tok.value in "+-":
            sign = tok.value
            self.i += 1
        num = self.take("number")
        if num is not None:
            value = _number(num.value, f"position {num.pos + 1}")
            return -value if sign == "-" else value
        if sign:
            raise self.error("expected a number after the sign")
        return self.string(what)

    def string(self, what: str) -> str:
        tok = self.take("string")
        if tok is None:
            raise self.error(f"expected {what}")
        return tok.value[1:-1].replace("''", "'")

    def string_list(self) -> tuple[str, ...]:
        self.need("op", "(", "'(' after IN")
        values = [self.string("a quoted string in IN (...)")]
        while self.take("op", ","):
            values.append(self.string("a quoted string in IN (...)"))
        self.need("op", ")", "')' closing IN (...)")
        return tuple(values)

    def comparison(
        self,
        start: _Token,
        left: tuple[str, str | int | float],
        op: str,
        right: tuple[str, str | int | float],
    ) -> Node:
        text = self.span(start)
        if left[0] == "name" and right[0] == "name":
            raise SelectorError(
                f"{_quote(text)}: compares two attributes, which a PADRES predicate cannot"
            )
        if left[0] == "constant" and right[0] == "constant":
            return Const(text, _compare(left[1], op, right[1]) is True)
        if left[0] == "constant":
            left, right, op = right, left, _FLIP[op]
        name = self.attribute(left, start)
        if op == "<>":  # NOT =, as ActiveMQ reads it: a number <> 'x' is true
            return Not(text, Compare(text, name, "=", right[1]))
        return Compare(text, name, op, right[1])


def _with_text(node: Node, text: str) -> Node:
    if isinstance(node, In):
        return In(text, node.attr, node.values)
    if isinstance(node, Like):
        return Like(text, node.attr, node.pattern, node.escape)
    return node


def parse(text: str) -> Node:
    """The syntax tree of selector ``text``; :class:`SelectorError` names what is wrong."""
    if not isinstance(text, str):
        raise SelectorError(f"a selector must be a string, got {type(text).__name__}")
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(
            f"a selector of {len(text)} characters is over the limit ({MAX_SELECTOR_LENGTH})"
        )
    if not text.strip():
        raise SelectorError("empty selector")
    return _Parser(text).parse()


# ---------------------------------------------------------------------------------------
# Reference semantics

Truth: TypeAlias = bool | None  # None = unknown


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _compare(v: object, op: str, c: object) -> Truth:
    if v is None or isinstance(v, bool) or not isinstance(v, (str, int, float)):
        return None
    if op == "<>":
        return not _compare(v, "=", c)
    if isinstance(v, str) != isinstance(c, str):
        return False
    if op == "=":
        return v == c
    return {"<": v < c, ">": v > c, "<=": v <= c, ">=": v >= c}[op]  # type: ignore[operator]


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    out = []
    chars = iter(pattern)
    for ch in chars:
        if ch == escape:
            out.append(re.escape(next(chars, "")))
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def evaluate(node: Node, message: Mapping[str, object]) -> Truth:
    """The selector's value for ``message`` (True, False or None for unknown)."""
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Compare):
        return _compare(message.get(node.attr), node.op, node.value)
    if isinstance(node, IsNull):
        v = message.get(node.attr)
        return v is None or isinstance(v, bool) or not isinstance(v, (str, int, float))
    if isinstance(node, Like):
        v = message.get(node.attr)
        if not isinstance(v, str):
            return False if _is_number(v) else None
        return _like_regex(node.pattern, node.escape).fullmatch(v) is not None
    if isinstance(node, In):
        v = message.get(node.attr)
        return v in node.values if isinstance(v, str) else None
    if isinstance(node, Not):
        v = evaluate(node.operand, message)
        return None if v is None else not v
    if isinstance(node, Junction):
        values = [evaluate(n, message) for n in node.operands]
        decisive = node.any_of
        if decisive in values:
            return decisive
        return None if None in values else not decisive
    raise TypeError(f"not a selector node: {node!r}")


def selects(text: str, message: Mapping[str, object]) -> bool:
    """Whether selector ``text`` selects ``message`` (it evaluates to true)."""
    return evaluate(parse(text), message) is True


# ---------------------------------------------------------------------------------------
# Translation to disjunctive form

Conjunction: TypeAlias = tuple[Predicate, ...]
Form: TypeAlias = list[Conjunction]
"""A union of conjunctions of PADRES predicates: a publication is in it when every
predicate of one conjunction holds. ``[()]`` is everything, ``[]`` nothing."""

_NUMERIC_NOT = {"=": "<>", "<>": "=", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_STRING_OP = {
    "=": "eq",
    "<>": "neq",
    "<": "str-lt",
    "<=": "str-le",
    ">": "str-gt",
    ">=": "str-ge",
}


def _is_string(attr: str) -> Predicate:
    return Predicate(attr, "str-ge", "")


def _is_numeric(attr: str) -> Predicate:
    return Predicate(attr, ">=", -FLOAT_MAX)


def _successor(prefix: str) -> str | None:
    """The least string greater than every string starting with ``prefix`` (None: none)."""
    while prefix:
        code = ord(prefix[-1]) + 1
        if code == 0xD800:
            code = 0xE000
        if code <= sys.maxunicode:
            return prefix[:-1] + chr(code)
        prefix = prefix[:-1]
    return None


def _like_parts(node: Like) -> list[str]:
    """The pattern as a list of literal runs (``"s:<text>"``), ``"%"`` (runs of ``%``
    merged) and ``"_"``."""
    parts: list[str] = []
    literal: list[str] = []
    chars = iter(node.pattern)
    for ch in chars:
        if ch == node.escape:
            nxt = next(chars, None)
            if nxt is None:
                raise SelectorError(
                    f"{_quote(node.text)}: the pattern ends with its escape character"
                )
            literal.append(nxt)
        elif ch in "%_":
            if literal:
                parts.append("s:" + "".join(literal))
                literal = []
            if ch == "_" or not parts or parts[-1] != "%":
                parts.append(ch)
        else:
            literal.append(ch)
    if literal:
        parts.append("s:" + "".join(literal))
    return parts


def _overlaps(head: str, tail: str) -> bool:
    """Whether a string shorter than ``len(head) + len(tail)`` can start with ``head``
    and end with ``tail``."""
    return any(head.endswith(tail[:k]) for k in range(1, min(len(head), len(tail)) + 1))


@dataclass(frozen=True)
class _LikeShape:
    true: Form
    false: Form | None  # None: no exact complement


def _like_shape(node: Like) -> _LikeShape:
    a = node.attr
    parts = _like_parts(node)
    shape = [p[0] for p in parts]
    texts = [p[2:] for p in parts]
    number = (_is_numeric(a),)
    if shape == []:
        return _LikeShape([(Predicate(a, "eq", ""),)], [(Predicate(a, "neq", ""),), number])
    if shape == ["s"]:
        s = texts[0]
        return _LikeShape([(Predicate(a, "eq", s),)], [(Predicate(a, "neq", s),), number])
    if shape == ["%"]:
        return _LikeShape([(_is_string(a),)], [number])
    if shape in (["_", "%"], ["%", "_"], ["%", "_", "%"]):
        return _LikeShape([(Predicate(a, "str-gt", ""),)], [(Predicate(a, "eq", ""),), number])
    if shape == ["s", "%"]:
        p = texts[0]
        after = _successor(p)
        false = [(Predicate(a, "str-lt", p),), number]
        if after is not None:
            false.insert(1, (Predicate(a, "str-ge", after),))
        return _LikeShape([(Predicate(a, "str-prefix", p),)], false)
    if shape == ["%", "s"]:
        return _LikeShape([(Predicate(a, "str-postfix", texts[1]),)], None)
    if shape == ["%", "s", "%"]:
        return _LikeShape([(Predicate(a, "str-contains", texts[1]),)], None)
    if shape == ["s", "%", "s"]:
        head, tail = texts[0], texts[2]
        if not _overlaps(head, tail):
            both = (Predicate(a, "str-prefix", head), Predicate(a, "str-postfix", tail))
            return _LikeShape([both], None)
    raise SelectorError(
        f"{_quote(node.text)}: the overlay's language has no exact form of this LIKE pattern "
        "(it has: abc, abc%, %abc, %abc%, abc%xyz, %, %_%)"
    )


class _Translator:
    def __init__(self, limit: int) -> None:
        self.limit = limit

    def bounded(self, form: Form, node: Node) -> Form:
        unique = list(dict.fromkeys(form))
        if len(unique) > self.limit:
            raise SelectorError(
                f"{_quote(node.text)}: needs more than {self.limit} subscriptions "
                "(rewrite it, or raise the limit)"
            )
        return unique

    def both(self, forms: list[Form], node: Node) -> Form:
        """The intersection of ``forms`` (every conjunction of one with each of the rest)."""
        out: Form = [()]
        for form in forms:
            out = self.bounded([tuple(dict.fromkeys(c + d)) for c in out for d in form], node)
        return out

    def true(self, node: Node) -> Form:
        if isinstance(node, Const):
            return [()] if node.value else []
        if isinstance(node, Compare):
            return [(_predicate(node, node.op),)]
        if isinstance(node, In):
            return [(Predicate(node.attr, "eq", v),) for v in node.values]
        if isinstance(node, Like):
            return _like_shape(node).true
        if isinstance(node, IsNull):
            raise SelectorError(
                f"{_quote(node.text)}: the overlay's language cannot select on an absent "
                "attribute (IS NOT NULL it can)"
            )
        if isinstance(node, Not):
            return self.false(node.operand)
        if isinstance(node, Junction):
            forms = [self.true(n) for n in node.operands]
            if node.any_of:
                return self.bounded([c for f in forms for c in f], node)
            return self.both(forms, node)
        raise TypeError(f"not a selector node: {node!r}")

    def false(self, node: Node) -> Form:
        if isinstance(node, Const):
            return [] if node.value else [()]
        if isinstance(node, Compare):
            other = _is_numeric if isinstance(node.value, str) else _is_string
            return [(_predicate(node, _NUMERIC_NOT[node.op]),), (other(node.attr),)]
        if isinstance(node, In):
            return [tuple(Predicate(node.attr, "neq", v) for v in node.values)]
        if isinstance(node, Like):
            false = _like_shape(node).false
            if false is None:
                raise SelectorError(
                    f"NOT {_quote(node.text)}: the overlay's language has no exact form of "
                    "the strings this pattern does not match"
                )
            return false
        if isinstance(node, IsNull):
            return [(Predicate(node.attr, "isPresent", None),)]
        if isinstance(node, Not):
            return self.true(node.operand)
        if isinstance(node, Junction):
            forms = [self.false(n) for n in node.operands]
            if node.any_of:
                return self.both(forms, node)
            return self.bounded([c for f in forms for c in f], node)
        raise TypeError(f"not a selector node: {node!r}")


def _predicate(node: Compare, op: str) -> Predicate:
    if isinstance(node.value, str):
        op = _STRING_OP[op]
    try:
        return Predicate(node.attr, op, node.value)
    except FilterError as e:
        raise SelectorError(f"{_quote(node.text)}: {e}") from None


def translate(
    selector: str | None, topic: str, max_subscriptions: int = SELECTOR_SUBSCRIPTIONS
) -> list[Subscription]:
    """The PADRES subscriptions whose union selects exactly what ``selector`` selects
    among publications of class ``topic`` (all of them when ``selector`` is None or
    blank). Empty when the selector can never be true. :class:`SelectorError` names the
    part that cannot be parsed or expressed exactly, or the bound it would pass."""
    topic_is = Predicate("class", "eq", topic)
    if selector is None or not selector.strip():
        return [Subscription((topic_is,))]
    node = parse(selector)
    form = _Translator(max_subscriptions).true(node)
    out = []
    for conjunction in form:
        try:
            out.append(Subscription(tuple(dict.fromkeys((topic_is, *conjunction)))))
        except FilterError as e:
            raise SelectorError(f"{_quote(selector)}: {e}") from None
    return out
