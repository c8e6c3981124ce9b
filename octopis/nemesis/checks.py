"""What the nemesis holds a simulated run's history to (:mod:`octopis.nemesis.scenarios`):
historic queries, durable subscribers and composite subscribers, each against a
reference computed from everything published.

- :func:`check_historic`: each historic query against what was published in its window.
- :func:`check_durables`: each durable client against its contract (every publication
  its filter matches, published from its first subscribe on, once).
- :func:`check_composites`: each composite client's matches against a brute-force
  oracle over everything published (:func:`brute_force_matches`, straight from the
  definition in :class:`~octopis.filters.composite.Composite`): each match delivered is
  a match, and once; every match whose publications all reached the host's join is
  delivered, unless the join said it may miss some (late, dropped or cut counted and
  told the client) or the host crashed. A part publication that never reached the join
  must be counted undeliverable by a broker, or it is a silent loss.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from octopis.core import Notification
from octopis.core.composite import PartKey
from octopis.filters.composite import Composite, Join
from octopis.sim.composite_clients import CompositeClients
from octopis.sim.durable_clients import DurableClient, DurableSimulator
from octopis.sim.engine import Simulator
from octopis.sim.stores import in_gaps


class Query(NamedTuple):
    """A historic query: who asked it, for the publications whose ``x`` is below ``k``
    published in ``[after, until)`` (the simulator's time)."""

    asker: str
    k: int
    after: float
    until: float


def check_historic(
    sim: Simulator, asked: dict[str, Query], notes: dict[tuple[str, int], Notification]
) -> dict[str, Any]:
    """Each historic query against the reference: every publication routed (``notes``)
    published in its window whose ``x`` is below its ``k``, once; nothing else (a
    publication outside the window or the filter is a problem); one missing is accounted
    for only by a gap reported to the asker (a store silent, or a store's range it no
    longer holds), by a round its host never finished (it died under it), or by its
    store's loss at a power failure (named by the store check: no store can tell it); one
    its store refused (a full disk) is counted refused."""
    problems: list[str] = []
    counts = dict.fromkeys(("expected", "delivered", "duplicated", "lost", "silent", "refused"), 0)
    for req_id, (asker, k, after, until) in sorted(asked.items()):
        got = sim.historic_received[req_id]
        reference = {
            key
            for key, n in notes.items()
            if after <= n.published_at < until and n.publication["x"] < k
        }
        extra = sorted(set(got) - reference)
        if extra:
            problems.append(f"historic {req_id}: {len(extra)} outside its window or filter: "
                            f"{extra[:3]}")  # fmt: skip
        refused = {key for key in reference - set(got) if key in sim.retention.refused}
        missing = reference - set(got) - refused
        if sim.replay_gaps.get(asker) or req_id not in sim.historic_done:
            silent = set()
        else:
            told, lost = sim.store_gaps.get(asker, set()), sim.retention.lost
            silent = {k for k in missing if not in_gaps(told, notes[k]) and k not in lost}
        if silent:
            problems.append(f"historic {req_id}: {len(silent)} missing, no gap reported: "
                            f"{sorted(silent)[:3]}")  # fmt: skip
        counts["expected"] += len(reference)
        counts["delivered"] += len(set(got) & reference)
        counts["duplicated"] += len(got) - len(set(got))
        counts["lost"] += len(missing)
        counts["silent"] += len(silent)
        counts["refused"] += len(refused)
        if len(got) != len(set(got)):
            problems.append(f"historic {req_id}: {len(got) - len(set(got))} duplicated")
    return {"problems": problems, **counts}


COUNTS = ("expected", "delivered", "duplicated", "lost", "silent", "gaps")


def check_durables(sim: DurableSimulator) -> tuple[list[str], dict[str, int]]:
    """Each durable client against its contract: every publication its filter matches,
    published from its first subscribe on (while it was away too), once; nothing else.
    One missing is accounted for by a gap reported to it (a broker silent, or a range a
    store reported it no longer holds); one refused to its publisher (a full disk) is
    counted refused, not lost; one a store lost at a power failure (``sync = "normal"``:
    no store can tell what it lost, so no gap is reported) by the verdict's store check,
    which names it; or, published while it was
    away (only its record's replay could give it), by a stamp before its record began
    (a publisher's clock behind: the record owes what was published since it began, by
    the publishers' clocks); or, published while it was connected, by a broker's count
    of a copy undeliverable. Anything else is a silent loss. A delivery comes twice only
    if its acknowledgement died with its host before that host wrote it (a broker
    writes acknowledgements within a second), counted ``redelivered``, or after a claim
    that did not find its record or that a broker did not answer (reported to it: its
    subscription started anew, or the copy it resumed from may not be the freshest).
    Returns the
    problems and the counts (:data:`COUNTS` and ``redelivered``)."""
    problems: list[str] = []
    counts = dict.fromkeys((*COUNTS, "redelivered", "refused"), 0)
    clocks = sim.clocks
    kept = {n.key: n for ns in sim.published.values() for n in ns}
    refused, lost = sim.retention.refused, sim.retention.lost
    undeliverable = sim.undeliverable_keys
    sent = {key: n.published_at - clocks.get(n.publisher, 0.0) for key, n in kept.items()}
    for name, c in sorted(sim.durable_clients.items()):
        reference = {
            key for key, n in kept.items() if c.subscription.matches(n.publication)
            and sent[key] >= c.started
        }  # fmt: skip
        got = set(c.received)
        extra = sorted(got - reference)
        if extra:
            problems.append(f"durable {name}: {len(extra)} outside its filter or from before "
                            f"its subscription: {extra[:3]}")  # fmt: skip
        duplicated = sum(c.received.values()) - len(got)
        lost_record = any(g.startswith("claim") for g in c.gaps)  # it was told: a new one
        dups = sorted(
            k for k, n in c.received.items() if n > 1 and k not in c.unwritten and not lost_record
        )
        if dups:
            problems.append(f"durable {name}: {len(dups)} duplicated: {dups[:3]}")
        missing = {key for key in reference - got if key not in refused}
        silent = sorted(
            key
            for key in missing
            if key not in lost and not _accounted(c, key, sent[key], kept[key], undeliverable)
        )
        if silent:
            problems.append(f"durable {name}: {len(silent)} lost without a count or a reported "
                            f"gap: {silent[:3]}")  # fmt: skip
        redelivered = sum(c.received[k] - 1 for k in c.unwritten & got)
        for key, n in (("expected", len(reference)), ("delivered", len(got & reference)),
                       ("duplicated", duplicated), ("lost", len(missing)),
                       ("silent", len(silent)), ("gaps", int(c.told_gap())),
                       ("redelivered", redelivered),
                       ("refused", len(reference - got) - len(missing))):  # fmt: skip
            counts[key] += n
    return problems, counts


def _accounted(
    c: DurableClient,
    key: tuple[str, int],
    sent: float,
    n: Notification,
    undeliverable: set[tuple[str, int]],
) -> bool:
    """Whether ``c`` missing ``key`` (sent at ``sent``, true time) is accounted for (see
    :func:`check_durables`)."""
    if c.told_gap() or in_gaps(c.store_gaps, n):
        return True
    away = [*c.away, *([(c.left, float("inf"))] if c.left is not None else [])]
    if any(a <= sent < b for a, b in away):
        return n.published_at < c.started
    return key in undeliverable


Stream = Iterable[tuple[PartKey, float, dict[str, Any]]]
"""(key, published_at, publication) of every publication."""
Matches = dict[frozenset[PartKey], dict[PartKey, frozenset[int]]]
"""Each match as the set of its publications, with the parts each one fills."""


def brute_force_matches(composite: Composite, stream: Stream) -> Matches:
    """Every match of ``composite`` over ``stream`` by brute force, from the definition:
    each assignment of publications to parts that satisfies the expression with equal
    variable bindings, as the set of its publications, within the window."""
    stream = list(stream)
    at = {key: t for key, t, _ in stream}

    def satisfying(node: int | Join) -> Iterator[tuple[dict[int, PartKey], dict[str, Any]]]:
        if isinstance(node, int):
            for key, _, publication in stream:
                bound = composite.parts[node].bind(publication)
                if bound is not None:
                    yield {node: key}, bound
        elif node.op == "|":
            for term in node.terms:
                yield from satisfying(term)
        else:
            for combo in itertools.product(*(list(satisfying(t)) for t in node.terms)):
                bound: dict[str, Any] = {}
                if all(bound.setdefault(v, x) == x for _, b in combo for v, x in b.items()):
                    assigned: dict[int, PartKey] = {}
                    for a, _ in combo:
                        assigned.update(a)
                    yield assigned, bound

    found: dict[frozenset[PartKey], dict[PartKey, set[int]]] = {}
    for assigned, _ in satisfying(composite.expression):
        keys = frozenset(assigned.values())
        times = [at[k] for k in keys]
        if composite.window is not None and max(times) - min(times) > composite.window:
            continue
        roles = found.setdefault(keys, {})
        for part, key in assigned.items():
            roles.setdefault(key, set()).add(part)
    return {k: {key: frozenset(p) for key, p in r.items()} for k, r in found.items()}


def check_composites(sim: Simulator) -> tuple[list[str], dict[str, int]]:
    """The problems of ``sim``'s composite clients (module docstring) and their counts:
    expected matches, delivered, duplicated, lost, silent (lost and not accounted for)."""
    hosted: CompositeClients = sim.composites
    stream = [
        ((n.publisher, n.session, n.seq), n.published_at, n.publication)
        for store in sim.published.values()
        for n in store
    ]
    undeliverable = sim.undeliverable_keys
    problems: list[str] = []
    counts = dict.fromkeys(("expected", "delivered", "duplicated", "lost", "silent", "gaps"), 0)
    for client, (_, _, composite) in sorted(hosted.clients.items()):
        oracle = brute_force_matches(composite, stream)
        got = Counter(hosted.matches[client])
        wrong = [keys for keys in got if keys not in oracle]
        if wrong:
            problems.append(f"composite {client}: {len(wrong)} matches that are none: "
                            f"{sorted(map(sorted, wrong))[:2]}")  # fmt: skip
        twice = sum(n - 1 for n in got.values())
        if twice:
            problems.append(f"composite {client}: {twice} matches delivered twice")
        join = hosted.join_of(client)
        excused = hosted.host_crashed(client) or join.late + join.dropped + join.cut > 0
        offered = hosted.offered[client]
        missing = [keys for keys in oracle if keys not in got]
        silent = [keys for keys in missing if keys <= offered and not excused]
        if silent:
            first = sorted(map(sorted, silent))[:2]
            problems.append(f"composite {client}: {len(silent)} matches of publications its "
                            f"join had, not delivered: {first}")  # fmt: skip
        parts = {
            key
            for key, _, publication in stream
            if any(part.routing.matches(publication) for part in composite.parts)
        }
        unheard = {k for k in parts - offered if (k[0], k[2]) not in undeliverable}
        if unheard and not hosted.host_crashed(client):
            problems.append(f"composite {client}: {len(unheard)} part publications never "
                            f"reached its join, none counted: {sorted(unheard)[:3]}")  # fmt: skip
        counts["expected"] += len(oracle)
        counts["delivered"] += len(set(got) & oracle.keys())
        counts["duplicated"] += twice
        counts["lost"] += len(missing)
        counts["silent"] += len(silent)
    return problems, counts
