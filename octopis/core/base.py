"""What every routing core shares, clustered or BID (DESIGN §2): identity, routing table,
counters, subscription ids, the check of a local withdrawal and the dispatch of a
neighbour's message to the mode's own rules.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Hashable

from bitarray import frozenbitarray

from octopis.core import messages as m
from octopis.core.dedup import EdgeDedup
from octopis.core.lst import LinkView
from octopis.core.table import RoutingEntry, RoutingTable


class Counts(dict[Hashable, int]):
    """Event counts by name, a missing one reading 0: a ``Counter`` without its methods,
    because a plain dict subclass's ``counts[k] += 1`` costs half as much, and the
    per-notification path counts on every hop."""

    __slots__ = ()

    def __missing__(self, key: Hashable) -> int:
        return 0


class CoreBase(ABC):
    """A broker's routing state machine; subclasses give the mode's rules:
    :meth:`broadcast_subscription`, :meth:`withdraw_subscription` and :meth:`route`."""

    def __init__(
        self,
        broker_id: str,
        neighbours: Collection[str],
        table: RoutingTable,
        dedup: EdgeDedup | None,
    ) -> None:
        self.id = broker_id
        self._neighbours = frozenset(neighbours)
        self.table = table
        self.dedup = dedup or EdgeDedup()
        self.stats: Counts = Counts()
        """Event counts by name, but for the two every notification adds to (read both
        in :meth:`counts`)."""
        self.matchings = 0
        """Matching steps (``"matching"`` in :meth:`counts`)."""
        self.notification_copies = 0
        """Notification copies forwarded (``"sent.notification"`` in :meth:`counts`)."""
        self.id_token: Callable[[], str] | None = None
        """Appended to each new subscription id when set: a broker process sets a random
        source, so an id cannot be guessed from another (DESIGN §8); the simulator keeps
        ids deterministic."""
        self._next_sub = 0
        self.epoch = ""
        """Prefix of this broker's subscription numbers: a restarted broker's shell sets
        it from its incarnation, so its ids never collide with its predecessor's."""

    def counts(self) -> Counts:
        """Every event count: :attr:`stats` with the per-notification ones. Those are
        integer attributes rather than items of :attr:`stats` because an item update of a
        dict subclass is not specialised by the interpreter: on the forwarding path the
        two updates cost a few per cent of a hop (bench/RESULTS.md, issue 16)."""
        counts = Counts(self.stats)
        for key, count in (
            ("matching", self.matchings),
            ("sent.notification", self.notification_copies),
        ):
            if count:
                counts[key] = count
        return counts

    def _new_sub_id(self) -> str:
        """This broker's id, its incarnation's epoch, a sequence number and, if set,
        :attr:`id_token`, for a subscription a local subscriber makes (counted in
        ``subscriptions_made``: each starts one SBP)."""
        self._next_sub += 1
        self.stats["subscriptions_made"] += 1
        sub_id = f"{self.id}#{self.epoch}{self._next_sub}"
        return sub_id if self.id_token is None else f"{sub_id}.{self.id_token()}"

    def _store(
        self,
        message: m.Subscribe,
        src: str,
        local: bool,
        cbv: frozenbitarray | None = None,
        cluster: int = 0,
    ) -> None:
        """Store ``message`` as an entry whose last hop is ``src`` (the entry another
        broker made of the same message object from the same neighbour, if any: entries
        are immutable, see ``Subscribe.stored``)."""
        entry = message.stored
        if (
            entry is None
            or entry.last_hop != src
            or entry.local != local
            or entry.cluster != cluster
            or entry.cbv is not cbv
        ):
            entry = RoutingEntry(
                message.sub_id,
                message.subscription,
                src,
                cbv,
                cluster,
                local,
                message.host,
                message.hops,
                message.issued_at,
            )
            object.__setattr__(message, "stored", entry)
        self.table.add(entry)

    def unsubscribe(self, subscriber: str, sub_id: str) -> list[m.Action]:
        """A local subscriber withdraws ``sub_id``: it goes the way its subscription went."""
        entry = self.table.entries.get(sub_id)
        if entry is None or not entry.local or entry.last_hop != subscriber:
            raise m.ProtocolError(f"{subscriber} holds no subscription {sub_id} at {self.id}")
        return self.withdraw_subscription(m.Unsubscribe(sub_id, m.SubState.PRIMARY), subscriber)

    def receive(self, src: str, message: m.Message, links: LinkView) -> list[m.Action]:
        """Handle one message from neighbour ``src``."""
        if src not in self._neighbours:
            raise m.ProtocolError(f"{self.id} has no link to {src}")
        if type(message) is m.Notification:
            return self.route(message, src, links)
        if isinstance(message, m.Subscribe):
            return self.broadcast_subscription(message, src)
        if isinstance(message, m.Unsubscribe):
            return self.withdraw_subscription(message, src)
        if isinstance(message, m.Move):
            return self.move_subscription(message, src)
        if isinstance(message, m.Rehost):
            return self.rehost(message, src)
        if isinstance(message, m.Advertise):
            return self.receive_advertisement(message, src)
        if isinstance(message, m.Unadvertise):
            return self.receive_unadvertisement(message, src)
        raise m.ProtocolError(f"unexpected message {type(message).__name__}")

    @abstractmethod
    def broadcast_subscription(self, message: m.Subscribe, src: str) -> list[m.Action]:
        """Store a subscription from neighbour ``src`` and pass it on (mode's SBP)."""

    @abstractmethod
    def withdraw_subscription(self, message: m.Unsubscribe, src: str) -> list[m.Action]:
        """Remove a subscription and pass the withdrawal on (mode's SBP)."""

    def move_subscription(self, message: m.Move, src: str) -> list[m.Action]:
        """Turn an entry toward a subscriber's new host (moves inside a cluster, DESIGN
        §9); a mode without clusters has no such moves."""
        raise m.ProtocolError(f"{self.id} routes without clusters: no moves inside one")

    def rehost(self, message: m.Rehost, src: str) -> list[m.Action]:
        """Record a moved subscription's new host (see :meth:`move_subscription`)."""
        raise m.ProtocolError(f"{self.id} routes without clusters: no moves inside one")

    def receive_advertisement(self, message: m.Advertise, src: str) -> list[m.Action]:
        """An advertisement from ``src`` (DESIGN §12); only clustered modes route by them."""
        raise m.ProtocolError(f"{self.id} routes without advertisements")

    def receive_unadvertisement(self, message: m.Unadvertise, src: str) -> list[m.Action]:
        """An advertisement's withdrawal from ``src`` (see :meth:`receive_advertisement`)."""
        raise m.ProtocolError(f"{self.id} routes without advertisements")

    def refresh_link(self, link: str) -> list[m.Action]:
        """What to send again over ``link`` when it is back after a cut: nothing, unless a
        mode passes subscriptions on selectively (covering, :class:`ClusteredBroker`)."""
        return []

    @abstractmethod
    def route(self, n: m.Notification, src: str, links: LinkView) -> list[m.Action]:
        """Route a notification from neighbour ``src`` (mode's routing)."""
