"""A connection's socket to the broker it uses now (DESIGN §4, §7): a DEALER socket read
into the connection's frame handler (pausing while a stream is full), heartbeats, and
the judgement that the broker fell silent.

The socket is read by a reader on its event FD that drains what waits, and written
without waiting (:meth:`BrokerLink.send`): pyzmq's asyncio ``recv`` costs a future, an
exception and a turn of the loop per message, ~60% of a subscriber process's CPU at a
few hundred deliveries a second."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from octopis.client_policy.silence import SilenceWatch
from octopis.keys import KeyPair, connect_securely
from octopis.wire import pack
from octopis.wire.client import HeartbeatRequest

log = logging.getLogger("octopis.client")

READ_BATCH = 64
"""Deliveries the reader handles before it yields to the application's tasks."""
UNSENT_LIMIT = 10_000
"""Messages a link keeps while its socket has no connection to take them (a broker that
refused the handshake, or is away); one more is refused with :class:`BufferError`."""


class BrokerLink:
    """The socket to the broker at :attr:`endpoint` (CurveZMQ with ``curve``: this
    client's key pair and each endpoint's broker key; None: in the clear), at most
    ``receive_buffer`` incoming messages held by ZeroMQ; every frame goes to
    ``on_frame``. The first socket is made, not connected (:meth:`connect`)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        *,
        receive_buffer: int,
        curve: tuple[KeyPair, dict[str, bytes]] | None,
        on_frame: Callable[[list[bytes]], None],
    ) -> None:
        self._ctx = ctx
        self.receive_buffer = receive_buffer
        self._curve = curve
        self.on_frame = on_frame
        self.endpoint = endpoint
        self.socket = self.new_socket(endpoint)
        self._sync = zmq.Socket.shadow(self.socket.underlying)
        self._fd: int | None = None
        """The event FD watched while the socket is read."""
        self._waiting: asyncio.Task | None = None
        """The wait for room in a full stream, while one is under way."""
        self._drain_soon = False
        """A drain is due on the loop's next turn."""
        self._unsent: deque[bytes] = deque()
        """What ZeroMQ did not take (no connection: its pipe is gone), in order; sent by
        the next drain, dropped by a switch to another broker (:meth:`switch`)."""
        self.heard = time.monotonic()
        """When the broker was last heard (monotonic time)."""
        self._stalls: list[asyncio.Event] = []
        self.reading_paused = False
        """The reader waits for the application to take from a full stream."""

    def new_socket(self, endpoint: str) -> zmq.asyncio.Socket:
        """A DEALER socket for ``endpoint``, not yet connected."""
        socket = self._ctx.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, self.receive_buffer)
        socket.setsockopt(zmq.SNDHWM, 0)
        if self._curve is not None:
            pair, server_keys = self._curve
            connect_securely(socket, pair, server_keys[endpoint])
        return socket

    def connect(self) -> None:
        """Connect the first socket (made in the constructor, so that it can be watched)."""
        self.socket.connect(self.endpoint)

    @property
    def reading(self) -> bool:
        """Whether the socket is read."""
        return self._fd is not None

    def start_reading(self) -> None:
        """Read the socket (if not already): a reader on its event FD drains it."""
        if self._fd is None:
            loop = asyncio.get_running_loop()
            self._fd = self.socket.getsockopt(zmq.FD)
            loop.add_reader(self._fd, self._drain)
            self._drain_soon = True
            loop.call_soon(self._drain)  # the FD signals edges: input may wait already

    def stop_reading(self) -> asyncio.Task | None:
        """Stop reading; returns the wait for a full stream (cancelled) to await, if
        one was under way."""
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            self._fd = None
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.cancel()
        return waiting

    def send(self, payload: bytes) -> None:
        """Send ``payload`` to the broker without waiting. ZeroMQ queues it for its I/O
        thread (the socket's send high-water mark is 0: no limit) while the socket has a
        connection; while it has none (a handshake refused, a broker away) the link keeps
        it, up to :data:`UNSENT_LIMIT`, and the reader sends it once the socket takes
        messages again. Sending through pyzmq's asyncio methods would leave pyzmq's own
        reader on the event FD in this link's place. A send may consume the FD's signal
        of input that arrived meanwhile, so it looks for input afterwards
        (:meth:`unread`)."""
        if self._unsent or not self._send_now(payload):
            if len(self._unsent) >= UNSENT_LIMIT:
                raise BufferError(
                    f"{UNSENT_LIMIT} messages wait for the socket to {self.endpoint} to take them"
                )
            self._unsent.append(payload)
        self.unread()

    def _send_now(self, payload: bytes) -> bool:
        """Hand ``payload`` to ZeroMQ if it takes it now."""
        try:
            self._sync.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def unread(self) -> bool:
        """Whether something from the broker waits unread in the socket. Asking resets
        ZeroMQ's FD signal, as any operation on the socket may, so input found waiting
        is drained on the loop's next turn."""
        waiting = bool(self._sync.get(zmq.EVENTS) & zmq.POLLIN)
        if waiting and self._fd is not None and not self._drain_soon:
            self._drain_soon = True
            asyncio.get_running_loop().call_soon(self._drain)
        return waiting

    async def switch(self, endpoint: str, left: zmq.asyncio.Socket | None) -> None:
        """Read a new socket to ``endpoint``; the current one is closed unless it is
        ``left`` (a session kept at the broker left, read elsewhere)."""
        waiting = self.stop_reading()
        if waiting is not None:
            await asyncio.gather(waiting, return_exceptions=True)
        if self.socket is not left:
            self.socket.close()
        self._unsent.clear()  # meant for the broker left (fail-over sends its requests again)
        self.socket = self.new_socket(endpoint)
        self._sync = zmq.Socket.shadow(self.socket.underlying)
        self.socket.connect(endpoint)
        self.endpoint = endpoint
        self.start_reading()

    def stall_until(self, room: asyncio.Event) -> None:
        """Stop reading after the current message until ``room`` is set (a full stream)."""
        self._stalls.append(room)

    def _drain(self) -> None:
        """Hand every message waiting to ``on_frame`` (called by the event loop when the
        FD signals); after :data:`READ_BATCH` messages the rest waits for the next turn
        of the loop, so the application's tasks run between batches. A full stream
        (:meth:`stall_until`) stops it until there is room."""
        self._drain_soon = False
        if self._fd is None:
            return
        unsent = self._unsent
        while unsent and self._send_now(unsent[0]):
            unsent.popleft()
        if self._waiting is not None:
            return
        recv = self._sync.recv_multipart
        for _ in range(READ_BATCH):
            try:
                parts = recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:  # the socket was closed under this reader
                self.stop_reading()
                return
            self.heard = time.monotonic()
            try:
                self.on_frame(parts)
            except Exception:
                log.exception("client of %s dropped a frame it could not handle", self.endpoint)
            if self._stalls:  # unwatched meanwhile: the FD stays readable until read
                asyncio.get_running_loop().remove_reader(self._fd)
                self._waiting = asyncio.create_task(self._wait_for_room())
                return
        self._drain_soon = True
        asyncio.get_running_loop().call_soon(self._drain)

    async def _wait_for_room(self) -> None:
        """Wait while a stream is full, then watch the FD again and read on."""
        self.reading_paused = True
        try:
            while self._stalls:
                await self._stalls.pop().wait()
        finally:
            self.reading_paused = False
        self.heard = time.monotonic()
        self._waiting = None
        if self._fd is not None:
            asyncio.get_running_loop().add_reader(self._fd, self._drain)
            self._drain()

    async def heartbeat(
        self, interval: float, liveness: float, silent: Callable[[], Awaitable[None]]
    ) -> None:
        """Heartbeat the broker every ``interval`` seconds; await ``silent()`` (a
        fail-over) when the client policy's watch judges it silent
        (:class:`~octopis.client_policy.silence.SilenceWatch`: three heartbeats in a row,
        the first sent ``liveness`` seconds ago or more, followed by nothing at all from
        it). Input that waits unread, or whose reading is paused behind deliveries,
        counts as an answer: a stall of this process does not read as the broker's
        silence."""
        beats = itertools.count(-1, -1)  # negative numbers: replies nobody waits for
        watch = SilenceWatch(liveness)
        while True:
            await asyncio.sleep(interval)
            waiting = watch.first_unanswered is not None
            answered = self.reading_paused or (waiting and self.unread())
            if watch.tick(time.monotonic(), self.heard, answered):
                await silent()
                continue
            self.send(pack(HeartbeatRequest(client="-", req=next(beats))))
