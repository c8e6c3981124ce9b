"""A new topology version in the simulator (DESIGN §9): brokers added (filled by the
restart resync) or removed (after their subscribers moved and their links drained)."""

from __future__ import annotations

from collections.abc import Callable

from octopis.sim.congestion import FreeLinks, InjectedCongestion
from octopis.topology import Scot

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
        its shares. A broker that leaves must host no subscriber and have nothing in
        flight (move its subscribers and drain first). Whether a broker may take the new
        view is its node's decision (:meth:`BrokerNode.relink`: not under BID, which has
        no resync, nor under DNR with advertisements), asked before anything changes."""
        if not isinstance(self.links, FreeLinks | InjectedCongestion):
            raise ValueError("reshape works on free or injected links, not timed ones")
        old = self.scot
        added = [b for b in scot.brokers if b not in old.brokers]
        removed = [b for b in old.brokers if b not in scot.brokers]
        hosted = sorted(c for c, b in self._home.items() if b in removed)
        if hosted:
            raise ValueError(f"clients {', '.join(hosted[:3])} are still attached to a broker "
                             "that leaves: move them first")  # fmt: skip
        events = self.events
        busy = [b for b in removed if events.carrying(b)] + [
            b for b in old.brokers for d in removed if events.carrying(b, d)
        ]
        if busy:
            raise ValueError(f"messages are in flight at {busy[0]}: let the overlay drain first")
        relinked = [
            b
            for b in scot.brokers
            if b in self.cores
            and (scot.clusters != old.clusters or set(scot.graph[b]) != set(old.graph[b]))
        ]
        dropped = [self.nodes[b].relink(scot.brokers[b], scot.clusters, self.now) for b in relinked]
        state = self._failure_state()
        for broker in removed:
            node = self.brokers.remove(broker)
            self.failure_counts.update(node.counts())
            events.remove(broker)
            state.custody.forget(broker, {})  # nothing in flight: nothing kept nor waiting
        for broker, held in zip(relinked, dropped, strict=True):
            self.failure_counts["relink.held_dropped"] += held
            for gone in set(old.graph[broker]) - set(scot.graph[broker]):
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
        every ``poll`` seconds) the overlay becomes ``scot`` (:meth:`reshape`)."""
        leaving = set(self.scot.brokers) - set(scot.brokers)
        if not leaving:
            raise ValueError(f"{scot.name} removes no broker: use reshape")
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
        busy = (
            any(self.moving(s) for s in self._home)
            or any(self.events.carrying(b, d) for b in self.cores for d in leaving)
            or any(self.events.carrying(b) for b in leaving)
        )
        if busy or late:
            self.at(self.now + poll, self._shrink_when_ready, scot, refuge, poll)
            return
        self.reshape(scot)
        self.retiring -= leaving
