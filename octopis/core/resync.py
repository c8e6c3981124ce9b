"""Resync after a restart (DESIGN §7): what a neighbour hands a restarted broker, and the
withdrawal of what its predecessor had subscribed.

A restarted broker B(x, c) comes back empty. Each live neighbour sends it what the
two-step broadcast (§5) would have given it, as SECONDARY messages (stored, never
forwarded):

- a primary neighbour B(z, c): its cluster-c entries whose last hop is not B(x, c) —
  the subscriptions of z's side of the cluster tree;
- a secondary neighbour B(x, k): its cluster-k entries.

With covering (DESIGN §12) the share is what covering would send: those no other in it
covers (with advertisements too, of those advertisements draw over the link); the
restarted broker passes them on by the same rule.

With advertisements alone (DESIGN §12) a share is the subscriptions the neighbour sent over
the link (or may have: after its own restart), and it starts with the advertisements
that came from its side (:func:`advertisement_share`): a primary neighbour B(z, c) hands
those whose host lies on its side of the tree or in its region, an iCOL neighbour
B(x, k) those it hosts (so too with covering). The restarted broker passes on its
cluster's share entries by the rule it routes by (a neighbour that holds one already
ignores it).

Entries *hosted at* B(x, c) by its predecessor (sub ids without the new incarnation's
epoch) are withdrawn by each neighbour as if B(x, c) had sent the unsubscribe: the
neighbours split the cluster tree into parts, one each, so every entry is withdrawn
exactly once.
"""

from __future__ import annotations

from octopis.core.clustered import ClusteredBroker
from octopis.core.messages import Action, Advertise, Subscribe, SubState, Unsubscribe


def epoch_of(incarnation: int) -> str:
    """The sub-id epoch of a broker process with ``incarnation`` (see ``core.epoch``)."""
    return f"{incarnation:x}."


def resync_messages(
    core: ClusteredBroker,
    restarted: str,
    carried: set[str] | frozenset[str] = frozenset(),
    *,
    handed: bool = False,
) -> list[Subscribe]:
    """The SECONDARY messages ``core`` sends its restarted neighbour ``restarted``, less
    the subscriptions in ``carried`` (on the link already). With covering, those of them
    no other covers (:meth:`Covering.share`), each stamped with the time it was made;
    ``handed``: they are being sent, and covering records them as what went over the
    link (otherwise nothing changes: a look at what a restart would be handed)."""
    return core.travel.share(restarted, carried, handed)


def advertisement_share(core: ClusteredBroker, restarted: str) -> list[Advertise]:
    """The advertisements ``core`` hands its restarted neighbour ``restarted`` (as
    SECONDARY messages, stored there and not passed on): over a tree edge those whose
    host is not on the restarted broker's side, over an iCOL those ``core`` hosts."""
    return core.travel.advertisement_share(restarted)


def withdraw_predecessor(core: ClusteredBroker, restarted: str, epoch: str) -> list[Action]:
    """Withdraw the entries hosted at ``restarted`` by an earlier incarnation (their sub
    ids lack ``epoch``), as the two-step unsubscribe from ``restarted`` would; with
    advertisements, its advertisements too."""
    prefix = f"{restarted}#{epoch}"
    stale = [
        e.sub_id
        for e in core.table.entries.values()
        if e.host == restarted and e.last_hop == restarted and not e.sub_id.startswith(prefix)
    ]
    state = SubState.PRIMARY if core.cluster_of[restarted] == core.cluster else SubState.SECONDARY
    actions: list[Action] = []
    for sub_id in stale:
        actions += core.withdraw_subscription(Unsubscribe(sub_id, state), restarted)
    return actions + core.travel.withdraw_stale_advertisements(restarted, epoch, state)
