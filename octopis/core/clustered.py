"""A broker of the clustered SCOT: two-step SBP, SNR and DNR (paper §5, §6.2, §6.3).

The broker knows only its own labels and its direct neighbours (§4.3): the primary
neighbours in its cluster (aCOLs) and one secondary neighbour B(x, k) per other cluster k
(iCOLs). It reads no clock and does no I/O: every method takes one input and returns the
:class:`Forward` / :class:`Deliver` actions for the shell to carry out.

Its parts, one concern each: where it stands (:mod:`octopis.core.cluster_links`), how a
notification is routed (:mod:`octopis.core.notification_routing`), how a subscription
travels (:mod:`octopis.core.subscription_travel`, chosen once, when the broker is made),
and here the subscriptions' own rules: Algorithm 1's checks, the advertisements' entry
points and moves inside the cluster.
"""

from __future__ import annotations

from dataclasses import replace

from bitarray import bitarray, frozenbitarray

from octopis.core.advertising import Advertising
from octopis.core.cluster_links import SBP_PRIMARY, SBP_SECONDARY
from octopis.core.covering import Covering
from octopis.core.dedup import EdgeDedup
from octopis.core.messages import (
    Action,
    Advertise,
    Forward,
    Move,
    ProtocolError,
    Rehost,
    Released,
    Subscribe,
    SubState,
    Unadvertise,
    Unsubscribe,
)
from octopis.core.notification_routing import NotificationRouting
from octopis.core.subscription_travel import travel_for
from octopis.core.table import MatcherFactory
from octopis.core.view import BrokerView
from octopis.filters.language import Subscription


class ClusteredBroker(NotificationRouting):
    """Routing state machine of B(x, c) for SNR (``dynamic=False``) or DNR (``True``);
    with ``covering``, SBP passes on only what no subscription sent the same way covers
    (:mod:`octopis.core.covering`, DESIGN §12); with ``advertisements``, only toward
    publishers that advertised what it may match (:mod:`octopis.core.advertising`);
    with both, where advertisements draw it and nothing sent there covers it. Which of
    the four is :attr:`travel`, chosen here once."""

    def __init__(
        self,
        broker: BrokerView,
        clusters: int,
        matcher_factory: MatcherFactory,
        *,
        dynamic: bool = False,
        dedup: EdgeDedup | None = None,
        covering: bool = False,
        advertisements: bool = False,
    ) -> None:
        super().__init__(broker, clusters, matcher_factory, dynamic=dynamic, dedup=dedup)
        self.travel = travel_for(self, covering=covering, advertisements=advertisements)
        """How a subscription travels from here (:mod:`octopis.core.subscription_travel`)."""
        self.withheld: dict[str, tuple[Unsubscribe, str]] = {}
        """With covering, the withdrawals from neighbours waiting for another primary
        neighbour's resync share, by sub_id (at most one per entry held):
        :meth:`withdraw_subscription` defers them, :meth:`withdrawals_due` lets them go."""
        self.restarted_neighbours: set[str] = set()
        """Neighbours met again in a new process (:meth:`neighbour_restarted`): what their
        predecessors held for this broker died with them."""

    @property
    def covering(self) -> Covering | None:
        """Covering state, or None when every subscription goes everywhere."""
        return self.travel.covering

    @property
    def advertising(self) -> Advertising | None:
        """Advertisements (DESIGN §12, :mod:`octopis.core.advertising`), or None when
        subscriptions go everywhere."""
        return self.travel.advertising

    @property
    def unquench(self) -> bool:
        """With covering, whether a withdrawal sends the subscriptions it covered in its
        place; only the law showing that it must is allowed to turn it off."""
        return self.travel.unquench

    @unquench.setter
    def unquench(self, on: bool) -> None:
        self.travel.unquench = on

    def relink(self, broker: BrokerView, clusters: int) -> None:
        """Take this broker's view in a new topology version (see
        :meth:`ClusterLinks.relink`); the subscriptions' record forgets a link gone."""
        super().relink(broker, clusters)
        self.travel.set_links(self.neighbour_ids)

    # -- subscriptions: Algorithm 1 ------------------------------------------------------

    def subscribe(
        self, subscriber: str, subscription: Subscription, now: float
    ) -> tuple[str, list[Action]]:
        """A local subscriber subscribes: set our cluster bit and start the two steps."""
        sub_id = self._new_sub_id()
        cbv = bitarray(self.clusters)
        cbv[self.cluster] = 1
        message = Subscribe(
            sub_id, self.id, subscription, SubState.PRIMARY, frozenbitarray(cbv), now
        )
        return sub_id, self.broadcast_subscription(message, subscriber, local=True)

    def broadcast_subscription(
        self, message: Subscribe, src: str, *, local: bool = False
    ) -> list[Action]:
        """Two-step SBP (§5, Algorithm 1).

        Store ``(filter, src, cbv)``. A subscription from a local subscriber or arriving
        PRIMARY from primary neighbour ``src`` goes on as PRIMARY to every other primary
        neighbour and as SECONDARY to every secondary neighbour; a SECONDARY one stops
        here. The host cluster is a tree, so no identifier is needed to stop loops.

        With covering or advertisements (DESIGN §12) it goes only over the links
        :attr:`travel` chooses, and one already held from ``src`` is a neighbour passing
        on again what it may have sent before (a restart, a link back) and is ignored. A
        SECONDARY one from a primary neighbour is a resync share entry (DESIGN §7): it
        goes on by the same rule, so that this restarted broker's neighbours get what the
        rule gives them now.
        """
        cluster = self._check_subscription(message, src, local)
        if len(message.cbv) != self.clusters:  # sent before a cluster joined or left
            message = replace(message, cbv=self._cbv({cluster}))
            self.stats["sbp.cbv_resized"] += 1
        travel = self.travel
        if message.state is SBP_SECONDARY:
            if self._held_from(message.sub_id, src, "resync.already_known"):
                return []  # SBP brought it before the share
            self._store(message, src, local, message.cbv, cluster)
            if cluster != self.cluster:
                return []
            return travel.pass_on(message, src, restored=True)
        if travel.already_held is not None and self._held_from(
            message.sub_id, src, travel.already_held
        ):
            return []
        self._store(message, src, local, message.cbv, cluster)
        return travel.pass_on(message, None if local else src)

    def _held_from(self, sub_id: str, src: str, count: str) -> bool:
        """Whether ``sub_id`` is held with last hop ``src`` (counted as ``count``)."""
        known = self.table.entries.get(sub_id)
        if known is not None and known.last_hop == src:
            self.stats[count] += 1
            return True
        return False

    def withdraw_subscription(self, message: Unsubscribe, src: str) -> list[Action]:
        """Unsubscribe by the two steps of SBP: remove, then forward like the subscription.

        With covering or advertisements, the withdrawal of a subscription of this
        cluster goes where the subscription went (or, after a restart, may have gone:
        one not held is ignored); with covering, each preceded by the subscriptions it
        covered there that go in its place (:meth:`Covering.withdraw`). A withdrawal of
        one not held, from a neighbour whose resync share this broker still misses, is
        ignored too: the share would have brought it, and will not now; and so is one from
        a neighbour that restarted, whose predecessor may have died holding the
        subscription for this broker (its new process passes on the withdrawals held for
        the predecessor).

        With covering, the withdrawal from a neighbour of a subscription of this cluster
        waits while this broker misses another primary neighbour's resync share (counted
        ``covering.withdrawal_deferred``; the entry stays meanwhile): it sends in its
        place what it covered, and some of that may be in the share, which the
        neighbours downstream would then hold neither of (:meth:`withdrawals_due`).
        """
        entry = self.table.entries.get(message.sub_id)
        travel = self.travel
        if entry is None and travel.not_held is not None:
            self.stats[travel.not_held] += 1
            return []
        if entry is None and src in self.missing_shares:
            self.stats["resync.withdrawn_before_share"] += 1
            return []
        if entry is None and src in self.restarted_neighbours:
            self.stats["resync.withdrawn_never_received"] += 1
            return []
        if entry is None or entry.last_hop != src:
            raise ProtocolError(f"unsubscribe of {message.sub_id} from {src}: no such entry")
        if message.state is SBP_PRIMARY and not entry.local and src not in self.primary:
            raise ProtocolError(f"PRIMARY unsubscribe from non-primary neighbour {src}")
        if (
            entry.cluster == self.cluster
            and not entry.local
            and travel.covering is not None
            and not self.share_complete(src)
        ):
            self.withheld[message.sub_id] = (message, src)
            self.stats["covering.withdrawal_deferred"] += 1
            return []
        self.table.remove(message.sub_id)
        if entry.cluster == self.cluster:
            return travel.withdraw(message, src)
        return travel.sbp_withdrawal(message, src)

    def neighbour_restarted(self, neighbour: str) -> None:
        """``neighbour`` runs a new process: a withdrawal it passes on may name a
        subscription its predecessor never handed here (:meth:`withdraw_subscription`)."""
        self.restarted_neighbours.add(neighbour)

    def withdrawals_due(self) -> list[Action]:
        """The withdrawals :meth:`withdraw_subscription` deferred whose shares are all in
        now (a share came): each goes as it would have, preceded by what it covered."""
        withheld = self.withheld
        due = [sub_id for sub_id, (_, src) in withheld.items() if self.share_complete(src)]
        out: list[Action] = []
        for sub_id in due:
            message, src = withheld.pop(sub_id)
            out += self.withdraw_subscription(message, src)
        return out

    def refresh_link(self, link: str) -> list[Action]:
        """With covering, the subscriptions sent over ``link``, sent again (a link back
        after a cut: one lost in flight would leave the neighbour without what covers
        those quenched for it; one it holds already is ignored there); counted as
        ``covering.refreshed``. Without covering, nothing."""
        return self.travel.refresh(link)

    # -- advertisements (DESIGN §12) -------------------------------------------------------

    def advertise(self, publisher: str, advertisement: Subscription) -> tuple[str, list[Action]]:
        """Local ``publisher`` advertises ``advertisement``: it spreads by SBP's two steps.
        Returns its id (for :meth:`unadvertise`) and the actions."""
        return self.travel.advertise(publisher, advertisement)

    def unadvertise(self, publisher: str, adv_id: str) -> list[Action]:
        """Local ``publisher`` withdraws its advertisement ``adv_id`` (or leaves)."""
        return self.travel.unadvertise(publisher, adv_id)

    def advertisements_of(self, publisher: str) -> list[str]:
        """The ids of local ``publisher``'s advertisements."""
        return self.travel.advertisements_of(publisher)

    def check_advertised(self, publisher: str, publication: dict) -> None:
        """With advertisements on, raise :class:`UnadvertisedPublication` unless local
        ``publisher`` advertised a filter ``publication`` matches."""
        self.travel.check_advertised(publisher, publication)

    def receive_advertisement(self, message: Advertise, src: str) -> list[Action]:
        """An advertisement from neighbour ``src``: hold it with the link it opens, pass
        it on by SBP's two steps (a SECONDARY one stops here), then send over that link
        the subscriptions held back from it that it may feed (:meth:`_opened`)."""
        out, opens = self.travel.receive_advertisement(message, src)
        if opens is None:
            return out
        return out + self._opened(opens, message.advertisement)

    def _opened(self, link: str, advertisement: Subscription) -> list[Action]:
        """This cluster's subscriptions held back from ``link`` that ``advertisement``,
        having opened it, may feed (counted ``advertising.released``); with covering, of
        those it draws there, the ones nothing sent over ``link`` covers."""
        return self.travel.opened(link, advertisement)

    def receive_unadvertisement(self, message: Unadvertise, src: str) -> list[Action]:
        """An advertisement's withdrawal from ``src``: forget it and pass the withdrawal
        on as the advertisement went. The subscriptions it drew stay where they are."""
        return self.travel.receive_unadvertisement(message, src)

    # -- moves inside the cluster (DESIGN §9) ---------------------------------------------

    @property
    def adopts(self) -> bool:
        """Whether a subscription can move inside the cluster by :meth:`adopt` (not with
        covering or advertisements: the brokers between two hosts may not hold it)."""
        return self.travel.adopts

    def adopt(self, subscriber: str, sub_id: str) -> list[Action]:
        """Local ``subscriber`` takes over ``sub_id``, hosted elsewhere in this cluster.

        The primary entry becomes a local one (this broker delivers from now on) and a
        :class:`Move` goes to its last hop, toward the old host; every other neighbour
        holds the entry with this broker as last hop and gets a :class:`Rehost`. Only
        primary entries on the cluster-tree path between the hosts change; secondary
        entries point at this cluster, not at a host in it, and stay as they are."""
        self.travel.check_adoption(sub_id)
        entry = self.table.entries.get(sub_id)
        if entry is None or entry.local or entry.cluster != self.cluster:
            raise ProtocolError(
                f"{sub_id} is not a subscription of another broker of cluster {self.cluster}, "
                f"so it cannot move to {self.id}"
            )
        self.table.replace(replace(entry, last_hop=subscriber, local=True, host=self.id, hops=0))
        self.stats["moves.adopted"] += 1
        self.stats["sent.move"] += 1
        out: list[Action] = [Forward(entry.last_hop, Move(sub_id, self.id))]
        return out + self._rehost(sub_id, self.id, entry.last_hop)

    def move_subscription(self, message: Move, src: str) -> list[Action]:
        """A :class:`Move` from primary neighbour ``src``: point the entry at ``src`` and
        pass the move on to the old last hop; at the old host (a local entry) the
        subscriber is :class:`Released` and the neighbours off the path are told the new
        host."""
        sub_id = message.sub_id
        entry = self.table.entries.get(sub_id)
        if (
            src not in self.primary
            or entry is None
            or entry.cluster != self.cluster
            or entry.last_hop == src
        ):
            raise ProtocolError(f"move of {sub_id} from {src}: no entry it can turn at {self.id}")
        self.table.replace(replace(entry, last_hop=src, local=False, host=message.host))
        if not entry.local:
            self.stats["sent.move"] += 1
            return [Forward(entry.last_hop, message)]
        self.stats["moves.released"] += 1
        out: list[Action] = [Released(entry.last_hop, sub_id)]
        return out + self._rehost(sub_id, message.host, src)

    def rehost(self, message: Rehost, src: str) -> list[Action]:
        """Record that ``message.sub_id``, held with last hop ``src``, is hosted at
        ``message.host`` now (bookkeeping for restart withdrawal; routing is unchanged).
        A note that finds the entry pointing elsewhere (or gone) is stale and ignored
        (``rehost.stale``): a later move turned or adopted the entry here while the note
        was on its way, and that move's own notes say where the host is."""
        entry = self.table.entries.get(message.sub_id)
        if entry is None or entry.last_hop != src:
            self.stats["rehost.stale"] += 1
            return []
        self.table.replace(replace(entry, host=message.host))
        return []

    def _rehost(self, sub_id: str, host: str, path: str) -> list[Action]:
        """:class:`Rehost` to every neighbour but ``path`` (the one on the move's path)."""
        note = Rehost(sub_id, host)
        out = self.two_steps(note, note, path)
        self.stats["sent.rehost"] += len(out)
        return out

    # -- checks --------------------------------------------------------------------------

    def _check_subscription(self, message: Subscribe, src: str, local: bool) -> int:
        """Validate an SBP message against our labels; returns the host cluster. Its CBV
        may be as wide as the cluster count of the topology version it was sent in (a
        cluster joined or left since, :meth:`relink`), but its one bit must name one of
        our clusters."""
        cbv = message.cbv
        if cbv is None or cbv.count(1) != 1 or cbv.index(1) >= self.clusters:
            raise ProtocolError(
                f"subscription {message.sub_id}: CBV must have exactly one bit set, "
                f"of one of our {self.clusters} clusters"
            )
        cluster = cbv.index(1)
        if local:
            return cluster
        state = message.state
        if state is SBP_SECONDARY:
            if self.cluster_of.get(src) != cluster:
                raise ProtocolError(
                    f"SECONDARY subscription {message.sub_id} from {src} "
                    f"does not come from host cluster {cluster}"
                )
        elif state is SBP_PRIMARY and (src not in self.primary or cluster != self.cluster):
            raise ProtocolError(
                f"PRIMARY subscription {message.sub_id} from {src} "
                f"(host cluster {cluster}) at cluster {self.cluster}"
            )
        return cluster
