"""How a broker of the clustered SCOT routes a notification: SNR and DNR (paper §6.2,
§6.3, Algorithms 3 and 4), and the detours along squares and the custody reroutes that
carry copies past failed links (DESIGN §7). :class:`NotificationRouting` reads no clock
and does no I/O: each method takes one notification and returns the actions for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType

from octopis.core.cluster_links import SECONDARY_PART, ClusterLinks
from octopis.core.lst import LinkView
from octopis.core.messages import (
    Action,
    Deliver,
    Forward,
    Hold,
    Message,
    Notification,
    ProtocolError,
    Tunnel,
    forward_copy,
)

NO_TARGETS: frozenset[str] = frozenset()
"""No local subscribers: what :meth:`NotificationRouting.static_targets` gives most hops,
without a new set each time."""
NO_ICOLS: Mapping[int, str] = MappingProxyType({})
"""No iCOLs (a notification that came from a neighbour): read-only, so never changed."""


class NotificationRouting(ClusterLinks):
    """SNR (``dynamic`` False) or DNR (True) over this broker's table, its links and the
    shares it still waits for (:class:`~octopis.core.cluster_links.ClusterLinks`)."""

    @property
    def advertising(self) -> object | None:
        """Advertisements, when on (then a cluster's entries lie only towards publishers
        that advertised, so a copy enters another cluster only in its own region)."""
        return None

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
        secondary = self.table.values(SECONDARY_PART, publication)
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
    ) -> list[Action]:
        """DNR's copies of ``n`` (no CBV) for target ``acols`` and ``icols`` (by cluster).

        Plain copies go on every target aCOL and every unoverloaded target iCOL (U). If
        some target iCOLs are overloaded or *down* (O), their clusters travel as a CBV on
        exactly one copy: Case I on the least-loaded link of U; Case II, U empty, on the
        least-loaded unoverloaded target aCOL; Case III, every target link overloaded, on
        the least-loaded live link of O (cluster k0), minus k0, or, every link of O down,
        on the least-loaded live target aCOL. A down link never carries anything
        (DESIGN §7): a target aCOL that is down gets a tunnel copy (:meth:`detour`); bits
        no live target link can carry (or, with advertisements, that would ride an aCOL)
        enter their clusters at this region's B(x,k) itself, by a tunnel through the
        region (:meth:`_enter_region`, ``dnr_detour``). Without failures the CBV only goes
        on a target link and never holds the current cluster's bit.
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
        for link in sorted(acols):  # the same choices in any process (ties of min below)
            (dead_acols if down(link) else live_acols).append(link)
        copies = dict.fromkeys((*live_acols, *unloaded), n)
        entering: list[Action] = []
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
                case, carrier = "dnr_detour", None
            if carrier is None or (carrier in live_acols and self.advertising is not None):
                dead = {k for k in carried if down(loaded[k])}
                carried -= dead
                entering = self._enter_region(n, dead, links) if dead else []
            if carrier is not None and (carried or carrier not in copies):
                copies[carrier] = n._replace(cbv=self._cbv(carried)) if carried else n
                self.stats[case if self.dynamic else "snr.cbv_detour"] += 1
                self.stats["dnr_kept_off"] += len(loaded) - (carrier in loaded.values())
        out: list[Action] = [Forward(link, copy) for link, copy in copies.items()]
        out += entering
        for link in dead_acols:
            out += self.detour(n, link, links)
        self.notification_copies += len(out)
        return out

    # -- failures: detours along squares and custody (DESIGN §7) -------------------------

    def _enter_region(self, n: Notification, clusters: set[int], links: LinkView) -> list[Action]:
        """The copies of ``n`` for ``clusters`` whose iCOLs are down and no live target
        link can carry: each is a tunnel to this region's B(x,k), crossing from another
        cluster of the region, or, none reaching it, fanned out around it (:meth:`_cross`);
        B(x,k) routes it as if from its iCOL. Entering cluster k at another region would
        miss what advertisements routed only towards the publisher's region."""
        self.stats["dnr_detour"] += 1
        out: list[Action] = []
        for k in sorted(clusters):
            self.stats["tunnel.started"] += 1
            tunnel = Tunnel(k, self.region, self.region, 1 << self.cluster)
            out += self._cross(n._replace(tunnel=tunnel, cbv=None), links, None)
        return out

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
            inside = tunnel.origin == self.region and src in self.secondary.values()
            origin = src if inside else self.primary_in.get(tunnel.origin)
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


def _by_load(links: LinkView) -> Callable[[str], tuple]:
    return lambda link: (*links.load(link), link)
