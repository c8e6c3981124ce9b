"""Matching publications against stored subscriptions (the hottest code of a broker).

Every OctopiS broker stores every subscription (paper §5) and matches every notification
it handles against all of them (§6.2), so this is where a broker spends its time.

Two implementations share one API and one semantics (:meth:`Subscription.matches`):

* :class:`ReferenceMatcher` — plain Python, one subscription after the other; the
  readable definition the property tests compare against.
* :class:`Matcher` — compiled (``octopis/_match.pyx``: storage and API; index building
  in ``_match_index.pxi``, matching in ``_match_query.pxi``), an *access-predicate index*.

API: ``add(key, subscription)`` (any hashable key; an existing key raises KeyError),
``remove(key)`` (an unknown key raises KeyError), ``match(publication) -> list`` of the
matching keys (each once, order unspecified), ``match_many(publications)``, ``len()``,
``key in matcher`` and ``matcher[key]`` (the stored subscription). A subscription may be
added with a small integer ``group`` (the routing core uses its next hop), and
``match_groups(publication)`` returns ``{group: one matching key}`` for the groups with a
match: Algorithm 3's distinct next destinations, computed without materialising every
matching key. ``Matcher`` also has ``rebuild()`` and ``stats()``.


Why an access-predicate index. The workloads are conjunctions of equality and range
predicates over a few attributes (paper §7: stock quotes, 10 attributes, 2% selectivity).

* The *counting algorithm* (SIENA's forwarding table, Carzaniga & Wolf 2003; Yan &
  Garcia-Molina's counting) finds every satisfied predicate and counts per subscription.
  With range predicates about half of all predicates on an attribute hold for any value,
  so a notification costs work in proportion to the predicates, not to the matches.
* *BE-Tree* (Sadoghi & Jacobsen 2011) partitions the subscription space recursively and
  clusters subscriptions under selective predicates; it adapts to skew, but its
  maintenance (splits, cluster moves) is heavy for what the stock workloads need.
* The *access-predicate* scheme keeps BE-Tree's central idea at one level: each
  subscription is indexed once, under the predicate expected to be most selective, in a
  structure that returns exactly the subscriptions whose access predicate holds: string
  ids for ``eq`` (and for ``str-prefix``/``str-postfix``, looked up by the prefixes and
  suffixes of the publication's string), and per attribute sorted rays plus a centred
  interval tree for numeric ranges, where a stabbing query costs O(log n + k). Only those
  candidates are verified against the rest of their predicates, whose copy sits next to
  the index entry. ``[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,<,30]`` is found
  through ``symbol`` and never looked at for other symbols; on the stock workloads about
  half of the candidates match.

Selectivity is estimated from the subscriptions themselves: the constants of all stored
subscriptions stand for the value distribution of each attribute (an equality's estimate
is its constant's share among the equality constants on that attribute; an interval's is
the share of numeric constants inside it). This needs no publication history and is
deterministic; on the stock workloads it comes within about 10% of the candidates an
oracle choosing by true selectivity would verify. The choice affects speed only; results
never depend on it.

Maintenance is lazy and amortised: ``add`` compiles the subscription into a pending
list that ``match`` verifies in full; ``remove`` marks indexed subscriptions dead.
``match`` rebuilds the index (O(n log n)) once the pending list exceeds
``pending_limit`` + 1/32 of the index or a quarter of the index is dead.

Numbers compare as C doubles in the compiled matcher, exactly like Python as long as
integers stay within ±2**53 (which :mod:`octopis.filters` enforces for constants and
checked publications). NaN and infinities in publications follow Python's comparisons.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Iterable, Mapping
from time import perf_counter

from octopis._match import Matcher, check_entry
from octopis.filters import Subscription

__all__ = ["MatchClock", "Matcher", "ReferenceMatcher", "TimedMatcher"]


MATCH_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2)
"""Upper bounds (seconds) of :attr:`MatchClock.histogram`'s buckets; the last bucket is
everything slower."""


class MatchClock:
    """Time spent in matchers and the number of matches (the paper's matching delay, §7.2),
    with a histogram of single match times over :data:`MATCH_BUCKETS`."""

    __slots__ = ("calls", "histogram", "seconds")

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        self.histogram = [0] * (len(MATCH_BUCKETS) + 1)

    def observe(self, seconds: float) -> None:
        """Count one match that took ``seconds``."""
        self.calls += 1
        self.seconds += seconds
        self.histogram[bisect_left(MATCH_BUCKETS, seconds)] += 1


class TimedMatcher:
    """A compiled :class:`Matcher` whose ``match_groups`` adds its time to a shared clock;
    a broker process gives one clock to every part of its routing table."""

    __slots__ = ("_clock", "_matcher")

    def __init__(self, clock: MatchClock) -> None:
        self._matcher = Matcher()
        self._clock = clock

    def add(self, key: Hashable, subscription: Subscription, group: int | None = None) -> None:
        """As :meth:`Matcher.add`."""
        self._matcher.add(key, subscription, group)

    def remove(self, key: Hashable) -> None:
        """As :meth:`Matcher.remove`."""
        self._matcher.remove(key)

    def match_groups(self, publication: Mapping[str, object]) -> dict[int, Hashable]:
        """As :meth:`Matcher.match_groups`, timed."""
        started = perf_counter()
        groups = self._matcher.match_groups(publication)
        self._clock.observe(perf_counter() - started)
        return groups

    def __len__(self) -> int:
        return len(self._matcher)


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
