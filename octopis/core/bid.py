"""A broker of the *unclustered* SCOT routing by broker IDs: the baseline (paper §6.1).

No cluster, region or link roles. Subscriptions flood with a network-wide id (host BID +
sequence); the first copy to arrive decides the last hop and later copies are counted as
duplicates and dropped (issues I1–I3 of §2). The publisher's host broker matches and puts
into the notification the destination brokers, each with the id of one of its matching
subscriptions; every broker splits that list by next hop (the last hop of the listed
subscription), and destination brokers match against their local subscriptions and
deliver. Intermediate brokers do not match (Algorithm 2).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from octopis.core.base import CoreBase
from octopis.core.dedup import EdgeDedup
from octopis.core.lst import LinkView
from octopis.core.messages import (
    Action,
    Deliver,
    Forward,
    Message,
    Notification,
    ProtocolError,
    Subscribe,
    SubState,
    Unsubscribe,
)
from octopis.core.table import LOCAL_PART, MatcherFactory, RoutingTable
from octopis.filters.language import Subscription

REMOTE_PART = "remote"
"""The table part of the entries of other brokers' subscribers."""
ROUTE_LOST = "(route lost)"
"""The last hop of a remote entry whose last hop restarted (:meth:`BidBroker.lose_routes_via`):
it routes nowhere, and a notification for it is counted ``undeliverable.route_lost``."""
WITHDRAWN_KEPT = 65_536
"""Withdrawn subscription ids a broker remembers (the oldest forgotten first, counted in
``withdrawn.forgotten``): a copy of a withdrawn subscription that comes late is dropped."""


class BidBroker(CoreBase):
    """Routing state machine of one broker of the unclustered SCOT (BID baseline)."""

    def __init__(
        self,
        broker_id: str,
        neighbours: list[str],
        matcher_factory: MatcherFactory,
        dedup: EdgeDedup | None = None,
    ) -> None:
        table = RoutingTable(
            (LOCAL_PART, REMOTE_PART),
            matcher_factory,
            part_of=lambda e: LOCAL_PART if e.local else REMOTE_PART,
            value_of=lambda e: e.last_hop if e.local or e.last_hop == ROUTE_LOST else e.host,
        )
        super().__init__(broker_id, neighbours, table, dedup)
        self.links = tuple(neighbours)
        self.withdrawn: OrderedDict[str, None] = OrderedDict()
        """Ids of the subscriptions withdrawn (at most :data:`WITHDRAWN_KEPT`). Flooding
        sends each subscription and its withdrawal over every link, by paths of their own:
        a copy of the subscription held for a link that was down, or slowed, can come
        after its withdrawal; taken again, it would flood again, its withdrawal behind it,
        round every cycle of the graph for ever."""
        self.table_lost = False
        """Set by the shell of a restarted broker: BID has no resync, so the table lacks
        every remote subscription made before the restart (DESIGN §7)."""

    def subscribe(
        self, subscriber: str, subscription: Subscription, now: float
    ) -> tuple[str, list[Action]]:
        """A local subscriber subscribes: id = this broker's BID + a sequence number."""
        sub_id = self._new_sub_id()
        message = Subscribe(sub_id, self.id, subscription, SubState.PRIMARY, None, now)
        return sub_id, self.broadcast_subscription(message, subscriber, local=True)

    def broadcast_subscription(
        self, message: Subscribe, src: str, *, local: bool = False
    ) -> list[Action]:
        """Flooding SBP: keep the first copy (its sender is the last hop), drop the rest."""
        if message.sub_id in self.table:
            self.stats["sbp_duplicates"] += 1
            return []
        if message.sub_id in self.withdrawn:
            self.stats["sbp_after_withdrawal"] += 1
            return []
        self._store(message, src, local)
        onward = message.onward(message.state)
        out: list[Action] = [Forward(n, onward) for n in self.links if n != src]
        self.stats["sent.subscribe"] += len(out)
        return out

    def lose_routes_via(self, neighbour: str) -> int:
        """``neighbour`` restarted: the remote entries whose last hop it was lose their
        route (last hop :data:`ROUTE_LOST`; how many is returned, counted
        ``routes_lost``). Its new process lacks them (BID has no resync), and it may take
        one again from a late copy of the flood (one held for a link that was down) that
        came by way of this broker: routed through it, a notification would go round that
        cycle for ever. An entry that lost its route stays in the table, so that no late
        copy makes it again here; its withdrawal removes it as any other. A chain of last
        hops then always leads to entries stored earlier, never round a cycle."""
        entries = self.table.entries
        lost = [e for e in entries.values() if not e.local and e.last_hop == neighbour]
        for entry in lost:
            self.table.replace(replace(entry, last_hop=ROUTE_LOST))
        self.stats["routes_lost"] += len(lost)
        return len(lost)

    def withdraw_subscription(self, message: Unsubscribe, src: str) -> list[Action]:
        """Remove the entry on first arrival, remember the id withdrawn (its subscription
        may come after it by another path) and flood on, whether the entry was here yet or
        not; later copies are duplicates."""
        sub_id = message.sub_id
        if sub_id in self.withdrawn:
            self.stats["unsubscribe_duplicates"] += 1
            return []
        self.withdrawn[sub_id] = None
        if len(self.withdrawn) > WITHDRAWN_KEPT:
            self.withdrawn.popitem(last=False)
            self.stats["withdrawn.forgotten"] += 1
        if sub_id in self.table:
            self.table.remove(sub_id)
        out: list[Action] = [Forward(n, message) for n in self.links if n != src]
        self.stats["sent.unsubscribe"] += len(out)
        return out

    def publish(self, notification: Notification, links: LinkView) -> list[Action]:
        """A local publisher publishes: match here and build the destination list."""
        return self.route_by_bids(notification, None, links)

    def route(self, n: Notification, src: str, links: LinkView) -> list[Action]:
        """A notification from a neighbour: it must carry a destination list only."""
        if n.destinations is None or n.cbv is not None or n.tunnel:
            raise ProtocolError("a BID notification must carry a destination list only")
        return self.route_by_bids(n, src, links)

    def route_by_bids(self, n: Notification, src: str | None, links: LinkView) -> list[Action]:
        """BID-based routing (§6.1, Algorithm 2).

        At the publisher's host (``src`` is None): match all entries, deliver to matching
        local subscribers, list every other host broker once with one matching sub_id.
        Elsewhere: if listed, match local subscriptions and deliver. Then split the
        remaining list by next hop and forward one copy per next hop. BID stays static
        under failures: the destinations behind a next hop that is down are counted
        undeliverable, and so is every local publication of a restarted broker, whose
        table lost the remote subscriptions (DESIGN §7), and those whose last hop
        restarted (:meth:`lose_routes_via`). A host delivers a ``(publisher, seq)`` once
        (edge dedup).
        """
        subscribers: set[str] = set()
        if src is None:
            self.matchings += 1
            if self.table_lost:  # whoever subscribed before the restart is not listed
                self.stats["undeliverable.table_lost"] += 1
            subscribers = self.table.values(LOCAL_PART, n.publication)
            destinations = self.table.by_value(REMOTE_PART, n.publication)
        else:
            destinations = dict(n.destinations or ())
            if destinations.pop(self.id, None) is not None:
                self.matchings += 1
                subscribers = self.table.values(LOCAL_PART, n.publication)
        if subscribers and not self.dedup.first((n.publisher, n.session), n.seq):
            self.stats["dedup.absorbed"] += len(subscribers)
            subscribers = set()

        by_hop: dict[str, list[tuple[str, str]]] = {}
        for broker, sub_id in destinations.items():
            entry = self.table.entries.get(sub_id)
            if entry is None or entry.local:
                self.stats["undeliverable.no_route"] += 1
                continue
            if entry.last_hop == ROUTE_LOST:
                self.stats["undeliverable.route_lost"] += 1
                continue
            by_hop.setdefault(entry.last_hop, []).append((broker, sub_id))
        for hop in [hop for hop in by_hop if links.down(hop)]:
            self.stats["undeliverable.link_down"] += len(by_hop.pop(hop))
        plain = n if n.destinations is None else n._replace(destinations=None)
        out: list[Action] = [Deliver(s, plain) for s in subscribers]
        out += [
            Forward(hop, n._replace(destinations=tuple(dests))) for hop, dests in by_hop.items()
        ]
        self.notification_copies += len(by_hop)
        self.stats["bids_carried"] += sum(len(d) for d in by_hop.values())
        return out

    def reroute(self, link: str, message: Message, links: LinkView) -> list[Action]:
        """A copy left in custody on ``link`` when it went down (DESIGN §7): BID stays
        static, so each destination it listed is counted undeliverable."""
        if type(message) is not Notification:
            self.stats["custody.sbp_dropped"] += 1
            return []
        self.stats["custody.rerouted"] += 1
        self.stats["undeliverable.link_down"] += len(message.destinations or ())
        return []
