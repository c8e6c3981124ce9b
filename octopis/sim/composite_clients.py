"""Composite subscribers in the simulator (DESIGN §12), and what the nemesis holds them to.

Each composite subscription is hosted at its broker by the node's own
:class:`~octopis.core.composite_hosting.HostedComposites` (the one the broker process
uses): its parts travel as ordinary subscriptions, the publications delivered for them
are joined at the host on the simulator's clock, and every ``composite`` notice is kept
as the client's. A simulated composite client does not fail over: when its host
crashes, its composite is gone (the SDK subscribes afresh after a fail-over; the join
starts empty there).

:func:`check_composites` compares each client's matches with a brute-force oracle over
everything published (:func:`brute_force_matches`, straight from the definition in
:class:`~octopis.filters.composite.Composite`): each match delivered is a match, and
once; every match whose publications all reached the host's join is delivered, unless
the join said it may miss some (late, dropped or cut counted and told the client) or
the host crashed. A part publication that never reached the join must be counted
undeliverable by a broker, or it is a silent loss.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from octopis.core.composite import PartKey
from octopis.core.composite_hosting import HostedComposites
from octopis.core.messages import Notification
from octopis.defaults import COMPOSITE_HELD, COMPOSITE_LATENESS
from octopis.filters.composite import Composite, Join

if TYPE_CHECKING:
    from octopis.core.node import BrokerNode
    from octopis.sim.engine import Simulator

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


class CompositeClients:
    """The composite subscriptions the simulated brokers host, and what their clients got
    (the join's bounds: ``max_held`` and ``lateness``, the process's defaults)."""

    def __init__(
        self, sim: Simulator, max_held: int = COMPOSITE_HELD, lateness: float = COMPOSITE_LATENESS
    ) -> None:
        self._sim = sim
        self._max_held, self._lateness = max_held, lateness
        self.hosts: dict[str, tuple[BrokerNode, HostedComposites]] = {}
        """Each hosting broker: the node (incarnation) its composites live in, and them."""
        self.clients: dict[str, tuple[str, str, Composite]] = {}
        """Each composite client: (its broker, its sub_id, its composite)."""
        self.matches: dict[str, list[frozenset[PartKey]]] = {}
        """Each client's matches as delivered, in order (repeats kept)."""
        self.offered: dict[str, set[PartKey]] = {}
        """The part publications each client's join was offered."""
        self.counts: Counter[str] = Counter()

    def subscribe(self, client: str, broker: str, composite: Composite) -> str:
        """``client`` subscribes ``composite`` at ``broker`` now; returns its sub_id."""
        sim = self._sim
        node = sim.nodes[broker]
        host = self.hosts.get(broker)
        if host is None or host[0] is not node:
            core = sim.cores[broker]
            hosted = HostedComposites(
                core.subscribe,
                core.unsubscribe,
                self._notify,
                self._max_held,
                self._lateness,
                self.counts,
            )
            host = self.hosts[broker] = (node, hosted)
        sub_id, actions = host[1].subscribe(client, composite, sim.now)
        self.clients[client] = (broker, sub_id, composite)
        self.matches[client] = []
        self.offered[client] = set()
        sim._dispatch_local(broker, actions)
        return sub_id

    def deliver(self, broker: str, key: str, notification: Notification) -> bool:
        """``broker`` delivered ``notification`` to local subscriber ``key``: True if
        that is a composite's (joined now), else False."""
        host = self.hosts.get(broker)
        if host is None:
            return False
        node, hosted = host
        composite = hosted.by_key.get(key)
        if composite is None or node is not self._sim.nodes[broker]:
            return False
        n = notification
        self.offered[composite.client].add((n.publisher, n.session, n.seq))
        return hosted.deliver(key, n, self._sim.now)

    def _notify(self, client: str, notice: dict) -> bool:
        if notice["op"] == "composite":
            self.matches[client].append(frozenset(tuple(p[:3]) for p in notice["parts"]))
        return True

    def join_of(self, client: str) -> Any:
        """``client``'s join (its counts: late, dropped, cut)."""
        broker, sub_id, _ = self.clients[client]
        return self.hosts[broker][1].by_id[sub_id].join

    def host_crashed(self, client: str) -> bool:
        """Whether ``client``'s host died after it subscribed (its composite went with it)."""
        broker = self.clients[client][0]
        state = self._sim.failures
        dead = state is not None and broker in state.dead
        return dead or self.hosts[broker][0] is not self._sim.nodes[broker]


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
