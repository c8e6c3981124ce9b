"""Handshakes and liveness of a broker's neighbours (DESIGN §7): what HELLO, heartbeat and
SYNCED frames and silence do to their links.

Liveness. Every directed link carries a heartbeat when it has sent nothing for
``links.heartbeat`` seconds; any frame counts as a sign of life. A neighbour silent for
``links.down_after`` seconds (T, default 1 s) is *down*: its LST row says so, DNR's cases
avoid it, and the frames queued for it go back to the broker
(:meth:`~octopis.transport.peer_events.PeerEvents.link_down`).

Incarnations. HELLO carries the sender's incarnation and the receiver's as the sender
knows it; a new incarnation seen in a HELLO or a heartbeat means the neighbour restarted:
what was queued for it goes back to the broker, and the handshake starts again. So does
what waited for a neighbour's first handshake: the broker's node hands it on, in order
(:meth:`~octopis.core.node.BrokerNode.link_down`).

What these frames mean is not decided here: each moves the neighbour's state machine in
the broker's node (:class:`~octopis.core.neighbours.Neighbours`), which says whether to
route through it and when the broker serves
(:meth:`~octopis.core.node.BrokerNode.serve_if_ready`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from octopis.core import LinkStatusTable
from octopis.core.codec import Heartbeat, Hello, Synced
from octopis.core.custody import counts_for
from octopis.core.neighbours import Neighbour, liveness_tick, stall
from octopis.core.node import BrokerNode
from octopis.transport.frames import HANDSHAKE
from octopis.transport.peer_output import PeerOutput

if TYPE_CHECKING:
    from octopis.transport.peer_events import PeerEvents

log = logging.getLogger("octopis.broker.peers")

DETECTIONS_KEPT = 1000
"""Failure detections remembered for ``octopis status`` (the oldest go first)."""


class PeerLiveness:
    """Handshakes, heartbeats heard, failure detection and the start of serving of one
    broker; what detection decides is written into the LST's rows, which the core reads.
    ``heartbeat``, ``down_after`` and ``ack_interval`` are ``[links]``' settings."""

    def __init__(
        self,
        broker_id: str,
        incarnation: int,
        node: BrokerNode,
        lst: LinkStatusTable,
        output: PeerOutput,
        events: PeerEvents,
        counters: Counter[str],
        *,
        heartbeat: float,
        down_after: float,
        ack_interval: float,
    ) -> None:
        self.id = broker_id
        self.incarnation = incarnation
        self.node = node
        """The broker's node: its neighbours' states and whether it serves are its."""
        self.neighbours = node.neighbours
        self.lst = lst
        self.output = output
        self.events = events
        self.counters = counters
        self.heartbeat = heartbeat
        self.down_after = down_after
        self.ack_interval = ack_interval
        self.detections: list[dict[str, float | str]] = []

    def start(self, now: float) -> None:
        """This process starts at ``now``: every link down until its neighbour is heard,
        and a HELLO queued on each."""
        self.node.start(now, self.down_after)
        for name in self.output.links:
            self.lst.set_down(name, True)
            self.output.hello(name, now)

    def route_through(self, name: str) -> None:
        """The LST row says down unless the neighbour is up and serving."""
        self.lst.set_down(name, not self.neighbours.routable(name))

    def check_serving(self, now: float) -> None:
        """Start serving when the node says so (:meth:`BrokerNode.serve_if_ready`): carry
        out its steps, then tell every neighbour at once, behind what they sent it."""
        served = self.node.serve_if_ready(now, self.lst)
        if served is None:
            return
        log.info("%s is serving (resynced from every live neighbour)", self.id)
        self.events.now_serving(served)
        for name, state in self.neighbours.items():
            self.output.beat(name, state, now, behind_data=True)

    # -- frames heard ----------------------------------------------------------------------

    def link_message(
        self, sender: str, state: Neighbour, message: Hello | Heartbeat, now: float
    ) -> None:
        """Handshake and heartbeat: a new incarnation is the node's step
        (:meth:`BrokerNode.meet`: its link gives back, our HELLO goes ahead of the
        hand-over), a HELLO says whether it names us, a heartbeat acknowledges."""
        link = self.output.links[sender]

        def give_back() -> None:  # routed around it, then our HELLO ahead of the hand-over
            self.route_through(sender)
            self.events.link_down(sender, link.take_back(now), link.give_up())
            hello = Hello(self.incarnation, message.incarnation)
            link.greet(self.output.frame(hello, HANDSHAKE), now)

        met = self.node.meet(sender, message.incarnation, give_back)
        if met is not None:
            if met.restarted:
                self._restarted(sender)
            self.events.execute(met.actions)
        if type(message) is Hello:
            self.neighbours.handshake(sender, message.peer_incarnation, self.incarnation)
            return
        if counts_for(message.acked_incarnation, self.incarnation):
            self.output.links[sender].acknowledge(message.acked, now)

    def synced(self, sender: str, message: Synced, now: float) -> None:
        """``sender`` says it handed us its share: the node's step
        (:meth:`BrokerNode.share_heard`); the LST row follows the node's table; then this
        broker may serve."""
        self.events.synced(sender, message)
        self.route_through(sender)
        self.check_serving(now)

    def heard(self, sender: str, state: Neighbour, serving: bool | None, now: float) -> None:
        """A frame from ``sender`` at ``now`` (``serving``: what a heartbeat says of it,
        None: not a heartbeat), after what its handshake or heartbeat says of
        incarnations (:meth:`link_message`): the node's steps, in its order
        (:meth:`BrokerNode.heard`); if it heals, the link gives back first what was put
        on it while ``sender`` was down (the node holds it behind what it held then,
        :meth:`PeerEvents.link_down`, so that the hand-over sends it in the order it was
        sent). The LST row follows the node's table."""
        link = self.output.links[sender]
        heard = self.node.heard(
            sender, now, serving, lambda: self.events.link_down(sender, link.take_back(now))
        )
        self.route_through(sender)
        self.events.execute(heard.actions)
        if heard.back and state.was_down:
            log.warning("%s: link to %s is up again after %.2f s", self.id, sender, state.was_down)

    def _restarted(self, sender: str) -> None:
        """``sender`` runs as a new process: nothing queued for the old one reached it
        (its link gave it back, :meth:`link_message`)."""
        self.counters["peer_restarts"] += 1
        log.warning("%s: neighbour %s restarted (new incarnation)", self.id, sender)

    # -- silence -------------------------------------------------------------------------

    async def run(self, loop: asyncio.AbstractEventLoop, caught_up: Callable[[], bool]) -> None:
        """Each tick: acknowledge what was taken from each neighbour since the last
        acknowledgement; a heartbeat on each link idle for a heartbeat interval; declare
        down the neighbours silent past T, as the node judges them
        (:meth:`~octopis.core.neighbours.Neighbours.overdue`, asking whether the input is
        ``caught_up``). Time this process spent not running (a tick that comes late) is
        not counted as anyone's silence.

        What input passes take is acknowledged at once or within ``ack_delay``
        (:meth:`PeerOutput.taken`, :class:`~octopis.core.acknowledging.Acknowledgements`), so the
        tick is every ack interval only while backpressure withholds acknowledgements
        (they are released here), else every half heartbeat interval: an idle broker
        wakes ten times a second, not twenty."""
        output = self.output
        calm = liveness_tick(self.heartbeat)
        woke = loop.time()
        while True:
            tick = output.pressure.tick(calm, self.ack_interval)
            await asyncio.sleep(tick)
            now = loop.time()
            self.neighbours.stalled(stall(now, woke, tick))  # not running: not their silence
            woke = now
            output.check_pressure(now)
            output.beat_due(now, self.heartbeat)
            for name, silent in self.neighbours.overdue(now, self.down_after, caught_up):
                self._declare_down(name, now, silent)
            self.check_serving(now)

    def _declare_down(self, name: str, now: float, silent: float) -> None:
        self.neighbours.silent(name, now)
        self.lst.set_down(name, True)
        self.counters["links_down"] += 1
        if len(self.detections) >= DETECTIONS_KEPT:
            del self.detections[0]
        self.detections.append({"link": name, "silent": silent, "at": now})
        link = self.output.links[name]
        queued = link.take_back(now)
        link.pause()
        log.warning(
            "%s: link to %s is down (silent for %.2f s; %d unacknowledged frames taken back)",
            self.id,
            name,
            silent,
            len(queued),
        )
        self.events.link_down(name, queued)
