"""Whether a broker may take its view in a new topology version now (DESIGN §9): the rule
both shells ask before anything changes, the broker process at its control RPC's
``relink`` (through :meth:`~octopis.core.node.BrokerNode.relink`) and the simulator for
every broker a reshape touches, the leaving ones included
(:meth:`~octopis.sim.reshaping.Reshaping.reshape`, whose shrink waits on it too)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from octopis.core.bid import BidBroker
from octopis.core.clustered import ClusteredBroker
from octopis.core.custody import Custody

Carrying = Callable[[str], int]
"""What the link to a neighbour still carries: the routing messages queued on it or sent
and unacknowledged (:mod:`~octopis.core.custody`), as the shell that holds the link
counts them."""


def carried(queued: int, custody: Custody | None) -> int:
    """What a link carries (:data:`Carrying`), as both shells count it: the ``queued``
    routing messages waiting to leave on it, and those sent and not acknowledged, kept
    or pending in its ``custody`` (a copy in flight is one of those: counted once). Link
    frames (acknowledgements, heartbeats, a RESENT) carry nothing a relink would lose."""
    return queued + (len(custody) if custody is not None else 0)


def leaving_busy(leaving: Iterable[str], carrying: Carrying) -> dict[str, int]:
    """The neighbours among ``leaving`` whose link still carries something, with what it
    carries, by name: a link may leave the overlay only once this is empty, since what
    it carries would be lost with it (its custody, its queue, its resend after a heal)."""
    return {name: count for name in sorted(leaving) if (count := carrying(name))}


def refuse_relink(
    core: ClusteredBroker | BidBroker, leaving: Iterable[str], carrying: Carrying
) -> None:
    """:class:`ValueError`, naming why, if ``core``'s broker may not take a new view that
    drops its links to ``leaving`` now: under BID (no resync fills a new broker), under
    DNR with advertisements (a relink does not recompute where advertisements draw the
    subscriptions made before it: those would miss a new region's publishers), or while
    a leaving link still carries something (:func:`leaving_busy`; the refusal says the
    links *still carry*, which an operator's tool takes as a cue to retry once they
    drain)."""
    if not isinstance(core, ClusteredBroker):
        raise ValueError(f"{core.id} routes by BID, which has no resync to fill a new broker")
    if core.dynamic and core.advertising is not None:
        raise ValueError(
            f"{core.id} routes by DNR with advertisements, which a relink does not "
            "recompute yet (subscriptions made before it would miss a new region's "
            "publishers): route by SNR, or turn advertisements off"
        )
    busy = leaving_busy(leaving, carrying)
    if busy:
        raise ValueError(
            f"{core.id}: the links to {', '.join(busy)} still carry "
            f"{sum(busy.values())} unacknowledged messages: retry once they drain"
        )
