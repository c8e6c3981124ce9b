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
    Unsubscribe,
)
from octopis.core.table import MatcherFactory
from octopis.core.view import BrokerView, TopologyView

MODES = ("snr", "dnr", "bid")

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
) -> BrokerCore:
    """The routing core of ``broker_id`` for ``mode`` (snr, dnr or bid).

    The core sees only the broker's own labels and its neighbours (a :class:`BrokerView`
    read from the topology, never the topology itself); BID sees the unclustered graph
    (neighbour names, no roles). ``dedup`` bounds edge dedup (defaults otherwise).
    """
    if matcher_factory is None:
        from octopis.matching import Matcher

        matcher_factory = Matcher
    broker = scot.brokers[broker_id]
    if mode == "bid":
        return BidBroker(broker.id, [n.id for n in broker.neighbours], matcher_factory, dedup)
    if mode in ("snr", "dnr"):
        return ClusteredBroker(
            broker, scot.clusters, matcher_factory, dynamic=mode == "dnr", dedup=dedup
        )
    raise ValueError(f"unknown routing mode {mode!r}; choose one of {', '.join(MODES)}")


__all__ = [
    "MODES",
    "Action",
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
    "Unsubscribe",
    "make_broker",
]
