"""A connection's socket to the broker it uses now (DESIGN §4, §7): a DEALER socket read
into the connection's frame handler (pausing while a stream is full), heartbeats, and
the judgement that the broker fell silent."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from octopis.keys import KeyPair, connect_securely
from octopis.wire import pack

log = logging.getLogger("octopis.client")

READ_BATCH = 64
"""Deliveries the reader handles before it yields to the application's tasks."""


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
        self._reader: asyncio.Task | None = None
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
        return self._reader is not None

    def start_reading(self) -> None:
        """Read the socket (if not already)."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())

    def stop_reading(self) -> asyncio.Task | None:
        """Stop reading; returns the reader's task (cancelled) to await, if one ran."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
        return reader

    async def switch(self, endpoint: str, left: zmq.asyncio.Socket | None) -> None:
        """Read a new socket to ``endpoint``; the current one is closed unless it is
        ``left`` (a session kept at the broker left, read elsewhere)."""
        reader = self.stop_reading()
        if reader is not None:
            await asyncio.gather(reader, return_exceptions=True)
        if self.socket is not left:
            self.socket.close()
        self.socket = self.new_socket(endpoint)
        self.socket.connect(endpoint)
        self.endpoint = endpoint
        self.start_reading()

    def stall_until(self, room: asyncio.Event) -> None:
        """Stop reading after the current message until ``room`` is set (a full stream)."""
        self._stalls.append(room)

    async def _read(self) -> None:
        """Hand every frame to ``on_frame``, yielding every :data:`READ_BATCH`, and wait
        while a stream is full (:meth:`stall_until`)."""
        handled = 0
        while True:
            parts = await self.socket.recv_multipart()
            self.heard = time.monotonic()
            try:
                self.on_frame(parts)
            except Exception:
                log.exception("client of %s dropped a frame it could not handle", self.endpoint)
            handled += 1
            if self._stalls:
                self.reading_paused = True
                while self._stalls:
                    await self._stalls.pop().wait()
                self.reading_paused = False
                self.heard = time.monotonic()
            elif handled >= READ_BATCH:
                handled = 0
                await asyncio.sleep(0)

    async def heartbeat(
        self, interval: float, liveness: float, silent: Callable[[], Awaitable[None]]
    ) -> None:
        """Heartbeat the broker every ``interval`` seconds; await ``silent()`` (a
        fail-over) once three heartbeats in a row, the first sent ``liveness`` seconds ago
        or more, were followed by nothing at all from it. Counting
        heartbeats rather than seconds, and counting input that waits unread as an
        answer, keeps a stall of this process (a busy or starved event loop) from reading
        as the broker's silence."""
        beats = itertools.count(-1, -1)  # negative numbers: replies nobody waits for
        first_unanswered: float | None = None
        missed = 0
        while True:
            await asyncio.sleep(interval)
            if self.reading_paused:  # replies wait unread behind deliveries: not silence
                first_unanswered, missed = None, 0
            if first_unanswered is not None and self.heard >= first_unanswered:
                first_unanswered, missed = None, 0
            if first_unanswered is not None and self.unread():
                first_unanswered, missed = None, 0  # it did answer: this process is behind
            if first_unanswered is not None:
                missed += 1
                if missed >= 3 and time.monotonic() - first_unanswered >= liveness:
                    await silent()
                    first_unanswered, missed = None, 0
                    continue
            await self.socket.send(pack({"op": "heartbeat", "client": "-", "req": next(beats)}))
            if first_unanswered is None:
                first_unanswered = time.monotonic()

    def unread(self) -> bool:
        """Whether something from the broker waits unread in the socket."""
        return bool(self.socket.get(zmq.EVENTS) & zmq.POLLIN)
