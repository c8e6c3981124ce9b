"""A broker of the clustered SCOT: two-step SBP, SNR and DNR (paper §5, §6.2, §6.3).

The broker knows only its own labels and its direct neighbours (§4.3): the primary
neighbours in its cluster (aCOLs) and one secondary neighbour B(x, k) per other cluster k
(iCOLs). It reads no clock and does no I/O: every method takes one input and returns the
:class:`Forward` / :class:`Deliver` actions for the shell to carry out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from bitarray import bitarray, frozenbitarray

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
from octopis.core.table import MatcherFactory, RoutingEntry, RoutingTable
from octopis.core.view import ICOL, BrokerView
from octopis.filters import Subscription

LOCAL = "local"
PRIMARY = "primary"
SECONDARY = "secondary"


class ClusteredBroker:
    """Routing state machine of B(x, c) for SNR (``dynamic=False``) or DNR (``True``)."""

    def __init__(
        self,
        broker: BrokerView,
        clusters: int,
        matcher_factory: MatcherFactory,
        *,
        dynamic: bool = False,
    ) -> None:
        self.id = broker.id
        self.cluster = broker.cluster
        self.clusters = clusters
        self.dynamic = dynamic
        self.primary = tuple(n.id for n in broker.neighbours if n.link != ICOL)
        self.secondary = {n.cluster: n.id for n in broker.neighbours if n.link == ICOL}
        self.cluster_of = {n.id: n.cluster for n in broker.neighbours}
        self.table = RoutingTable((LOCAL, PRIMARY, SECONDARY), matcher_factory, self._part_of)
        self.stats: Counter[str] = Counter()
        self._next_sub = 0
        self.epoch = ""
        """Prefix of this broker's subscription numbers: a restarted broker's shell sets
        it from its incarnation, so its ids never collide with its predecessor's."""

    # -- subscriptions: Algorithm 1 ------------------------------------------------------

    def subscribe(
        self, subscriber: str, subscription: Subscription, now: float
    ) -> tuple[str, list[Action]]:
        """A local subscriber subscribes: set our cluster bit and start the two steps."""
        self._next_sub += 1
        sub_id = f"{self.id}#{self.epoch}{self._next_sub}"
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
        """
        cluster = self._check_subscription(message, src, local)
        self.table.add(
            RoutingEntry(
                message.sub_id,
                message.subscription,
                src,
                message.cbv,
                cluster,
                local,
                message.host,
                message.hops,
            )
        )
        if message.state is SubState.SECONDARY:
            return []
        hops = message.hops + 1
        primary = replace(message, hops=hops)
        secondary = replace(message, state=SubState.SECONDARY, hops=hops)
        out: list[Action] = [Forward(n, primary) for n in self.primary if n != src]
        out += [Forward(n, secondary) for n in self.secondary.values()]
        self.stats["sent.subscribe"] += len(out)
        return out

    def unsubscribe(self, subscriber: str, sub_id: str) -> list[Action]:
        """A local subscriber withdraws ``sub_id``: the same two steps remove it."""
        entry = self.table.entries.get(sub_id)
        if entry is None or not entry.local or entry.last_hop != subscriber:
            raise ProtocolError(f"{subscriber} holds no subscription {sub_id} at {self.id}")
        return self.withdraw_subscription(Unsubscribe(sub_id, SubState.PRIMARY), subscriber)

    def withdraw_subscription(self, message: Unsubscribe, src: str) -> list[Action]:
        """Unsubscribe by the two steps of SBP: remove, then forward like the subscription."""
        entry = self.table.entries.get(message.sub_id)
        if entry is None or entry.last_hop != src:
            raise ProtocolError(f"unsubscribe of {message.sub_id} from {src}: no such entry")
        if message.state is SubState.PRIMARY and not entry.local and src not in self.primary:
            raise ProtocolError(f"PRIMARY unsubscribe from non-primary neighbour {src}")
        self.table.remove(message.sub_id)
        if message.state is SubState.SECONDARY:
            return []
        secondary = Unsubscribe(message.sub_id, SubState.SECONDARY)
        out: list[Action] = [Forward(n, message) for n in self.primary if n != src]
        out += [Forward(n, secondary) for n in self.secondary.values()]
        self.stats["sent.unsubscribe"] += len(out)
        return out

    # -- notifications: Algorithms 3 and 4 -----------------------------------------------

    def publish(self, notification: Notification, links: LinkView) -> list[Action]:
        """A local publisher publishes ``notification``."""
        return self._route(notification, None, links)

    def receive(self, src: str, message: Message, links: LinkView) -> list[Action]:
        """Handle one message from neighbour ``src``."""
        if src not in self.cluster_of:
            raise ProtocolError(f"{self.id} has no link to {src}")
        if type(message) is Notification:
            return self._route(message, src, links)

        if isinstance(message, Subscribe):
            return self.broadcast_subscription(message, src)
        if isinstance(message, Unsubscribe):
            return self.withdraw_subscription(message, src)
        raise ProtocolError(f"unexpected message {type(message).__name__}")

    def _route(self, n: Notification, src: str | None, links: LinkView) -> list[Action]:
        if n.destinations is not None:
            raise ProtocolError("a BID destination list reached a clustered broker")
        if n.cbv is not None and not self.dynamic:
            raise ProtocolError("a CBV header reached a broker routing statically (SNR)")
        if self.dynamic:
            return self.route_dynamic(n, src, links)
        return self.route_static(n, src, links)

    def static_targets(
        self, n: Notification, src: str | None
    ) -> tuple[set[str], set[str], dict[int, str]]:
        """SNR's next destinations (§6.2): local subscribers, aCOLs, iCOLs by cluster.

        Local subscribers and aCOLs are the distinct last hops of matching local and
        primary entries (minus ``src``); iCOLs only when ``src`` is None (a local
        publisher): one link B(x, k) per cluster k with a matching secondary entry.
        """
        self.stats["matching"] += 1
        publication = n.publication
        table = self.table
        subscribers = table.values(LOCAL, publication) if table.size(LOCAL) else set()
        acols = table.values(PRIMARY, publication)
        acols.discard(src)  # type: ignore[arg-type]
        icols: dict[int, str] = {}
        if src is None:
            cluster_of = self.cluster_of
            icols = {cluster_of[link]: link for link in table.values(SECONDARY, publication)}
        return subscribers, acols, icols

    def route_static(self, n: Notification, src: str | None, links: LinkView) -> list[Action]:
        """Static Notification Routing (§6.2, Algorithm 3): one copy per distinct target.

        A broker entered over an iCOL forwards only inside its cluster; every cluster is a
        tree, so each interested subscriber gets the notification exactly once. SNR stays
        static under failures: a copy for a link that is down is counted undeliverable,
        never sent and never silently lost (DESIGN §7).
        """
        subscribers, acols, icols = self.static_targets(n, src)
        out: list[Action] = [Deliver(s, n) for s in subscribers]
        for link in (*acols, *icols.values()):
            if links.down(link):
                self.stats["undeliverable.link_down"] += 1
            else:
                out.append(Forward(link, n))
        self.stats["sent.notification"] += len(out) - len(subscribers)
        return out

    def route_dynamic(self, n: Notification, src: str | None, links: LinkView) -> list[Action]:
        """Dynamic Notification Routing (§6.3, Algorithm 4, Cases I–III).

        Targets are SNR's plus the iCOL to B(x, k) for every cluster k in the incoming
        CBV. A target link that is *down* (DESIGN §7) counts as overloaded and never
        carries anything: its cluster's subscribers are reached by entering that cluster
        elsewhere. Plain copies go on every target aCOL and every unoverloaded target iCOL (U).
        If some target iCOLs are overloaded (O), their clusters travel as a CBV on exactly
        one copy: Case I on the least-loaded link of U; Case II, U empty, on the
        least-loaded unoverloaded target aCOL; Case III, every target link overloaded, on
        the least-loaded live link of O (cluster k0), minus k0, or, every link of O down,
        on the least-loaded live target aCOL. The CBV never goes on a link that is not a
        target, and never holds the current cluster's bit; bits no live target link can
        carry are counted undeliverable.
        """
        subscribers, acols, icols = self.static_targets(n, src)
        if n.cbv is not None:
            for k in n.cbv.search(1):
                if k == self.cluster or k not in self.secondary:
                    raise ProtocolError(f"CBV bit {k} is invalid at cluster {self.cluster}")
                icols[k] = self.secondary[k]
            n = n._replace(cbv=None)
        down = links.down
        unloaded: list[str] = []
        loaded: dict[int, str] = {}
        for k, link in icols.items():
            if down(link) or links.overloaded(link):
                loaded[k] = link
            else:
                unloaded.append(link)
        live_acols = [link for link in acols if not down(link)]
        if len(live_acols) < len(acols):
            self.stats["undeliverable.link_down"] += len(acols) - len(live_acols)
        copies = dict.fromkeys((*live_acols, *unloaded), n)
        if loaded:
            carried = set(loaded)
            free_acols = [link for link in live_acols if not links.overloaded(link)]
            live_loaded = [link for link in loaded.values() if not down(link)]
            if unloaded:
                case, carrier = 1, min(unloaded, key=_by_load(links))
            elif free_acols:
                case, carrier = 2, min(free_acols, key=_by_load(links))
            elif live_loaded:
                case, carrier = 3, min(live_loaded, key=_by_load(links))
                carried.discard(self.cluster_of[carrier])
            elif live_acols:
                case, carrier = 3, min(live_acols, key=_by_load(links))
            else:
                self.stats["undeliverable.no_live_link"] += len(carried)
                case, carrier = 0, None
            if carrier is not None:
                copies[carrier] = n._replace(cbv=self._cbv(carried)) if carried else n
                self.stats[f"dnr_case_{case}"] += 1
                self.stats["dnr_kept_off"] += len(loaded) - (carrier in loaded.values())
        out: list[Action] = [Deliver(s, n) for s in subscribers]
        out += [Forward(link, copy) for link, copy in copies.items()]
        self.stats["sent.notification"] += len(copies)
        return out

    # -- helpers -------------------------------------------------------------------------

    def _part_of(self, entry: RoutingEntry) -> str:
        if entry.local:
            return LOCAL
        return PRIMARY if entry.cluster == self.cluster else SECONDARY

    def _cbv(self, clusters: set[int]) -> frozenbitarray:
        bits = bitarray(self.clusters)
        bits.setall(0)
        for k in clusters:
            bits[k] = 1
        return frozenbitarray(bits)

    def _check_subscription(self, message: Subscribe, src: str, local: bool) -> int:
        """Validate an SBP message against our labels; returns the host cluster."""
        cbv = message.cbv
        if cbv is None or len(cbv) != self.clusters or cbv.count(1) != 1:
            raise ProtocolError(
                f"subscription {message.sub_id}: CBV must have exactly one "
                f"of {self.clusters} bits set"
            )
        cluster = cbv.index(1)
        if local:
            return cluster
        if message.state is SubState.PRIMARY and (
            src not in self.primary or cluster != self.cluster
        ):
            raise ProtocolError(
                f"PRIMARY subscription {message.sub_id} from {src} "
                f"(host cluster {cluster}) at cluster {self.cluster}"
            )
        if message.state is SubState.SECONDARY and self.cluster_of.get(src) != cluster:
            raise ProtocolError(
                f"SECONDARY subscription {message.sub_id} from {src} "
                f"does not come from host cluster {cluster}"
            )
        return cluster


def _by_load(links: LinkView):
    return lambda link: (*links.load(link), link)
