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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from octopis.core import client_requests as rules
from octopis.core.composite import PartKey
from octopis.core.composite_hosting import HostedComposites
from octopis.core.messages import Notification
from octopis.filters.composite import Composite
from octopis.wire.client import CompositeNotice, Notice

if TYPE_CHECKING:
    from octopis.core import Action
    from octopis.sim.brokers import Brokers
    from octopis.sim.events import EventQueue


class CompositeClients:
    """The composite subscriptions the simulated brokers host (each broker's
    :class:`HostedComposites`, made with its node, :attr:`Brokers.composites`), and
    what their clients got."""

    def __init__(
        self,
        brokers: Brokers,
        events: EventQueue,
        submit: Callable[[str, list[Action]], None],
        dead: Callable[[str], bool],
    ) -> None:
        self._brokers, self._events = brokers, events
        self._submit, self._dead = submit, dead
        self.hosts: dict[str, HostedComposites] = {}
        """Each hosting broker's composites (those of the incarnation its clients
        subscribed at)."""
        self.counts = brokers.composite_counts
        self.clients: dict[str, tuple[str, str, Composite]] = {}
        """Each composite client: (its broker, its sub_id, its composite)."""
        self.matches: dict[str, list[frozenset[PartKey]]] = {}
        """Each client's matches as delivered, in order (repeats kept)."""
        self.offered: dict[str, set[PartKey]] = {}
        """The part publications each client's join was offered."""

    def subscribe(self, client: str, broker: str, composite: Composite) -> str:
        """``client`` subscribes ``composite`` at ``broker`` now, held for it by the
        broker's client sessions as a broker process holds it
        (:func:`~octopis.core.client_requests.subscribe`); returns its sub_id."""
        node = self._brokers.nodes[broker]
        hosted = self.hosts[broker] = self._brokers.composites[broker]
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
        hosted = self._brokers.composites.get(broker)
        composite = hosted.by_key.get(key) if hosted is not None else None
        if composite is None:
            return False
        n = notification
        self.offered[composite.client].add((n.publisher, n.session, n.seq))
        return hosted.deliver(key, n, self._events.now)

    def notify(self, client: str, notice: Notice) -> bool:
        """A broker's notice to composite client ``client`` (a
        :class:`~octopis.wire.client.CompositeNotice` is a match); whether it got it."""
        if type(notice) is CompositeNotice:
            self.matches[client].append(frozenset(p[:3] for p in notice.parts))
        return True

    def join_of(self, client: str) -> Any:
        """``client``'s join (its counts: late, dropped, cut)."""
        broker, sub_id, _ = self.clients[client]
        return self.hosts[broker].by_id[sub_id].join

    def host_crashed(self, client: str) -> bool:
        """Whether ``client``'s host died after it subscribed (its composite went with it)."""
        broker = self.clients[client][0]
        return self._dead(broker) or self.hosts[broker] is not self._brokers.composites.get(broker)
