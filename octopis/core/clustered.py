"""A broker of the clustered SCOT: two-step SBP, SNR and DNR (paper §5, §6.2, §6.3).

The broker knows only its own labels and its direct neighbours (§4.3): the primary
neighbours in its cluster (aCOLs) and one secondary neighbour B(x, k) per other cluster k
(iCOLs). It reads no clock and does no I/O: every method takes one input and returns the
:class:`Forward` / :class:`Deliver` actions for the shell to carry out.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from types import MappingProxyType

from bitarray import bitarray, frozenbitarray

from octopis.core.advertising import AdvertEntry, Advertising
from octopis.core.base import CoreBase
from octopis.core.covering import Covering
from octopis.core.dedup import EdgeDedup
from octopis.core.lst import LinkView
from octopis.core.messages import (
    Action,
    Advertise,
    Deliver,
    Forward,
    Hold,
    Message,
    Move,
    Notification,
    ProtocolError,
    Rehost,
    Released,
    Subscribe,
    SubState,
    Tunnel,
    Unadvertise,
    UnadvertisedPublication,
    Unsubscribe,
    forward_copy,
)
from octopis.core.table import MatcherFactory, RoutingEntry, RoutingTable
from octopis.core.view import ICOL, BrokerView
from octopis.filters import Subscription, intersects

LOCAL = "local"
PRIMARY = "primary"
SECONDARY = "secondary"
NO_TARGETS: frozenset[str] = frozenset()
"""No local subscribers: what :meth:`ClusteredBroker.static_targets` gives most hops,
without a new set each time."""
NO_ICOLS: Mapping[int, str] = MappingProxyType({})
"""No iCOLs (a notification that came from a neighbour): read-only, so never changed."""

SBP_PRIMARY, SBP_SECONDARY = SubState.PRIMARY, SubState.SECONDARY
"""The steps of SBP as plain names: on Python 3.11 ``SubState.PRIMARY`` is a descriptor
lookup (~85 ns), and a 1,000-broker simulation reads a state ~5 × 10^7 times."""


class ClusteredBroker(CoreBase):
    """Routing state machine of B(x, c) for SNR (``dynamic=False``) or DNR (``True``);
    with ``covering``, SBP passes on only what no subscription sent the same way covers
    (:mod:`octopis.core.covering`, DESIGN §12); with ``advertisements``, only toward
    publishers that advertised what it may match (:mod:`octopis.core.advertising`);
    with both, where advertisements draw it and nothing sent there covers it."""

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
        super().__init__(
            broker.id,
            [n.id for n in broker.neighbours],
            RoutingTable((LOCAL, PRIMARY, SECONDARY), matcher_factory, self._part_of),
            dedup,
        )
        self.cluster = broker.cluster
        self.region = broker.region
        self.clusters = clusters
        self.dynamic = dynamic
        self.covering: Covering | None = None
        """Covering state, or None when every subscription goes everywhere."""
        self.unquench = True
        """With covering, whether a withdrawal sends the subscriptions it covered in its
        place; only the law showing that it must is allowed to turn it off."""
        self.advertising: Advertising | None = Advertising() if advertisements else None
        """Advertisements (DESIGN §12, :mod:`octopis.core.advertising`), or None when
        subscriptions go everywhere."""
        self._next_adv = 0
        self._know(broker)
        if covering:
            self.covering = Covering(self._neighbours, advertisements=advertisements)
        self._missing_primary: frozenset[str] = frozenset()
        self._missing_secondary: dict[int, str] = {}
        self._local, self._primary = self.table.part(LOCAL), self.table.part(PRIMARY)

    def _know(self, broker: BrokerView) -> None:
        """Take ``broker``'s neighbours as this broker's links."""
        self._neighbours = frozenset(n.id for n in broker.neighbours)
        self.primary = tuple(n.id for n in broker.neighbours if n.link != ICOL)
        self.secondary = {n.cluster: n.id for n in broker.neighbours if n.link == ICOL}
        self.cluster_of = {n.id: n.cluster for n in broker.neighbours}
        self.region_of = {n.id: n.region for n in broker.neighbours}
        self.primary_in = {n.region: n.id for n in broker.neighbours if n.link != ICOL}
        if self.covering is not None:
            self.covering.set_links(self._neighbours)

    # -- a new topology version (issue 18, DESIGN §9) --------------------------------------

    def relink(self, broker: BrokerView, clusters: int) -> None:
        """Take this broker's view in a new topology version: links to brokers added or
        removed, and ``clusters`` when a cluster joined or left (every entry's CBV then
        gets that many bits, its host cluster's set). A link may go only once no entry
        points over it, a cluster only once no entry is of it (their subscribers moved
        away and withdrew first): :class:`ProtocolError` otherwise, and nothing changes."""
        if (broker.id, broker.cluster, broker.region) != (self.id, self.cluster, self.region):
            raise ProtocolError(f"{self.id} cannot take the view of {broker.id}")
        entries = self.table.entries.values()
        gone = set(self.cluster_of) - {n.id for n in broker.neighbours}
        over = sorted({e.last_hop for e in entries if e.last_hop in gone})
        if over:
            raise ProtocolError(
                f"{self.id} still routes subscriptions over {', '.join(over)}: they must be "
                "withdrawn before the link goes"
            )
        left = [e.sub_id for e in entries if e.cluster >= clusters]
        if left:
            raise ProtocolError(
                f"{self.id} still holds {len(left)} subscriptions of a cluster that leaves "
                f"(e.g. {left[0]})"
            )
        if clusters != self.clusters:
            for entry in list(entries):
                if entry.cbv is not None:
                    self.table.replace(replace(entry, cbv=self._cbv({entry.cluster}, clusters)))
            self.stats["relink.cbvs_resized"] += len(self.table)
        self.clusters = clusters
        self._know(broker)
        self._missing_primary -= gone  # a share from a neighbour that left will not come
        self._missing_secondary = {
            k: n for k, n in self._missing_secondary.items() if n not in gone
        }
        self.stats["relinks"] += 1

    # -- resync shares (DESIGN §7) ---------------------------------------------------------

    @property
    def missing_shares(self) -> frozenset[str]:
        """Neighbours whose resync share this (re)started broker has not received."""
        return self._missing_primary | frozenset(self._missing_secondary.values())

    def expect_shares(self, neighbours: set[str] | frozenset[str]) -> None:
        """Until :meth:`share_received`, route every notification toward each of
        ``neighbours`` as if its side of the table matched: a primary neighbour gets every
        copy from elsewhere, a secondary one every local publication. Its side's own
        tables filter; nothing is lost for want of the share, nothing is duplicated
        (the cluster stays a tree, the cluster gets one copy)."""
        unknown = set(neighbours) - set(self.cluster_of)
        if unknown:
            raise ProtocolError(f"{self.id} has no neighbours {sorted(unknown)}")
        self._missing_primary = frozenset(n for n in neighbours if n in self.primary)
        self._missing_secondary = {
            self.cluster_of[n]: n for n in neighbours if n not in self._missing_primary
        }

    def share_received(self, neighbour: str) -> None:
        """``neighbour``'s resync share has arrived whole: route by the table on its side."""
        self._missing_primary = self._missing_primary - {neighbour}
        self._missing_secondary.pop(self.cluster_of.get(neighbour, -1), None)

    def share_complete(self, neighbour: str) -> bool:
        """Whether the share this broker would hand ``neighbour`` is whole: no primary
        share but ``neighbour``'s is missing (a share is made of primary entries)."""
        return self._missing_primary <= {neighbour}

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

        With covering (DESIGN §12) it goes only over the links where no subscription
        sent over them covers it (:meth:`Covering.add`), and with advertisements only
        over those they draw it over (:meth:`_toward_publishers`; both: :meth:`_pass_on`);
        a subscription already held from ``src`` is a neighbour passing on again what it
        may have sent before (a restart, a link back) and is ignored. A SECONDARY one
        from a primary neighbour is a resync share entry (DESIGN §7): it goes on by the
        same rule, so that this restarted broker's neighbours get what the rule gives
        them now.
        """
        cluster = self._check_subscription(message, src, local)
        if len(message.cbv) != self.clusters:  # sent before a cluster joined or left
            message = replace(message, cbv=self._cbv({cluster}))
            self.stats["sbp.cbv_resized"] += 1
        covering = self.covering
        if message.state is SBP_SECONDARY:
            known = self.table.entries.get(message.sub_id)
            if known is not None and known.last_hop == src:
                self.stats["resync.already_known"] += 1  # SBP brought it before the share
                return []
            self._store(message, src, local, message.cbv, cluster)
            if cluster != self.cluster:
                return []
            if covering is not None:
                return self._pass_on(covering, message, src, restored=True)
            if self.advertising is not None:
                return self._toward_publishers(self.advertising, message, src, restored=True)
            return []
        if covering is not None:
            known = self.table.entries.get(message.sub_id)
            if known is not None and known.last_hop == src:
                self.stats["covering.already_held"] += 1
                return []
            self._store(message, src, local, message.cbv, cluster)
            return self._pass_on(covering, message, None if local else src)
        if self.advertising is not None:
            known = self.table.entries.get(message.sub_id)
            if known is not None and known.last_hop == src:
                self.stats["advertising.already_held"] += 1  # a restarted neighbour's
                return []
            self._store(message, src, local, message.cbv, cluster)
            return self._toward_publishers(self.advertising, message, None if local else src)
        self._store(message, src, local, message.cbv, cluster)
        primary = message.onward(SBP_PRIMARY)
        secondary = message.onward(SBP_SECONDARY)
        out: list[Action] = [Forward(n, primary) for n in self.primary if n != src]
        out += [Forward(n, secondary) for n in self.secondary.values()]
        self.stats["sent.subscribe"] += len(out)
        return out

    def _pass_on(
        self, covering: Covering, message: Subscribe, origin: str | None, restored: bool = False
    ) -> list[Action]:
        """SBP's two steps for ``message``, come over ``origin`` (None: local), over the
        links covering leaves it (counted ``covering.quenched`` per link left out); with
        advertisements, of those they draw it over (counted ``advertising.held_back``
        per link they do not)."""
        targets = [n for n in self.primary if n != origin]
        targets += self.secondary.values()
        drawn = None
        if self.advertising is not None:
            drawn = self.advertising.draws(message.subscription, targets, self._always_open)
            self.stats["advertising.held_back"] += len(targets) - len(drawn)
        links = covering.add(
            message.sub_id, message.subscription, origin, targets, drawn=drawn, restored=restored
        )
        self.stats["covering.quenched"] += len(targets if drawn is None else drawn) - len(links)
        if not links:
            return []
        return self._send_subscription(message, links)

    def withdraw_subscription(self, message: Unsubscribe, src: str) -> list[Action]:
        """Unsubscribe by the two steps of SBP: remove, then forward like the subscription.

        With covering, the withdrawal goes where the subscription went (or, after a
        restart, may have gone: one not held there is ignored), each preceded by the
        subscriptions it covered there that go in its place (:meth:`Covering.withdraw`).
        """
        entry = self.table.entries.get(message.sub_id)
        covering = self.covering
        if entry is None and covering is not None:
            self.stats["covering.unsubscribe_not_held"] += 1
            return []
        if entry is None and self.advertising is not None:
            self.stats["advertising.unsubscribe_not_held"] += 1  # see _withdraw_sent
            return []
        if entry is None or entry.last_hop != src:
            raise ProtocolError(f"unsubscribe of {message.sub_id} from {src}: no such entry")
        if message.state is SBP_PRIMARY and not entry.local and src not in self.primary:
            raise ProtocolError(f"PRIMARY unsubscribe from non-primary neighbour {src}")
        self.table.remove(message.sub_id)
        if covering is not None and entry.cluster == self.cluster:
            return self._withdraw_covering(covering, message.sub_id)
        if self.advertising is not None and entry.cluster == self.cluster:
            return self._withdraw_sent(self.advertising, message.sub_id)
        if message.state is SBP_SECONDARY:
            return []
        secondary = Unsubscribe(message.sub_id, SBP_SECONDARY)
        out: list[Action] = [Forward(n, message) for n in self.primary if n != src]
        out += [Forward(n, secondary) for n in self.secondary.values()]
        self.stats["sent.unsubscribe"] += len(out)
        return out

    # -- advertisements (DESIGN §12) -------------------------------------------------------

    def _toward_publishers(
        self,
        advertising: Advertising,
        message: Subscribe,
        origin: str | None,
        restored: bool = False,
    ) -> list[Action]:
        """SBP's two steps for ``message`` (come over ``origin``; None: local), over the
        links an intersecting advertisement opened (under DNR, every tree edge too);
        counted ``advertising.held_back`` per link left out for now. ``restored``: a
        resync share entry of this restarted broker's cluster; it goes on by the same
        rule (a neighbour that has it from the predecessor ignores it). Without covering
        (with it, :meth:`_pass_on`)."""
        targets = [n for n in self.primary if n != origin]
        targets += self.secondary.values()
        links = advertising.choose(
            message.sub_id, message.subscription, targets, self._always_open, restored=restored
        )
        self.stats["advertising.held_back"] += len(targets) - len(links)
        return self._send_subscription(message, links)

    @property
    def _always_open(self) -> frozenset[str]:
        """The links every subscription of this cluster is drawn over, whatever the
        advertisements: under DNR every tree edge (a copy may enter the cluster at any
        region), under SNR none."""
        return frozenset(self.primary) if self.dynamic else NO_TARGETS

    def _send_subscription(self, message: Subscribe, links: list[str]) -> list[Action]:
        primary = message.onward(SBP_PRIMARY)
        secondary = message.onward(SBP_SECONDARY)
        cluster_of = self.cluster_of
        out: list[Action] = [
            Forward(n, primary if cluster_of[n] == self.cluster else secondary) for n in links
        ]
        self.stats["sent.subscribe"] += len(out)
        return out

    def _withdraw_sent(self, advertising: Advertising, sub_id: str) -> list[Action]:
        """The withdrawal of ``sub_id``, over the links it went over (after a restart,
        also those its predecessor may have sent it over: one not held there is
        ignored)."""
        sent = advertising.forget(sub_id)
        out: list[Action] = [
            Forward(
                n,
                Unsubscribe(
                    sub_id, SBP_PRIMARY if self.cluster_of[n] == self.cluster else SBP_SECONDARY
                ),
            )
            for n in sorted(sent)
        ]
        self.stats["sent.unsubscribe"] += len(out)
        return out

    def advertise(self, publisher: str, advertisement: Subscription) -> tuple[str, list[Action]]:
        """Local ``publisher`` advertises ``advertisement``: it spreads by SBP's two steps.
        Returns its id (for :meth:`unadvertise`) and the actions."""
        advertising = self._advertising()
        self._next_adv += 1
        self.stats["advertisements_made"] += 1
        adv_id = f"{self.id}@{self.epoch}{self._next_adv}"
        advertising.add(AdvertEntry(adv_id, advertisement, self.id, publisher, None, True))
        message = Advertise(adv_id, self.id, advertisement, SBP_PRIMARY)
        return adv_id, self._spread_advert(message, None, None)

    def unadvertise(self, publisher: str, adv_id: str) -> list[Action]:
        """Local ``publisher`` withdraws its advertisement ``adv_id`` (or leaves)."""
        advertising = self._advertising()
        entry = advertising.entries.get(adv_id)
        if entry is None or not entry.local or entry.last_hop != publisher:
            raise ProtocolError(f"{publisher} holds no advertisement {adv_id} at {self.id}")
        advertising.remove(adv_id)
        return self._spread_withdrawal(Unadvertise(adv_id, SBP_PRIMARY), None)

    def advertisements_of(self, publisher: str) -> list[str]:
        """The ids of local ``publisher``'s advertisements."""
        if self.advertising is None:
            return []
        return sorted(self.advertising.publishers.get(publisher, {}))

    def check_advertised(self, publisher: str, publication: dict) -> None:
        """With advertisements on, raise :class:`UnadvertisedPublication` unless local
        ``publisher`` advertised a filter ``publication`` matches."""
        if self.advertising is None or self.advertising.advertised(publisher, publication):
            return
        self.stats["advertising.refused"] += 1
        raise UnadvertisedPublication(
            f"publication refused at {self.id}: it is outside every advertisement its "
            "publisher made here; advertise a filter it matches first"
        )

    def _advertising(self) -> Advertising:
        if self.advertising is None:
            raise ProtocolError(
                f"{self.id} routes without advertisements; turn them on for the overlay "
                "([routing] advertisements = on)"
            )
        return self.advertising

    def receive_advertisement(self, message: Advertise, src: str) -> list[Action]:
        """An advertisement from neighbour ``src``: hold it with the link it opens, pass
        it on by SBP's two steps (a SECONDARY one stops here), then send over that link
        the subscriptions held back from it that it may feed."""
        advertising = self._advertising()
        if message.state is SBP_PRIMARY:
            if src not in self.primary:
                raise ProtocolError(f"PRIMARY advertisement {message.adv_id} from {src}")
            opens: str | None = src
        elif src in self.primary:  # a resync share entry: its host lies on src's side
            opens = src
        else:
            opens = src if message.via is None else self.primary_in.get(message.via)
            if opens is None:
                raise ProtocolError(
                    f"advertisement {message.adv_id} from {src} came via region "
                    f"{message.via}, which is not a neighbour of {self.id}'s"
                )
        known = advertising.entries.get(message.adv_id)
        if known is not None and known.last_hop == src:
            self.stats["advertising.already_held"] += 1
            return []
        entry = AdvertEntry(message.adv_id, message.advertisement, message.host, src, opens, False)
        advertising.add(entry)
        out = self._spread_advert(message, src, self.region_of[src])
        return out + self._opened(advertising, opens, message.advertisement)

    def _spread_advert(self, message: Advertise, src: str | None, via: str | None) -> list[Action]:
        if message.state is SBP_SECONDARY:
            return []
        primary = Advertise(message.adv_id, message.host, message.advertisement, SBP_PRIMARY)
        secondary = Advertise(
            message.adv_id, message.host, message.advertisement, SBP_SECONDARY, via
        )
        out: list[Action] = [Forward(n, primary) for n in self.primary if n != src]
        out += [Forward(n, secondary) for n in self.secondary.values()]
        self.stats["sent.advertise"] += len(out)
        return out

    def _opened(
        self, advertising: Advertising, link: str, advertisement: Subscription
    ) -> list[Action]:
        """Send over ``link`` this cluster's subscriptions held back from it that
        ``advertisement`` may feed (counted ``advertising.released``); with covering,
        of those it draws there, the ones nothing sent over ``link`` covers
        (:meth:`Covering.draw`; the rest counted ``covering.quenched``)."""
        if self.dynamic and link in self.primary:
            return []  # every tree edge carries every subscription under DNR
        if self.covering is not None:
            return self._opened_covering(self.covering, link, advertisement)
        out: list[Action] = []
        for sub_id, sent in advertising.sent.items():
            if link in sent:
                continue
            entry = self.table.entries[sub_id]
            if entry.last_hop == link or not intersects(advertisement, entry.subscription):
                continue
            sent.add(link)
            maybe = advertising.maybe.get(sub_id)
            if maybe:
                maybe.discard(link)
            held = Subscribe(
                sub_id,
                entry.host,
                entry.subscription,
                SBP_PRIMARY,
                entry.cbv,
                entry.issued_at,
                entry.hops,
            )
            out += self._send_subscription(held, [link])
        self.stats["advertising.released"] += len(out)
        return out

    def _opened_covering(
        self, covering: Covering, link: str, advertisement: Subscription
    ) -> list[Action]:
        entries = self.table.entries
        drawn = [
            k for k in covering.undrawn(link) if intersects(advertisement, entries[k].subscription)
        ]
        if not drawn:
            return []
        state = SBP_PRIMARY if self.cluster_of[link] == self.cluster else SBP_SECONDARY
        out: list[Action] = [
            Forward(link, self._resent(entries[k], state)) for k in covering.draw(link, drawn)
        ]
        self.stats["covering.quenched"] += len(drawn) - len(out)
        self.stats["advertising.released"] += len(out)
        self.stats["sent.subscribe"] += len(out)
        return out

    def receive_unadvertisement(self, message: Unadvertise, src: str) -> list[Action]:
        """An advertisement's withdrawal from ``src``: forget it and pass the withdrawal
        on as the advertisement went. The subscriptions it drew stay where they are."""
        advertising = self._advertising()
        if advertising.remove(message.adv_id) is None:
            self.stats["advertising.unadvertise_not_held"] += 1  # a restarted broker's
        return self._spread_withdrawal(message, src)

    def _spread_withdrawal(self, message: Unadvertise, src: str | None) -> list[Action]:
        if message.state is SBP_SECONDARY:
            return []
        secondary = Unadvertise(message.adv_id, SBP_SECONDARY)
        out: list[Action] = [Forward(n, message) for n in self.primary if n != src]
        out += [Forward(n, secondary) for n in self.secondary.values()]
        self.stats["sent.unadvertise"] += len(out)
        return out

    def _withdraw_covering(self, covering: Covering, sub_id: str) -> list[Action]:
        links, instead = covering.withdraw(sub_id, self.unquench)
        entries = self.table.entries
        out: list[Action] = []
        for link in links:
            state = SBP_PRIMARY if self.cluster_of[link] == self.cluster else SBP_SECONDARY
            for k in instead.get(link, ()):
                out.append(Forward(link, self._resent(entries[k], state)))
            out.append(Forward(link, Unsubscribe(sub_id, state)))
        unquenched = len(out) - len(links)
        self.stats["sent.subscribe"] += unquenched
        self.stats["covering.unquenched"] += unquenched
        self.stats["sent.unsubscribe"] += len(links)
        return out

    def refresh_link(self, link: str) -> list[Action]:
        """With covering, the subscriptions sent over ``link``, sent again (a link back
        after a cut: one lost in flight would leave the neighbour without what covers
        those quenched for it; one it holds already is ignored there); counted as
        ``covering.refreshed``. Without covering, nothing."""
        if self.covering is None:
            return []
        state = SBP_PRIMARY if self.cluster_of[link] == self.cluster else SBP_SECONDARY
        entries = self.table.entries
        out: list[Action] = [
            Forward(link, self._resent(entries[k], state)) for k in self.covering.on_link(link)
        ]
        self.stats["covering.refreshed"] += len(out)
        self.stats["sent.subscribe"] += len(out)
        return out

    @staticmethod
    def _resent(entry: RoutingEntry, state: SubState) -> Subscribe:
        """The SBP message for ``entry``, one hop further, sent again."""
        return Subscribe(
            entry.sub_id,
            entry.host,
            entry.subscription,
            state,
            entry.cbv,
            entry.issued_at,
            entry.hops + 1,
        )

    # -- moves inside the cluster (DESIGN §9) ---------------------------------------------

    @property
    def adopts(self) -> bool:
        """Whether a subscription can move inside the cluster by :meth:`adopt` (not with
        covering or advertisements: the brokers between two hosts may not hold it)."""
        return self.covering is None and self.advertising is None

    def adopt(self, subscriber: str, sub_id: str) -> list[Action]:
        """Local ``subscriber`` takes over ``sub_id``, hosted elsewhere in this cluster.

        The primary entry becomes a local one (this broker delivers from now on) and a
        :class:`Move` goes to its last hop, toward the old host; every other neighbour
        holds the entry with this broker as last hop and gets a :class:`Rehost`. Only
        primary entries on the cluster-tree path between the hosts change; secondary
        entries point at this cluster, not at a host in it, and stay as they are."""
        if self.advertising is not None:
            raise ProtocolError(
                f"{self.id} routes with advertisements: {sub_id} cannot be adopted (the "
                "brokers between the hosts may not hold it); subscribe afresh here and "
                "withdraw it at the old host"
            )
        if self.covering is not None:
            raise ProtocolError(
                f"{self.id} routes with covering: {sub_id} cannot be adopted (the brokers "
                "between the hosts may hold only a subscription covering it); subscribe "
                "afresh here and withdraw it at the old host"
            )
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
        out: list[Action] = [Forward(n, note) for n in self.primary if n != path]
        out += [Forward(n, note) for n in self.secondary.values()]
        self.stats["sent.rehost"] += len(out)
        return out

    # -- notifications: Algorithms 3 and 4 -----------------------------------------------

    def publish(self, notification: Notification, links: LinkView) -> list[Action]:
        """A local publisher publishes ``notification``."""
        return self.route(notification, None, links)

    def route(self, n: Notification, src: str | None, links: LinkView) -> list[Action]:
        """A notification from ``src`` (None: a local publisher): a tunnel copy is relayed
        (DESIGN §7), anything else is routed by SNR or DNR. In SNR a copy with a tunnel or
        a CBV is on a failure detour and follows DNR's detour rules with congestion left
        out (:class:`FailuresOnly`)."""
        if n.destinations is not None:
            raise ProtocolError("a BID destination list reached a clustered broker")
        if not self.dynamic:
            if n.tunnel is None and n.cbv is None:
                return self.route_static(n, src, links)
            links = FailuresOnly(links)
        if n.tunnel is not None and src is not None:
            return self.relay(n, links, src)
        return self.route_dynamic(n, src, links)

    def static_targets(
        self, n: Notification, src: str | None
    ) -> tuple[AbstractSet[str], set[str], Mapping[int, str]]:
        """SNR's next destinations (§6.2): local subscribers, aCOLs, iCOLs by cluster
        (the first and last read-only).

        Local subscribers and aCOLs are the distinct last hops of matching local and
        primary entries (minus ``src``); iCOLs only when ``src`` is None (a local
        publisher): one link B(x, k) per cluster k with a matching secondary entry.
        A neighbour whose resync share is missing is a target as if it matched
        (:meth:`expect_shares`). Local subscribers are left out when this host has
        delivered the same
        ``(publisher, seq)`` before (edge dedup, DESIGN §7; counted as ``dedup.absorbed``).
        """
        self.matchings += 1
        publication = n.publication
        local, primary = self._local, self._primary
        subscribers: AbstractSet[str] = NO_TARGETS
        if len(local.matcher):
            subscribers = local.matcher.match_values(publication, local.value)
        if subscribers and not self.dedup.first((n.publisher, n.session), n.seq):
            self.stats["dedup.absorbed"] += len(subscribers)
            subscribers = NO_TARGETS
        acols = primary.matcher.match_values(publication, primary.value)
        if self._missing_primary:
            acols |= self._missing_primary
        acols.discard(src)  # type: ignore[arg-type]
        if src is not None:
            return subscribers, acols, NO_ICOLS
        cluster_of = self.cluster_of
        secondary = self.table.values(SECONDARY, publication)
        icols = {cluster_of[link]: link for link in secondary}
        if self._missing_secondary:
            icols.update(self._missing_secondary)
        return subscribers, acols, icols

    def route_static(self, n: Notification, src: str | None, links: LinkView) -> list[Action]:
        """Static Notification Routing (§6.2, Algorithm 3): one copy per distinct target.

        A broker entered over an iCOL forwards only inside its cluster; every cluster is a
        tree, so each interested subscriber gets the notification exactly once. SNR is
        static with respect to congestion only: when a target link is down (a failure),
        the copies take DNR's failure detours (:meth:`spread` on :class:`FailuresOnly`
        links: tunnels along squares for a dead aCOL, a CBV bit for a dead iCOL; DESIGN §7).
        """
        subscribers, acols, icols = self.static_targets(n, src)
        out: list[Action] = [Deliver(s, n) for s in subscribers] if subscribers else []
        down = links.down
        for link in (*acols, *icols.values()) if icols else acols:
            if down(link):
                del out[len(subscribers) :]
                out += self.spread(n, src, acols, icols, FailuresOnly(links))
                return out
            out.append(forward_copy(link, n))
        self.notification_copies += len(out) - len(subscribers)
        return out

    def route_dynamic(self, n: Notification, src: str | None, links: LinkView) -> list[Action]:
        """Dynamic Notification Routing (§6.3, Algorithm 4, Cases I–III).

        Targets are SNR's plus the iCOL to B(x, k) for every cluster k in the incoming
        CBV. With no target iCOL and every target aCOL live, that is a plain copy on each
        aCOL (the common case, decided here); otherwise :meth:`spread` sends the copies.
        """
        named = None if n.cbv is None else self._icols_named(n.cbv)  # checked before dedup
        subscribers, acols, icols = self.static_targets(n, src)
        if named is not None:
            icols = {**icols, **named}
            n = n._replace(cbv=None)
        out: list[Action] = [Deliver(s, n) for s in subscribers] if subscribers else []
        if not icols:
            down = links.down
            for link in acols:
                if down(link):  # not the common case after all: spread decides
                    del out[len(subscribers) :]
                    break
                out.append(forward_copy(link, n))
            else:
                self.notification_copies += len(acols)
                return out
        out += self.spread(n, src, acols, icols, links)
        return out

    def spread(
        self,
        n: Notification,
        src: str | None,
        acols: set[str],
        icols: Mapping[int, str],
        links: LinkView,
    ) -> list[Forward]:
        """DNR's copies of ``n`` (no CBV) for target ``acols`` and ``icols`` (by cluster).

        Plain copies go on every target aCOL and every unoverloaded target iCOL (U). If
        some target iCOLs are overloaded or *down* (O), their clusters travel as a CBV on
        exactly one copy: Case I on the least-loaded link of U; Case II, U empty, on the
        least-loaded unoverloaded target aCOL; Case III, every target link overloaded, on
        the least-loaded live link of O (cluster k0), minus k0, or, every link of O down,
        on the least-loaded live target aCOL. A down link never carries anything
        (DESIGN §7): a target aCOL that is down gets a tunnel copy (:meth:`detour`); bits
        no live target link can carry take the square the other way round, on the
        least-loaded live aCOL away from ``src`` (``dnr_detour``), or are counted
        undeliverable when there is none. Without failures the CBV only goes on a target
        link and never holds the current cluster's bit.
        """
        down = links.down
        unloaded: list[str] = []
        loaded: dict[int, str] = {}
        for k, link in icols.items():
            if down(link) or links.overloaded(link):
                loaded[k] = link
            else:
                unloaded.append(link)
        live_acols: list[str] = []
        dead_acols: list[str] = []
        for link in acols:
            (dead_acols if down(link) else live_acols).append(link)
        copies = dict.fromkeys((*live_acols, *unloaded), n)
        if loaded:
            carried = set(loaded)
            free_acols = [link for link in live_acols if not links.overloaded(link)]
            live_loaded = [link for link in loaded.values() if not down(link)]
            if unloaded:
                case, carrier = "dnr_case_1", min(unloaded, key=_by_load(links))
            elif free_acols:
                case, carrier = "dnr_case_2", min(free_acols, key=_by_load(links))
            elif live_loaded:
                case, carrier = "dnr_case_3", min(live_loaded, key=_by_load(links))
                carried.discard(self.cluster_of[carrier])
            elif live_acols:
                case, carrier = "dnr_case_3", min(live_acols, key=_by_load(links))
            else:
                away = [link for link in self.primary if link != src and not down(link)]
                case, carrier = "dnr_detour", min(away, key=_by_load(links), default=None)
            if carrier is None:
                self.stats["undeliverable.no_live_link"] += len(carried)
            else:
                copies[carrier] = n._replace(cbv=self._cbv(carried)) if carried else n
                self.stats[case if self.dynamic else "snr.cbv_detour"] += 1
                self.stats["dnr_kept_off"] += len(loaded) - (carrier in loaded.values())
        out = [Forward(link, copy) for link, copy in copies.items()]
        for link in dead_acols:
            out += self.detour(n, link, links)
        self.notification_copies += len(out)
        return out

    # -- failures: detours along squares and custody (DESIGN §7) -------------------------

    def detour(self, n: Notification, link: str, links: LinkView) -> list[Forward]:
        """The copy ``n`` for aCOL ``link`` (down) takes the square B(x,c) → B(x,k) →
        B(y,k) → B(y,c) through the cluster k of the least-loaded live iCOL; it keeps
        its CBV, if any. Counted as ``tunnel.started``, or undeliverable when no iCOL
        is live."""
        live = [(k, icol) for k, icol in self.secondary.items() if not links.down(icol)]
        if not live:
            self.stats["undeliverable.no_live_path"] += 1
            return []
        k, icol = min(live, key=lambda pair: (links.overloaded(pair[1]), *links.load(pair[1])))
        self.stats["tunnel.started"] += 1
        tunnel = Tunnel(self.cluster, self.region_of[link], self.region, 1 << k)
        return [Forward(icol, n._replace(tunnel=tunnel))]

    def relay(self, n: Notification, links: LinkView, src: str | None = None) -> list[Action]:
        """A tunnel copy from ``src`` (DESIGN §7). Its target B(y,c) routes it as if it had
        come from B(x,c); a relay B(x,k) passes it to B(y,k), or, that aCOL down, to
        another cluster's B(x,k') not yet tried; B(y,k) crosses to B(y,c), or, that iCOL
        down, hands it to another B(y,k') of its region to cross from there; when no
        cluster of region y reaches B(y,c) (presumed dead), the last fans out to every
        B(z,k), z a tree neighbour of y other than x, each to cross to B(z,c) and be
        routed there as if from B(y,c). A CBV rides on exactly one copy; a copy with
        nowhere to go is counted undeliverable."""
        tunnel = n.tunnel
        if tunnel.cluster == self.cluster:
            origin = self.primary_in.get(tunnel.origin)
            if tunnel.target != self.region or origin is None:
                raise ProtocolError(
                    f"tunnel to {tunnel.target} from {tunnel.origin} in cluster "
                    f"{tunnel.cluster} reached {self.id}"
                )
            self.stats["tunnel.arrived"] += 1
            n = n._replace(tunnel=None)
            if self.dynamic or n.cbv is not None:
                return self.route_dynamic(n, origin, links)
            return self.route_static(n, origin, links)
        if tunnel.cluster not in self.secondary:
            raise ProtocolError(f"tunnel to cluster {tunnel.cluster} reached {self.id}")
        self.stats["tunnel.relayed"] += 1
        if tunnel.target == self.region:
            return self._cross(n, links, src)
        ahead = self.primary_in.get(tunnel.target)
        if ahead is None:
            raise ProtocolError(f"tunnel to region {tunnel.target} reached {self.id}")
        if not links.down(ahead):
            return [Forward(ahead, n)]
        other = self._untried_cluster(n, tunnel, links)
        if other is None:
            self.stats["undeliverable.no_live_path"] += 1
            return []
        return [other]

    def _untried_cluster(self, n: Notification, tunnel: Tunnel, links: LinkView) -> Forward | None:
        """``n`` with ``tunnel`` handed over the least-loaded live iCOL to a cluster the
        tunnel has not tried (that cluster's bit set), or None."""
        untried = [
            (k, icol)
            for k, icol in self.secondary.items()
            if k != tunnel.cluster and not tunnel.tried >> k & 1 and not links.down(icol)
        ]
        if not untried:
            return None
        k, icol = min(untried, key=lambda pair: links.load(pair[1]))
        return Forward(icol, n._replace(tunnel=tunnel._replace(tried=tunnel.tried | 1 << k)))

    def _cross(self, n: Notification, links: LinkView, src: str | None) -> list[Action]:
        """B(y,k) passes a tunnel copy to B(y,c): over its own iCOL, else through another
        cluster of region y (``tried`` restarts when the copy enters the region), else it
        fans out around B(y,c) (dead, stalled, or cut off from every cluster of its
        region) and holds a copy for B(y,c) itself (:class:`Hold`, counted
        ``held.target_unreachable``): a B(y,c) that was only stalled gets it on its
        return, and its subscribers lose nothing; the CBV rides on the first fan-out
        copy, or on the held one when no fan-out link is live."""
        tunnel = n.tunnel
        icol = self.secondary[tunnel.cluster]
        if not links.down(icol):
            return [Forward(icol, n)]
        if src is None or self.region_of.get(src) != self.region:
            tunnel = tunnel._replace(tried=1 << self.cluster)
        other = self._untried_cluster(n, tunnel, links)
        if other is not None:
            return [other]
        self.stats["tunnel.fanout"] += 1
        out: list[Action] = []
        cbv = n.cbv
        for region, link in self.primary_in.items():
            if region == tunnel.origin:
                continue
            if links.down(link):
                self.stats["undeliverable.no_live_path"] += 1
                continue
            fanned = tunnel._replace(target=region, origin=self.region)
            out.append(Forward(link, n._replace(tunnel=fanned, cbv=cbv)))
            cbv = None
        self.stats["held.target_unreachable"] += 1
        out.append(Hold(icol, n._replace(cbv=cbv)))
        return out

    def reroute(self, link: str, message: Message, links: LinkView) -> list[Action]:
        """A copy sent on ``link`` and never acknowledged before it went down comes back
        from custody (DESIGN §7) and is routed again with ``link`` down: a tunnel copy by
        the relay rules, an aCOL copy by a tunnel, an iCOL copy as a CBV bit for its
        cluster (plus the bits it carried); SNR alike, congestion left out. Subscription
        messages are left to resync (counted ``custody.sbp_dropped``)."""
        if type(message) is not Notification:
            self.stats["custody.sbp_dropped"] += 1
            return []
        self.stats["custody.rerouted"] += 1
        if not self.dynamic:
            links = FailuresOnly(links)
        tunnel = message.tunnel
        if tunnel is not None and tunnel.cluster == self.cluster:
            target = self.primary_in[tunnel.target]
            return list(self.detour(message._replace(tunnel=None), target, links))
        if tunnel is not None:
            return self.relay(message, links)
        if link in self.primary:
            return list(self.detour(message, link, links))
        icols = {self.cluster_of[link]: link}
        if message.cbv is not None:
            icols.update(self._icols_named(message.cbv))
        return list(self.spread(message._replace(cbv=None), None, set(), icols, links))

    def _icols_named(self, cbv: frozenbitarray) -> dict[int, str]:
        """The iCOL to each cluster a CBV names. A bit for a cluster that has left since
        the copy was routed (issue 18: its subscribers moved away first) is skipped and
        counted as ``dnr.cbv_bit_of_departed_cluster``; any other bit that names no
        other cluster breaks the protocol."""
        icols = {}
        for k in cbv.search(1):
            if k >= self.clusters:
                self.stats["dnr.cbv_bit_of_departed_cluster"] += 1
            elif k == self.cluster or k not in self.secondary:
                raise ProtocolError(f"CBV bit {k} is invalid at cluster {self.cluster}")
            else:
                icols[k] = self.secondary[k]
        return icols

    # -- helpers -------------------------------------------------------------------------

    def _part_of(self, entry: RoutingEntry) -> str:
        if entry.local:
            return LOCAL
        return PRIMARY if entry.cluster == self.cluster else SECONDARY

    def _cbv(self, clusters: set[int], width: int = 0) -> frozenbitarray:
        """A CBV of ``width`` bits (this broker's cluster count by default) with
        ``clusters`` set."""
        bits = bitarray(width or self.clusters)
        bits.setall(0)
        for k in clusters:
            bits[k] = 1
        return frozenbitarray(bits)

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


class FailuresOnly:
    """SNR's view of its links on a failure detour (DESIGN §7): down as failure detection
    says, never overloaded, all equally loaded, so a detour's choices depend on failures
    alone (the first live candidate), never on congestion."""

    __slots__ = ("links",)

    def __init__(self, links: LinkView) -> None:
        self.links = links

    def overloaded(self, link: str) -> bool:
        return False

    def load(self, link: str) -> tuple[float, int]:
        return (0.0, 0)

    def down(self, link: str) -> bool:
        return self.links.down(link)


def _by_load(links: LinkView):
    return lambda link: (*links.load(link), link)
