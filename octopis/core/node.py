"""The broker node's failure decisions (DESIGN §7), once for the broker process and the
simulator.

:class:`BrokerNode` wraps one broker's routing core with everything it decides about its
neighbours' failures and its own resync: what it holds for a neighbour that is down,
in which order it hands things over when a link heals, when it owes or pays a resync
share, when it starts serving, what it does with a local publication while it is not
serving yet, and what a restarted BID broker knows of its lost table. It keeps what it knows of each
neighbour in :class:`~octopis.core.neighbours.Neighbours` (one state machine each),
which the shell feeds from what it hears. It is sans-IO: a shell reports events (a link
down or back, a neighbour met, a share arrived, a neighbour serving, its own start) and
carries out the actions that come back, in order:

- the core's actions (:data:`~octopis.core.messages.Action`: a ``Forward`` is encoded
  and put on its link like any routing message);
- :class:`HandedShare`: tell the neighbour, behind what went before on its link, that a
  share was handed (the process's SYNCED frame; the simulator's arrival event).

The broker process (``transport/broker.py``) and the simulator (``sim/failures.py``)
differ only in how bytes move and how time passes: neither decides any of this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from octopis.core.bid import BidBroker
from octopis.core.clustered import ClusteredBroker
from octopis.core.custody import PublishReceipt
from octopis.core.durable import Durables
from octopis.core.lst import LinkView
from octopis.core.messages import (
    Action,
    Advertise,
    Forward,
    Hold,
    Message,
    Notification,
    ProtocolError,
    Subscribe,
    SubState,
    Unadvertise,
)
from octopis.core.neighbours import Neighbours
from octopis.core.recovery import Recovery
from octopis.core.relinking import Carrying, refuse_relink
from octopis.core.replay import Replay, ReplayData, ReplayEcho, sbp_targets
from octopis.core.resync import epoch_of
from octopis.core.sessions import ClientTable, Withdraw
from octopis.core.view import BrokerView
from octopis.defaults import MOVE_TIMEOUT, PUBLICATION_HOLD, SUBSCRIPTIONS_PER_CLIENT

Token = TypeVar("Token", bound="PublishReceipt | None")
Item = TypeVar("Item")
Read = Callable[[Item], Any]
"""What gives a given-back item's message (:meth:`BrokerNode.link_down`)."""
Given = Iterable[Item]
"""What a link gives back (:meth:`BrokerNode.link_down`)."""


@dataclass(frozen=True, slots=True)
class HandedShare:
    """Tell ``link`` that our resync share went out ahead of this (``entries``
    subscriptions): ``complete`` false means our own table is not whole for it yet and
    the share follows later (it routes toward us as if our side matched meanwhile);
    ``wants_share`` asks for its share; ``predecessor``: we knew an earlier incarnation
    of it (it restarted)."""

    link: str
    entries: int
    complete: bool = True
    wants_share: bool = False
    predecessor: bool = False


Step = tuple[list[Action | HandedShare], PublishReceipt | None]
"""Actions to carry out with the receipt their copies carry
(:meth:`BrokerNode.route_again`, :meth:`BrokerNode.serve_if_ready`)."""


@dataclass(frozen=True, slots=True)
class Resend:
    """The link to ``link`` healed: it sends again, ahead of all, what it has no
    acknowledgement for (the cut may have lost it in flight, DESIGN §7), and carries
    again (the process's link paused while its neighbour was down)."""

    link: str


class Heard(NamedTuple):
    """What a sign of life from a neighbour does (:meth:`BrokerNode.heard`): ``back``,
    it was down; the ``actions`` to carry out, in order."""

    back: bool
    actions: list[Action | HandedShare | Resend]


class Refused(RuntimeError):
    """A local publication refused before routing: neither kept nor routed here (the
    publisher keeps it and retries; the message says why)."""


class NotServing(Refused):
    """Refused: this broker is still resyncing and its hold is full (the message says how
    many it holds)."""


class NotKept(Refused):
    """Refused: its retention store cannot keep it now (its disk refused a commit moments
    ago; the message is the store's, :func:`~octopis.core.answer.store_refusal`)."""


def read_sbp(message: Message | Replay) -> tuple[str, bool]:
    """The id a held routing message names, and whether it makes something (subscribe,
    advertise) rather than withdraws it; a replay request held with them (it travels
    behind the subscriptions, DESIGN §11) is handed like a subscription no later message
    names."""
    kind = type(message)
    if kind is Replay:
        return f"replay {message.req_id}", True
    if kind is Advertise or kind is Unadvertise:
        return f"advertisement {message.adv_id}", kind is Advertise
    return message.sub_id, kind is Subscribe


class BrokerNode(Generic[Token]):
    """One broker's routing core and its failure decisions (see the module docstring).

    ``serving``: it starts in an overlay whose
    tables are built. ``hold_limit`` bounds what is held per neighbour (subscription
    messages and copies each); ``publication_hold`` the local publications held while not
    serving. A publication's ``Token`` is its :class:`~octopis.core.custody.PublishReceipt`
    (None where nothing is confirmed: the simulator without failures).
    ``predecessor``: the shell knows that an earlier process of this broker ran (its data
    directory says so); a BID broker's table then lost what was subscribed before it.
    ``client_limit``: the most subscriptions one client holds here, ``move_timeout``
    the seconds a move order may take (its :attr:`sessions`)."""

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
        withdraw: Withdraw | None = None,
    ) -> None:
        self.core = core
        self.withdraw: Withdraw = withdraw or core.unsubscribe
        """How a client's subscription is withdrawn here (the composites' hosting's
        ``local_unsubscribe``: a composite's parts, else the core's; default the core's)."""
        self.sessions = ClientTable(client_limit, move_timeout)
        """Its clients' subscriptions here and the session rules (limits, moves); what a
        client's going or a move's end withdraws is decided by :meth:`client_gone`,
        :meth:`released` and :meth:`moves_expired`."""
        clustered = isinstance(core, ClusteredBroker)
        if predecessor and not clustered:  # no neighbour need tell it (it may meet none)
            core.table_lost = True
        neighbours = sorted(core.neighbour_ids if clustered else core.links)
        self.neighbours = Neighbours(neighbours)
        """What it knows of each neighbour's session, liveness and word."""
        self.started_at, self.down_after = 0.0, 0.0
        self.recovery: Recovery[Message] = Recovery(hold_limit)
        self.publication_hold = publication_hold
        self.serving = serving
        """Resynced from every live neighbour since this node started (or started in an
        overlay whose tables are built, ``serving``); until then local publications wait
        in :attr:`held` (DESIGN §7)."""
        if not serving and clustered:
            core.expect_shares(set(neighbours))
        self.held: list[tuple[Notification, Token]] = []
        """Local publications waiting for :attr:`serving`, with their shell tokens."""
        self.counters: Counter[str] = Counter()
        self.on_undeliverable = on_undeliverable
        """Told of each notification copy this node gives up (the simulator's ledger)."""

    @property
    def clustered(self) -> bool:
        """Whether the core resyncs (SNR, DNR); BID has no resync (DESIGN §7)."""
        return isinstance(self.core, ClusteredBroker)

    # -- local publications ----------------------------------------------------------------

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

    # -- a neighbour's link ----------------------------------------------------------------

    def hold(self, action: Hold) -> None:
        """The core holds a copy for a neighbour that is down (DESIGN §7): kept for its
        return, bounded (what does not fit is counted undeliverable)."""
        self.recovery.hold_copy(action.link, action.message)

    def link_down(
        self, neighbour: str, items: Given, read: Read | None = None, sent: Given = ()
    ) -> list[Item]:
        """The ``items`` the link to ``neighbour`` gave back, oldest first: its custody's copies,
        then the routing messages that waited on it (DESIGN §7); a link gives back when
        its neighbour is declared down, when a new incarnation of it is met (before
        :meth:`neighbour_met`, with ``sent``: what its predecessor was sent and did not
        acknowledge, :meth:`Custody.give_up`) and when it is heard again after (before
        :meth:`link_back`). ``read`` gives an item's message (default: the item). The
        notification copies are returned in order, to be routed again (``reroute``);
        replay answers are dropped and counted, so is the word that a share was handed;
        every other routing message is held for the neighbour, in order, ``sent`` first."""
        copies, kept, answers = sort_given_back(items, read)
        first, dropped = sort_given_back(sent, read)[1:]
        if answers + dropped:
            self.counters["replay_answers_dropped"] += answers + dropped
        self.recovery.hold_subscriptions(neighbour, kept, first)
        return copies

    def heard(
        self,
        neighbour: str,
        now: float,
        word: bool | None = None,
        give_back: Callable[[], object] = lambda: None,
    ) -> Heard:
        """A frame from ``neighbour`` at ``now``, whatever it is (a heartbeat, the usual
        first one after a cut since a paused link still beats; data; RESENT): a sign of
        life (:meth:`Neighbours.heard`), and ``word``, what a heartbeat says of its
        serving (None: no heartbeat). Both shells call this for every frame they take
        from a neighbour; it orders a heal (DESIGN §7). Back from a silence that its
        session outlived (:meth:`Neighbours.resumed`): first the shell's ``give_back``
        runs (its link gives back what was put on it while down: :meth:`link_down`,
        then :meth:`route_again`, routed around the neighbour, whose word the silence
        reset), then the actions: :class:`Resend`, and the hand-over of
        :meth:`link_back` (held subscriptions, ``refresh_link``, held copies, shares).
        Only then is its word heard (:meth:`Neighbours.said`): serving news hands it
        what is still held for it (:meth:`neighbour_serving`), which the hand-over
        already gave it after a heal."""
        back = self.neighbours.heard(neighbour, now)
        actions: list[Action | HandedShare | Resend] = []
        if back and self.neighbours.resumed(neighbour):
            give_back()
            actions += [Resend(neighbour), *self.link_back(neighbour)]
        if word is not None and self.neighbours.said(neighbour, word):
            actions += self.neighbour_serving(neighbour)
        return Heard(back, actions)

    def route_again(
        self,
        neighbour: str,
        copies: Iterable[Item],
        view: LinkView,
        read: Read | None = None,
        receipt_of: Read | None = None,
    ) -> Iterator[Step]:
        """The notification ``copies`` :meth:`link_down` returned, routed again with the
        link to ``neighbour`` down (the core's ``reroute`` by ``view``), one step each:
        the shell carries out its actions with its receipt (``receipt_of`` the item;
        default none), and when it asks for the next step the receipt counts the copy
        taken back as held (:meth:`PublishReceipt.held`: the rerouted copies count now).
        A copy the core gives up is told to :attr:`on_undeliverable`."""
        core = self.core
        for copy in copies:
            message = copy if read is None else read(copy)
            receipt = None if receipt_of is None else receipt_of(copy)
            yield self.watched(message, core.reroute, neighbour, message, view), receipt
            if receipt is not None:
                receipt.held()

    def link_back(self, neighbour: str) -> list[Action | HandedShare]:
        """A link that was down healed with the same process on the other side, in this
        order: the subscription messages held for it; with covering, what went over the
        link before (one lost in flight would leave it without what covers others); the
        copies held for it; then the shares owed to neighbours that are ``up``; and, if
        our share was paid it late, the word that it was (lost if the link failed before
        it was taken; said twice, it changes nothing), else, if we still miss its share,
        a word that asks for it again (:meth:`synced`)."""
        actions: list[Action | HandedShare] = self._hand_held_sbp(neighbour)[0]
        actions += self.core.refresh_link(neighbour)
        actions += self._released(neighbour, self.recovery.release_copies(neighbour))
        actions += self.pay_owed_shares()
        core = self.core
        if isinstance(core, ClusteredBroker):
            wants = neighbour in core.missing_shares
            if neighbour in self.recovery.paid_late:
                actions.append(HandedShare(neighbour, 0, True, wants))
            elif wants:  # what it handed us may have been lost in flight: ask again
                actions.append(HandedShare(neighbour, 0, False, True))
        self.recovery.asked_after_heal.add(neighbour)
        return actions

    def neighbour_met(
        self, neighbour: str, incarnation: int, restarted: bool
    ) -> tuple[list[Action], HandedShare]:
        """A new incarnation of ``neighbour`` (its first, or a restart): the actions that
        hand it our state, and what to tell it after them.

        What was held for a restarted neighbour's predecessor is undeliverable, and its
        subscriptions are withdrawn once it serves (:meth:`neighbour_serving`). It is
        handed first the subscription messages held for it (what its link gave back,
        :meth:`link_down`; it broadcasts them on), then what the two-step broadcast would
        have given it, if our own table is whole for it: while we are resyncing, or
        missing another neighbour's share, we say so and owe it the share. BID, the
        static baseline, has no resync: it is handed only what was held, and the entries
        routed through a restarted neighbour lose their route
        (:meth:`BidBroker.lose_routes_via`)."""
        clustered = self.clustered
        self.recovery.paid_late.discard(neighbour)  # a new process: its share comes below
        if restarted:
            epoch = epoch_of(incarnation) if clustered else None
            for copy in self.recovery.restarted(neighbour, epoch, read_sbp):
                self.on_undeliverable(copy)
        else:  # met first: nothing this process sent reached it, so withdrawals name nothing
            self.recovery.keep_for_new_process(neighbour, read_sbp)
        if not clustered:
            if restarted:
                self.counters["restarts_without_resync"] += 1
                assert isinstance(self.core, BidBroker)
                self.core.lose_routes_via(neighbour)
            held = self._hand_held_sbp(neighbour)[0]
            return held, HandedShare(neighbour, 0, predecessor=restarted)
        core = self.core
        assert isinstance(core, ClusteredBroker)
        if restarted:
            core.neighbour_restarted(neighbour)
        actions, carried = self._hand_held_sbp(neighbour)
        wants = neighbour in core.missing_shares
        if not self.serving or not core.share_complete(neighbour):
            self.recovery.owed_shares.add(neighbour)  # until it says it wants none
            return actions, HandedShare(neighbour, 0, False, wants, restarted)
        share = self._share(neighbour, carried)
        return actions + share, HandedShare(neighbour, len(share), True, wants, restarted)

    def share_heard(self, neighbour: str, handed: HandedShare) -> list[Action | HandedShare]:
        """``neighbour`` says it handed its share (its SYNCED, ``handed``; the step both
        shells take): its session counts it (:meth:`Neighbours.share`); a share for us
        is taken (:meth:`synced`), then, if the neighbour serves now (it had said so
        before its share came in), it is handed what is held for it
        (:meth:`neighbour_serving`). The shell then asks :meth:`serve_if_ready`."""
        heard = self.neighbours.share(neighbour)
        actions = self.synced(neighbour, handed) if heard.for_us else []
        if heard.now_serving:
            actions += self.neighbour_serving(neighbour)
        return actions

    def synced(self, neighbour: str, handed: HandedShare) -> list:
        """``neighbour`` handed us its share (``handed`` as it told us): whole, we route by
        the table on its side and pay the shares this completed; if it wants none of ours,
        we owe it nothing; if it still wants ours after its link healed, we owe it again
        (what we handed it was lost in flight). A share that completes our table lets the
        withdrawals deferred for it go (:meth:`ClusteredBroker.withdrawals_due`,
        :meth:`Recovery.withdraw_predecessor`). A neighbour that knew our predecessor
        tells a BID broker that its table lost what was subscribed before the restart."""
        recovery = self.recovery
        healed = neighbour in recovery.asked_after_heal
        recovery.asked_after_heal.discard(neighbour)
        if not handed.wants_share:
            recovery.owed_shares.discard(neighbour)
        core = self.core
        if isinstance(core, BidBroker):
            core.table_lost |= handed.predecessor
            return []
        again = healed and handed.wants_share and neighbour not in recovery.owed_shares
        if again:  # what we handed it before the link failed was lost in flight
            recovery.owed_shares.add(neighbour)
            self.counters["shares_asked_again"] += 1
        if handed.complete and neighbour in core.missing_shares:
            core.share_received(neighbour)
            self.counters["shares_received_late"] += self.serving
            deferred = core.withdrawals_due() + [
                action
                for n in sorted(recovery.withdraw_when_serving)
                if self.neighbours[n].serving
                for action in recovery.withdraw_predecessor(core, n)
            ]
            return [*deferred, *self.pay_owed_shares()]
        return self.pay_owed_shares() if again else []

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
        owed that are whole now. None: serving already, or not yet."""
        if self.serving:
            return None
        if not self.neighbours.ready(now - self.started_at >= self.down_after):
            return None
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

    def neighbour_serving(self, neighbour: str) -> list[Action]:
        """``neighbour`` is serving: the copies held for it and, if it restarted, the
        withdrawal of its predecessor's subscriptions."""
        held, withdrawals = self.recovery.serving(self.core, neighbour)
        return [*self._released(neighbour, held), *withdrawals]

    def pay_owed_shares(self) -> list[Action | HandedShare]:
        """Every owed share that is whole now, to a neighbour that is reachable
        (:meth:`Neighbours.reachable`); nothing while this node is not serving itself."""
        core = self.core
        if not self.serving or not isinstance(core, ClusteredBroker):
            return []
        actions: list[Action | HandedShare] = []
        for neighbour in self.recovery.payable(core, self.neighbours.reachable):
            share = self._share(neighbour, set())
            wants = neighbour in core.missing_shares
            actions += [*share, HandedShare(neighbour, len(share), True, wants)]
            self.recovery.paid_late.add(neighbour)
            self.counters["shares_handed_late"] += 1
        return actions

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
        (returned: how many messages). Refused with :class:`ValueError`, nothing changed,
        when :func:`~octopis.core.relinking.refuse_relink` refuses (BID, DNR with
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
        return sum(self.recovery.forget(neighbour) for neighbour in sorted(gone))

    # -- client sessions (DESIGN §7-§9) ---------------------------------------------------

    def client_gone(
        self, key: str, heard: float, durables: Durables | None
    ) -> tuple[list[str], list[Action]]:
        """Client ``key`` is gone (silent past the client timeout, or it said bye; last
        heard at wall time ``heard``): the sub ids withdrawn and the actions that withdraw
        them (by :attr:`withdraw`) and its advertisements. Those under a
        move order are kept as orphans (:meth:`ClientTable.gone`); a durable one's record
        in ``durables`` waits for its client's return (:meth:`Durables.detached`)."""
        withdrawn, actions = self.sessions.gone(key), []
        for sub_id in withdrawn:
            actions += self.withdraw(key, sub_id)
            if durables is not None:
                durables.detached(sub_id, heard)
        core = self.core
        if isinstance(core, ClusteredBroker):
            for adv_id in core.advertisements_of(key):
                actions += core.unadvertise(key, adv_id)
        return withdrawn, actions

    def released(self, key: str, sub_id: str, durables: Durables | None) -> bool:
        """A move of ``sub_id`` reached its new host and released it here (the core's
        :class:`~octopis.core.messages.Released`): its durable record in ``durables``
        went with it; whether its client ``key`` is to be told
        (:meth:`ClientTable.released`)."""
        if durables is not None:
            durables.moved(sub_id)
        return self.sessions.released(key, sub_id)

    def moves_expired(self, now: float) -> list[Action]:
        """Move orders past their deadline at ``now`` are forgotten; what orphaned ones
        kept is withdrawn (:meth:`ClientTable.expire`; by :attr:`withdraw`): the actions."""
        withdraw = self.withdraw
        return [a for key, sub_id in self.sessions.expire(now) for a in withdraw(key, sub_id)]

    # -- what it holds ---------------------------------------------------------------------

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

    def held_messages(self) -> Iterator[Message]:
        """The subscription messages (and replay requests) held for neighbours."""
        for messages in self.recovery.subscriptions.values():
            yield from messages

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

    # -- internals -------------------------------------------------------------------------

    def _hand_held_sbp(self, neighbour: str) -> tuple[list[Action], set[str]]:
        held, carried = self.recovery.take_subscriptions(neighbour, read_sbp)
        return [Forward(neighbour, m) for m in held], carried

    def _share(self, neighbour: str, carried: set[str]) -> list[Action]:
        core = self.core
        assert isinstance(core, ClusteredBroker)
        return [Forward(neighbour, m) for m in self.recovery.share(core, neighbour, carried)]

    def watched(self, message: Any, step: Callable[..., list[Action]], *args: Any) -> list[Action]:
        """``step(*args)``, a step of the core's: ``message``, a notification, is told to
        :attr:`on_undeliverable` if the core counted a copy of it undeliverable."""
        if type(message) is not Notification:
            return step(*args)
        before = undeliverable(self.core.stats)
        actions = step(*args)
        if undeliverable(self.core.stats) > before:
            self.on_undeliverable(message)
        return actions

    @staticmethod
    def _released(neighbour: str, copies: list[Message]) -> list[Action]:
        return [Forward(neighbour, m) for m in copies]


def undeliverable(stats: Counter[str]) -> int:
    """The copies a core's ``stats`` count undeliverable, every reason together."""
    return sum(n for key, n in stats.items() if key.startswith("undeliverable."))


def sort_given_back(
    items: Iterable[Item], read: Callable[[Item], Any] | None = None
) -> tuple[list[Item], list[Any], int]:
    """What a link gave back (:meth:`BrokerNode.link_down`), sorted: the notification
    copies (items, in order), the other routing messages to hold (messages, in order, the
    word that a share was handed left out), and how many replay answers are dropped."""
    copies, kept, answers = [], [], 0
    for item in items:
        message = item if read is None else read(item)
        kind = type(message)
        if kind is Notification:
            copies.append(item)
        elif kind is ReplayData or kind is ReplayEcho:
            answers += 1
        elif kind is not HandedShare:
            kept.append(message)
    return copies, kept, answers
