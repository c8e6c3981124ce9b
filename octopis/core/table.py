"""Routing tables: entries ``(filter, last_hop, cbv)`` backed by matchers (paper §5).

Entries are split into disjoint *parts*, each with its own matcher; every entry is added
with the value routing needs from a match (the last hop, or for BID the host broker) as
its matcher *group*. A clustered broker in cluster c has three parts: its local subscribers,
*primary* entries (cbv bit c, last hop over an aCOL) and *secondary* entries (bit k ≠ c,
last hop B(x, k) over an iCOL). A notification that enters from another broker never
needs the secondary part (§6.2), so it is matched against a fraction of the table; and
the distinct next hops of a match (Algorithm 3's getDistinctSubs) come straight out of
the compiled matcher (``match_values``) rather than from a Python loop per entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from bitarray import frozenbitarray

from octopis.core.messages import ProtocolError
from octopis.filters.language import Publication, Subscription


class MatcherLike(Protocol):
    """The matcher API (``octopis.matching``) the tables rely on."""

    def add(self, key: str, subscription: Subscription, group: int | None = None) -> None: ...
    def remove(self, key: str) -> None: ...
    def match_groups(self, publication: Publication) -> dict[int, str]: ...
    def match_values(self, publication: Publication, values: list[str]) -> set[str]: ...
    def __len__(self) -> int: ...


MatcherFactory = Callable[[], MatcherLike]


@dataclass(frozen=True, slots=True)
class RoutingEntry:
    """One routing-table entry ``(filter, last_hop, cbv)``.

    ``local`` marks a subscriber of this broker (``last_hop`` is then the subscriber);
    ``cluster`` caches the index of the CBV's single set bit; ``hops`` is the entry's
    distance from the host broker along the subscription tree when it was stored
    (bookkeeping only: a move inside the cluster leaves it as it was); ``issued_at`` is
    when the subscription was made (a covering broker that passes it on later keeps it).
    Immutable: brokers that stored the same message object from the same neighbour
    share one entry (see ``Subscribe.stored``).
    """

    sub_id: str
    subscription: Subscription
    last_hop: str
    cbv: frozenbitarray | None
    cluster: int
    local: bool
    host: str
    hops: int
    issued_at: float = 0.0


LOCAL_PART = "local"
"""The table part of the entries of this broker's own subscribers, in every mode."""


class TablePart:
    """A matcher whose groups number the distinct values (next hops) of its entries:
    ``matcher.match_values(publication, value)`` is :meth:`RoutingTable.values`."""

    __slots__ = ("group", "matcher", "value")

    def __init__(self, matcher: MatcherLike) -> None:
        self.matcher = matcher
        self.group: dict[str, int] = {}
        self.value: list[str] = []

    def group_of(self, value: str) -> int:
        group = self.group.get(value)
        if group is None:
            group = self.group[value] = len(self.value)
            self.value.append(value)
        return group


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
        value_of: Callable[[RoutingEntry], str] = attrgetter("last_hop"),
    ) -> None:
        self.entries: dict[str, RoutingEntry] = {}
        self._parts = {name: TablePart(matcher_factory()) for name in parts}
        self._part_of = part_of
        self._value_of = value_of

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self.entries

    def add(self, entry: RoutingEntry) -> None:
        """Store ``entry``; a second entry for the same subscription is a protocol error."""
        sub_id = entry.sub_id
        if sub_id in self.entries:
            raise ProtocolError(f"subscription {sub_id} is already stored")
        part = self._parts[self._part_of(entry)]
        value = self._value_of(entry)
        group = part.group.get(value)
        if group is None:
            group = part.group_of(value)
        part.matcher.add(sub_id, entry.subscription, group)
        self.entries[sub_id] = entry

    def remove(self, sub_id: str) -> RoutingEntry:
        """Drop and return the entry of ``sub_id``."""
        entry = self.entries.pop(sub_id, None)
        if entry is None:
            raise ProtocolError(f"subscription {sub_id} is not stored")
        self._parts[self._part_of(entry)].matcher.remove(sub_id)
        return entry

    def replace(self, entry: RoutingEntry) -> RoutingEntry:
        """Put ``entry`` in place of the stored entry of its subscription (which must
        exist) and return the old one; the matcher is touched only when the part or the
        value changes (a new last hop), not for bookkeeping (host, hops)."""
        old = self.entries.get(entry.sub_id)
        if old is None:
            raise ProtocolError(f"subscription {entry.sub_id} is not stored")
        if self._part_of(old) == self._part_of(entry) and self._value_of(old) == self._value_of(
            entry
        ):
            self.entries[entry.sub_id] = entry
            return old
        self.remove(entry.sub_id)
        self.add(entry)
        return old

    def part(self, name: str) -> TablePart:
        """The part ``name`` itself, for a router that matches it on every notification
        (one object for the table's life)."""
        return self._parts[name]

    def size(self, part: str) -> int:
        """Entries in ``part``."""
        return len(self._parts[part].matcher)

    def values(self, part: str, publication: Publication) -> set[str]:
        """The distinct values (next hops) of the entries of ``part`` matching."""
        p = self._parts[part]
        return p.matcher.match_values(publication, p.value)

    def by_value(self, part: str, publication: Publication) -> dict[str, str]:
        """One matching ``sub_id`` per distinct value of the entries of ``part``."""
        p = self._parts[part]
        return {p.value[g]: key for g, key in p.matcher.match_groups(publication).items()}
