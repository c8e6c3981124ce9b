"""The STOMP listener inside a broker process: TCP and WebSocket (``v12.stomp``) servers
whose connections are client sessions of the broker (DESIGN §13).

Each connection gets an identity of its own in the broker's client sessions
(:class:`~octopis.transport.clients.ClientSessions`): its requests go in through
``requests`` and whatever the broker sends it comes out through its entry in ``outlets``
— the path a ZeroMQ client's messages take, so limits, the publish window, the
slow-consumer policy, liveness and counters are the same. The outlet says "full" when
more than ``stomp.write_buffer`` bytes wait to be written; the broker then queues for
the connection (``clients.backlog_limit``) as for a client whose pipe is full.

Liveness: while a connection is open the listener tells the broker it is alive (a
heartbeat request every quarter of ``clients.timeout``); when the client negotiated
heart-beats and is silent for two of its periods, the connection is closed and its
subscriptions withdrawn, as they are when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable

from aiohttp import WSMsgType, web

from octopis.gateway.credentials import Credentials
from octopis.gateway.frames import Decoder, FrameError, FrameLimits, encode, error_frame
from octopis.gateway.session import DeliveryCache, Effects, SessionLimits, StompSession
from octopis.logs import RateLimitedLog
from octopis.settings import Clients, Stomp
from octopis.transport.clients import STOMP_IDENTITY, ClientSessions
from octopis.wire import pack
from octopis.wire.client import HeartbeatRequest

log = logging.getLogger("octopis.broker.stomp")

READ_BYTES = 65_536
WS_PROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
CLOSE_WAIT = 1.0
"""Seconds a closing connection is given to take its last frames."""


class Connection:
    """One STOMP connection: decoder, session, write queue, and its tasks' shared state."""

    def __init__(
        self,
        listener: Listener,
        write: Callable[[list[bytes]], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
        peer: str,
    ) -> None:
        self.listener = listener
        self.identity = STOMP_IDENTITY + secrets.token_bytes(8)
        self.peer = peer
        self.decoder = Decoder(listener.frame_limits)
        self.session = StompSession(
            listener.authenticate, secrets.randbits(62), listener.session_limits, listener.cache
        )
        self._write, self._close = write, close
        self.out: deque[bytes] = deque()
        self.out_bytes = 0
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.closing = False
        self.reason = "it closed the connection"
        self.last_read = self.last_written = self.last_told = time.monotonic()
        self.pending: list[bytes] = []
        self.registered = False
        """The broker has a client session for this connection (after its first request)."""

    # -- to the client --------------------------------------------------------------------

    def outlet(self, parts: list[bytes]) -> bool:
        """What the broker sends this connection; False when its write queue is full."""
        if self.closing:
            return True
        if self.out_bytes > self.listener.stomp.write_buffer:
            return False
        self.apply(self.session.from_broker(parts))
        return True

    def apply(self, effects: Effects) -> None:
        """Queue the frames, pass the requests on (after the current pass), close; log
        the durable subscriptions' gaps (at most one line per log interval)."""
        for client, gap in effects.gaps:
            self.listener.warn.warning("durable gap", "durable %s: %s", client, gap)
        version = self.session.version or "1.0"
        for frame in effects.frames:
            data = encode(frame, version)
            self.out.append(data)
            self.out_bytes += len(data)
        if effects.requests:
            self.pending += effects.requests
            asyncio.get_running_loop().call_soon(self.submit)
        if effects.close and not self.closing:
            self.closing = True
            refusals = [f.headers["message"] for f in effects.frames if f.command == "ERROR"]
            self.reason = refusals[0] if refusals else "it disconnected"
        if self.closing or self.session.unanswered < self.listener.client_settings.publish_window:
            self.room.set()  # a closing connection's reader must not wait for answers
        self.wake.set()

    def submit(self) -> None:
        """Hand the requests gathered so far to the broker, as one pass."""
        if self.pending and not self.closing:
            requests, self.pending = self.pending, []
            self.listener.clients.requests(self.identity, requests)
            self.last_told = time.monotonic()
            self.registered = True

    async def writer(self) -> None:
        """Write queued frames (and heart-beats), all that waits at once, then close when
        asked to."""
        out = self.out
        while True:
            await self.wake.wait()
            self.wake.clear()
            if out:
                batch = list(out)
                out.clear()
                self.out_bytes = 0
                try:
                    await self._write(batch)
                except (ConnectionError, RuntimeError) as exc:  # the client went away
                    self.reason = f"connection lost: {exc}"
                    self.closing = True
                    self.room.set()
                    return
                self.last_written = time.monotonic()
            if self.closing:
                await self._close()
                return

    # -- from the client ------------------------------------------------------------------

    async def received(self, data: bytes) -> None:
        """Bytes from the client: frames out of them, requests to the broker."""
        self.last_read = time.monotonic()
        try:
            self.decoder.feed(data)
            while not self.closing and (frame := self.decoder.next_frame()) is not None:
                self.apply(self.session.received(frame, time.time()))
                if self.session.version is not None:
                    self.decoder.version = self.session.version
        except FrameError as exc:
            self.apply(Effects([error_frame(str(exc))], close=True))
            self.listener.counters["frames_refused"] += 1
        self.submit()
        if self.session.unanswered >= self.listener.client_settings.publish_window:
            self.room.clear()  # read no more until the broker answers
        await self.room.wait()

    async def keepalive(self) -> None:
        """Tell the broker the connection lives; send and expect STOMP heart-beats."""
        timeout = self.listener.client_settings.timeout
        tick = timeout / 4
        s = self.session
        while not self.closing:
            periods = [p / 1000 for p in (s.send_every, s.expect_every) if p]
            await asyncio.sleep(min([tick, *[p / 2 for p in periods]]))
            now = time.monotonic()
            clients = self.listener.clients
            if self.registered and self.identity not in clients.connections:
                self.reason = clients.dropped.get(self.identity, "dropped by the broker")
                self.apply(Effects([error_frame(self.reason)], close=True))
                return
            if s.expect_every and now - self.last_read > 2 * s.expect_every / 1000:
                self.reason = f"no heart-beat for {2 * s.expect_every} ms"
                self.apply(Effects([error_frame(self.reason)], close=True))
                return
            if s.send_every and now - self.last_written >= s.send_every / 1000:
                self.out.append(b"\n")
                self.out_bytes += 1
                self.wake.set()
            if s.connected and now - self.last_told >= tick:
                self.pending.append(pack(HeartbeatRequest(client=s.publisher)))
                self.submit()

    def closed(self) -> None:
        """The connection is gone: the broker withdraws what it held."""
        clients = self.listener.clients
        clients.outlets.pop(self.identity, None)
        if self.identity in clients.connections:
            clients.drop(self.identity, f"STOMP {self.peer}: {self.reason}", left=self.closing)


class Listener:
    """The STOMP servers of one broker."""

    def __init__(
        self,
        clients: ClientSessions,
        stomp: Stomp,
        client_settings: Clients,
        credentials: Credentials | None,
        log_interval: float,
    ) -> None:
        """``stomp`` and ``client_settings``: the ``[stomp]`` and ``[clients]`` sections;
        ``log_interval``, ``[logs] interval``: seconds between two lines of a kind."""
        self.clients = clients
        self.stomp = stomp
        self.client_settings = client_settings
        self.credentials = credentials
        """None: an insecure overlay (any CONNECT is accepted)."""
        self.frame_limits = FrameLimits(stomp.header_bytes, stomp.headers, stomp.body_bytes)
        self.session_limits = SessionLimits(
            stomp.subscriptions,
            stomp.selector_subscriptions,
            stomp.unacked,
            (stomp.heartbeat, stomp.heartbeat),
        )
        self.connections: set[Connection] = set()
        self.counters = clients.counters
        self.cache = DeliveryCache()
        self.warn = RateLimitedLog(log, log_interval)

    def authenticate(self, login: str | None, passcode: str | None) -> str | None:
        """None when a CONNECT with these headers may proceed, else why not."""
        if self.credentials is None:
            return None
        problem = self.credentials.check(login, passcode)
        if problem is not None:
            self.counters["stomp.logins_refused"] += 1
        return problem

    async def _run(self, conn: Connection, reader: Callable[[], Awaitable[None]]) -> None:
        """Serve one connection until it closes either way."""
        self.connections.add(conn)
        self.clients.outlets[conn.identity] = conn.outlet
        self.counters["stomp.connections"] += 1
        tasks = [asyncio.create_task(conn.writer()), asyncio.create_task(conn.keepalive())]
        try:
            await reader()
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            conn.reason = f"connection lost: {exc}"
        finally:
            if conn.closing:  # the last frames (a RECEIPT, an ERROR) go out first
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(tasks[0]), CLOSE_WAIT)
            conn.closed()
            self.connections.discard(conn)
            for task in tasks:
                task.cancel()

    async def _tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def write(frames: list[bytes]) -> None:
            writer.write(b"".join(frames))
            await writer.drain()

        async def close() -> None:
            writer.close()

        conn = Connection(self, write, close, str(writer.get_extra_info("peername")))

        async def read() -> None:
            while not conn.closing and (data := await reader.read(READ_BYTES)):
                await conn.received(data)

        await self._run(conn, read)
        writer.close()

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            protocols=WS_PROTOCOLS,
            max_msg_size=self.stomp.header_bytes + self.stomp.body_bytes + 2,
        )
        await ws.prepare(request)

        async def write(frames: list[bytes]) -> None:
            for data in frames:  # a WebSocket message per frame
                try:
                    await ws.send_str(data.decode("utf-8"))
                except UnicodeDecodeError:
                    await ws.send_bytes(data)

        async def close() -> None:
            await ws.close()

        conn = Connection(self, write, close, str(request.remote))

        async def read() -> None:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await conn.received(msg.data.encode("utf-8"))
                elif msg.type == WSMsgType.BINARY:
                    await conn.received(msg.data)
                if conn.closing:
                    break

        await self._run(conn, read)
        return ws

    async def serve(
        self,
        tcp: tuple[str, int] | None,
        ws: tuple[str, int] | None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """Listen on ``tcp`` and ``ws`` (host, port), over TLS when ``tls`` is given, until
        cancelled; then close every connection (their subscriptions are withdrawn)."""
        server = runner = None
        try:
            if tcp is not None:
                server = await asyncio.start_server(self._tcp, *tcp, ssl=tls)
            if ws is not None:
                app = web.Application()
                app.router.add_get("/", self._websocket)
                app.router.add_get("/stomp", self._websocket)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                await web.TCPSite(runner, *ws, ssl_context=tls).start()
            log.info(
                "%s STOMP on tcp %s, websocket %s%s",
                self.clients.id,
                tcp,
                ws,
                " (TLS)" if tls is not None else "",
            )
            await asyncio.Event().wait()
        finally:
            if server is not None:
                server.close()
            for conn in list(self.connections):
                conn.closing = True
                conn.closed()
            if runner is not None:
                await runner.cleanup()
