"""Matching publications against stored subscriptions (the hottest code of a broker).

Every OctopiS broker stores every subscription (paper §5) and matches every notification
it handles against all of them (§6.2), so this is where a broker spends its time.

Two implementations share one API and one semantics (:meth:`Subscription.matches`):

* :class:`ReferenceMatcher` — plain Python, one subscription after the other; the
  readable definition the property tests compare against.
* :class:`Matcher` — compiled (``octopis/_match.pyx``: storage and API; index building
  in ``_match_index.pxi``, matching in ``_match_query.pxi``): string *cells* and
  per-attribute *bucket bitmaps*.

A simulation's tables share one :class:`Matcher` through :class:`SharedMatcher` (each
part a :class:`SharedPart` of the same API), so that N brokers hold a subscription once.

API: ``add(key, subscription)`` (any hashable key; an existing key raises KeyError),
``remove(key)`` (an unknown key raises KeyError), ``match(publication) -> list`` of the
matching keys (each once, order unspecified), ``match_many(publications)``, ``len()``,
``key in matcher`` and ``matcher[key]`` (the stored subscription). A subscription may be
added with a small integer ``group`` (the routing core uses its next hop), and
``match_groups(publication)`` returns ``{group: one matching key}`` for the groups with a
match: Algorithm 3's distinct next destinations, computed without materialising every
matching key; ``match_values(publication, values)`` returns ``{values[group]}`` for the
same groups (the next hops themselves). ``Matcher`` also has ``rebuild()`` and ``stats()``,
and records every group match in a :class:`MatchClock` given as ``Matcher(clock=...)``.


Why bucket bitmaps. The workloads are conjunctions of equality and range predicates over
a few attributes (paper §7: stock quotes, 10 attributes, 2% selectivity), but a
subscription need not have one selective predicate: two bands of 14% each, four of 21%,
up to six predicates over ten attributes (:mod:`octopis.shapes`).

* The *counting algorithm* (SIENA's forwarding table, Carzaniga & Wolf 2003; Yan &
  Garcia-Molina's counting) finds every satisfied predicate and counts per subscription.
  With range predicates about half of all predicates on an attribute hold for any value,
  so a notification costs work in proportion to the predicates, not to the matches.
* *BE-Tree* (Sadoghi & Jacobsen 2011) partitions the subscription space recursively and
  clusters subscriptions under selective predicates; it adapts to skew, but its
  maintenance (splits, cluster moves) is heavy.
* An *access-predicate* index (this matcher's first design) keeps BE-Tree's idea at one
  level: each subscription is found through its most selective predicate and verified
  against the rest. Exact and fast when one predicate is selective (a symbol), it
  verified 7 to 100 times more candidates than matches when none is (bench/RESULTS.md).
* *Bitmap indexes* with binned values (as in FastBit; Wu, Otoo & Shoshani 2006) combine
  predicates 64 subscriptions at a time: per attribute and bucket of values, one bit per
  subscription says whether its predicates on the attribute hold for every value of the
  bucket; ANDing one bitmap per attribute decides the conjunction, and only the few
  subscriptions whose boundary lies inside the publication's bucket need a check.

The compiled matcher combines the last two:

* *Cells*: a subscription with an ``eq``, ``str-prefix`` or ``str-postfix`` sits in the
  cell of its most selective one, looked up exactly by the publication's string (and
  its prefixes and suffixes of the lengths in use); the *root* holds the others.
  ``[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,<,30]`` is never looked at for other
  symbols. Selectivity is estimated from the subscriptions themselves (a constant's
  share among the constants of that kind on that attribute): no publication history,
  deterministic, and it affects speed only, never results.
* *Columns*: for every other attribute a subscription tests, a column of bitmaps. Numbers
  fall into up to 256 buckets cut at quantiles of the ranges' boundaries (so each holds
  about as many boundaries); the 64 most frequent ``eq``/``neq`` constants get a bucket
  each (exact for every string operator), then NaN, any other string, absent. Per
  bucket: the *sure* bitmap and the *edges*, the subscriptions whose predicates hold for
  part of the bucket, each with its range (or string id) to check inline.
* *Layout*: subscriptions are ordered by cell, then by a *key range* of theirs, its
  attribute first (a group of over 1,000 testing the same attributes keeps words of its
  own): so the subscriptions one value satisfies on that attribute sit together, and
  most words are empty after its column; within a slice of a cell's key ranges, a group of
  a word or more testing the same attributes keeps words of its own too, so that where
  many small groups share a key range's attribute a word still tests few attributes. The
  key range is the first
  range, or, for a group of subscriptions testing the same attributes, the range on the
  attribute that is clearly the most selective on average (estimated, like a cell's, from
  the subscriptions alone: the share of all boundaries on the attribute that a range
  holds). Words form chunks of at most 32 (a new chunk where a long run of words testing
  the same attributes begins); per chunk, each column has a piece: its positions there,
  the key ranges' attribute first.
* *Scan*: per chunk, the live bits ANDed with each column's piece — the sure bits of the
  publication's bucket, plus its edges in the chunk that hold (an index per bucket and
  piece finds them; the next chunk's are prefetched) — until no bit is left. Every bit
  left is a match; no subscription is verified against its whole program.
  ``match_groups`` stops at the first chunk after which every group has a match;
  ``match`` keeps the words with a match and builds its list from them, with each slot's
  key at hand. Taking a reference to every matching key is most of ``match``'s time
  where publications match thousands of subscriptions (a cache miss per key when the
  keys lie where they were allocated), so a build copies int and tuple keys in slot
  order (``_slot_copy``: an equal key of the same type), and the list is filled two
  stages ahead (where a key is, then the key).

Memory: per column, 8 bytes per bucket and word of 64 subscriptions testing the attribute,
24 per edge (at most two per range), 4 per bucket and chunk; 16 per subscription for its
key, and its copy (32 bytes for an int): 0.1–0.4 KB per subscription at 100k and 1M
(bench/RESULTS.md). Building costs O(n log n),
about 0.3 s at 100k subscriptions.

Maintenance is lazy and amortised: ``add`` compiles the subscription into a pending
list that ``match`` verifies in full; ``remove`` clears the subscription's live bit.
``match`` rebuilds the index once the pending list exceeds ``pending_limit`` + 1/32 of
the index and verifying it since the last build has cost about a build, once it exceeds
a quarter of the index, or once a quarter of the index is dead.

Numbers compare as C doubles in the compiled matcher, exactly like Python as long as
integers stay within ±2**53 (which :mod:`octopis.filters` enforces for constants and
checked publications). NaN and infinities in publications follow Python's comparisons.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from itertools import combinations
from typing import Any

from octopis._match import MATCH_BUCKETS, MatchClock, Matcher, check_entry
from octopis.filters.covering import CoverForm, cover_form
from octopis.filters.language import Subscription

__all__ = ["MATCH_BUCKETS", "CoverIndex", "MatchClock", "Matcher", "ReferenceMatcher"]


class ReferenceMatcher:
    """The readable definition: every subscription's :meth:`Subscription.matches`, in turn."""

    def __init__(self) -> None:
        self._subscriptions: dict[Hashable, Subscription] = {}
        self._groups: dict[Hashable, int] = {}

    def add(self, key: Hashable, subscription: Subscription, group: int | None = None) -> None:
        """Store ``subscription`` under ``key``; a key already present raises KeyError.

        ``group`` (a small integer ≥ 0, e.g. the index of a next hop) is what
        :meth:`match_groups` reports for this subscription.
        """
        check_entry(subscription, group)
        if key in self._subscriptions:
            raise KeyError(key)
        if group is not None:
            self._groups[key] = group
        self._subscriptions[key] = subscription

    def remove(self, key: Hashable) -> None:
        """Forget the subscription stored under ``key``; an unknown key raises KeyError."""
        del self._subscriptions[key]
        self._groups.pop(key, None)

    def match_groups(self, publication: Mapping[str, object]) -> dict[int, Hashable]:
        """``{group: key}``: every group with a matching subscription, each with one of its
        matching keys (subscriptions added without a group are left out)."""
        found: dict[int, Hashable] = {}
        for key in self.match(publication):
            if key in self._groups:
                found.setdefault(self._groups[key], key)
        return found

    def match_values(self, publication: Mapping[str, object], values: list) -> set:
        """``{values[group]}`` for the groups :meth:`match_groups` finds."""
        return {values[group] for group in self.match_groups(publication)}

    def match(self, publication: Mapping[str, object]) -> list:
        """Keys of the subscriptions ``publication`` satisfies, each once."""
        return [k for k, s in self._subscriptions.items() if s.matches(publication)]

    def match_many(self, publications: Iterable[Mapping[str, object]]) -> list[list]:
        """``[self.match(p) for p in publications]``."""
        return [self.match(p) for p in publications]

    def __len__(self) -> int:
        return len(self._subscriptions)

    def __contains__(self, key: object) -> bool:
        return key in self._subscriptions

    def __getitem__(self, key: Hashable) -> Subscription:
        """The subscription stored under ``key``."""
        return self._subscriptions[key]


class _File:
    """The subscriptions of one file of a :class:`CoverIndex`, ordered by the lower
    bound of their numeric range on the file's *lead* attribute (the first of its
    attributes), each with the upper bound: F can cover S only if F's range there holds
    S's, so a query walks only the part of the order where that can be, and tests
    covering on those whose upper bound fits too. (Bounds ignore openness: a necessary
    condition; an attribute without a numeric range has (-inf, inf).)"""

    __slots__ = ("entries", "lead", "where")

    def __init__(self, lead: str) -> None:
        self.lead = lead
        self.entries: list[tuple[float, int, float, Hashable, CoverForm]] = []
        """(lower bound, serial, upper bound, key, form), in order."""
        self.where: dict[Hashable, tuple[float, int]] = {}

    def add(self, key: Hashable, form: CoverForm, serial: int) -> None:
        lo, hi = _bounds(form, self.lead)
        insort(self.entries, (lo, serial, hi, key, form))
        self.where[key] = (lo, serial)

    def remove(self, key: Hashable) -> None:
        place = self.where.pop(key)
        del self.entries[bisect_left(self.entries, place, key=_place)]

    def covering(self, form: CoverForm) -> Iterator[tuple[Hashable, CoverForm]]:
        """Members whose range on the lead attribute holds ``form``'s."""
        lo, hi = _bounds(form, self.lead)
        end = bisect_right(self.entries, lo, key=_lower)
        return ((k, f) for _, _, top, k, f in self.entries[:end] if top >= hi)

    def covered(self, form: CoverForm) -> Iterator[tuple[Hashable, CoverForm]]:
        """Members whose range on the lead attribute lies within ``form``'s."""
        lo, hi = _bounds(form, self.lead)
        start = bisect_left(self.entries, lo, key=_lower)
        end = bisect_right(self.entries, hi, key=_lower)
        return ((k, f) for _, _, top, k, f in self.entries[start:end] if top <= hi)

    def __len__(self) -> int:
        return len(self.entries)


def _bounds(form: CoverForm, attr: str) -> tuple[float, float]:
    constraint = form.constraints.get(attr)
    if constraint is None or not constraint.numeric:
        return (-math.inf, math.inf)
    return (constraint.lo, constraint.hi)


def _lower(entry: tuple) -> float:
    return entry[0]


def _place(entry: tuple) -> tuple[float, int]:
    return entry[0], entry[1]


class CoverIndex:
    """Subscriptions filed for covering queries (:func:`octopis.filters.covering.covers`): which
    stored ones cover a given subscription (:meth:`covering`), which it covers
    (:meth:`covered`), without testing every stored one.

    A subscription F can cover S only if each equality of F is one of S's (an ``eq`` or
    ``=`` is implied by nothing else) and each attribute F constrains is constrained by
    S. So subscriptions are filed by their set of equalities, then by their set of
    attributes: a query looks only at the files whose sets are subsets (covering) or
    supersets (covered) of the query's, and in each only at the members whose range on
    the file's first attribute can hold (or lie within) the query's (:class:`_File`);
    it tests covering on those alone. On stock quotes,
    ``[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,<,27.5]`` is tested only against
    subscriptions on MSFT's close, or on no symbol and close alone (or less), never
    against other symbols or attributes; among bands of equal width on one attribute,
    only those with the same bounds are tested."""

    __slots__ = ("_files", "_forms", "_holding", "_serial")

    def __init__(self) -> None:
        self._forms: dict[Hashable, CoverForm] = {}
        self._files: dict[frozenset, dict[frozenset[str], _File]] = {}
        """equalities → attributes → file."""
        self._holding: dict[tuple, set[frozenset]] = {}
        """One equality → the equality sets of the files that hold it."""
        self._serial = 0

    def add(self, key: Hashable, subscription: Subscription | CoverForm) -> CoverForm:
        """File ``subscription`` under ``key`` (its :func:`~octopis.filters.covering.cover_form`
        unless given as a form) and return its form; a key already present raises
        KeyError."""
        if key in self._forms:
            raise KeyError(key)
        form = subscription if isinstance(subscription, CoverForm) else cover_form(subscription)
        self._forms[key] = form
        by_attributes = self._files.get(form.equalities)
        if by_attributes is None:
            by_attributes = self._files[form.equalities] = {}
            for equality in form.equalities:
                self._holding.setdefault(equality, set()).add(form.equalities)
        file = by_attributes.get(form.attributes)
        if file is None:
            file = by_attributes[form.attributes] = _File(min(form.attributes))
        self._serial += 1
        file.add(key, form, self._serial)
        return form

    def remove(self, key: Hashable) -> None:
        """Forget ``key``; an unknown key raises KeyError."""
        form = self._forms.pop(key)
        by_attributes = self._files[form.equalities]
        file = by_attributes[form.attributes]
        file.remove(key)
        if file:
            return
        del by_attributes[form.attributes]
        if by_attributes:
            return
        del self._files[form.equalities]
        for equality in form.equalities:
            holding = self._holding[equality]
            holding.discard(form.equalities)
            if not holding:
                del self._holding[equality]

    def form(self, key: Hashable) -> CoverForm:
        """The form filed under ``key``."""
        return self._forms[key]

    def __len__(self) -> int:
        return len(self._forms)

    def __contains__(self, key: object) -> bool:
        return key in self._forms

    def covering(self, form: CoverForm) -> Iterator[Hashable]:
        """The keys of the stored subscriptions that cover ``form`` (its own key too, if
        it is stored); lazily, so a caller may stop at the first it can use."""
        equalities, attributes = form.equalities, form.attributes
        files = self._files
        if 2 ** len(equalities) <= len(files):
            subsets: Iterable[frozenset] = (
                frozenset(c)
                for n in range(len(equalities) + 1)
                for c in combinations(equalities, n)
            )
        else:
            subsets = [e for e in files if e <= equalities]
        for subset in subsets:
            by_attributes = files.get(subset)
            if by_attributes is None:
                continue
            for attrs, file in list(by_attributes.items()):
                if attrs <= attributes:
                    for key, member in file.covering(form):
                        if member.covers(form):
                            yield key

    def covered(self, form: CoverForm) -> Iterator[Hashable]:
        """The keys of the stored subscriptions ``form`` covers (its own key too, if it is
        stored), lazily."""
        equalities, attributes = form.equalities, form.attributes
        if equalities:
            holding = sorted((self._holding.get(e, set()) for e in equalities), key=len)
            supersets = set(holding[0]).intersection(*holding[1:])
        else:
            supersets = set(self._files)
        for superset in supersets:
            by_attributes = self._files.get(superset)
            if by_attributes is None:
                continue
            for attrs, file in list(by_attributes.items()):
                if attrs >= attributes:
                    for key, member in file.covered(form):
                        if form.covers(member):
                            yield key


CACHED = 256
"""Publications whose matching keys are kept (the ones matched last)."""


class SharedMatcher:
    """The subscriptions of every part of every table of a simulation, each compiled once.

    Every broker of a SCOT stores every subscription (paper §5): N brokers and S
    subscriptions hold N × S routing entries, about 450 bytes each with a compiled
    matcher per part (4.5 GB at 1,000 brokers × 10,000 subscriptions), though every copy
    is the same immutable :class:`Subscription` that SBP passes on. Here one compiled
    :class:`Matcher` holds each subscription once (keyed by its network-wide sub_id,
    counted by the parts that hold it), and each part of each table is a
    :class:`SharedPart`: only ``sub_id → group``, behind the matcher API the tables use
    (``add``, ``remove``, ``match_groups``, ``match_values``, ``len``); real brokers keep
    their own compiled matcher per part. A publication's matching keys are computed once
    and kept, while the subscriptions do not change, for the :data:`CACHED` matched last
    (a publication is known by the object: it must not change while in flight, which the
    simulator's never do).

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
