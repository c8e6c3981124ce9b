"""The session a connection keeps at the broker it left at a fail-over (DESIGN §7): read
and heartbeated until the clients' subscriptions have spread from the new broker, so
that a broker that was only stalled delivers what it routed meanwhile; then bye."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Callable

import zmq
import zmq.asyncio

from octopis.wire import pack
from octopis.wire.client import ByeReply, ByeRequest, HeartbeatRequest, Reply, Request, is_reply

log = logging.getLogger("octopis.client")


def _send_nowait(socket: zmq.asyncio.Socket, message: Request) -> None:
    """Send if ZeroMQ takes it now (a broker left behind may be gone: nothing waits)."""
    with contextlib.suppress(zmq.Again):
        zmq.Socket.shadow(socket.underlying).send(pack(message), zmq.NOBLOCK)


class LeftSession:
    """The ``socket`` to the broker at ``endpoint`` a connection left: what arrives goes
    to ``on_frame``; heartbeats every ``liveness / 3`` seconds until ``linger`` seconds
    after the clients resumed elsewhere."""

    def __init__(
        self,
        socket: zmq.asyncio.Socket,
        endpoint: str,
        *,
        liveness: float,
        linger: float,
        on_frame: Callable[[list[bytes]], None],
    ) -> None:
        self.socket = socket
        self.endpoint = endpoint
        self.liveness = liveness
        self.linger = linger
        self.on_frame = on_frame

    async def keep(self, settled: asyncio.Event) -> None:
        """Keep the session at a broker left at a fail-over: read what it still delivers
        and heartbeat it until ``linger`` seconds after the clients resumed at the
        new broker (``settled`` is set), so that its subscriptions stay in place until the new
        ones have spread; then say bye (it withdraws them at once) and close."""
        loop = asyncio.get_running_loop()
        beats = itertools.count(-1, -1)
        interval = self.liveness / 3
        deadline = math.inf
        late = 0
        try:
            while loop.time() < deadline:
                if deadline == math.inf and settled.is_set():
                    deadline = loop.time() + self.linger
                _send_nowait(self.socket, HeartbeatRequest(client="-", req=next(beats)))
                late += await self._read(min(deadline, loop.time() + interval))
            _send_nowait(self.socket, ByeRequest(client="-", req=next(beats)))
            late += await self._read(loop.time() + self.liveness, until_reply=ByeReply)
        finally:
            self.socket.close()
            if late:
                log.warning("%d deliveries came from %s after leaving it", late, self.endpoint)

    async def _read(self, until: float, *, until_reply: type[Reply] | None = None) -> int:
        """Handle what arrives on a socket left at a fail-over until loop time ``until``,
        or until a reply of kind ``until_reply``: that one follows every delivery the broker had
        queued for this connection (a broker short of capacity may hold many, DESIGN §8),
        so the wait goes on while they keep coming. Returns the number of deliveries."""
        loop = asyncio.get_running_loop()
        deliveries = 0
        while (left := until - loop.time()) > 0:
            try:
                parts = await asyncio.wait_for(self.socket.recv_multipart(), left)
            except TimeoutError:
                break
            deliveries += len(parts) // 2
            if until_reply is not None:
                until = max(until, loop.time() + self.liveness)
            try:
                self.on_frame(parts)
            except Exception:
                log.exception("client dropped a frame it could not handle")
            if until_reply is not None and len(parts) == 1 and is_reply(parts[0], until_reply):
                break
        return deliveries
