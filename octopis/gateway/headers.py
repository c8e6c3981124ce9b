"""STOMP headers as typed publication attributes, and back (DESIGN §13).

The typing rule: a header value that is a JSON number (``27.9``, ``-3``, ``1e6``; not
``007``, ``+5``, ``.5``, ``0x1F``, ``NaN``) is a number; every other value is a string.
A sender forces strings with the header ``octopis-strings``, a comma-separated list of
header names whose values stay strings whatever they read as (``octopis-strings:
zip,account``). Integers beyond ±2**53 and numbers beyond a double's range stay strings
too, so that every number compares exactly.

Not attributes: the frame's own headers ``destination`` (it gives ``class``),
``content-length``, ``receipt``, ``transaction`` and ``octopis-strings``. A header named
``class`` is refused (the destination sets it), and so is a header whose name the overlay
does not allow as an attribute — the error names it.

Back to headers, a number is written in its canonical form (``27.90`` arrives as
``27.9``, ``1e3`` as ``1000.0``); a sender that needs the text kept forces a string.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from octopis.filters.language import (
    ATTRIBUTE_NAME,
    FilterError,
    Publication,
    validate_publication,
)
from octopis.filters.limits import MAX_INTEGER

STRINGS_HEADER = "octopis-strings"
"""The header listing header names whose values stay strings."""
FRAME_HEADERS = frozenset(("destination", "content-length", "receipt", "transaction"))
"""SEND headers that belong to the frame, not to the publication."""
TOPIC_PREFIX = "/topic/"

_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


class HeaderError(ValueError):
    """A SEND's headers that cannot become a publication; the message names the header."""


def typed_value(text: str) -> str | int | float:
    """``text`` as a number when it is a JSON number the overlay can compare exactly,
    else ``text`` itself."""
    m = _JSON_NUMBER.fullmatch(text)
    if m is None:
        return text
    if m.group(1) is None and m.group(2) is None:
        value = int(text)
        return value if abs(value) <= MAX_INTEGER else text
    number = float(text)
    return number if math.isfinite(number) else text


def topic_of(destination: str | None) -> str:
    """The topic name of a ``/topic/NAME`` destination (HeaderError otherwise)."""
    if destination is None:
        raise HeaderError("missing header 'destination'")
    if not destination.startswith(TOPIC_PREFIX) or len(destination) == len(TOPIC_PREFIX):
        raise HeaderError(
            f"destination {destination[:80]!r}: only /topic/<name> destinations are served"
        )
    return destination[len(TOPIC_PREFIX) :]


def publication_of(headers: Mapping[str, str]) -> Publication:
    """The publication a SEND with ``headers`` makes: ``class`` from its destination,
    every other header typed by the rule above. Raises HeaderError naming the header
    (or the limit) that cannot be one."""
    strings = {name.strip() for name in headers.get(STRINGS_HEADER, "").split(",") if name.strip()}
    publication: Publication = {"class": topic_of(headers.get("destination"))}
    for name, value in headers.items():
        if name in FRAME_HEADERS or name == STRINGS_HEADER:
            continue
        if name == "class":
            raise HeaderError("header 'class' is not allowed: the destination sets the class")
        if not ATTRIBUTE_NAME.fullmatch(name):
            raise HeaderError(
                f"header {name[:80]!r}: not a valid attribute name (letters, digits, _, %, ., "
                "- starting with a letter or _)"
            )
        publication[name] = value if name in strings else typed_value(value)
    try:
        return validate_publication(publication)
    except FilterError as e:
        raise HeaderError(str(e)) from None


def _text(value: str | int | float) -> str:
    return value if isinstance(value, str) else repr(value)


def headers_of(publication: Mapping[str, str | int | float]) -> dict[str, str]:
    """The MESSAGE headers of a publication: ``destination`` from its class (when it is a
    string) and every other attribute as text. Numbers keep their canonical form; a
    string that would read back as a number is listed in ``octopis-strings`` so a
    subscriber that forwards the frame keeps its type."""
    headers: dict[str, str] = {}
    kept: list[str] = []
    for name, value in publication.items():
        if name == "class" and isinstance(value, str):
            headers["destination"] = TOPIC_PREFIX + value
            continue
        headers[name] = _text(value)
        if isinstance(value, str) and not isinstance(typed_value(value), str):
            kept.append(name)
    if kept:
        headers[STRINGS_HEADER] = ",".join(kept)
    return headers
