"""Routing tables: entries ``(filter, last_hop, cbv)`` backed by matchers (paper §5).

A clustered broker in cluster c splits its entries by the bit set in their CBV: *own*
entries (bit c: local subscribers and primary entries pointing along aCOLs) and
*secondary* entries (bit k ≠ c, pointing over the iCOL to B(x, k)). Notifications that
enter a broker from another broker only ever need the own entries (§6.2), so each part
has its own matcher and a forwarded notification is matched against 1/n of the table.
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


class RoutingTable:
    """Entries by ``sub_id`` plus matchers over disjoint parts of them.

    ``part_of(entry)`` names the matcher an entry belongs to; ``match(part, pub)``
    returns the matching entries of that part.
    """

    def __init__(
        self,
        parts: tuple[str, ...],
        matcher_factory: MatcherFactory,
        part_of: Callable[[RoutingEntry], tuple[str, ...]],
    ) -> None:
        self.entries: dict[str, RoutingEntry] = {}
        self.matchers = {part: matcher_factory() for part in parts}
        self._part_of = part_of

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self.entries

    def add(self, entry: RoutingEntry) -> None:
        """Store ``entry``; a second entry for the same subscription is a protocol error."""
        if entry.sub_id in self.entries:
            raise ProtocolError(f"subscription {entry.sub_id} is already stored")
        self.entries[entry.sub_id] = entry
        for part in self._part_of(entry):
            self.matchers[part].add(entry.sub_id, entry.subscription)

    def remove(self, sub_id: str) -> RoutingEntry:
        """Drop and return the entry of ``sub_id``."""
        entry = self.entries.pop(sub_id, None)
        if entry is None:
            raise ProtocolError(f"subscription {sub_id} is not stored")
        for part in self._part_of(entry):
            self.matchers[part].remove(sub_id)
        return entry

    def match(self, part: str, publication: Publication) -> list[RoutingEntry]:
        """Entries of ``part`` whose filter matches ``publication``."""
        entries = self.entries
        return [entries[key] for key in self.matchers[part].match(publication)]
