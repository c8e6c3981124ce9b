"""How a subscription travels from a broker of the clustered SCOT, chosen once, when the
broker is made (:func:`travel_for`), one class per way:

- :class:`Flood`: the paper's two-step SBP (§5): every subscription goes everywhere;
- :class:`Covered`: only over the links where no subscription sent over them covers it
  (DESIGN §12, :mod:`octopis.core.covering`);
- :class:`Advertised`: only toward publishers that advertised what it may match
  (DESIGN §12, :mod:`octopis.core.advertising`); it carries the advertisements too;
- :class:`CoveredAdvertised`: both, where advertisements draw it and nothing sent there
  covers it.

Each passes on a subscription its broker has stored, withdraws one, releases what an
advertisement that opens a link draws, sends again what a link back after a cut should
hold, and tells what a restarted neighbour is handed (DESIGN §7).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from octopis.core.advertising import AdvertEntry, Advertising
from octopis.core.cluster_links import SBP_PRIMARY, SBP_SECONDARY, ClusterLinks
from octopis.core.covering import Covering
from octopis.core.messages import (
    Action,
    Advertise,
    Forward,
    ProtocolError,
    Subscribe,
    SubState,
    Unadvertise,
    UnadvertisedPublication,
    Unsubscribe,
)
from octopis.core.table import RoutingEntry
from octopis.filters.covering import intersects
from octopis.filters.language import Subscription

NO_LINKS: frozenset[str] = frozenset()


class Travel(ABC):
    """What every way answers to, the rules they share, and what a way without
    advertisements answers to them. ``already_held``: the count of a subscription a
    neighbour passes on again (a restart, a link back) that is ignored; None, stored
    again. ``not_held``: the count of a withdrawal of one not held that is ignored;
    None, a protocol error."""

    not_adopted: tuple[str, str] | None = None
    """Why a subscription cannot move inside the cluster by ``adopt`` under this way: its
    name and what the brokers between the two hosts may hold; None: it can."""
    already_held: str | None = None
    not_held: str | None = None

    covering: Covering | None = None
    """Covering state, or None when every subscription goes everywhere."""
    advertising: Advertising | None = None
    """Advertisements, or None when subscriptions go everywhere."""

    def __init__(self, broker: ClusterLinks) -> None:
        self.broker = broker
        self.unquench = True
        """With covering, whether a withdrawal sends the subscriptions it covered in its
        place; only the law showing that it must is allowed to turn it off."""

    @abstractmethod
    def pass_on(
        self, message: Subscribe, origin: str | None, restored: bool = False
    ) -> list[Action]:
        """SBP's two steps for ``message`` (stored), come over ``origin`` (None: a local
        subscriber). ``restored``: a resync share entry of this broker's cluster."""

    @abstractmethod
    def withdraw(self, message: Unsubscribe, src: str) -> list[Action]:
        """The withdrawal of an entry of this broker's cluster (removed) from ``src``."""

    @abstractmethod
    def share(
        self, restarted: str, carried: set[str] | frozenset[str], handed: bool
    ) -> list[Subscribe]:
        """The SECONDARY messages handed to restarted neighbour ``restarted``, less those
        in ``carried`` (see :func:`octopis.core.resync.resync_messages`)."""

    def sbp_withdrawal(self, message: Unsubscribe, src: str) -> list[Action]:
        """The withdrawal by SBP's two steps: a SECONDARY one stops here."""
        if message.state is SBP_SECONDARY:
            return []
        out = self.broker.two_steps(message, Unsubscribe(message.sub_id, SBP_SECONDARY), src)
        self.broker.stats["sent.unsubscribe"] += len(out)
        return out

    def set_links(self, links: frozenset[str]) -> None:
        """The broker's links from now on (a topology version); a way that keeps
        nothing per link has nothing to change."""
        return

    def refresh(self, link: str) -> list[Action]:
        """What to send again over ``link``, back after a cut."""
        return []

    @property
    def adopts(self) -> bool:
        """Whether a subscription can move inside the cluster by ``adopt``."""
        return self.not_adopted is None

    def check_adoption(self, sub_id: str) -> None:
        """Raise :class:`ProtocolError` unless ``sub_id`` may be adopted here."""
        if self.not_adopted is not None:
            way, between = self.not_adopted
            raise ProtocolError(
                f"{self.broker.id} routes with {way}: {sub_id} cannot be adopted (the brokers "
                f"between the hosts {between}); subscribe afresh here and withdraw it at the "
                "old host"
            )

    # -- advertisements: none in this way ------------------------------------------------

    def _no_advertisements(self) -> ProtocolError:
        return ProtocolError(
            f"{self.broker.id} routes without advertisements; turn them on for the overlay "
            "([routing] advertisements = on)"
        )

    def advertise(self, publisher: str, advertisement: Subscription) -> tuple[str, list[Action]]:
        """Local ``publisher`` advertises ``advertisement``."""
        raise self._no_advertisements()

    def unadvertise(self, publisher: str, adv_id: str) -> list[Action]:
        """Local ``publisher`` withdraws its advertisement ``adv_id``."""
        raise self._no_advertisements()

    def receive_advertisement(
        self, message: Advertise, src: str
    ) -> tuple[list[Action], str | None]:
        """An advertisement from ``src``: the actions and the link it opens (None: held
        already, nothing opens)."""
        raise self._no_advertisements()

    def receive_unadvertisement(self, message: Unadvertise, src: str) -> list[Action]:
        """An advertisement's withdrawal from ``src``."""
        raise self._no_advertisements()

    def opened(self, link: str, advertisement: Subscription) -> list[Action]:
        """What ``advertisement``, having opened ``link``, draws over it."""
        raise self._no_advertisements()

    def advertisements_of(self, publisher: str) -> list[str]:
        """The ids of local ``publisher``'s advertisements."""
        return []

    def check_advertised(self, publisher: str, publication: dict) -> None:
        """Raise :class:`UnadvertisedPublication` unless ``publication`` may be published
        (without advertisements, every publication may)."""
        return

    def advertisement_share(self, restarted: str) -> list[Advertise]:
        """The advertisements handed to restarted neighbour ``restarted``."""
        return []

    def withdraw_stale_advertisements(
        self, restarted: str, epoch: str, state: SubState
    ) -> list[Action]:
        """Withdraw the advertisements of ``restarted``'s earlier incarnation."""
        return []

    # -- helpers -------------------------------------------------------------------------

    def _targets(self, origin: str | None) -> list[str]:
        """SBP's target links for a subscription come over ``origin`` (None: local)."""
        broker = self.broker
        return [n for n in broker.primary if n != origin] + list(broker.secondary.values())

    def _send(self, message: Subscribe, links: list[str]) -> list[Action]:
        """``message`` one hop on over ``links``: PRIMARY inside the cluster, else SECONDARY."""
        broker = self.broker
        primary = message.onward(SBP_PRIMARY)
        secondary = message.onward(SBP_SECONDARY)
        cluster_of, cluster = broker.cluster_of, broker.cluster
        out: list[Action] = [
            Forward(n, primary if cluster_of[n] == cluster else secondary) for n in links
        ]
        broker.stats["sent.subscribe"] += len(out)
        return out

    def _state(self, link: str) -> SubState:
        """The SBP step of a message over ``link``."""
        broker = self.broker
        return SBP_PRIMARY if broker.cluster_of[link] == broker.cluster else SBP_SECONDARY


class Flood(Travel):
    """The paper's SBP: every subscription to every primary neighbour but the one it came
    from (PRIMARY) and to every secondary one (SECONDARY); a share entry stops here."""

    def pass_on(
        self, message: Subscribe, origin: str | None, restored: bool = False
    ) -> list[Action]:
        if restored:
            return []
        broker = self.broker
        out = broker.two_steps(message.onward(SBP_PRIMARY), message.onward(SBP_SECONDARY), origin)
        broker.stats["sent.subscribe"] += len(out)
        return out

    def withdraw(self, message: Unsubscribe, src: str) -> list[Action]:
        return self.sbp_withdrawal(message, src)

    def share(
        self, restarted: str, carried: set[str] | frozenset[str], handed: bool
    ) -> list[Subscribe]:
        """To a primary neighbour, this cluster's entries not from it; to a secondary
        one, this cluster's entries."""
        broker = self.broker
        if broker.cluster_of[restarted] == broker.cluster:
            chosen = [
                e
                for e in broker.table.entries.values()
                if e.cluster == broker.cluster and e.last_hop != restarted
            ]
        else:
            chosen = [e for e in broker.table.entries.values() if e.cluster == broker.cluster]
        return _share_messages(chosen, carried)


class Covered(Travel):
    """Covering (DESIGN §12, :class:`~octopis.core.covering.Covering`): a subscription goes
    over the links where nothing sent over them covers it; its withdrawal sends in its
    place what it covered there."""

    not_adopted = ("covering", "may hold only a subscription covering it")
    already_held = "covering.already_held"
    not_held = "covering.unsubscribe_not_held"
    covering: Covering

    def __init__(self, broker: ClusterLinks) -> None:
        super().__init__(broker)
        self.covering = Covering(broker.neighbour_ids, advertisements=self.advertising is not None)

    def pass_on(
        self, message: Subscribe, origin: str | None, restored: bool = False
    ) -> list[Action]:
        """Over the links covering leaves it (counted ``covering.quenched`` per link left
        out)."""
        targets = self._targets(origin)
        drawn = self._drawn(message.subscription, targets)
        links = self.covering.add(
            message.sub_id, message.subscription, origin, targets, drawn=drawn, restored=restored
        )
        self.broker.stats["covering.quenched"] += len(targets if drawn is None else drawn) - len(
            links
        )
        if not links:
            return []
        return self._send(message, links)

    def _drawn(self, subscription: Subscription, targets: list[str]) -> list[str] | None:
        """The targets advertisements draw ``subscription`` over (None: every one)."""
        return None

    def withdraw(self, message: Unsubscribe, src: str) -> list[Action]:
        """Where the subscription went (or, after a restart, may have gone), each preceded
        by the subscriptions it covered there that go in its place
        (:meth:`Covering.withdraw`)."""
        sub_id = message.sub_id
        links, instead = self.covering.withdraw(sub_id, self.unquench)
        entries = self.broker.table.entries
        out: list[Action] = []
        for link in links:
            state = self._state(link)
            for k in instead.get(link, ()):
                out.append(Forward(link, _resent(entries[k], state)))
            out.append(Forward(link, Unsubscribe(sub_id, state)))
        unquenched = len(out) - len(links)
        stats = self.broker.stats
        stats["sent.subscribe"] += unquenched
        stats["covering.unquenched"] += unquenched
        stats["sent.unsubscribe"] += len(links)
        return out

    def set_links(self, links: frozenset[str]) -> None:
        self.covering.set_links(links)

    def refresh(self, link: str) -> list[Action]:
        """The subscriptions sent over ``link``, sent again (one lost in flight would
        leave the neighbour without what covers those quenched for it; one it holds
        already is ignored there); counted as ``covering.refreshed``."""
        state = self._state(link)
        entries = self.broker.table.entries
        out: list[Action] = [
            Forward(link, _resent(entries[k], state)) for k in self.covering.on_link(link)
        ]
        self.broker.stats["covering.refreshed"] += len(out)
        self.broker.stats["sent.subscribe"] += len(out)
        return out

    def share(
        self, restarted: str, carried: set[str] | frozenset[str], handed: bool
    ) -> list[Subscribe]:
        """Those no other in the share covers (:meth:`Covering.share`), each stamped with
        the time it was made; ``handed``: covering records them as sent over the link."""
        entries = self.broker.table.entries
        shared = self.covering.share(restarted, set(carried), commit=handed)
        return [
            Subscribe(e.sub_id, e.host, e.subscription, SBP_SECONDARY, e.cbv, e.issued_at,
                      e.hops + 1)
            for e in (entries[k] for k in shared)
        ]  # fmt: skip


class Advertised(Travel):
    """Advertisements (DESIGN §12): a subscription goes over the links an intersecting
    advertisement opened (under DNR, every tree edge too), and over a link opened later
    when that advertisement arrives."""

    not_adopted = ("advertisements", "may not hold it")
    already_held = "advertising.already_held"
    not_held = "advertising.unsubscribe_not_held"
    advertising: Advertising

    def __init__(self, broker: ClusterLinks) -> None:
        self._next_adv = 0
        super().__init__(broker)
        self.advertising = Advertising()

    @property
    def _always_open(self) -> frozenset[str]:
        """The links every subscription of this cluster is drawn over, whatever the
        advertisements: under DNR every tree edge (a copy may enter the cluster at any
        region), under SNR none; and the links to neighbours whose resync share this
        broker still misses (the advertisements from their side come with it)."""
        broker = self.broker
        always = frozenset(broker.primary) if broker.dynamic else NO_LINKS
        return always | broker.missing_shares

    def pass_on(
        self, message: Subscribe, origin: str | None, restored: bool = False
    ) -> list[Action]:
        """Over the links an intersecting advertisement opened; counted
        ``advertising.held_back`` per link left out for now. ``restored``: it goes on by
        the same rule (a neighbour that has it from the predecessor ignores it)."""
        targets = self._targets(origin)
        links = self.advertising.choose(
            message.sub_id, message.subscription, targets, self._always_open, restored=restored
        )
        self.broker.stats["advertising.held_back"] += len(targets) - len(links)
        return self._send(message, links)

    def withdraw(self, message: Unsubscribe, src: str) -> list[Action]:
        """Over the links it went over (after a restart, also those its predecessor may
        have sent it over: one not held there is ignored)."""
        sub_id = message.sub_id
        sent = self.advertising.forget(sub_id)
        out: list[Action] = [Forward(n, Unsubscribe(sub_id, self._state(n))) for n in sorted(sent)]
        self.broker.stats["sent.unsubscribe"] += len(out)
        return out

    def share(
        self, restarted: str, carried: set[str] | frozenset[str], handed: bool
    ) -> list[Subscribe]:
        """The subscriptions sent over the link (or that may have been: after a restart)."""
        broker = self.broker
        sent, maybe = self.advertising.sent, self.advertising.maybe
        chosen = [
            e
            for e in broker.table.entries.values()
            if e.cluster == broker.cluster
            and (restarted in sent.get(e.sub_id, ()) or restarted in maybe.get(e.sub_id, ()))
        ]
        return _share_messages(chosen, carried)

    # -- the advertisements themselves ---------------------------------------------------

    def advertise(self, publisher: str, advertisement: Subscription) -> tuple[str, list[Action]]:
        """It spreads by SBP's two steps; returns its id (for :meth:`unadvertise`)."""
        broker = self.broker
        self._next_adv += 1
        broker.stats["advertisements_made"] += 1
        adv_id = f"{broker.id}@{broker.epoch}{self._next_adv}"
        self.advertising.add(AdvertEntry(adv_id, advertisement, broker.id, publisher, None, True))
        message = Advertise(adv_id, broker.id, advertisement, SBP_PRIMARY)
        return adv_id, self._spread(message, None, None)

    def unadvertise(self, publisher: str, adv_id: str) -> list[Action]:
        advertising = self.advertising
        entry = advertising.entries.get(adv_id)
        if entry is None or not entry.local or entry.last_hop != publisher:
            raise ProtocolError(f"{publisher} holds no advertisement {adv_id} at {self.broker.id}")
        advertising.remove(adv_id)
        return self._spread_withdrawal(Unadvertise(adv_id, SBP_PRIMARY), None)

    def advertisements_of(self, publisher: str) -> list[str]:
        return sorted(self.advertising.publishers.get(publisher, {}))

    def check_advertised(self, publisher: str, publication: dict) -> None:
        """Unless local ``publisher`` advertised a filter ``publication`` matches."""
        if self.advertising.advertised(publisher, publication):
            return
        self.broker.stats["advertising.refused"] += 1
        raise UnadvertisedPublication(
            f"publication refused at {self.broker.id}: it is outside every advertisement its "
            "publisher made here; advertise a filter it matches first"
        )

    def receive_advertisement(
        self, message: Advertise, src: str
    ) -> tuple[list[Action], str | None]:
        """Hold it with the link it opens and pass it on by SBP's two steps (a SECONDARY
        one stops here)."""
        broker = self.broker
        if message.state is SBP_PRIMARY:
            if src not in broker.primary:
                raise ProtocolError(f"PRIMARY advertisement {message.adv_id} from {src}")
            opens: str | None = src
        elif src in broker.primary:  # a resync share entry: its host lies on src's side
            opens = src
        else:
            opens = src if message.via is None else broker.primary_in.get(message.via)
            if opens is None:
                raise ProtocolError(
                    f"advertisement {message.adv_id} from {src} came via region "
                    f"{message.via}, which is not a neighbour of {broker.id}'s"
                )
        advertising = self.advertising
        known = advertising.entries.get(message.adv_id)
        if known is not None and known.last_hop == src:
            broker.stats["advertising.already_held"] += 1
            return [], None
        entry = AdvertEntry(message.adv_id, message.advertisement, message.host, src, opens, False)
        advertising.add(entry)
        return self._spread(message, src, broker.region_of[src]), opens

    def receive_unadvertisement(self, message: Unadvertise, src: str) -> list[Action]:
        """Forget it and pass the withdrawal on as the advertisement went. The
        subscriptions it drew stay where they are."""
        if self.advertising.remove(message.adv_id) is None:
            self.broker.stats["advertising.unadvertise_not_held"] += 1  # a restarted broker's
        return self._spread_withdrawal(message, src)

    def opened(self, link: str, advertisement: Subscription) -> list[Action]:
        """This cluster's subscriptions held back from ``link`` that ``advertisement`` may
        feed (counted ``advertising.released``); none under DNR over a tree edge, which
        carries every subscription already."""
        broker = self.broker
        if broker.dynamic and link in broker.primary:
            return []
        return self._release(link, advertisement)

    def _release(self, link: str, advertisement: Subscription) -> list[Action]:
        advertising = self.advertising
        entries = self.broker.table.entries
        out: list[Action] = []
        for sub_id, sent in advertising.sent.items():
            if link in sent:
                continue
            entry = entries[sub_id]
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
            out += self._send(held, [link])
        self.broker.stats["advertising.released"] += len(out)
        return out

    def advertisement_share(self, restarted: str) -> list[Advertise]:
        """Over a tree edge those whose host is not on the restarted broker's side, over an
        iCOL those this broker hosts."""
        entries = self.advertising.entries.values()
        if restarted in self.broker.primary:
            chosen = [e for e in entries if e.opens != restarted]
        else:
            chosen = [e for e in entries if e.local]
        return [Advertise(e.adv_id, e.host, e.advertisement, SBP_SECONDARY) for e in chosen]

    def withdraw_stale_advertisements(
        self, restarted: str, epoch: str, state: SubState
    ) -> list[Action]:
        """As ``restarted`` would withdraw them (their ids lack ``epoch``)."""
        own = f"{restarted}@{epoch}"
        actions: list[Action] = []
        for entry in list(self.advertising.entries.values()):
            stale_advert = entry.host == restarted and entry.last_hop == restarted
            if stale_advert and not entry.adv_id.startswith(own):
                withdrawal = Unadvertise(entry.adv_id, state)
                actions += self.receive_unadvertisement(withdrawal, restarted)
        return actions

    def _spread(self, message: Advertise, src: str | None, via: str | None) -> list[Action]:
        if message.state is SBP_SECONDARY:
            return []
        primary = Advertise(message.adv_id, message.host, message.advertisement, SBP_PRIMARY)
        secondary = Advertise(
            message.adv_id, message.host, message.advertisement, SBP_SECONDARY, via
        )
        out = self.broker.two_steps(primary, secondary, src)
        self.broker.stats["sent.advertise"] += len(out)
        return out

    def _spread_withdrawal(self, message: Unadvertise, src: str | None) -> list[Action]:
        if message.state is SBP_SECONDARY:
            return []
        out = self.broker.two_steps(message, Unadvertise(message.adv_id, SBP_SECONDARY), src)
        self.broker.stats["sent.unadvertise"] += len(out)
        return out


class CoveredAdvertised(Covered, Advertised):
    """Both (DESIGN §12): advertisements decide where a subscription is drawn, covering
    which of those links it goes over (:class:`~octopis.core.covering.Covering` keeps
    where it went; :attr:`Advertising.sent` stays empty)."""

    not_adopted = Advertised.not_adopted

    def _drawn(self, subscription: Subscription, targets: list[str]) -> list[str] | None:
        """Counted ``advertising.held_back`` per target not drawn."""
        drawn = self.advertising.draws(subscription, targets, self._always_open)
        self.broker.stats["advertising.held_back"] += len(targets) - len(drawn)
        return drawn

    def _release(self, link: str, advertisement: Subscription) -> list[Action]:
        """Of those it draws there, the ones nothing sent over ``link`` covers
        (:meth:`Covering.draw`; the rest counted ``covering.quenched``)."""
        covering = self.covering
        entries = self.broker.table.entries
        drawn = [
            k for k in covering.undrawn(link) if intersects(advertisement, entries[k].subscription)
        ]
        if not drawn:
            return []
        state = self._state(link)
        out: list[Action] = [
            Forward(link, _resent(entries[k], state)) for k in covering.draw(link, drawn)
        ]
        stats = self.broker.stats
        stats["covering.quenched"] += len(drawn) - len(out)
        stats["advertising.released"] += len(out)
        stats["sent.subscribe"] += len(out)
        return out


def travel_for(broker: ClusterLinks, *, covering: bool, advertisements: bool) -> Travel:
    """The way subscriptions travel from ``broker``."""
    if covering:
        return CoveredAdvertised(broker) if advertisements else Covered(broker)
    return Advertised(broker) if advertisements else Flood(broker)


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


def _share_messages(
    chosen: list[RoutingEntry], carried: set[str] | frozenset[str]
) -> list[Subscribe]:
    return [
        Subscribe(e.sub_id, e.host, e.subscription, SBP_SECONDARY, e.cbv, 0.0, e.hops + 1)
        for e in chosen
        if e.sub_id not in carried
    ]
