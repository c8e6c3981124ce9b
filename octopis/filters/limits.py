"""The sizes and ranges accepted in any filter or publication (DESIGN §8).

A broker puts its ``[limits]`` in force at start (:func:`set_limits`); every parser and
check of :mod:`octopis.filters.language` and :mod:`octopis.filters.composite` reads them
through :func:`limits_in_force`, so a copy is never accepted at one broker and refused at
the next. The checks here return the problem as text (None: no problem); the languages
raise it as a :class:`~octopis.filters.language.FilterError` naming where it is.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

MAX_INTEGER = 2**53
"""Largest magnitude of an integer value (exactly representable as a double)."""


class InputLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes accepted in any filter or publication, at whichever entry it comes in —
    client, peer or file — so a copy is never accepted at one broker and refused at the
    next (DESIGN §8). A broker sets them from ``[limits]`` (:func:`set_limits`)."""

    attributes: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Attributes in one publication."""
    predicates: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Predicates in one subscription."""
    string_length: Annotated[int, msgspec.Meta(ge=1)] = 1024
    """Characters in one string value or constant."""
    name_length: Annotated[int, msgspec.Meta(ge=1)] = 128
    """Characters in one attribute name."""


_in_force = InputLimits()

VALID_ATTRIBUTES: set[str] = set()
"""Attribute names already checked against the grammar and :attr:`InputLimits.name_length`:
every broker validates every publication it receives, so the regular expression runs once
per name, not per hop. At most :data:`VALID_ATTRIBUTES_CACHED` names."""
VALID_ATTRIBUTES_CACHED = 4096


def limits_in_force() -> InputLimits:
    """The limits in force in this process."""
    return _in_force


def set_limits(limits: InputLimits) -> None:
    """Put ``limits`` in force in this process (a broker does at start)."""
    global _in_force
    _in_force = limits
    VALID_ATTRIBUTES.clear()  # names checked under the old limits are checked again


def _too_long(text: str, what: str, limit: str) -> str | None:
    """Why ``text`` (a ``what``) is over ``limits.<limit>``, or None."""
    most = getattr(_in_force, limit)
    if len(text) > most:
        return f"{what} of {len(text)} characters is over limits.{limit} ({most})"
    return None


def string_problem(value: str) -> str | None:
    """Why string ``value`` is too long, or None."""
    return _too_long(value, "a string", "string_length")


def name_problem(attr: str) -> str | None:
    """Why attribute name ``attr`` is too long, or None."""
    return _too_long(attr, "attribute name", "name_length")


def value_problem(value: object) -> str | None:
    """Why ``value`` is not a valid string or number constant (None if it is)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return f"value {value!r} is not a string or a number"
    if isinstance(value, int) and abs(value) > MAX_INTEGER:
        return f"integer {value} is out of range (at most ±2**53)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"number {value!r} is not finite"
    if isinstance(value, str):
        return string_problem(value)
    return None


def attribute_count_problem(count: int) -> str | None:
    """Why a publication of ``count`` attributes is too large, or None."""
    most = _in_force.attributes
    if count > most:
        return f"a publication of {count} attributes is over limits.attributes ({most})"
    return None


def predicate_count_problem(count: int) -> str | None:
    """Why a subscription of ``count`` predicates is too large, or None."""
    most = _in_force.predicates
    if count > most:
        return f"a subscription of {count} predicates is over limits.predicates ({most})"
    return None
