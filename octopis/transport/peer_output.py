"""The sending side of a broker's peer links (DESIGN §7, §8): one :class:`OutputLink` per
neighbour, what the broker puts on them, and the acknowledgements its heartbeats carry.

Backpressure (DESIGN §8). While the node's rule
(:class:`~octopis.core.pressure.Backpressure`) holds a neighbour back, the
acknowledgement a heartbeat carries repeats the last count instead of growing, so the
held neighbour's custody buffer fills and it stops sending us data (its heartbeats still
come). When a heartbeat is due is the node's rule too
(:func:`~octopis.core.custody.heartbeat_due`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from functools import partial

import zmq.asyncio

from octopis.core import LinkStatusTable
from octopis.core.acknowledging import ARM, SEND, Acknowledgements
from octopis.core.capacity import SendRate
from octopis.core.codec import Ask, Control, Heartbeat, Hello, Synced, encode_peer
from octopis.core.custody import PublishReceipt, acknowledge_every, heartbeat_due
from octopis.core.neighbours import Neighbour, Neighbours
from octopis.core.relinking import carried
from octopis.settings import Links
from octopis.transport.frames import HANDSHAKE, KEPT, KIND, LINK, RECEIPT, is_routing
from octopis.transport.links import LOOP_SLACK, Activity, OutputLink, SendPass
from octopis.transport.pressure import PressureGauge
from octopis.transport.security import Curve


class PeerOutput:
    """The output links of one broker (:attr:`links`, by neighbour) and the
    acknowledgements it sends its neighbours. ``links``: the ``[links]`` settings (queue
    sizes, custody, retention, capacities); ``serving``: whether the broker serves (its
    heartbeats say so); ``waiting_deliveries``: deliveries the client side has waiting
    (``clients.capacity``)."""

    def __init__(
        self,
        broker_id: str,
        incarnation: int,
        links: Links,
        ctx: zmq.asyncio.Context,
        lst: LinkStatusTable,
        neighbours: Neighbours,
        pressure: PressureGauge,
        serving: Callable[[], bool],
        waiting_deliveries: Callable[[], int],
        counters: Counter[str],
        activity: Activity,
        send_pass: SendPass,
        curve: Curve | None = None,
    ) -> None:
        self.id = broker_id
        self.incarnation = incarnation
        self.settings = links
        self._ctx = ctx
        self.lst = lst
        self.neighbours = neighbours
        self.pressure = pressure.rule
        """Which neighbours are held back, and why (checked every tick, DESIGN §8)."""
        self._gauge = pressure
        self.serving = serving
        self.waiting_deliveries = waiting_deliveries
        self.counters = counters
        self.activity = activity
        self.send_pass = send_pass
        self._curve = curve
        self._broker_sender = (
            SendRate(links.broker_capacity, LOOP_SLACK) if links.broker_capacity else None
        )
        self.links: dict[str, OutputLink] = {}
        self._ask = self.frame(Ask(), LINK)
        every = acknowledge_every(links.ack_every, links.custody_limit)
        self.acks = Acknowledgements(self.pressure, every, counters)
        """When what the broker takes from its neighbours is acknowledged (DESIGN §7)."""

    def open(self, name: str, endpoint: str) -> OutputLink:
        """A link to neighbour ``name`` at ``endpoint``, kept in :attr:`links`."""
        settings = self.settings
        link = self.links[name] = OutputLink(
            name,
            endpoint,
            self._ctx,
            self.lst,
            settings.sndhwm,
            self._senders(name),
            self.activity,
            settings.custody_limit,
            settings.retain,
            settings.retain_limit,
            self._curve,
            self.send_pass,
            settings.down_after,
        )
        return link

    def close(self, name: str) -> OutputLink:
        """Forget the link to ``name`` (a neighbour that left); returns it."""
        self.pressure.forget(name)
        return self.links.pop(name)

    def _senders(self, neighbour: str) -> tuple[SendRate, ...]:
        """The broker's shared sender (broker capacity), then the link's own (link
        capacity), those that are set."""
        rate = self.settings.capacity_of(self.id, neighbour)
        link = SendRate(rate, LOOP_SLACK) if rate else None
        return tuple(s for s in (self._broker_sender, link) if s is not None)

    def carrying(self, name: str) -> int:
        """Routing frames (notifications and subscription messages) queued on the link to
        ``name``, and notifications in its custody not yet acknowledged (a link may leave
        the overlay only when this is 0)."""
        link = self.links[name]
        return carried(sum(map(is_routing, link.queue)), link.custody)

    # -- what the broker sends ----------------------------------------------------------

    def forward(self, name: str, frame: list, now: float, receipt: PublishReceipt | None) -> None:
        """Put one routing ``frame`` on neighbour ``name``'s link. A local publication's
        copy that the link keeps in custody carries ``receipt`` and counts in it, as
        :meth:`PublishReceipt.goes` says (the publisher is answered once every such copy
        is acknowledged, DESIGN §7), behind an ASK: the neighbour acknowledges it at once."""
        link = self.links[name]
        if receipt is not None and receipt.goes(link.custody, frame[KIND] == KEPT):
            if len(frame) == RECEIPT:
                frame.append(receipt)
            link.ask(self._ask, now)
        link.put(frame, now)

    def put(self, name: str, frames: list[list], now: float) -> None:
        """Put ``frames`` on neighbour ``name``'s link, in order (none if it has left)."""
        link = self.links.get(name)
        if link is not None:
            for frame in frames:
                link.put(frame, now)

    def hello(self, name: str, now: float) -> None:
        """Our first HELLO to ``name``, queued on its link (we know no incarnation of it)."""
        hello = Hello(self.incarnation, peer_incarnation=0)
        self.links[name].put(self.frame(hello, HANDSHAKE), now)

    def send_synced(self, neighbour: str, synced: Synced, now: float) -> None:
        """Tell ``neighbour`` a share was put on its link (behind the share's frames)."""
        self.links[neighbour].put(self.frame(synced, LINK), now)

    def resend(self, name: str, now: float) -> None:
        """The link to ``name`` healed (:class:`~octopis.core.node.Resend`): it sends again,
        ahead of all, what it has no acknowledgement for (:meth:`OutputLink.resent`), and
        carries again what waits (:meth:`OutputLink.resume`)."""
        link = self.links[name]
        link.put_link(self.frame(link.resent(), LINK), now)
        link.resume()

    def frame(self, message: Control, kind: int) -> list:
        """A link-level ``message`` from this broker as a frame of ``kind``."""
        return [*encode_peer(self.id, message), kind]

    async def flush(self, timeout: float) -> None:
        """Give queued frames up to ``timeout`` seconds to leave (clean shutdown) on the
        greeted links: on one that is not (its neighbour down, or never met) the routing
        frames wait for a handshake, so a broker alone stops at once."""
        greeted = (link.flush(timeout) for link in self.links.values() if link.greeted)
        await asyncio.gather(*greeted)

    # -- acknowledgements ---------------------------------------------------------------

    def beat(
        self,
        name: str,
        state: Neighbour,
        now: float,
        *,
        behind_data: bool = False,
        at_once: bool = False,
    ) -> None:
        """A heartbeat (with acknowledgement, withheld as the module docstring says) ahead
        of queued data, or behind it: the first one saying *serving* must not overtake
        the subscriptions it forwarded meanwhile. ``at_once``: ahead of queued data and
        sent now, even during a send pass (:meth:`OutputLink.put_now`)."""
        acked = self.pressure.acknowledge(name, state)
        beat = Heartbeat(self.incarnation, state.incarnation, acked, self.serving())
        link = self.links[name]
        put = link.put if behind_data else link.put_now if at_once else link.put_link
        put(self.frame(beat, LINK), now)

    def check_pressure(self, now: float) -> set[str]:
        """Look at backpressure afresh: the neighbours held back (:class:`PressureGauge`)."""
        return self._gauge.check(now, self.links, self.waiting_deliveries())

    def taken(
        self, name: str, state: Neighbour, count: int, now: float, notifications: bool = True
    ) -> bool:
        """Whether ``count`` routing frames from ``name`` (``notifications``, or another
        routing message) are taken, as the node's rule says (stale ones are counted,
        :meth:`Acknowledgements.taken`), and their acknowledgement carried out
        (:meth:`_acknowledgement`)."""
        refresh = partial(self.check_pressure, now)
        fate = self.acks.taken(
            name,
            state,
            count,
            refresh,
            notifications=notifications,
            deliveries_waiting=self.waiting_deliveries(),
        )
        if fate is None:
            return False
        self._acknowledgement(name, state, now, fate)
        return True

    def acknowledge_now(self, name: str, state: Neighbour, now: float) -> None:
        """An acknowledgement to ``name`` the node's rule wants at once (a RESENT taken
        with something owed, :meth:`Acknowledgements.at_once`), carried out."""
        fate = self.acks.at_once(name, partial(self.check_pressure, now), self.waiting_deliveries())
        self._acknowledgement(name, state, now, fate)

    def _acknowledgement(self, name: str, state: Neighbour, now: float, fate: int) -> None:
        """Carry out what becomes of an acknowledgement to ``name``: sent now, before the
        frames taken are routed and outside the pass's batch (the copies are this
        process's from here, so a publisher's confirm need not wait for the fan-out
        behind them), or within ``ack_delay`` by the timer; one held back is the tick's
        (:meth:`PeerLiveness.run` looks again every ``ack_interval`` meanwhile)."""
        if fate == SEND:
            self.beat(name, state, now, at_once=True)
        elif fate == ARM:
            asyncio.get_running_loop().call_later(self.settings.ack_delay, self._acknowledge_owed)

    def _acknowledge_owed(self) -> None:
        """The ``ack_delay`` timer (:meth:`Acknowledgements.timer_fired`): each neighbour it
        releases is acknowledged; one held back is left to the tick's heartbeat, which
        counts what it withholds."""
        now = asyncio.get_running_loop().time()
        released, _ = self.acks.timer_fired(
            self.neighbours.items(), partial(self.check_pressure, now)
        )
        for name, state in released:
            self.beat(name, state, now)

    def beat_due(self, now: float, heartbeat: float) -> None:
        """A heartbeat to each neighbour the node says is due one
        (:func:`~octopis.core.custody.heartbeat_due`; a queue held back, :meth:`OutputLink.held`,
        has nothing about to leave)."""
        for name, state in self.neighbours.items():
            link = self.links[name]
            sending = bool(link.queue) and not link.held()
            if heartbeat_due(state, now - link.last_sent, heartbeat, sending):
                self.beat(name, state, now)
