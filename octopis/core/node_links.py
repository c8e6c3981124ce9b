"""What a broker node decides about its neighbours' links (DESIGN §7), once for the broker
process and the simulator: what it holds for a neighbour that is down, what it does with
what a link gives back, in which order it hands things over when a link heals
(:meth:`NeighbourLinks.heard`), what a new incarnation of a neighbour is handed, and
when a resync share is owed, taken or paid. :class:`~octopis.core.node.BrokerNode` is
one, with its local publications, client sessions and relinks besides.

It keeps what it knows of each neighbour in :class:`~octopis.core.neighbours.Neighbours`
(one state machine each), which the shell feeds from what it hears, and what it holds
in :class:`~octopis.core.recovery.Recovery`. It is sans-IO: a shell reports events and
carries out the actions that come back, in order: the core's actions
(:data:`~octopis.core.messages.Action`), :class:`HandedShare` (tell the neighbour,
behind what went before on its link, that a share was handed: the process's SYNCED
frame, the simulator's arrival event) and :class:`Resend` (a healed link sends again
what it has no acknowledgement for).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from octopis.core.bid import BidBroker
from octopis.core.clustered import ClusteredBroker
from octopis.core.custody import PublishReceipt
from octopis.core.lst import LinkView
from octopis.core.messages import (
    Action,
    Advertise,
    Forward,
    Hold,
    Message,
    Notification,
    Subscribe,
    Unadvertise,
)
from octopis.core.neighbours import Neighbours
from octopis.core.recovery import Recovery
from octopis.core.replay import Replay, ReplayData, ReplayEcho
from octopis.core.resync import epoch_of

Item = TypeVar("Item")
Read = Callable[[Item], Any]
"""What gives a given-back item's message (:meth:`NeighbourLinks.link_down`)."""
Given = Iterable[Item]
"""What a link gives back (:meth:`NeighbourLinks.link_down`)."""


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
(:meth:`NeighbourLinks.route_again`, :meth:`~octopis.core.node.BrokerNode.serve_if_ready`)."""


@dataclass(frozen=True, slots=True)
class Resend:
    """The link to ``link`` healed: it sends again, ahead of all, what it has no
    acknowledgement for (the cut may have lost it in flight, DESIGN §7), and carries
    again (the process's link paused while its neighbour was down)."""

    link: str


class Met(NamedTuple):
    """A new incarnation of a neighbour met (:meth:`NeighbourLinks.meet`): whether it
    restarted (an earlier one was known); the ``actions`` that hand it our state, the
    :class:`HandedShare` (its SYNCED) last."""

    restarted: bool
    actions: list[Action | HandedShare]


class Heard(NamedTuple):
    """What a sign of life from a neighbour does (:meth:`NeighbourLinks.heard`): ``back``,
    it was down; the ``actions`` to carry out, in order."""

    back: bool
    actions: list[Action | HandedShare | Resend]


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


class NeighbourLinks:
    """A broker node's decisions about its neighbours' links (see the module docstring),
    around its routing ``core``. ``hold_limit`` bounds what is held per neighbour
    (subscription messages and copies each); ``serving``: the node starts in an overlay
    whose tables are built; ``predecessor``: the shell knows that an earlier process of
    this broker ran (a BID broker's table then lost what was subscribed before it);
    ``on_undeliverable`` is told of each notification copy given up (the simulator's
    ledger)."""

    def __init__(
        self,
        core: ClusteredBroker | BidBroker,
        hold_limit: int,
        on_undeliverable: Callable[[Notification], None] = lambda n: None,
        *,
        serving: bool = False,
        predecessor: bool = False,
    ) -> None:
        self.core = core
        clustered = isinstance(core, ClusteredBroker)
        if predecessor and not clustered:  # no neighbour need tell it (it may meet none)
            core.table_lost = True
        neighbours = sorted(core.neighbour_ids if clustered else core.links)
        self.neighbours = Neighbours(neighbours)
        """What it knows of each neighbour's session, liveness and word."""
        self.recovery: Recovery[Message] = Recovery(hold_limit)
        self.serving = serving
        """Resynced from every live neighbour since this node started (or started in an
        overlay whose tables are built, ``serving``); until then local publications wait
        (DESIGN §7)."""
        if not serving and clustered:
            core.expect_shares(set(neighbours))
        self.counters: Counter[str] = Counter()
        self.on_undeliverable = on_undeliverable
        """Told of each notification copy this node gives up (the simulator's ledger)."""
        self._undeliverable: tuple[object, int, tuple[str, ...]] = (None, 0, ())
        """The core's stats, their size and their undeliverable keys, when last read."""

    @property
    def clustered(self) -> bool:
        """Whether the core resyncs (SNR, DNR); BID has no resync (DESIGN §7)."""
        return isinstance(self.core, ClusteredBroker)

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

    def given_back(
        self, neighbour: str, items: Given, sent: Given, view: LinkView, read: Read, receipts: Read
    ) -> Iterator[Step]:
        """What the link to ``neighbour`` gave back (``items`` and ``sent``, as
        :meth:`link_down` takes them, ``read`` giving an item's message), the step both
        shells take: held or dropped now, then the copies routed again around
        ``neighbour`` by ``view``, one step each, as the shell asks, with the receipt
        ``receipts`` gives (:meth:`route_again`)."""
        copies = self.link_down(neighbour, items, read, sent)
        return self.route_again(neighbour, copies, view, read, receipts)

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

    def meet(self, neighbour: str, incarnation: int, give_back: Callable[[], object]) -> Met | None:
        """A handshake or heartbeat from ``neighbour`` carrying ``incarnation``, the step
        both shells take (DESIGN §7): None if that incarnation is known. Else a new one
        (its first, or a restart; :meth:`Neighbours.met` starts its session again): first
        the shell's ``give_back`` runs (its link gives back what waited for the handshake
        and what the predecessor was sent and did not acknowledge, :meth:`link_down` with
        ``sent``, then :meth:`route_again`; the process then queues its HELLO ahead of
        all), then the shell carries out the hand-over of :meth:`neighbour_met`."""
        restarted = self.neighbours.met(neighbour, incarnation)
        if restarted is None:
            return None
        give_back()
        actions, handed = self.neighbour_met(neighbour, incarnation, restarted)
        return Met(restarted, [*actions, handed])

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
        (:meth:`neighbour_serving`). The shell then asks
        :meth:`~octopis.core.node.BrokerNode.serve_if_ready`."""
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
        stats = self.core.stats
        keys = self._undeliverable_keys(stats)
        size, before = len(stats), sum(stats[key] for key in keys)
        actions = step(*args)
        if len(stats) != size:  # a count appeared: perhaps of a reason not counted before
            keys = self._undeliverable_keys(stats)
        if sum(stats[key] for key in keys) > before:
            self.on_undeliverable(message)
        return actions

    def _undeliverable_keys(self, stats: Mapping[Any, int]) -> tuple[str, ...]:
        """The keys of the core's ``stats`` that count copies undeliverable, every reason
        (read again only when a key was added: a count is never removed; :meth:`watched`
        runs on every notification step)."""
        known = self._undeliverable
        if known[0] is not stats or known[1] != len(stats):
            keys = tuple(key for key in stats if key.startswith("undeliverable."))
            self._undeliverable = known = (stats, len(stats), keys)
        return known[2]

    @staticmethod
    def _released(neighbour: str, copies: list[Message]) -> list[Action]:
        return [Forward(neighbour, m) for m in copies]


def sort_given_back(
    items: Iterable[Item], read: Callable[[Item], Any] | None = None
) -> tuple[list[Item], list[Any], int]:
    """What a link gave back (:meth:`NeighbourLinks.link_down`), sorted: the notification
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
