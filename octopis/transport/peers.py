"""A broker's peer links: one PULL for every neighbour's frames, one :class:`OutputLink`
per neighbour, handshakes with incarnations, heartbeats and failure detection (DESIGN §7).

Liveness. Every directed link carries a heartbeat when it has sent nothing for
``heartbeat`` seconds; any frame counts as a sign of life. A neighbour silent for
``down_after`` seconds (T, default 1 s) is *down*: its LST row says so, DNR's cases avoid
it, and the frames queued for it go back to the broker (:meth:`PeerEvents.link_down`).

Incarnations. A process start draws a random incarnation. HELLO carries the sender's and
the receiver's as the sender knows it; a receiver takes data from a neighbour only after a
HELLO that names its current incarnation, so frames queued for an earlier process are
dropped (counted) rather than replayed into an empty table. A new incarnation seen in a
HELLO or a heartbeat means the neighbour restarted: what was queued for it goes back to
the broker, and the handshake starts again.

Serving. A broker is *serving* once every live neighbour has handed it its resync state
(or is down); heartbeats carry the flag, and a neighbour's LST row says down until the
neighbour is up, synced and serving, so traffic takes detours around a broker that is
still filling its table (DESIGN §7).

What these frames mean is not decided here: each HELLO, heartbeat, SYNCED and silence
moves the neighbour's state machine in the broker's node
(:class:`~octopis.core.neighbours.Neighbours`), which says whether its frames are for
us, whether to route through it, and when the broker serves
(:meth:`~octopis.core.node.BrokerNode.serve_if_ready`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from operator import length_hint
from typing import Protocol

import zmq
import zmq.asyncio

from octopis.core import LinkStatusTable, Message, Notification, ProtocolError
from octopis.core.capacity import SendRate
from octopis.core.neighbours import Neighbour, Neighbours
from octopis.core.node import BrokerNode
from octopis.logs import RateLimitedLog
from octopis.settings import BrokerSettings
from octopis.transport.codec import (
    Control,
    Heartbeat,
    Hello,
    Synced,
    WireError,
    decode_body_in_full,
    decode_plain_notification,
    decode_sender,
    encode_peer,
)
from octopis.transport.frames import HANDSHAKE, KEPT, KIND, LINK, RECEIPT, is_routing
from octopis.transport.links import (
    LOOP_SLACK,
    Activity,
    InputWaiter,
    OutputLink,
    PublishReceipt,
    SendPass,
)
from octopis.transport.pressure import Backpressure
from octopis.transport.security import Curve
from octopis.transport.zmqio import FastSocket

log = logging.getLogger("octopis.broker.peers")

PEER_BATCH = 256
"""Bodies handled before yielding to the event loop, so senders keep draining (~1 ms
of work under load). Each yield is a pass of the loop with its ``epoll_wait``: at 64
it was ~5% of the broker's CPU per notification on the hop bench."""
PASS_SECONDS = 0.02
"""Wall time after which a pass ends, however few bodies it took: checked after each
body that is not a notification (a subscription costs far more than a notification, and
a neighbour's consecutive messages are read as one run of up to :data:`PEER_BATCH` bodies
and more) and between messages; the rest of a run cut short opens the next pass. On a
starved machine a pass bounded by count alone ran past ``links.down_after`` with no
heartbeat leaving (a neighbour declared this live broker down), and one checked only
between runs still took 0.2-0.3 s over a run of ~300 subscriptions. Passes that reach it
are counted (``input_passes_cut``)."""


class PeerEvents(Protocol):
    """What the broker does with what arrives on its peer links."""

    def peer_message(self, sender: str, message: Message, body: bytes, now: float) -> None:
        """A routing message from neighbour ``sender`` (``body`` as received, at loop
        time ``now``)."""

    def peer_notifications(
        self, sender: str, run: Iterator[tuple[Notification, bytes]], now: float
    ) -> None:
        """Consecutive notifications from neighbour ``sender``, each with its body as
        received: :meth:`peer_message` for each, in order, with the per-message work done
        once. An exception leaves ``run`` just past the message that raised it, so the
        caller can count it and hand over the rest."""

    def link_down(self, neighbour: str, queued: list[list[bytes]]) -> None:
        """``neighbour`` went silent or restarted; ``queued`` frames never reached it."""

    def link_back(self, neighbour: str) -> None:
        """``neighbour`` is heard again without having restarted (a cut link healed)."""

    def neighbour_met(self, neighbour: str, incarnation: int, restarted: bool) -> Synced:
        """A new incarnation of ``neighbour`` (its first, or a restart): hand it our state
        (queued behind the handshake); returns what to tell it we handed over."""

    def synced(self, neighbour: str, synced: Synced) -> None:
        """``neighbour`` has handed us its share (whole or not) and says whether it
        wants ours (DESIGN §7)."""

    def now_serving(self, held: list[tuple[Notification, PublishReceipt]], actions: list) -> None:
        """This broker has its resync state from every live neighbour (DESIGN §7): route
        the local publications ``held`` meanwhile, and carry out the node's ``actions``
        (:meth:`BrokerNode.serve_if_ready`)."""

    def neighbour_serving(self, neighbour: str) -> None:
        """``neighbour`` says it is serving (after its start or restart)."""


class PeerLinks:
    """Peer input, output links, handshakes and failure detection of one broker; what
    detection decides is written into the LST's rows, which the core reads."""

    def __init__(
        self,
        broker_id: str,
        endpoints: dict[str, str],
        bind: str,
        settings: BrokerSettings,
        lst: LinkStatusTable,
        ctx: zmq.asyncio.Context,
        events: PeerEvents,
        node: BrokerNode,
        incarnation: int,
        curve: Curve | None = None,
        send_pass: SendPass | None = None,
        waiting_deliveries: Callable[[], int] = lambda: 0,
        idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.id = broker_id
        self.idle = idle
        """Called each time the input has been read dry, before waiting for more."""
        self.waiting_deliveries = waiting_deliveries
        """Deliveries the broker's clients side has waiting (``clients.capacity``)."""
        self.incarnation = incarnation
        self.send_pass = send_pass or SendPass()
        """Opened around each pass over the input: what it sends leaves in batches."""
        self.settings = settings
        self.lst = lst
        self.events = events
        self.node = node
        """The broker's node: its neighbours' states and whether it serves are its."""
        self.neighbours: Neighbours = node.neighbours
        self.counters: Counter[str] = Counter()
        self.activity = Activity()
        self._names = {n.encode(): n for n in endpoints}
        """Each neighbour's name by its bytes as frames carry it: decoding is skipped for
        those (any other sender part is decoded, and checked)."""
        self.detections: list[dict[str, float | str]] = []
        self._detections_kept = 1000
        self._warn = RateLimitedLog(log, settings.logs.interval)
        self.input = ctx.socket(zmq.PULL)
        self.input.setsockopt(zmq.RCVHWM, 1000)
        self.input.setsockopt(zmq.MAXMSGSIZE, settings.limits.frame_bytes)
        if curve is not None:
            curve.serve(self.input, "peer")
        self.input.bind(bind)
        self._input_sync = zmq.Socket.shadow(self.input.underlying)
        self._waiter: InputWaiter | None = None
        self._reading = False
        """The input loop is working through a backlog (not waiting for input)."""
        self.pressure = Backpressure(broker_id, settings, self.counters, self._warn)
        """Which neighbours are held back, and why (checked every tick, DESIGN §8)."""
        self.departed: set[str] = set()
        """Neighbours whose link a relink closed: what they still send until they stop is
        dropped and counted, not taken for a protocol error (as many as brokers left)."""
        self._ctx = ctx
        self._curve = curve
        self._broker_sender = (
            SendRate(settings.links.broker_capacity, LOOP_SLACK)
            if settings.links.broker_capacity
            else None
        )
        self.links = {n: self._link(n, endpoint) for n, endpoint in endpoints.items()}

    def _link(self, name: str, endpoint: str) -> OutputLink:
        settings = self.settings
        return OutputLink(
            name,
            endpoint,
            self._ctx,
            self.lst,
            settings.links.sndhwm,
            self._senders(name, self._broker_sender),
            self.activity,
            settings.links.custody_limit,
            settings.links.retain,
            settings.links.retain_limit,
            self._curve,
            self.send_pass,
        )

    def add(self, name: str, endpoint: str, now: float) -> Coroutine[None, None, None]:
        """A link to ``name``, a neighbour that joined the overlay (DESIGN §9), at
        ``endpoint``: down (never heard) until its handshake; our HELLO waits on it.
        Returns the coroutine that serves it (the broker runs it as a task)."""
        if name in self.links:
            raise ValueError(f"{self.id} has a link to {name} already")
        link = self._link(name, endpoint)
        self.links[name] = link
        self._names[name.encode()] = name
        self.departed.discard(name)
        self.lst.add_link(name, now)
        link.put(self._frame(Hello(self.incarnation, peer_incarnation=0), HANDSHAKE), now)
        return link.run()

    def remove(self, name: str) -> OutputLink:
        """Drop the link to ``name``, a neighbour that left; what waits on it is dropped
        with it (the caller checked that nothing does: :meth:`carrying`). Returns the
        link, for the caller to close once the task serving it has ended."""
        link = self.links.pop(name)
        del self._names[name.encode()]
        self.departed.add(name)
        self.lst.remove_link(name)
        self.pressure.full.discard(name)
        return link

    def carrying(self, name: str) -> int:
        """Routing frames (notifications and subscription messages) queued on the link to
        ``name``, and notifications in its custody not yet acknowledged (a link may leave
        the overlay only when this is 0)."""
        link = self.links[name]
        return sum(map(is_routing, link.queue)) + len(link.custody)

    def _senders(self, neighbour: str, broker: SendRate | None) -> tuple[SendRate, ...]:
        """The broker's shared sender (broker capacity), then the link's own (link
        capacity), those that are set."""
        rate = self.settings.links.capacity_of(self.id, neighbour)
        link = SendRate(rate, LOOP_SLACK) if rate else None
        return tuple(s for s in (broker, link) if s is not None)

    @property
    def serving(self) -> bool:
        """Resynced from every live neighbour since this process started; until then
        neighbours route around this broker and local publications wait (DESIGN §7)."""
        return self.node.serving

    def _check_serving(self, now: float) -> None:
        """Start serving when the node says so (:meth:`BrokerNode.serve_if_ready`), then
        tell every neighbour at once, behind what was sent it meanwhile."""
        served = self.node.serve_if_ready(now)
        if served is None:
            return
        log.info("%s is serving (resynced from every live neighbour)", self.id)
        for name, state in self.neighbours.items():
            self._beat(name, state, now, behind_data=True)
        self.events.now_serving(*served)

    def _beat(
        self,
        name: str,
        state: Neighbour,
        now: float,
        *,
        behind_data: bool = False,
        at_once: bool = False,
    ) -> None:
        """A heartbeat (with acknowledgement) ahead of queued data, or behind it: the first
        one saying *serving* must not overtake the subscriptions it forwarded meanwhile.

        Backpressure (DESIGN §8): while a link to another neighbour has ``queue_limit``
        frames waiting, the acknowledgement repeats the last count instead of growing, so
        ``name``'s custody buffer fills and it stops sending us data (its heartbeats still
        come). The full link's own neighbour is still acknowledged: what it sends us never
        goes back to it, and withholding from it could lock two brokers that wait on
        each other. ``at_once``: ahead of queued data and sent now, even during a send
        pass (:meth:`OutputLink.put_now`)."""
        full = self.pressure.full
        if full and (len(full) > 1 or name not in full):
            acked = state.acked
            self.counters["backpressure.acks_withheld"] += acked != state.received
        else:
            acked = state.acked = state.received
        beat = Heartbeat(self.incarnation, state.incarnation, acked, self.serving)
        link = self.links[name]
        put = link.put if behind_data else link.put_now if at_once else link.put_link
        put(self._frame(beat, LINK), now)

    # -- what the broker sends ----------------------------------------------------------

    def forward(self, name: str, frame: list, now: float, receipt: PublishReceipt | None) -> None:
        """Put one routing ``frame`` on neighbour ``name``'s link. A local publication's
        copy that the link keeps in custody carries ``receipt`` and counts in it (the
        publisher is answered once every such copy is acknowledged, DESIGN §7)."""
        link = self.links[name]
        if receipt is not None and frame[KIND] == KEPT and link.keeps:
            if len(frame) == RECEIPT:
                frame.append(receipt)
            receipt.copies += 1
        link.put(frame, now)

    def put(self, name: str, frames: list[list], now: float) -> None:
        """Put ``frames`` on neighbour ``name``'s link, in order (none if it has left)."""
        link = self.links.get(name)
        if link is not None:
            for frame in frames:
                link.put(frame, now)

    def _route_through(self, name: str) -> None:
        """The LST row says down unless the neighbour is up and serving."""
        self.lst.set_down(name, not self.neighbours.routable(name))

    def tasks(self) -> list[tuple[str, Coroutine[None, None, None]]]:
        """The coroutines that serve the links: (name, coroutine)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.node.start(now, self.settings.links.down_after)
        for name, link in self.links.items():
            self.lst.set_down(name, True)
            link.put(self._frame(Hello(self.incarnation, peer_incarnation=0), HANDSHAKE), now)
        return [
            *((f"link {n}", link.run()) for n, link in self.links.items()),
            ("peers", self._input_loop(loop)),
            ("liveness", self._liveness_loop(loop)),
        ]

    # -- input ---------------------------------------------------------------------------

    async def _input_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the peer input in passes of up to :data:`PEER_BATCH` bodies or
        :data:`PASS_SECONDS`, whichever ends first (bodies received and not yet handled
        open the next pass); a message carrying several bodies is handled body by body;
        what a pass sends leaves in batches when it ends (:class:`SendPass`)."""
        sync = self._input_sync
        waiter = self._waiter = InputWaiter(sync, loop)
        receive = FastSocket(self.input).receive
        send_pass = self.send_pass
        on_message = self._on_message
        idle = self.idle
        acknowledge = self._acknowledge_pass
        clock = time.monotonic
        handled = 0
        left: list[list[bytes]] = []
        now, deadline = loop.time(), clock() + PASS_SECONDS
        try:
            while True:
                messages = left or receive(PEER_BATCH - handled, True)
                left = []
                if not messages:
                    acknowledge(now)
                    send_pass.end(now)
                    handled = 0
                    self._reading = False
                    idle()
                    await waiter.wait()
                    self._reading = True
                    now, deadline = loop.time(), clock() + PASS_SECONDS
                    continue
                send_pass.open = True
                for index, frame in enumerate(messages, 1):
                    end = len(frame)
                    if end > 1:
                        end = on_message(frame, now, deadline)
                        handled += end - 1
                    else:
                        self._malformed("frame has 1 part, expected [sender, body, ...]")
                        handled += 1
                    if clock() >= deadline:
                        left = messages[index:]
                        if end < len(frame):
                            left.insert(0, [frame[0], *frame[end:]])
                        self.counters["input_passes_cut"] += 1
                        handled = PEER_BATCH
                        break
                if handled >= PEER_BATCH:
                    acknowledge(now)
                    send_pass.end(now)
                    handled = 0
                    await asyncio.sleep(0)
                    now, deadline = loop.time(), clock() + PASS_SECONDS
        finally:
            send_pass.end(loop.time())  # whatever stopped the loop, nothing stays held

    def _acknowledge_pass(self, now: float) -> None:
        """At the end of an input pass: acknowledge to each neighbour the frames this pass
        took from it, in the pass's own batch, so a publisher's confirm (custody held,
        DESIGN §7) follows in a round trip rather than on the ack timer. Backpressure is
        looked at afresh first: a neighbour whose acknowledgement it withholds
        (:meth:`_beat`) is left to the timer's heartbeat, which counts what it withholds."""
        taken = [
            (name, state)
            for name, state in self.neighbours.items()
            if state.received != state.acked
        ]
        if not taken:
            return
        full = self._check_pressure(now)
        for name, state in taken:
            if not full or (len(full) == 1 and name in full):
                self._beat(name, state, now)

    def _acknowledge_first(self, name: str, state: Neighbour, now: float) -> None:
        """The first run of notifications taken from ``name`` since its last
        acknowledgement: acknowledge it at once, before routing it, outside the pass's
        batch. The copies are this process's from here (routed in this same synchronous
        pass), so a publisher's confirm need not wait for the fan-out behind them; more
        runs from ``name`` in the pass are acknowledged at its end, so a busy pass adds
        one acknowledgement per neighbour. Only with no delivery waiting for the client
        side's capacity: the run about to be routed may add to that backlog, which only
        the pass's end sees (:meth:`_acknowledge_pass` then looks at backpressure)."""
        if self.waiting_deliveries():
            return
        full = self._check_pressure(now)
        if not full or (len(full) == 1 and name in full):
            self._beat(name, state, now, at_once=True)

    def _on_message(self, frame: list[bytes], now: float, deadline: float = math.inf) -> int:
        """The bodies of ``frame`` (``[sender, body, ...]``, a batch or a run of messages
        from one neighbour) in order, until the monotonic clock passes ``deadline`` after
        a body that is not a notification. The sender and its state are looked up once;
        notifications from a neighbour that is up and accepting go to routing as one run
        (:meth:`PeerEvents.peer_notifications`), any other body through :meth:`_on_body`
        once the run before it is handled. A malformed body, or one that breaks the
        protocol, is counted, logged and dropped; the bodies after it are still handled.
        Returns the index in ``frame`` of the first body left for the next pass
        (``len(frame)``: none was)."""
        sender_part = frame[0]
        try:
            sender = self._names.get(sender_part) or decode_sender(sender_part)
        except WireError as exc:
            for _ in range(len(frame) - 1):
                self._malformed(str(exc))
            return len(frame)
        state = self.neighbours.get(sender)
        routing = state is not None and state.reachable
        decode_plain = decode_plain_notification
        clock = time.monotonic
        run: list[tuple[Notification, bytes]] = []
        bodies = iter(frame[1:])
        for body in bodies:
            try:
                message = decode_plain(body) or decode_body_in_full(sender, body)
                if routing and type(message) is Notification:
                    run.append((message, body))
                    continue
                if run:
                    self._route_run(sender, state, run, now)
                    run = []
                self._on_body(sender, message, body, now)
            except Exception as exc:
                self._failed(exc)
            routing = state is not None and state.reachable
            if clock() >= deadline:
                if run:  # a body that failed to decode ended it
                    self._route_run(sender, state, run, now)
                return len(frame) - length_hint(bodies)
        if run:
            self._route_run(sender, state, run, now)
        return len(frame)

    def _route_run(
        self,
        sender: str,
        state: Neighbour,
        run: list[tuple[Notification, bytes]],
        now: float,
    ) -> None:
        """Hand ``run`` (notifications from ``sender``, up and accepting) to routing; one
        that fails is counted and the rest are still routed. A failure before routing
        took any would repeat: the notifications left are then counted as internal
        errors and dropped."""
        state.last_heard = now
        first = state.received == state.acked
        state.received += len(run)
        if first:
            self._acknowledge_first(sender, state, now)
        pending = iter(run)
        while True:
            left = length_hint(pending)
            try:
                self.events.peer_notifications(sender, pending, now)
                return
            except Exception as exc:
                self._failed(exc)
                if length_hint(pending) == left:
                    self.counters["internal_errors"] += left
                    return

    def _failed(self, exc: Exception) -> None:
        """Count and log a body that could not be handled (called while handling ``exc``,
        whose traceback an internal error logs)."""
        if isinstance(exc, WireError):
            self._malformed(str(exc))
        elif isinstance(exc, ProtocolError):
            self.counters["protocol_errors"] += 1
            self._warn.warning(
                "protocol", "%s dropped a message that breaks the protocol: %s", self.id, exc
            )
        else:
            self.counters["internal_errors"] += 1
            self._warn.exception("internal", "%s failed on a peer frame", self.id)

    def _on_body(self, sender: str, message: Message | Control, body: bytes, now: float) -> None:
        """One decoded routing or link-level ``message`` from ``sender``: link-level ones
        move its state (:class:`~octopis.core.neighbours.Neighbours`); a routing one from
        a neighbour whose handshake has not named us is stale.
        :class:`ProtocolError` if ``sender`` is not a neighbour."""
        state = self.neighbours.get(sender)
        if state is None and sender in self.departed:
            self.counters["frames_from_departed"] += 1  # it stops once all let it go
            return
        if state is None:
            raise ProtocolError(f"frame from {sender}, which is not a neighbour")
        back = self.neighbours.heard(sender, now)
        kind = type(message)
        if kind is Heartbeat or kind is Hello:
            self._on_link_message(sender, state, message, now)
        elif kind is Synced:
            heard = self.neighbours.share(sender)
            if heard.for_us:
                self.events.synced(sender, message)
            if heard.now_serving:
                self._route_through(sender)
                self.events.neighbour_serving(sender)
            self._check_serving(now)
        if back:
            self._came_back(sender, state)
        if kind is Heartbeat or kind is Hello or kind is Synced:
            return
        if state.reachable:
            state.received += 1
        else:
            self.counters["stale_frames"] += 1
            self._warn.warning(
                "stale",
                "%s dropped a frame from %s sent before its handshake with us",
                self.id,
                sender,
            )
            return
        self.events.peer_message(sender, message, body, now)

    def _malformed(self, problem: str) -> None:
        self.counters["wire_errors"] += 1
        self._warn.warning("wire", "%s dropped a malformed peer frame: %s", self.id, problem)

    def _on_link_message(
        self, sender: str, state: Neighbour, message: Hello | Heartbeat, now: float
    ) -> None:
        """Handshake and heartbeat: learn incarnations, notice restarts, hear whether the
        neighbour serves."""
        restarted = self.neighbours.met(sender, message.incarnation)
        if restarted is not None:
            if restarted:
                self._restarted(sender, now)
            # Ahead of the routing frames waiting for it (a restart took back the rest);
            # the resync state follows it.
            link = self.links[sender]
            link.greet(self._frame(Hello(self.incarnation, message.incarnation), HANDSHAKE), now)
            synced = self.events.neighbour_met(sender, message.incarnation, restarted)
            link.put(self._frame(synced, LINK), now)
        if type(message) is Hello:
            self.neighbours.handshake(sender, message.peer_incarnation, self.incarnation)
            return
        if message.acked_incarnation == self.incarnation:
            self.links[sender].acknowledge(message.acked, now)
        if self.neighbours.said(sender, message.serving):
            self._route_through(sender)
            self.events.neighbour_serving(sender)
        elif not message.serving:
            self._route_through(sender)

    def _came_back(self, sender: str, state: Neighbour) -> None:
        self._route_through(sender)
        if state.incarnation and not self.links[sender].greeted:
            self.links[sender].resume()  # the same incarnation: its session goes on
            self.events.link_back(sender)
        if state.was_down:
            log.warning("%s: link to %s is up again after %.2f s", self.id, sender, state.was_down)

    def _restarted(self, sender: str, now: float) -> None:
        """``sender`` runs as a new process: nothing queued for the old one reaches it."""
        self._route_through(sender)
        self.counters["peer_restarts"] += 1
        log.warning("%s: neighbour %s restarted (new incarnation)", self.id, sender)
        self.events.link_down(sender, self.links[sender].take_back(now))

    # -- liveness ------------------------------------------------------------------------

    async def _liveness_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Each tick: acknowledge what was taken from each neighbour since the last
        acknowledgement; a heartbeat on each link idle for a heartbeat interval; declare
        neighbours silent past T down. Time this process spent not running (a tick that
        comes late) is not counted as anyone's silence.

        Input passes acknowledge what they took (:meth:`_acknowledge_pass`), so the tick
        is every ack interval only while backpressure withholds acknowledgements (they are
        released here), else every half heartbeat interval: an idle broker wakes ten
        times a second, not twenty."""
        settings = self.settings
        calm = settings.links.heartbeat / 2
        woke = loop.time()
        while True:
            tick = min(settings.links.ack_interval, calm) if self.pressure.full else calm
            await asyncio.sleep(tick)
            now = loop.time()
            late, woke = now - woke - tick, now
            if late > tick:  # this process was not running: that is not their silence
                for _, state in self.neighbours.items():
                    state.last_heard += late
            self._check_pressure(now)
            for name, state in self.neighbours.items():
                link = self.links[name]
                if state.received != state.acked or (
                    not link.queue and now - link.last_sent >= settings.links.heartbeat
                ):
                    self._beat(name, state, now)
            overdue = self.neighbours.overdue(now, settings.links.down_after)
            if overdue and self._caught_up():
                for name, silent in overdue:
                    self._declare_down(name, now, silent)
            self._check_serving(now)

    def _check_pressure(self, now: float) -> set[str]:
        return self.pressure.check(now, self.links, self.waiting_deliveries())

    def _caught_up(self) -> bool:
        """Whether every frame that reached us has been read: silence is judged only then,
        so a stall of this process (a backlog, a starved event loop) never reads as the
        neighbours' silence."""
        if self._reading:
            return False
        # Through the waiter: reading ZeroMQ's events resets its FD signal, so whoever
        # reads them must also wake the input loop, or that input waits for the next.
        return self._waiter is not None and not self._waiter.poke()

    def send_synced(self, neighbour: str, synced: Synced, now: float) -> None:
        """Tell ``neighbour`` a share was put on its link (behind the share's frames)."""
        self.links[neighbour].put(self._frame(synced, LINK), now)

    def _frame(self, message: Hello | Heartbeat | Synced, kind: int) -> list:
        return [*encode_peer(self.id, message), kind]

    def _declare_down(self, name: str, now: float, silent: float) -> None:
        self.neighbours.silent(name, now)
        self.lst.set_down(name, True)
        self.counters["links_down"] += 1
        if len(self.detections) >= self._detections_kept:
            del self.detections[0]
        self.detections.append({"link": name, "silent": silent, "at": now})
        link = self.links[name]
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

    # -- status --------------------------------------------------------------------------

    def snapshot(self, now: float) -> dict[str, dict[str, object]]:
        """Per neighbour: state, incarnation, silence, restarts, queue length."""
        return {
            name: {
                "state": "up" if s.up else "down",
                "phase": s.describe(),
                "serving": s.serving,
                "incarnation": s.incarnation,
                "silent": now - s.last_heard,
                "restarts": s.restarts,
                "queue_length": len(self.links[name].queue),
                "custody": len(self.links[name].custody),
                "full": name in self.pressure.full,
            }
            for name, s in self.neighbours.items()
        }

    async def flush(self, timeout: float) -> None:
        """Give queued frames up to ``timeout`` seconds to leave (clean shutdown)."""
        await asyncio.gather(*(link.flush(timeout) for link in self.links.values()))

    def close(self) -> None:
        """Stop watching the input socket."""
        if self._waiter is not None:
            self._waiter.close()
