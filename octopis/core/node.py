"""The broker node (DESIGN §7-§9), once for the broker process and the simulator.

:class:`BrokerNode` wraps one broker's routing core with everything it decides: about its
neighbours' links (:class:`~octopis.core.node_links.NeighbourLinks`: what it holds for a
neighbour that is down, the order of a heal, handshakes and resync shares), when it
starts serving, what it does with a local publication (refused, routed, or held while it
is not serving yet), what a restarted BID broker knows of its lost table, its clients'
sessions and its relinks. It is sans-IO: a shell reports events and carries out the
actions that come back, in order.

The broker process (``transport/broker.py``) and the simulator (``sim/failures.py``)
differ only in how bytes move and how time passes: neither decides any of this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

from octopis.core.bid import BidBroker
from octopis.core.clustered import ClusteredBroker
from octopis.core.custody import PublishReceipt
from octopis.core.durable import Durables
from octopis.core.lst import LinkView
from octopis.core.messages import Action, Notification, ProtocolError, SubState
from octopis.core.node_links import HandedShare, NeighbourLinks, Resend, Step, read_sbp
from octopis.core.recovery import Recovery
from octopis.core.relinking import Carrying, refuse_relink
from octopis.core.replay import sbp_targets
from octopis.core.sessions import ClientTable, Liveness, Withdraw
from octopis.core.view import BrokerView
from octopis.defaults import (
    CLIENT_TIMEOUT,
    MOVE_TIMEOUT,
    PUBLICATION_HOLD,
    SUBSCRIPTIONS_PER_CLIENT,
)

__all__ = [
    "BrokerNode",
    "ClientGone",
    "HandedShare",
    "NotKept",
    "NotServing",
    "Refused",
    "Release",
    "Resend",
    "Step",
    "read_sbp",
]

Token = TypeVar("Token", bound="PublishReceipt | None")


class Refused(RuntimeError):
    """A local publication refused before routing: neither kept nor routed here (the
    publisher keeps it and retries; the message says why)."""


class NotServing(Refused):
    """Refused: this broker is still resyncing and its hold is full (the message says how
    many it holds)."""


class NotKept(Refused):
    """Refused: its retention store cannot keep it now (its disk refused a commit moments
    ago; the message is the store's, :meth:`~octopis.core.answer.CommitRefusals.refusal`)."""


class ClientGone(NamedTuple):
    """What a client's going withdraws (:meth:`BrokerNode.client_gone`): its sub ids and
    the actions; ``save``: write the durable records now (one waits for its client)."""

    withdrawn: list[str]
    actions: list[Action]
    save: bool


class Release(NamedTuple):
    """A move's release here (:meth:`BrokerNode.released`): ``tell`` its client; ``save``:
    write the durable records now (one went with the move)."""

    tell: bool
    save: bool


class BrokerNode(NeighbourLinks, Generic[Token]):
    """One broker's routing core and its decisions (see the module docstring); those
    about its neighbours' links are :class:`NeighbourLinks`'s.

    ``serving``: it starts in an overlay whose
    tables are built. ``hold_limit`` bounds what is held per neighbour (subscription
    messages and copies each); ``publication_hold`` the local publications held while not
    serving. A publication's ``Token`` is its :class:`~octopis.core.custody.PublishReceipt`
    (None where nothing is confirmed: the simulator without failures).
    ``predecessor``: the shell knows that an earlier process of this broker ran (its data
    directory says so); a BID broker's table then lost what was subscribed before it.
    ``client_limit``: the most subscriptions one client holds here, ``move_timeout``
    the seconds a move order may take (its :attr:`sessions`); ``client_timeout``: the
    seconds of silence that drop a client (its :attr:`client_liveness`)."""

    def __init__(
        self,
        core: ClusteredBroker | BidBroker,
        hold_limit: int,
        publication_hold: int = PUBLICATION_HOLD,
        on_undeliverable: Callable[[Notification], None] = lambda n: None,
        *,
        serving: bool = False,
        predecessor: bool = False,
        client_limit: int = SUBSCRIPTIONS_PER_CLIENT,
        move_timeout: float = MOVE_TIMEOUT,
        client_timeout: float = CLIENT_TIMEOUT,
        withdraw: Withdraw | None = None,
    ) -> None:
        super().__init__(
            core, hold_limit, on_undeliverable, serving=serving, predecessor=predecessor
        )
        self.withdraw: Withdraw = withdraw or core.unsubscribe
        """How a client's subscription is withdrawn here (the composites' hosting's
        ``local_unsubscribe``: a composite's parts, else the core's; default the core's)."""
        self.sessions = ClientTable(client_limit, move_timeout)
        """Its clients' subscriptions here and the session rules (limits, moves); what a
        client's going or a move's end withdraws is decided by :meth:`client_gone`,
        :meth:`released` and :meth:`moves_expired`."""
        self.client_liveness: Liveness[Any] = Liveness(client_timeout)
        """When its clients (by the shell's key) were last heard; which are silent."""
        self.started_at, self.down_after = 0.0, 0.0
        self.publication_hold = publication_hold
        self.held: list[tuple[Notification, Token]] = []
        """Local publications waiting for :attr:`serving`, with their shell tokens."""

    def publish(
        self, notification: Notification, token: Token, view: LinkView, refusal: str | None = None
    ) -> list[Action] | None:
        """A local publication, the step both shells take (DESIGN §7, §11): refused if its
        store refuses now (``refusal``, the store's word: counted
        ``publications_refused.not_kept``, :class:`NotKept`); else routed now if serving,
        or held with ``token`` until :meth:`serve_if_ready` hands it back (None now): the
        hold keeps a copy of it, which its receipt waits for
        (:meth:`PublishReceipt.keep`) until the shell has routed it; :class:`NotServing`
        when the hold is full. Refused, the publisher keeps it and retries. Taken, the
        shell's store keeps it (its receipt waits for the commit too) before the shell
        carries out the actions."""
        if refusal is not None:
            self.counters["publications_refused.not_kept"] += 1
            raise NotKept(refusal)
        if self.serving:
            return self.core.publish(notification, view)
        if len(self.held) >= self.publication_hold:
            self.counters["publications_refused.hold_full"] += 1
            raise NotServing(
                f"{self.core.id} is resyncing after its start and already holds "
                f"{len(self.held)} publications; retry later"
            )
        self.held.append((notification, token))
        if token is not None:
            token.keep()
        self.counters["publications_held"] += 1
        return None

    def routed(self, count: int = 1) -> None:
        """``count`` messages from neighbours went to the core's routing (subscriptions
        aside): those that came while this node was not serving yet are counted
        (``routed_while_resyncing``: static modes send into a broker that is still
        resyncing, and what its partial table cannot route is lost, DESIGN §7)."""
        if not self.serving:
            self.counters["routed_while_resyncing"] += count

    def start(self, now: float, down_after: float) -> None:
        """This node's process starts at ``now``: a neighbour not heard within
        ``down_after`` (the liveness timeout) does not hold back its serving."""
        self.started_at, self.down_after = now, down_after
        for _, record in self.neighbours.items():
            record.last_heard = now

    def serve_if_ready(self, now: float, view: LinkView) -> Iterator[Step] | None:
        """Start serving if this node has its share from every live neighbour
        (:meth:`Neighbours.ready`, the liveness timeout past :meth:`start` counting for
        those never heard): the steps to carry out, in order: each local publication held
        meanwhile, published now by ``view`` with its token (whose hold copy is held when
        the shell asks for the next step, :meth:`PublishReceipt.held`), then the shares
        owed that are whole now; once it has carried out every step, the shell tells each
        neighbour that this broker serves, behind what the steps sent it. None: serving
        already, or not yet."""
        if self.serving:
            return None
        if not self.neighbours.ready(self.started_at + self.down_after <= now):
            return None  # the sum compared, as a timer set for it sees it (silent_past)
        self.serving = True
        held, self.held = self.held, []
        return self._serve(held, self.pay_owed_shares(), view)

    def _serve(
        self,
        held: list[tuple[Notification, Token]],
        shares: list[Action | HandedShare],
        view: LinkView,
    ) -> Iterator[Step]:
        publish = self.core.publish
        for notification, token in held:
            yield self.watched(notification, publish, notification, view), token
            if token is not None:
                token.held()  # out of the hold
        yield shares, None

    def replay_targets(
        self, src: str | None, state: SubState, down: Callable[[str], bool]
    ) -> tuple[list[tuple[str, SubState]], list[tuple[str, SubState]]]:
        """Where a replay request from ``src`` (None: this host's own) goes on: SBP's next
        hops (:func:`~octopis.core.replay.sbp_targets`), split into those whose link is up
        and those that are ``down`` (their parts are reported silent, DESIGN §11)."""
        core = self.core
        if isinstance(core, ClusteredBroker):
            targets = sbp_targets(core.primary, list(core.secondary.values()), src, state)
        else:
            targets = sbp_targets(core.links, [], src, state)
        return [t for t in targets if not down(t[0])], [t for t in targets if down(t[0])]

    def relink(self, view: BrokerView, clusters: int, now: float, carrying: Carrying) -> int:
        """Take this broker's view in a new topology version (DESIGN §9): the core takes
        the new neighbours and cluster count, a neighbour that joined is new (last heard
        ``now``), and what was held for or owed to a neighbour that left is dropped
        (returned: how many messages, counted ``relink.held_dropped``). Refused with
        :class:`ValueError`, nothing changed, when
        :func:`~octopis.core.relinking.refuse_relink` refuses (BID, DNR with
        advertisements, a leaving link that still ``carrying`` something) or while the
        core still routes over a leaving link (move its subscribers first)."""
        core = self.core
        ids = [n.id for n in view.neighbours]
        gone = set(self.neighbours) - set(ids)
        refuse_relink(core, gone, carrying)
        assert isinstance(core, ClusteredBroker)
        try:
            core.relink(view, clusters)
        except ProtocolError as exc:
            raise ValueError(str(exc)) from None
        for neighbour in gone:
            self.neighbours.remove(neighbour)
        for neighbour in ids:
            if self.neighbours.get(neighbour) is None:
                self.neighbours.add(neighbour, now)
        dropped = sum(self.recovery.forget(neighbour) for neighbour in sorted(gone))
        self.counters["relink.held_dropped"] += dropped
        return dropped

    def client_gone(self, key: str, heard: float, durables: Durables | None) -> ClientGone:
        """Client ``key`` is gone (silent past the client timeout, or it said bye; last
        heard at wall time ``heard``): the sub ids withdrawn and the actions that withdraw
        them (by :attr:`withdraw`) and its advertisements. Those under a
        move order are kept as orphans (:meth:`ClientTable.gone`); a durable one's record
        in ``durables`` waits for its client's return (:meth:`Durables.detached`), and
        the records are then to be written at once (``save``)."""
        withdrawn, actions, save = self.sessions.gone(key), [], False
        for sub_id in withdrawn:
            actions += self.withdraw(key, sub_id)
            if durables is not None:
                save = durables.detached(sub_id, heard) or save
        core = self.core
        if isinstance(core, ClusteredBroker):
            for adv_id in core.advertisements_of(key):
                actions += core.unadvertise(key, adv_id)
        return ClientGone(withdrawn, actions, save)

    def released(self, key: str, sub_id: str, durables: Durables | None) -> Release:
        """A move of ``sub_id`` reached its new host and released it here (the core's
        :class:`~octopis.core.messages.Released`): whether its client ``key`` is to be
        told (:meth:`ClientTable.released`); its durable record in ``durables`` went
        with it, and the records are then to be written at once (``save``)."""
        save = durables is not None and durables.moved(sub_id)
        return Release(self.sessions.released(key, sub_id), save)

    def moves_expired(self, now: float) -> list[Action]:
        """Move orders past their deadline at ``now`` are forgotten; what orphaned ones
        kept is withdrawn (:meth:`ClientTable.expire`; by :attr:`withdraw`): the actions."""
        withdraw = self.withdraw
        return [a for key, sub_id in self.sessions.expire(now) for a in withdraw(key, sub_id)]

    @property
    def ready(self) -> bool:
        """Serving, with every neighbour up, synced and serving, and every neighbour's
        share (a clustered core misses none)."""
        core = self.core
        missing = isinstance(core, ClusteredBroker) and core.missing_shares
        return self.serving and not missing and self.neighbours.settled()

    def held_notifications(self) -> Iterator[Notification]:
        """Every notification this node holds: copies for neighbours that are down, and
        local publications waiting for it to serve."""
        for copies in self.recovery.copies.values():
            yield from copies  # type: ignore[misc]
        for notification, _ in self.held:
            yield notification

    def holding(self) -> dict[str, int]:
        """Notification copies held per neighbour that was down (those with any)."""
        return {n: len(copies) for n, copies in self.recovery.copies.items() if copies}

    def died(self) -> tuple[list[Notification], Counter[str]]:
        """The process died: what it held is gone (returned, for the count of what was
        lost) with its counts; the node holds nothing after."""
        lost, counts = list(self.held_notifications()), self.counts()
        self.recovery = Recovery(self.recovery.limit)
        self.held, self.counters = [], Counter()
        return lost, counts

    def counts(self) -> Counter[str]:
        """What the node counted: holds, shares, refusals (DESIGN §7)."""
        return self.recovery.counters + self.counters

    def status(self) -> dict[str, object]:
        """What an operator sees of its recovery: shares missing and owed, what it holds."""
        core = self.core
        return {
            "serving": self.serving,
            "missing_shares": sorted(getattr(core, "missing_shares", ())),
            "owed_shares": sorted(self.recovery.owed_shares),
            "held": {
                "publications": len(self.held),
                "sbp": sum(map(len, self.recovery.subscriptions.values())),
                "notifications": self.recovery.held_copies(),
            },
        }
