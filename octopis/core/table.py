"""Routing tables: entries ``(filter, last_hop, cbv)`` backed by matchers (paper §5).

Entries are split into disjoint *parts*, each with its own matcher and a map from
subscription id to the value routing needs from a match (the last hop, or for BID the
host broker). A clustered broker in cluster c has three parts: its local subscribers,
*primary* entries (cbv bit c, last hop over an aCOL) and *secondary* entries (bit k ≠ c,
last hop B(x, k) over an iCOL). A notification that enters from another broker never
needs the secondary part (§6.2), so it is matched against a fraction of the table; and
the distinct next hops of a match (Algorithm 3's getDistinctSubs) come out of one
C-level pass over the matching keys rather than a Python loop per entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from bitarray import frozenbitarray

from octopis.core.messages import ProtocolError
from octopis.filters import Publication, Subscription


class MatcherLike(Protocol):
    """The matcher API (``octopis.matching``) the tables rely on."""

    def add(self, key: str, subscription: Subscription) -> None: ...
    def remove(self, key: str) -> None: ...
    def match(self, publication: Publication) -> list: ...
    def __len__(self) -> int: ...


MatcherFactory = Callable[[], MatcherLike]


@dataclass(slots=True)
class RoutingEntry:
    """One routing-table entry ``(filter, last_hop, cbv)``.

    ``local`` marks a subscriber of this broker (``last_hop`` is then the subscriber);
    ``cluster`` caches the index of the CBV's single set bit; ``hops`` is the entry's
    distance from the host broker along the subscription tree (bookkeeping only).
    """

    sub_id: str
    subscription: Subscription
    last_hop: str
    cbv: frozenbitarray | None
    cluster: int
    local: bool
    host: str
    hops: int


class _Part:
    __slots__ = ("matcher", "value")

    def __init__(self, matcher: MatcherLike) -> None:
        self.matcher = matcher
        self.value: dict[str, str] = {}


class RoutingTable:
    """Entries by ``sub_id``, split into parts with a matcher and a value map each.

    ``part_of(entry)`` names the entry's part and ``value_of(entry)`` the value a match of
    it yields (its last hop unless told otherwise).
    """

    def __init__(
        self,
        parts: tuple[str, ...],
        matcher_factory: MatcherFactory,
        part_of: Callable[[RoutingEntry], str],
        value_of: Callable[[RoutingEntry], str] = lambda e: e.last_hop,
    ) -> None:
        self.entries: dict[str, RoutingEntry] = {}
        self._parts = {name: _Part(matcher_factory()) for name in parts}
        self._part_of = part_of
        self._value_of = value_of

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self.entries

    def add(self, entry: RoutingEntry) -> None:
        """Store ``entry``; a second entry for the same subscription is a protocol error."""
        if entry.sub_id in self.entries:
            raise ProtocolError(f"subscription {entry.sub_id} is already stored")
        part = self._parts[self._part_of(entry)]
        part.matcher.add(entry.sub_id, entry.subscription)
        part.value[entry.sub_id] = self._value_of(entry)
        self.entries[entry.sub_id] = entry

    def remove(self, sub_id: str) -> RoutingEntry:
        """Drop and return the entry of ``sub_id``."""
        entry = self.entries.pop(sub_id, None)
        if entry is None:
            raise ProtocolError(f"subscription {sub_id} is not stored")
        part = self._parts[self._part_of(entry)]
        part.matcher.remove(sub_id)
        del part.value[sub_id]
        return entry

    def size(self, part: str) -> int:
        """Entries in ``part``."""
        return len(self._parts[part].value)

    def values(self, part: str, publication: Publication) -> set[str]:
        """The distinct values (next hops) of the entries of ``part`` matching."""
        p = self._parts[part]
        return set(map(p.value.__getitem__, p.matcher.match(publication)))

    def by_value(self, part: str, publication: Publication) -> dict[str, str]:
        """One matching ``sub_id`` per distinct value of the entries of ``part``."""
        p = self._parts[part]
        keys = p.matcher.match(publication)
        return dict(zip(map(p.value.__getitem__, keys), keys, strict=True))
