"""Composite subscribers in the simulator (DESIGN §12).

Each composite subscription is hosted at its broker by the node's own
:class:`~octopis.core.composite_hosting.HostedComposites` (the one the broker process
uses): its parts travel as ordinary subscriptions, the publications delivered for them
are joined at the host on the simulator's clock, and every ``composite`` notice is kept
as the client's. A simulated composite client does not fail over: when its host
crashes, its composite is gone (the SDK subscribes afresh after a fail-over; the join
starts empty there).

The nemesis holds each client to the brute-force oracle
(:func:`octopis.nemesis.checks.check_composites`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from octopis.core import client_requests as rules
from octopis.core.composite import PartKey
from octopis.core.composite_hosting import HostedComposites
from octopis.core.messages import Notification
from octopis.defaults import COMPOSITE_HELD, COMPOSITE_LATENESS
from octopis.filters.composite import Composite

if TYPE_CHECKING:
    from octopis.core import Action
    from octopis.core.node import BrokerNode
    from octopis.sim.brokers import Brokers
    from octopis.sim.events import EventQueue


class CompositeClients:
    """The composite subscriptions the simulated brokers host, and what their clients got
    (the join's bounds: ``max_held`` and ``lateness``, the process's defaults)."""

    def __init__(
        self,
        brokers: Brokers,
        events: EventQueue,
        submit: Callable[[str, list[Action]], None],
        dead: Callable[[str], bool],
        max_held: int = COMPOSITE_HELD,
        lateness: float = COMPOSITE_LATENESS,
    ) -> None:
        self._brokers, self._events = brokers, events
        self._submit, self._dead = submit, dead
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
        """``client`` subscribes ``composite`` at ``broker`` now, held for it by the
        broker's client sessions as a broker process holds it
        (:func:`~octopis.core.client_requests.subscribe`); returns its sub_id."""
        node = self._brokers.nodes[broker]
        host = self.hosts.get(broker)
        if host is None or host[0] is not node:
            core = self._brokers.cores[broker]
            hosted = HostedComposites(
                core.subscribe,
                core.unsubscribe,
                self._notify,
                self._max_held,
                self._lateness,
                self.counts,
            )
            host = self.hosts[broker] = (node, hosted)
        hosted = host[1]
        sub_id, actions = rules.subscribe(  # by the rules a broker's client session keeps
            node.sessions, client, client, composite, hosted.local_subscribe, self._events.now
        )
        self.clients[client] = (broker, sub_id, composite)
        self.matches[client] = []
        self.offered[client] = set()
        self._submit(broker, actions)
        return sub_id

    def deliver(self, broker: str, key: str, notification: Notification) -> bool:
        """``broker`` delivered ``notification`` to local subscriber ``key``: True if
        that is a composite's (joined now), else False."""
        host = self.hosts.get(broker)
        if host is None:
            return False
        node, hosted = host
        composite = hosted.by_key.get(key)
        if composite is None or node is not self._brokers.nodes[broker]:
            return False
        n = notification
        self.offered[composite.client].add((n.publisher, n.session, n.seq))
        return hosted.deliver(key, n, self._events.now)

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
        return self._dead(broker) or self.hosts[broker][0] is not self._brokers.nodes[broker]
