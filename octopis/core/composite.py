"""The join of a composite subscription at its subscriber's host (DESIGN §12), sans-IO.

The parts of a composite subscription route as ordinary subscriptions (their variables
as ``isPresent``, a superset); every publication that reaches the host for one of them is
offered to the composite's :class:`CompositeJoin` with the host's clock, and the join
returns the matches it completes. What a match is, is defined by
:class:`~octopis.filters.composite.Composite`: a set of publications satisfying the AND/OR
expression with equal variable bindings, its publication times (``published_at``) at
most ``window`` apart. Each match is returned once: when its last publication arrives
(a set is complete only then, and every way it satisfies the expression is found then).

State is bounded. A publication is kept only if it fills a part under an AND (a part
reached only through ORs is a match alone), and only while it can still join: until the
host's clock passes its ``published_at`` by ``window + lateness``. A publication that
reaches the host more than ``lateness`` seconds after it was published may miss
partners already let go: it is counted as :attr:`CompositeJoin.late`. At most
``max_held`` publications are kept; past that the earliest published goes first,
counted as :attr:`CompositeJoin.dropped` (matches it would have made are missed: the
count says so). One arriving publication completes at most ``max_held`` matches; an
arrival that would complete more is counted as :attr:`CompositeJoin.cut`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from octopis.defaults import COMPOSITE_HELD, COMPOSITE_LATENESS
from octopis.filters.composite import Composite, Join
from octopis.filters.language import Value

PartKey = tuple[str, int, int]
"""(publisher, session, seq): one publication."""


@dataclass(slots=True)
class Held:
    """A publication offered to a join: what it binds for each part it fills."""

    key: PartKey
    published_at: float
    publication: Mapping[str, Any]
    bound: dict[int, dict[str, Value]]
    """Part index → the variables the publication binds as that part."""
    payload: Any = None
    """What the caller gave with it (returned in matches as is)."""


@dataclass(frozen=True, slots=True)
class Match:
    """One composite match: its publications, earliest published first (then by key),
    each with the indices of the parts it fills in this match."""

    parts: tuple[tuple[Held, tuple[int, ...]], ...]

    @property
    def keys(self) -> frozenset[PartKey]:
        return frozenset(held.key for held, _ in self.parts)


@dataclass(slots=True)
class _State:
    """A partial match: part → publication, the variables bound, the time span."""

    assigned: tuple[tuple[int, Held], ...]
    bound: dict[str, Value]
    first: float
    last: float


@dataclass
class CompositeJoin:
    """The join of one composite subscription (module docstring: what is kept, for how
    long, and what is counted)."""

    composite: Composite
    max_held: int = COMPOSITE_HELD
    lateness: float = COMPOSITE_LATENESS
    held: dict[PartKey, Held] = field(default_factory=dict)
    """The publications kept, by key."""
    offered: int = 0
    """Publications offered that fill at least one part."""
    matches: int = 0
    """Matches returned."""
    dropped: int = 0
    """Publications let go to stay within ``max_held`` while they could still join."""
    late: int = 0
    """Publications offered more than ``lateness`` seconds after they were published."""
    cut: int = 0
    """Arrivals whose matches were cut at ``max_held``."""

    def __post_init__(self) -> None:
        if self.max_held < 1 or self.lateness < 0:
            raise ValueError("a composite join needs max_held ≥ 1 and lateness ≥ 0")
        parts = self.composite.parts
        self._variables = [tuple(sorted({b.variable for b in p.bindings})) for p in parts]
        self._joined = _under_and(self.composite.expression, False)
        """The parts that have an AND above them: only their publications are kept."""
        self._index: list[dict[tuple[Value, ...], dict[PartKey, Held]]] = [{} for _ in parts]
        """Per part: the kept publications filling it, by the values of its variables."""
        self._by_time: list[tuple[float, int, PartKey]] = []
        self._order = itertools.count()

    @property
    def window(self) -> float | None:
        return self.composite.window

    def offer(
        self,
        key: PartKey,
        published_at: float,
        publication: Mapping[str, Any],
        now: float,
        payload: Any = None,
    ) -> list[Match]:
        """Publication ``key`` reached the host at time ``now`` (the clock
        ``published_at`` is read from): the matches it completes, each once. A
        publication kept already (a repeat) completes nothing."""
        if key in self.held:
            return []
        window = self.window
        if window is not None:
            self._forget(now - window - self.lateness)
        bound = {}
        for i, part in enumerate(self.composite.parts):
            b = part.bind(publication)
            if b is not None:
                bound[i] = b
        if not bound:
            return []
        self.offered += 1
        if window is not None and now - published_at > self.lateness:
            self.late += 1
        p = Held(key, published_at, publication, bound, payload)
        if any(i in self._joined for i in bound):
            self._keep(p)
        found = self._matches(p)
        self.matches += len(found)
        if window is not None:
            self._forget(now - window - self.lateness)
        while len(self.held) > self.max_held:
            self._let_go()
            self.dropped += 1
        return found

    # -- what is kept ------------------------------------------------------------------

    def _keep(self, p: Held) -> None:
        self.held[p.key] = p
        for i, b in p.bound.items():
            if i in self._joined:
                values = tuple(b[v] for v in self._variables[i])
                self._index[i].setdefault(values, {})[p.key] = p
        heapq.heappush(self._by_time, (p.published_at, next(self._order), p.key))

    def _let_go(self) -> None:
        """Forget the earliest published publication kept."""
        _, _, key = heapq.heappop(self._by_time)
        p = self.held.pop(key)
        for i, b in p.bound.items():
            if i in self._joined:
                values = tuple(b[v] for v in self._variables[i])
                bucket = self._index[i][values]
                del bucket[key]
                if not bucket:
                    del self._index[i][values]

    def _forget(self, before: float) -> None:
        """Forget what was published before ``before`` (it can no longer join)."""
        while self._by_time and self._by_time[0][0] < before:
            self._let_go()

    # -- matching ----------------------------------------------------------------------

    def _matches(self, p: Held) -> list[Match]:
        """Every match that contains ``p``: each set once, with the parts each of its
        publications fills in any of the ways the set satisfies the expression."""
        found: dict[frozenset[PartKey], dict[PartKey, set[int]]] = {}
        members: dict[PartKey, Held] = {}
        start = _State((), {}, p.published_at, p.published_at)
        for state in self._walk(self.composite.expression, start, p):
            keys = frozenset(held.key for _, held in state.assigned)
            roles = found.get(keys)
            if roles is None:
                if len(found) >= self.max_held:
                    self.cut += 1
                    break
                roles = found[keys] = {}
            for i, held in state.assigned:
                roles.setdefault(held.key, set()).add(i)
                members[held.key] = held
        out = []
        for roles in found.values():
            ordered = sorted(roles, key=lambda k: (members[k].published_at, k))
            out.append(Match(tuple((members[k], tuple(sorted(roles[k]))) for k in ordered)))
        return out

    def _walk(self, node: int | Join, state: _State, p: Held | None) -> Iterator[_State]:
        """The extensions of ``state`` by ``node``: with ``p`` given, those that place
        ``p`` under ``node``; without, those made of kept publications."""
        if isinstance(node, int):
            yield from self._place(node, state, p)
        elif node.op == "|":
            for term in node.terms:
                yield from self._walk(term, state, p)
        elif p is None:
            yield from self._chain(node.terms, state)
        else:
            for i, term in enumerate(node.terms):
                if not any(leaf in p.bound for leaf in _leaves(term)):
                    continue
                rest = node.terms[:i] + node.terms[i + 1 :]
                for placed in self._walk(term, state, p):
                    yield from self._chain(rest, placed)

    def _chain(self, terms: tuple[int | Join, ...], state: _State) -> Iterator[_State]:
        if not terms:
            yield state
            return
        for extended in self._walk(terms[0], state, None):
            yield from self._chain(terms[1:], extended)

    def _place(self, part: int, state: _State, p: Held | None) -> Iterator[_State]:
        """``state`` with a publication as ``part``: ``p``, or each kept one that fits."""
        if p is not None:
            candidates: Iterator[Held] = iter((p,) if part in p.bound else ())
        else:
            names = self._variables[part]
            bound = state.bound
            if all(v in bound for v in names):
                bucket = self._index[part].get(tuple(bound[v] for v in names), {})
                candidates = iter(list(bucket.values()))
            else:
                candidates = (h for b in list(self._index[part].values()) for h in b.values())
        window = self.window
        for held in candidates:
            first = min(state.first, held.published_at)
            last = max(state.last, held.published_at)
            if window is not None and last - first > window:
                continue
            mine = held.bound[part]
            if any(v in state.bound and state.bound[v] != x for v, x in mine.items()):
                continue
            bound = {**state.bound, **mine} if mine else state.bound
            yield _State((*state.assigned, (part, held)), bound, first, last)


def _leaves(node: int | Join) -> Iterator[int]:
    if isinstance(node, int):
        yield node
    else:
        yield from node.leaves()


def _under_and(node: int | Join, joined: bool) -> frozenset[int]:
    """The parts under ``node`` that have an AND above them (``joined``: ``node`` has)."""
    if isinstance(node, int):
        return frozenset((node,)) if joined else frozenset()
    below = joined or node.op == "&"
    return frozenset().union(*(_under_and(t, below) for t in node.terms))
