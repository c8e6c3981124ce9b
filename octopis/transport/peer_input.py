"""The receiving side of a broker's peer links (DESIGN §7): one PULL for every
neighbour's frames, read in passes, each body handed where it belongs.

Incarnations. Which routing bodies a receiver takes is the node's rule
(:func:`~octopis.core.custody.take`): only after a HELLO that names its current
incarnation, so frames queued for an earlier process are dropped (counted) rather than
replayed into an empty table. Link-level bodies (HELLO, heartbeat, SYNCED) go to
:class:`~octopis.transport.peer_liveness.PeerLiveness`; routing bodies to the broker
(:class:`~octopis.transport.peer_events.PeerEvents`), as do those a RESENT body carries that
were not taken before (:func:`~octopis.core.custody.resent`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from operator import length_hint
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from octopis.core import Message, Notification, ProtocolError
from octopis.core.codec import (
    Ask,
    Control,
    Heartbeat,
    Hello,
    Resent,
    Synced,
    WireError,
    decode_body_in_full,
    decode_plain_notification,
    decode_sender,
)
from octopis.core.custody import ask, resent_taken
from octopis.core.neighbours import Neighbour, Neighbours
from octopis.logs import RateLimitedLog
from octopis.transport.links import InputWaiter, SendPass
from octopis.transport.peer_liveness import PeerLiveness
from octopis.transport.peer_output import PeerOutput
from octopis.transport.security import Curve
from octopis.transport.zmqio import FastSocket

if TYPE_CHECKING:
    from octopis.transport.peer_events import PeerEvents

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


class PeerInput:
    """The peer input of one broker: its PULL socket (bound at ``bind``, frames of at
    most ``frame_bytes``) and the loop that reads it. ``idle`` is called each time the
    input has been read dry, before waiting for more."""

    def __init__(
        self,
        broker_id: str,
        bind: str,
        frame_bytes: int,
        ctx: zmq.asyncio.Context,
        neighbours: Neighbours,
        events: PeerEvents,
        liveness: PeerLiveness,
        output: PeerOutput,
        counters: Counter[str],
        warn: RateLimitedLog,
        send_pass: SendPass,
        idle: Callable[[], None],
        curve: Curve | None = None,
    ) -> None:
        self.id = broker_id
        self.neighbours = neighbours
        self.events = events
        self.liveness = liveness
        self.output = output
        self.counters = counters
        self._warn = warn
        self.send_pass = send_pass
        """Opened around each pass over the input: what it sends leaves in batches."""
        self.idle = idle
        self.names: dict[bytes, str] = {}
        """Each neighbour's name by its bytes as frames carry it: decoding is skipped for
        those (any other sender part is decoded, and checked)."""
        self.departed: set[str] = set()
        """Neighbours whose link a relink closed: what they still send until they stop is
        dropped and counted, not taken for a protocol error (as many as brokers left)."""
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.RCVHWM, 1000)
        self.socket.setsockopt(zmq.MAXMSGSIZE, frame_bytes)
        if curve is not None:
            curve.serve(self.socket, "peer")
        self.socket.bind(bind)
        self._fast = FastSocket(self.socket)
        self._waiter: InputWaiter | None = None
        self._reading = False
        """The input loop is working through a backlog (not waiting for input)."""

    def welcome(self, name: str) -> None:
        """Frames from neighbour ``name`` are taken from now on."""
        self.names[name.encode()] = name
        self.departed.discard(name)

    def depart(self, name: str) -> None:
        """``name`` left the overlay: what it still sends is dropped, counted."""
        del self.names[name.encode()]
        self.departed.add(name)

    async def run(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the peer input in passes of up to :data:`PEER_BATCH` bodies or
        :data:`PASS_SECONDS`, whichever ends first (bodies received and not yet handled
        open the next pass); a message carrying several bodies is handled body by body;
        what a pass sends leaves in batches when it ends (:class:`SendPass`)."""
        waiter = self._waiter = InputWaiter(self._fast, loop)
        receive = self._fast.receive
        send_pass = self.send_pass
        on_message = self.on_message
        idle = self.idle
        clock = time.monotonic
        handled = 0
        left: list[list[bytes]] = []
        now, deadline = loop.time(), clock() + PASS_SECONDS
        try:
            while True:
                messages = left or receive(PEER_BATCH - handled, True)
                left = []
                if not messages:
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
                    send_pass.end(now)
                    handled = 0
                    await asyncio.sleep(0)
                    now, deadline = loop.time(), clock() + PASS_SECONDS
        finally:
            send_pass.end(loop.time())  # whatever stopped the loop, nothing stays held

    def caught_up(self) -> bool:
        """Whether every frame that reached us has been read: silence is judged only then,
        so a stall of this process (a backlog, a starved event loop) never reads as the
        neighbours' silence."""
        if self._reading:
            return False
        # Through the waiter: reading ZeroMQ's events resets its FD signal, so whoever
        # reads them must also wake the input loop, or that input waits for the next.
        return self._waiter is not None and not self._waiter.poke()

    def on_message(self, frame: list[bytes], now: float, deadline: float = math.inf) -> int:
        """The bodies of ``frame`` (``[sender, body, ...]``, a batch or a run of messages
        from one neighbour) in order, until the monotonic clock passes ``deadline`` after
        a body that is not a notification. The sender and its state are looked up once;
        notifications from a neighbour that is up go to the node's rule and routing as one
        run (:meth:`_route_run`), any other body through :meth:`_on_body`
        once the run before it is handled. A malformed body, or one that breaks the
        protocol, is counted, logged and dropped; the bodies after it are still handled.
        Returns the index in ``frame`` of the first body left for the next pass
        (``len(frame)``: none was)."""
        sender_part = frame[0]
        try:
            sender = self.names.get(sender_part) or decode_sender(sender_part)
        except WireError as exc:
            for _ in range(len(frame) - 1):
                self._malformed(str(exc))
            return len(frame)
        state = self.neighbours.get(sender)
        live = state is not None and state.up
        decode_plain = decode_plain_notification
        clock = time.monotonic
        run: list[tuple[Notification, bytes]] = []
        bodies = iter(frame[1:])
        for body in bodies:
            try:
                message = decode_plain(body) or decode_body_in_full(sender, body)
                if live and type(message) is Notification:
                    run.append((message, body))
                    continue
                if run:
                    self._route_run(sender, state, run, now)
                    run = []
                self._on_body(sender, message, body, now)
            except Exception as exc:
                self._failed(exc)
            live = state is not None and state.up
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
        """Hand ``run`` (notifications from ``sender``, up: no sign of life is news) to
        routing if the node's rule takes them (:func:`~octopis.core.custody.take`; else
        they are stale); one that fails is counted and the rest are still routed. A
        failure before routing took any would repeat: the notifications left are then
        counted as internal errors and dropped."""
        self.neighbours.heard(sender, now)  # a sign of life (up: no news)
        if not self._taken(sender, state, len(run), now):
            return
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

    def _taken(
        self, sender: str, state: Neighbour, count: int, now: float, notifications: bool = True
    ) -> bool:
        """Whether ``count`` routing bodies from ``sender`` (``notifications``, or another
        routing message) are taken, as the node's rule says (:meth:`PeerOutput.taken`,
        which acknowledges them); the stale ones are logged."""
        if self.output.taken(sender, state, count, now, notifications):
            return True
        self._stale(sender)
        return False

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
        move its state (:class:`PeerLiveness`); a routing one goes to the broker if the
        node's rule takes it (:meth:`_taken`), else it is stale; an ASK marks what
        follows for an acknowledgement at once. :class:`ProtocolError` if ``sender`` is
        not a neighbour."""
        state = self.neighbours.get(sender)
        if state is None and sender in self.departed:
            self.counters["frames_from_departed"] += 1  # it stops once all let it go
            return
        if state is None:
            raise ProtocolError(f"frame from {sender}, which is not a neighbour")
        kind = type(message)
        serving = None
        if kind is Heartbeat or kind is Hello:
            self.liveness.link_message(sender, state, message, now)
            serving = message.serving if kind is Heartbeat else None  # type: ignore[union-attr]
        self.liveness.heard(sender, state, serving, now)
        if kind is Synced:
            self.liveness.synced(sender, message, now)
        if kind is Heartbeat or kind is Hello or kind is Synced:
            return
        if kind is Ask:
            ask(state)
            return
        if kind is Resent:
            self._resent(sender, state, message, now)  # type: ignore[arg-type]
            return
        if self._taken(sender, state, 1, now, kind is Notification):
            self.events.peer_message(sender, message, body, now)

    def _stale(self, sender: str) -> None:
        """Log routing bodies from ``sender`` the node's rule dropped (and counted) as
        stale."""
        self._warn.warning(
            "stale", "%s dropped a frame from %s sent before its handshake with us", self.id, sender
        )

    def _resent(self, sender: str, state: Neighbour, message: Resent, now: float) -> None:
        """``sender``'s link healed and sends again what it has no acknowledgement for:
        the bodies the node's rule takes go to the broker, in order; the others are
        counted, taken before (``links.resent_dropped``) or stale
        (:func:`~octopis.core.custody.resent_taken`)."""
        taken, at_once = resent_taken(state, message.numbered, message.messages, self.counters)
        for body in taken:
            try:
                self.events.peer_message(sender, decode_body_in_full(sender, body), body, now)
            except Exception as exc:
                self._failed(exc)
        if at_once:
            self.output.acknowledge_now(sender, state, now)

    def _malformed(self, problem: str) -> None:
        self.counters["wire_errors"] += 1
        self._warn.warning("wire", "%s dropped a malformed peer frame: %s", self.id, problem)

    def close(self) -> None:
        """Stop watching the input socket."""
        if self._waiter is not None:
            self._waiter.close()
