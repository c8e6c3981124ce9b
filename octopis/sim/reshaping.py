"""A new topology version in the simulator (DESIGN §9): brokers added (filled by the
restart resync) or removed (after their subscribers moved and their links drained)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from octopis.core.node import HandedShare
from octopis.core.relinking import carried, leaving_busy, refuse_relink
from octopis.sim.congestion import FreeLinks, InjectedCongestion
from octopis.topology import Scot
from octopis.topology_change import changed_brokers, changed_links, refuse_stranded_publishers

MOVE_POLL = 0.01
"""Seconds between checks whether a subscription moved across clusters is stored by every
broker, so that the old one can go (:meth:`Simulator.move`), and whether the brokers a
shrink removes are free to go (:meth:`Reshaping.shrink`)."""


class Reshaping:
    """The :class:`~octopis.sim.engine.Simulator`'s topology changes (a mixin beside its
    event loop)."""

    def reshape(self, scot: Scot) -> None:
        """Change the overlay to ``scot``, a version that adds or removes brokers
        (:mod:`octopis.topology_change`), now. Every remaining broker takes its view in
        it (:meth:`ClusteredBroker.relink`: links added or removed, CBV width); a new
        broker starts empty and is filled by resync, the state transfer a restarted
        broker gets (:meth:`_hand_share`), its neighbours routing around it until it has
        its shares. A broker that leaves must host no subscriber (move them first).
        Whether a broker may take the new view is its node's rule
        (:func:`~octopis.core.relinking.refuse_relink`: not under BID, which has no
        resync, nor under DNR with advertisements, nor while a link that leaves still
        carries something: let it drain), asked of every broker whose links change, the
        leaving ones included, before anything changes."""
        if not isinstance(self.links, FreeLinks | InjectedCongestion):
            raise ValueError("reshape works on free or injected links, not timed ones")
        old = self.scot
        added, removed, relinked = changed_brokers(old, scot)
        hosted = sorted(c for c, b in self._home.items() if b in removed)
        if hosted:
            raise ValueError(f"clients {', '.join(hosted[:3])} are still attached to a broker "
                             "that leaves: move them first")  # fmt: skip
        leaving = changed_links(old, scot)
        for broker, gone in leaving.items():  # asked of every broker before any changes
            refuse_relink(self.cores[broker], gone, partial(self._carrying, broker))
        for b in relinked:
            self.nodes[b].relink(
                scot.brokers[b], scot.clusters, self.now, partial(self._carrying, b)
            )
        events = self.events
        state = self._failure_state()
        for broker in removed:
            node = self.brokers.remove(broker)
            self.failure_counts.update(node.counts())
            events.remove(broker)
            state.custody.forget(broker, {})  # nothing in flight: nothing kept nor waiting
        for broker in relinked:
            for gone in leaving[broker]:
                events.drop_link(broker, gone)
                state.custody.drop(broker, gone)
                state.failed_at.pop((broker, gone), None)
        self.brokers.scot = scot
        for broker in added:
            events.add(broker)
            self._start(broker)
        for broker in added:
            self._greet(broker)
        self.failure_counts["brokers_added"] += len(added)
        self.failure_counts["brokers_removed"] += len(removed)

    def shrink(self, scot: Scot, refuge: Callable[[str], str], poll: float = MOVE_POLL) -> None:
        """Remove the brokers ``scot`` lacks, without loss: every subscriber attached to
        one moves now to ``refuge(its broker)`` (make-before-break, :meth:`move`), and
        once no move is under way and nothing is on the leaving brokers' links (checked
        every ``poll`` seconds) the overlay becomes ``scot`` (:meth:`reshape`).
        :class:`TopologyError` before anything moves if a publisher is attached to a
        leaving broker (:func:`~octopis.topology_change.refuse_stranded_publishers`, as
        ``octopis scale`` refuses)."""
        leaving = set(self.scot.brokers) - set(scot.brokers)
        if not leaving:
            raise ValueError(f"{scot.name} removes no broker: use reshape")
        refuse_stranded_publishers(self.clients.publishers_at(leaving))
        movers = sorted(s for s, b in self._home.items() if b in leaving)
        for subscriber in movers:
            if not self.moving(subscriber):
                self.move(subscriber, refuge(self._home[subscriber]))
        self.retiring |= leaving
        self.at(self.now + poll, self._shrink_when_ready, scot, refuge, poll)

    def _shrink_when_ready(self, scot: Scot, refuge: Callable[[str], str], poll: float) -> None:
        """:meth:`shrink`'s poll. Any move under way counts, not only those it ordered:
        one into a leaving broker, ordered before it retired, must end first."""
        leaving = set(self.scot.brokers) - set(scot.brokers)
        late = [s for s, b in self._home.items() if b in leaving and not self.moving(s)]
        for subscriber in late:  # moved there meanwhile, or its move was queued
            self.move(subscriber, refuge(self._home[subscriber]))
        busy = any(self.moving(s) for s in self._home) or any(
            leaving_busy(gone, partial(self._carrying, broker))
            for broker, gone in changed_links(self.scot, scot).items()
        )
        if busy or late:
            self.at(self.now + poll, self._shrink_when_ready, scot, refuge, poll)
            return
        self.reshape(scot)
        self.retiring -= leaving

    def _carrying(self, src: str, dst: str) -> int:
        """What ``src``'s link to ``dst`` carries, as the process counts it
        (:func:`~octopis.core.relinking.carried`): what waits on it, and what its custody
        holds unacknowledged; a share in flight counts as pending (the process's share
        frames are until acknowledged; the simulator's share is one unnumbered message).
        Without custody (no failure scheduled) what is in flight is all it carries."""
        state = self.failures
        if state is None:
            return self.events.carrying(src, dst)
        custody, link = state.custody, (src, dst)
        in_flight = self.events.in_flight[src].get(dst, ())
        shares = sum(type(flight[4]) is HandedShare for flight in in_flight)
        return carried(len(custody.waiting.get(link, ())) + shares, custody.links.get(link))
