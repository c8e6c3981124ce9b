"""Where a broker of the clustered SCOT stands (paper §4.3): its labels, its links by kind,
the resync shares it still waits for (DESIGN §7) and a topology version's new view
(DESIGN §9). :class:`ClusterLinks` is the base of the clustered broker: what both its
subscription rules (:mod:`octopis.core.clustered`) and its notification routing
(:mod:`octopis.core.notification_routing`) read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from bitarray import bitarray, frozenbitarray

from octopis.core.base import CoreBase
from octopis.core.dedup import EdgeDedup
from octopis.core.messages import Action, Forward, Message, ProtocolError, SubState
from octopis.core.table import LOCAL_PART, MatcherFactory, RoutingEntry, RoutingTable
from octopis.core.view import ICOL, BrokerView

PRIMARY_PART = "primary"
"""The table part of the entries of this broker's cluster that came from a neighbour."""
SECONDARY_PART = "secondary"
"""The table part of the entries of the other clusters."""

SBP_PRIMARY, SBP_SECONDARY = SubState.PRIMARY, SubState.SECONDARY
"""The steps of SBP as plain names: on Python 3.11 ``SubState.PRIMARY`` is a descriptor
lookup (~85 ns), and a 1,000-broker simulation reads a state ~5 × 10^7 times."""


class ClusterLinks(CoreBase):
    """B(x, c)'s labels and links: the primary neighbours in its cluster (aCOLs), one
    secondary neighbour B(x, k) per other cluster k (iCOLs), the cluster and region of
    each, and the neighbours whose resync share it has not received yet."""

    def __init__(
        self,
        broker: BrokerView,
        clusters: int,
        matcher_factory: MatcherFactory,
        *,
        dynamic: bool,
        dedup: EdgeDedup | None,
    ) -> None:
        super().__init__(
            broker.id,
            [n.id for n in broker.neighbours],
            RoutingTable(
                (LOCAL_PART, PRIMARY_PART, SECONDARY_PART), matcher_factory, self._part_of
            ),
            dedup,
        )
        self.cluster = broker.cluster
        self.region = broker.region
        self.clusters = clusters
        self.dynamic = dynamic
        self._know(broker)
        self._missing_primary: frozenset[str] = frozenset()
        self._missing_secondary: dict[int, str] = {}
        self._local, self._primary = self.table.part(LOCAL_PART), self.table.part(PRIMARY_PART)

    @property
    def neighbour_ids(self) -> frozenset[str]:
        """The neighbours this broker has links to."""
        return self._neighbours

    def _know(self, broker: BrokerView) -> None:
        """Take ``broker``'s neighbours as this broker's links."""
        self._neighbours = frozenset(n.id for n in broker.neighbours)
        self.primary = tuple(n.id for n in broker.neighbours if n.link != ICOL)
        self.secondary = {n.cluster: n.id for n in broker.neighbours if n.link == ICOL}
        self.cluster_of = {n.id: n.cluster for n in broker.neighbours}
        self.region_of = {n.id: n.region for n in broker.neighbours}
        self.primary_in = {n.region: n.id for n in broker.neighbours if n.link != ICOL}

    def _part_of(self, entry: RoutingEntry) -> str:
        if entry.local:
            return LOCAL_PART
        return PRIMARY_PART if entry.cluster == self.cluster else SECONDARY_PART

    def two_steps(
        self, primary: Message, secondary: Message, src: str | None = None
    ) -> list[Action]:
        """SBP's two steps (§5): ``primary`` to every primary neighbour but ``src``,
        ``secondary`` to every secondary one."""
        out: list[Action] = [Forward(n, primary) for n in self.primary if n != src]
        out += [Forward(n, secondary) for n in self.secondary.values()]
        return out

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

    # -- cluster bit vectors -------------------------------------------------------------

    def _cbv(self, clusters: Iterable[int], width: int = 0) -> frozenbitarray:
        """A CBV of ``width`` bits (this broker's cluster count by default) with
        ``clusters`` set."""
        bits = bitarray(width or self.clusters)
        bits.setall(0)
        for k in clusters:
            bits[k] = 1
        return frozenbitarray(bits)

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
