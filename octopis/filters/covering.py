"""The covering algebra: when one subscription covers another, when two may meet.

:func:`covers` tells whether every publication one subscription matches also matches
another (what lets a broker quench a subscription covered by one it sent, DESIGN §12);
:func:`intersects` whether some publication may match both (an advertisement and a
subscription). Both work attribute by attribute on what the predicates of
:mod:`octopis.filters.language` allow (:class:`Constraint`), and both are conservative:
:func:`covers` says no, :func:`intersects` yes, when the predicates alone do not tell.
"""

from __future__ import annotations

import math
from typing import Any

from octopis.filters.language import (
    EQUALITY_OPERATORS,
    IS_PRESENT,
    STRING_OPERATORS,
    Predicate,
    Subscription,
    Value,
)


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
            if p.op in EQUALITY_OPERATORS
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
