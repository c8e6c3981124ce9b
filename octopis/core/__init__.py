"""Sans-IO routing core: one broker's state machine (DESIGN §2–3).

``make_broker`` builds the core for one SCOT node in a routing mode: ``snr`` and ``dnr``
on the clustered SCOT (:class:`ClusteredBroker`), ``bid`` on the unclustered one
(:class:`BidBroker`). Real broker processes and the simulator both drive these objects.
"""

from __future__ import annotations

from octopis.core.base import Counts
from octopis.core.bid import BidBroker
from octopis.core.clustered import ClusteredBroker
from octopis.core.dedup import EdgeDedup
from octopis.core.lst import LinkStatusTable, LinkView
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
)
from octopis.core.table import MatcherFactory
from octopis.core.view import BrokerView, TopologyView

MODES = ("snr", "dnr", "bid")
COVERING = ("off", "active")
"""Covering settings: ``off`` (every subscription reaches every broker) or ``active``
(DESIGN §12)."""
DEFAULT_COVERING = "active"
"""The covering of brokers and simulations that are told none."""


BrokerCore = ClusteredBroker | BidBroker


class NoCongestion:
    """A :class:`LinkView` in which no link is ever overloaded or down."""

    def overloaded(self, link: str) -> bool:
        """Never."""
        return False

    def load(self, link: str) -> tuple[float, int]:
        """An idle link: CE 1, empty queue."""
        return (1.0, 0)

    def down(self, link: str) -> bool:
        """Never."""
        return False


def make_broker(
    scot: TopologyView,
    broker_id: str,
    mode: str,
    matcher_factory: MatcherFactory | None = None,
    dedup: EdgeDedup | None = None,
    covering: str = DEFAULT_COVERING,
    advertisements: bool = False,
) -> BrokerCore:
    """The routing core of ``broker_id`` for ``mode`` (snr, dnr or bid).

    The core sees only the broker's own labels and its neighbours (a :class:`BrokerView`
    read from the topology, never the topology itself); BID sees the unclustered graph
    (neighbour names, no roles). ``dedup`` bounds edge dedup (defaults otherwise).
    ``covering`` (:data:`COVERING`): ``active`` makes
    SNR and DNR pass a subscription on only where nothing sent the same way covers it
    (DESIGN §12); BID, the paper's
    flooding baseline, routes by subscription ids and always floods.
    ``advertisements``: SNR and DNR send a subscription only toward publishers that
    advertised what it may match (DESIGN §12), with covering or without; not under BID.
    """
    if covering not in COVERING:
        raise ValueError(f"unknown covering {covering!r}; choose one of {', '.join(COVERING)}")
    if advertisements and mode == "bid":
        raise ValueError(
            "advertisements need routing mode snr or dnr; got mode 'bid' (turn "
            "advertisements off, or choose snr or dnr)"
        )
    if matcher_factory is None:
        from octopis.matching import Matcher

        matcher_factory = Matcher
    broker = scot.brokers[broker_id]
    if mode == "bid":
        return BidBroker(broker.id, [n.id for n in broker.neighbours], matcher_factory, dedup)
    if mode in ("snr", "dnr"):
        return ClusteredBroker(
            broker,
            scot.clusters,
            matcher_factory,
            dynamic=mode == "dnr",
            dedup=dedup,
            covering=covering == "active",
            advertisements=advertisements,
        )
    raise ValueError(f"unknown routing mode {mode!r}; choose one of {', '.join(MODES)}")


__all__ = [
    "COVERING",
    "DEFAULT_COVERING",
    "MODES",
    "Action",
    "Advertise",
    "BidBroker",
    "BrokerCore",
    "BrokerView",
    "ClusteredBroker",
    "Counts",
    "Deliver",
    "EdgeDedup",
    "Forward",
    "Hold",
    "LinkStatusTable",
    "LinkView",
    "Message",
    "Move",
    "NoCongestion",
    "Notification",
    "ProtocolError",
    "Rehost",
    "Released",
    "SubState",
    "Subscribe",
    "Tunnel",
    "Unadvertise",
    "UnadvertisedPublication",
    "Unsubscribe",
    "make_broker",
]
