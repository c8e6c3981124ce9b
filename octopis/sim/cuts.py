"""What a cut link carries in the simulator (DESIGN §7), as TCP does on processes: it keeps
the frames in flight, and those its sender puts on it before declaring its neighbour down,
and delivers them first, in order, when it heals; a cut that lasts
:data:`~octopis.defaults.TCP_ABORT_AFTER` detection times aborts the connection, and what it
carried is lost (the process's ``TCP_MAXRT``, :func:`octopis.transport.links.tcp_abort_ms`),
as is what it carries to or from a broker that dies. (:mod:`octopis.sim.failures` keeps
which links are cut, :class:`~octopis.sim.failures.FailureState`.)
"""

from __future__ import annotations

from typing import Any

from octopis.core import Notification
from octopis.failure_schedule import Failure
from octopis.sim.custody import LINK_FRAMES


class CutLinks:
    """The :class:`~octopis.sim.engine.Simulator`'s cut links: what each carries, its
    abort, its retransmission at the heal (a mixin beside
    :class:`~octopis.sim.failures.FailureEvents`)."""

    def _cut(self, failure: Failure, links: list[tuple[str, str]]) -> None:
        """``failure`` cuts ``links`` now: each that carried until now aborts its
        connection :attr:`FailureState.abort` later unless it heals first (:meth:`_abort`)."""
        state = self.failures
        assert state is not None
        for src, dst in state.cut_by(failure, links, self.now):
            self.at(self.now + state.abort, self._abort, src, dst)

    def _abort(self, src: str, dst: str) -> None:
        """The connection of ``src → dst``, cut since :attr:`FailureState.abort` ago, is
        aborted: what it carried is lost (:meth:`_lose`)."""
        state = self.failures
        assert state is not None
        if not state.holds(src, dst, self.now):
            self._drop_stuck(src, dst)

    def _drop_stuck(self, src: str, dst: str) -> None:
        """What the cut link ``src → dst`` carried is lost (:meth:`_lose`)."""
        for message in self.failures.stuck.pop((src, dst), ()):  # type: ignore[union-attr]
            self._lose(dst, src, message)

    def _lose(self, broker: str, src: str, message: Any) -> None:
        """``message`` from ``src`` never reaches ``broker``: counted lost in transit
        (a link frame is not), and undeliverable if its dead sender's custody died with
        it: only it could have routed it again."""
        if type(message) in LINK_FRAMES:
            return
        self.failure_counts["lost_in_transit"] += 1
        if src in self.failures.dead and type(message) is Notification:  # type: ignore[union-attr]
            self.failure_counts["undeliverable.died_in_flight"] += 1
            self.brokers.given_up.add(message.key)

    def _loses(self, src: str, dst: str) -> bool:
        """Whether what ``src`` puts on its link to ``dst`` now does not go: an end is
        dead, or the link is cut and its connection aborted, or paused since ``src``
        declared ``dst`` down (what else it sends goes into the connection, which keeps
        it until the heal: :meth:`_carried`)."""
        state = self.failures
        assert state is not None
        if self.nodes[src].neighbours.declared_down(dst):
            return True  # the process pauses a link it declared down
        return state.broken(src, dst) and not state.holds(src, dst, self.now)

    def _carried(self, src: str, dst: str, message: Any) -> bool:
        """Whether ``message``, on the cut link ``src → dst``, is kept by it to arrive at
        the heal (:meth:`FailureState.holds`)."""
        state = self.failures
        assert state is not None
        if not state.holds(src, dst, self.now):
            return False
        state.stuck.setdefault((src, dst), []).append(message)
        return True

    def _retransmit(self, src: str, dst: str) -> None:
        """The link ``src → dst`` carries again: what it kept arrives first, in order, a
        link frame's latency later (TCP sends it again)."""
        state = self.failures
        assert state is not None
        for message in state.stuck.pop((src, dst), ()):
            late = self.network.link_frame_latency(src, dst) + state.slow.get((src, dst), 0.0)
            self.events.send(src, dst, self.now + late, message)

    def _connections_reset(self, broker: str) -> None:
        """``broker`` died: the connections of its cut links are gone, with what they
        carried (:meth:`_lose`); none is made until the heal, so nothing is carried."""
        state = self.failures
        assert state is not None
        for link in [link for link in state.cut_since if broker in link]:
            del state.cut_since[link]
            self._drop_stuck(*link)

    def _sending_again(self, broker: str) -> None:
        """``broker`` runs again after a pause, in which it sent nothing: on each of its
        cut links data goes unacknowledged from now, so the abort comes
        :attr:`FailureState.abort` from now (:meth:`_abort`)."""
        state = self.failures
        assert state is not None
        for link in [link for link in state.cut_since if link[0] == broker]:
            state.cut_since[link] = self.now
            self.at(self.now + state.abort, self._abort, *link)
