"""What a broker knows of the overlay (paper §4.3, DESIGN §1): its own labels and its
direct neighbours, nothing more. The core reads these through the protocols below, so it
depends on no topology code; ``octopis.topology``'s brokers satisfy them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

ICOL = "iCOL"
"""Link kind of a link inside a region (between clusters); the other kind is an aCOL."""


class NeighbourView(Protocol):
    """A direct neighbour: its name, the kind of link to it, its cluster index and its
    region label (region labels are shared by all clusters, so a broker can name the
    corners of every square it lies on, DESIGN §7)."""

    @property
    def id(self) -> str: ...
    @property
    def link(self) -> str: ...
    @property
    def cluster(self) -> int: ...
    @property
    def region(self) -> str: ...


class BrokerView(Protocol):
    """A broker's own labels (name, cluster index, region label) and its neighbours."""

    @property
    def id(self) -> str: ...
    @property
    def cluster(self) -> int: ...
    @property
    def region(self) -> str: ...
    @property
    def neighbours(self) -> Sequence[NeighbourView]: ...


class TopologyView(Protocol):
    """Where a core is made from: each broker's view, and the number of clusters (the
    length of a cluster bit vector, §4.4)."""

    @property
    def brokers(self) -> Mapping[str, BrokerView]: ...
    @property
    def clusters(self) -> int: ...
