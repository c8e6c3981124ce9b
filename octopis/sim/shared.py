"""One compiled matcher for every routing table of a simulation (issue 16).

Every broker of a SCOT stores every subscription (paper §5): a simulation of N brokers
and S subscriptions holds N × S routing entries. With a matcher per table part, each
subscription would be compiled and indexed N times — about 450 bytes per entry, 4.5 GB
at 1,000 brokers × 10,000 subscriptions — though all copies are the same immutable
:class:`~octopis.filters.language.Subscription` object, passed from broker to broker by SBP.

Here one compiled :class:`~octopis.matching.Matcher` holds each subscription once (keyed
by its network-wide sub_id, counted by how many parts hold it), and each part of each
broker's table is a :class:`SharedPart`: only ``sub_id → group``. The matcher API the
tables use (``add``, ``remove``, ``match_groups``, ``match_values``, ``len``) is kept, so
the routing core is unchanged and real brokers keep their own compiled matcher per part.

A publication travels to many brokers; its matching keys are computed once and kept
while the set of subscriptions does not change, for the :data:`CACHED` publications
matched last (a publication is identified by the object: it must not change while in
flight, which the simulator never does). A part's ``match_groups`` then keeps, of those
keys, the ones it holds — ``{group: one of its keys}``, as the compiled matcher answers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from octopis.filters.language import Subscription
from octopis.matching import Matcher, check_entry

CACHED = 256
"""Publications whose matching keys are kept (the ones matched last)."""


class SharedMatcher:
    """The subscriptions of every part of every table, each compiled once.

    :meth:`part` is the matcher factory to give the cores (``make_broker``).
    """

    __slots__ = ("_cache", "_held", "_limit", "_matcher")

    def __init__(self, matcher_factory: Callable[[], Any] = Matcher, cache: int = CACHED) -> None:
        if cache < 1:
            raise ValueError(f"cache must hold at least one publication, got {cache}")
        self._matcher = matcher_factory()
        self._held: dict[Hashable, list] = {}
        """key → [subscription, number of parts holding it]."""
        self._cache: dict[int, tuple[Mapping[str, object], list, set]] = {}
        self._limit = cache

    def part(self) -> SharedPart:
        """A new, empty table part backed by this matcher."""
        return SharedPart(self)

    def __len__(self) -> int:
        """Distinct subscriptions held by some part."""
        return len(self._held)

    def acquire(self, key: Hashable, subscription: Subscription) -> None:
        """One more part holds ``subscription`` under ``key``. A key held with another
        subscription raises ValueError (sub_ids are unique network-wide)."""
        held = self._held.get(key)
        if held is None:
            self._matcher.add(key, subscription)
            self._held[key] = [subscription, 1]
            self._cache.clear()
            return
        if held[0] is not subscription and held[0] != subscription:
            raise ValueError(f"{key!r} is held with another subscription")
        held[1] += 1

    def release(self, key: Hashable) -> None:
        """One part less holds ``key``; the last one takes it out of the matcher."""
        held = self._held[key]
        held[1] -= 1
        if held[1]:
            return
        del self._held[key]
        self._matcher.remove(key)
        self._cache.clear()

    def matching(self, publication: Mapping[str, object]) -> tuple[list, set]:
        """The keys ``publication`` matches, as a list and as a set (cached)."""
        cache = self._cache
        hit = cache.get(id(publication))
        if hit is not None and hit[0] is publication:
            return hit[1], hit[2]
        keys = self._matcher.match(publication)
        if len(cache) >= self._limit:
            del cache[next(iter(cache))]
        cache[id(publication)] = (publication, keys, set(keys))
        return keys, cache[id(publication)][2]


class SharedPart:
    """A table part of one broker: its keys and their groups over a :class:`SharedMatcher`
    (the matcher API of :class:`octopis.core.table.MatcherLike`)."""

    __slots__ = ("_groups", "_shared")

    def __init__(self, shared: SharedMatcher) -> None:
        self._shared = shared
        self._groups: dict[Hashable, int | None] = {}

    def add(self, key: Hashable, subscription: Subscription, group: int | None = None) -> None:
        """As :meth:`Matcher.add`: a key already present raises KeyError."""
        check_entry(subscription, group)
        if key in self._groups:
            raise KeyError(key)
        held = self._shared._held.get(key)
        if held is not None and held[0] is subscription:
            held[1] += 1  # the common case of acquire: another part holds it already
        else:
            self._shared.acquire(key, subscription)
        self._groups[key] = group

    def remove(self, key: Hashable) -> None:
        """As :meth:`Matcher.remove`: an unknown key raises KeyError."""
        del self._groups[key]
        self._shared.release(key)

    def match(self, publication: Mapping[str, object]) -> list:
        """The keys of this part ``publication`` matches."""
        keys, _ = self._shared.matching(publication)
        groups = self._groups
        return [key for key in keys if key in groups]

    def match_groups(self, publication: Mapping[str, object]) -> dict[int, Hashable]:
        """``{group: key}``: each group of this part with a match, with one matching key
        (keys added without a group are left out)."""
        groups = self._groups
        if not groups:
            return {}
        found: dict[int, Hashable] = {}
        for key in groups.keys() & self._shared.matching(publication)[1]:  # in C
            group = groups[key]
            if group is not None and group not in found:
                found[group] = key
        return found

    def match_values(self, publication: Mapping[str, object], values: list) -> set:
        """As :meth:`Matcher.match_values`: ``{values[group]}`` of this part's matches."""
        return {values[group] for group in self.match_groups(publication)}

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, key: object) -> bool:
        return key in self._groups
