"""ZeroMQ primitives of a broker's links: non-blocking sends and reads, an input waiter,
the outgoing peer link with its output queue (DESIGN §4, paper §6.3), and the send pass
that batches what one pass over the input puts on a link (DESIGN §5).

The output queue is what the Link Status Table measures: a low send high-water mark and
non-blocking sends make backpressure grow this queue instead of dropping anything.

A message on a peer link is ``[sender, body, body, ...]``: one or more frame bodies from
one sender, handled by the receiver in order, as if each had come alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import zmq
import zmq.asyncio

from octopis.core import LinkStatusTable
from octopis.core.capacity import SendRate, departure
from octopis.core.custody import Custody, Entry, settle_receipts
from octopis.defaults import DOWN_AFTER, TCP_ABORT_AFTER
from octopis.transport.frames import (
    BODY,
    DATA,
    HANDSHAKE,
    KEPT,
    KIND,
    receipt_of,
    without_receipt,
)
from octopis.transport.security import Curve
from octopis.transport.zmqio import FastSocket, book_sent
from octopis.wire import Resent

YIELDS_BEFORE_POLL = 4
"""Loop turns a blocked sender waits for ZeroMQ's pipe before it watches the FD."""

POLLIN, POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
LOOP_SLACK = 0.01
"""Seconds a paced sender may catch up after the event loop woke it late."""
CONNECT_TIMEOUT_MS = 500
"""A peer link's connection attempt gives up after this long and is tried again
(ZeroMQ's reconnect interval later): a SYN lost to a cut is not retried by the kernel's
backoff (1, 2, 4 s)."""


def tcp_abort_ms(down_after: float) -> int:
    """Milliseconds of unacknowledged data after which a peer link's TCP connection is
    aborted (:data:`TCP_ABORT_AFTER` times ``down_after`` seconds)."""
    return round(TCP_ABORT_AFTER * down_after * 1000)


FULL = -1
"""What :meth:`OutputLink._send_batch` returns when ZeroMQ's pipe is full."""


BATCH_FRAMES = 64
"""Frames one message carries at most (DESIGN §5: a batch)."""
BATCH_BYTES = 256 * 1024
"""Bytes of bodies after which a batch takes no further frame."""


class SendPass:
    """One synchronous pass over a broker's input (DESIGN §5, batching): while it is open,
    what the pass puts on a link or hands to a client waits; when it ends, each of them
    sends what it holds, as few messages as it can. Nothing waits to fill a batch: a pass
    over one frame sends it as soon as that frame is handled, so an idle link adds no
    delay, and under load a pass over many frames leaves as one message per link."""

    __slots__ = ("open", "pending")

    def __init__(self) -> None:
        self.open = False
        self.pending: dict[int, Callable[[float], None]] = {}
        """id(holder) → its flush; a dict, so holders flush in the order they joined."""

    def hold(self, holder: object, flush: Callable[[float], None]) -> None:
        """``flush(now)`` when the pass ends (once, however often held)."""
        self.pending[id(holder)] = flush

    def end(self, now: float) -> None:
        """Close the pass and let every holder send."""
        self.open = False
        pending = self.pending
        while pending:
            pending.pop(next(iter(pending)))(now)


class Activity:
    """Whether a frame was put on any link since the LST's tick last looked (the tick
    sleeps while every link is idle). ``seen`` is a plain flag that :meth:`OutputLink.put`
    reads before waking the tick, so a busy broker pays an attribute read per frame
    rather than an ``asyncio.Event.set`` call."""

    __slots__ = ("_event", "seen")

    def __init__(self) -> None:
        self.seen = False
        self._event = asyncio.Event()

    def note(self) -> None:
        """A frame was put: wake the waiting tick."""
        self.seen = True
        self._event.set()

    async def wait(self) -> None:
        """Until a frame is put (at once if one was since the last wait), then forget it."""
        await self._event.wait()
        self._event.clear()
        self.seen = False


class InputWaiter:
    """Wakes a coroutine when a ZeroMQ socket has input, through one persistent
    ``loop.add_reader`` on the socket's event FD rather than a poll registration (and its
    futures) per wait: most messages reach an idle broker, so the wake-up is the cost.

    ZeroMQ signals its FD edge-wise and any operation on the socket may consume the
    signal; whoever sends on a socket that is also read this way calls :meth:`poke`
    afterwards, so input that arrived meanwhile is never left unnoticed.
    """

    def __init__(self, sock: FastSocket, loop: asyncio.AbstractEventLoop) -> None:
        self._events = sock.events
        self._ready = asyncio.Event()
        self._fd = sock.socket.getsockopt(zmq.FD)
        self._loop = loop
        loop.add_reader(self._fd, self.poke)

    def poke(self) -> bool:
        """Mark input ready if there is some (also resets ZeroMQ's FD signal); returns
        whether there is."""
        if self._events() & POLLIN:
            self._ready.set()
            return True
        return False

    async def wait(self) -> None:
        """Return once the socket has input (the caller has read it dry)."""
        self._ready.clear()
        self.poke()
        await self._ready.wait()

    def close(self) -> None:
        """Stop watching the FD."""
        self._loop.remove_reader(self._fd)


async def writable(sock: FastSocket) -> None:
    """Return once ``sock`` takes a message again, watching its event FD only while
    waiting: pyzmq's own ``poll`` leaves its reader on the FD for the socket's life, and
    it then runs on every later event of the socket (~1 per message sent)."""
    loop = asyncio.get_running_loop()
    fd = sock.socket.getsockopt(zmq.FD)
    ready = loop.create_future()

    def check() -> None:
        if not ready.done() and sock.events() & POLLOUT:
            ready.set_result(None)

    loop.add_reader(fd, check)
    try:
        check()
        await ready
    finally:
        loop.remove_reader(fd)


class OutputLink:
    """An outgoing peer link: output queue, paced non-blocking sender, LST feed, custody.

    Queued frames leave in batches: one message carries every frame at the head of the
    queue that may go now (at most :data:`BATCH_FRAMES` and about :data:`BATCH_BYTES`),
    heartbeats and acknowledgements among them; frames put during a :class:`SendPass`
    wait for its end. A paced link sends one frame per booked slot.

    Frames are :mod:`~octopis.transport.frames`' ``[sender, body, kind]``. Routing frames
    sent after a handshake are numbered 1, 2, …; the receiver acknowledges the count it
    has taken (:meth:`acknowledge`), and until then the notifications among them stay in
    the link's :class:`~octopis.core.custody.Custody`, the others pending there (the
    rule the simulator's links keep too; :meth:`resent` after a heal). When custody is
    full the link stops sending, so the queue grows and the LST sees it.
    ``last_sent`` (loop time) tells the heartbeat whether the link has been idle.
    ZMQ_IMMEDIATE keeps ZeroMQ from queueing frames for a peer that is not connected, so
    while a neighbour is away its frames stay here, where :meth:`take_back` hands them
    and the unacknowledged ones back to the broker (DESIGN §7, custody).
    """

    def __init__(
        self,
        name: str,
        endpoint: str,
        ctx: zmq.asyncio.Context,
        lst: LinkStatusTable,
        sndhwm: int,
        senders: tuple[SendRate, ...],
        activity: Activity,
        custody_limit: int,
        retain: float = 0.0,
        retain_limit: int = 0,
        curve: Curve | None = None,
        send_pass: SendPass | None = None,
        down_after: float = DOWN_AFTER,
    ) -> None:
        self.name = name
        self._pass = send_pass
        self.socket = ctx.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, sndhwm)
        self.socket.setsockopt(zmq.IMMEDIATE, 1)
        self.socket.setsockopt(zmq.LINGER, 1000)
        # A cut link's TCP connection backs off its retransmissions (0.2, 0.4, ... 3.2 s):
        # left alone, the first frame after the cut heals waits seconds. Abort it after
        # TCP_ABORT_AFTER down_after instead (custody has taken back what it carried,
        # DESIGN §7), and let each new connection attempt give up after CONNECT_TIMEOUT,
        # so a healed link reconnects within a fraction of a second.
        self.socket.setsockopt(zmq.TCP_MAXRT, tcp_abort_ms(down_after))
        self.socket.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
        if curve is not None:
            curve.connect(self.socket, name)
        self.socket.connect(endpoint)
        self._fast = FastSocket(self.socket)
        self.queue: deque[list] = deque()
        self._asking = False
        """An ASK waits in the queue (:meth:`ask`)."""
        self.senders = senders
        self.sent = 0
        self.messages = 0
        """ZeroMQ messages sent: ``sent / messages`` frames a message (batching)."""
        self.copies = 0
        """Notification copies sent (the link's share of the broker's load, DESIGN §9)."""
        self.bytes_sent = 0
        self.last_sent = 0.0
        self.greeted = False
        """A handshake naming the receiver's incarnation is queued (:meth:`greet`); until
        then routing frames wait, since the receiver drops what arrives before one."""
        self.custody = Custody(custody_limit, retain, retain_limit, self._settle)
        """Notifications sent and not yet acknowledged, and those acknowledged within
        ``retain`` seconds, as ``(number, sent at, frame)`` entries (DESIGN §7)."""
        self._receipts = 0
        """Custody entries whose frame carries a receipt
        (:class:`~octopis.core.custody.PublishReceipt`)."""
        self._lst = lst
        self._wake = asyncio.Event()
        self._activity = activity

    def _sent(self, count: int, now: float) -> None:
        """Book-keeping of the ``count`` frames at the head of the queue, just handed to
        ZeroMQ: they leave the queue, routing frames are numbered, notifications go into
        custody and the others are pending (:func:`~octopis.transport.zmqio.book_sent`,
        :meth:`Custody.sent` for a batch); a handshake among them starts the numbering
        and the stop count again (:meth:`Custody.greeted`), as in the simulator."""
        self._asking = False
        custody = self.custody
        keeps = custody.keeps
        numbered, size, copies, receipts, greeted = book_sent(
            self.queue,
            count,
            custody.unacked if keeps else None,
            custody.pending if keeps else None,
            custody.numbered,
            now,
        )
        if greeted:
            custody.greeted()
        custody.numbered = numbered
        self._receipts += receipts
        self.copies += copies
        self.sent += count
        self.bytes_sent += size
        self.last_sent = now
        self.messages += 1
        self._lst.sent(self.name, now, count)

    def acknowledge(self, count: int, now: float) -> None:
        """The receiver has taken the first ``count`` routing frames of this session (at
        ``now``): custody settles them (:meth:`Custody.acknowledge`); a link that had
        stopped for full custody sends again."""
        if self.custody.acknowledge(count, now) and self.queue:
            self._wake.set()

    def _settle(self, entries: list[Entry]) -> None:
        """Acknowledged custody entries: a local publication's receipt
        (:class:`~octopis.core.custody.PublishReceipt`) counts the copy as held, and the
        entry keeps its frame without it."""
        if self._receipts:
            self._receipts -= settle_receipts(entries, receipt_of, without_receipt)

    def ask(self, frame: list, now: float) -> None:
        """Enqueue the ASK ``frame`` ahead of the next routing frame, unless one already
        waits to leave: the receiver acknowledges what follows at once (a copy a
        publisher's confirm waits for, DESIGN §7)."""
        if not self._asking:
            self._asking = True
            self.put(frame, now)

    def put(self, frame: list, now: float) -> None:
        """Enqueue one frame (counted as n_in). During a send pass it waits for the pass
        to end (:meth:`send_held`). Otherwise an empty, unpaced queue whose pipe has room
        sends it at once (counted as n_out too) without waking the sender task. A
        non-empty queue is left to the sender task: trying the pipe on every put would
        fail per frame while it is full."""
        self._lst.enqueued(self.name, now, frame[KIND] == KEPT)
        if not self._activity.seen:
            self._activity.note()
        queue = self.queue
        if self.senders:
            queue.append(frame)
            self._wake.set()
            return
        send_pass = self._pass
        if send_pass is not None and send_pass.open:
            if not queue:
                send_pass.hold(self, self.send_held)
            queue.append(frame)
            return
        queue.append(frame)
        if len(queue) > 1 or self._send_batch(now) != 1:
            self._wake.set()

    def send_held(self, now: float) -> None:
        """Send what may leave now, in batches, until the pipe is full; the sender task
        takes over what is left."""
        while self._send_batch(now) > 0:
            pass
        if self.queue:
            self._wake.set()

    def _send_batch(self, now: float, most: int = BATCH_FRAMES) -> int:
        """Send the frames at the head of the queue that may leave now, up to ``most``, as
        one message (LINK and HANDSHAKE frames always; routing frames once greeted and
        while custody has room); returns how many (0: none may leave; :data:`FULL`: the
        pipe is full, nothing sent)."""
        room = min(most, self.custody.room()) if self.greeted else 0
        count = self._fast.send_batch(self.queue, most, BATCH_BYTES, room)
        if count > 0:
            self._sent(count, now)
        return count

    def greet(self, frame: list, now: float) -> None:
        """Queue the handshake ``frame`` that names the receiver's incarnation ahead of
        the routing frames waiting for it (earlier handshakes still queued are void), and
        let them go (DESIGN §7: a broker's first routing frames must not reach a
        neighbour before their handshake, or it drops them as stale)."""
        void = [f for f in self.queue if f[KIND] == HANDSHAKE]
        if void:
            self.queue = deque(f for f in self.queue if f[KIND] != HANDSHAKE)
            for _ in void:
                self._lst.sent(self.name, now)
        self._lst.enqueued(self.name, now)
        self.queue.appendleft(frame)
        self.greeted = True
        self._wake.set()

    def pause(self) -> None:
        """Hold routing frames (the neighbour is down): a process that binds its address
        next may be a new incarnation, which would drop them as stale."""
        self.greeted = False

    def resume(self) -> None:
        """The same incarnation is back: send what waited."""
        self.greeted = True
        if self.queue:
            self._wake.set()

    def put_link(self, frame: list, now: float) -> None:
        """Enqueue a link-level frame (heartbeat, acknowledgement) ahead of queued data,
        so liveness and acks are never stuck behind a backlog (DESIGN §8)."""
        if not self.queue:
            self.put(frame, now)
            return
        self._lst.enqueued(self.name, now)
        self.queue.appendleft(frame)
        self._wake.set()

    def put_now(self, frame: list, now: float) -> None:
        """A link-level frame (an acknowledgement) that leaves at once, even during a send
        pass, when the queue is empty and the link unpaced; else as :meth:`put_link`."""
        if self.queue or self.senders:
            self.put_link(frame, now)
            return
        self._lst.enqueued(self.name, now)
        if not self._activity.seen:
            self._activity.note()
        self.queue.append(frame)
        if self._send_batch(now) != 1:
            self._wake.set()

    def take_back(self, now: float) -> list[list]:
        """Empty custody (:meth:`Custody.take_back`: retained, then unacknowledged) and
        the queue; returns their routing frames, oldest first (queued frames leave the
        LST's queue length). Only frames never acknowledged still carry a
        :class:`~octopis.core.custody.PublishReceipt`."""
        frames = self.custody.take_back()
        self._receipts = 0
        for frame in self.queue:
            self._lst.sent(self.name, now)
            if frame[KIND] >= DATA:
                frames.append(frame)
        self.queue.clear()
        self._asking = False
        return frames

    def resent(self) -> Resent:
        """The link healed with the same incarnation on the other side: the RESENT body
        that goes ahead of anything else, with the pending frames' bodies
        (:meth:`Custody.resend`)."""
        numbered, pending = self.custody.resend()
        return Resent(numbered, tuple((number, frame[BODY]) for number, frame in pending))

    def give_up(self) -> list[list]:
        """The receiver restarted: the pending routing frames, oldest first
        (:meth:`Custody.give_up`)."""
        return self.custody.give_up()

    def held(self) -> bool:
        """Routing frames at the head of the queue may not leave now: the neighbour is
        not greeted (down, or before its handshake) or custody is full. Nothing leaves
        such a link until then but what is put ahead of them (:meth:`put_link`)."""
        queue = self.queue
        return bool(queue) and queue[0][KIND] >= DATA and (not self.greeted or self.custody.full)

    async def run(self) -> None:
        """Send queued frames in order, each in a slot booked with the broker's and the
        link's senders (:func:`octopis.core.capacity.departure`)."""
        loop = asyncio.get_running_loop()
        booked = False
        while True:
            if not self.queue or self.held():
                if self.queue and self.greeted:
                    self.custody.stopped()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.senders and not booked:
                now = loop.time()
                leave = departure(now, self.senders)
                booked = True
                if leave > now:
                    await asyncio.sleep(leave - now)
                    if not self.queue:  # taken back meanwhile
                        continue
            if self._send_batch(loop.time(), 1 if self.senders else BATCH_FRAMES) == FULL:
                await self._writable()
                continue
            booked = False

    async def _writable(self) -> None:
        """Wait until the socket takes frames again. ZeroMQ's I/O thread usually drains
        the pipe within microseconds, so yield to the loop a few times before paying for
        a reader on the FD (which matters with a low high-water mark)."""
        for _ in range(YIELDS_BEFORE_POLL):
            await asyncio.sleep(0)
            if self._fast.events() & POLLOUT:
                return
        await writable(self._fast)

    async def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the queue to empty."""
        deadline = time.monotonic() + timeout
        while self.queue and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
