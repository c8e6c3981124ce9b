"""Publisher/subscriber SDK (DESIGN §4): asyncio first, a blocking wrapper beside it.

A client connects to one broker's ``client_endpoint``. Several named clients may share
one :class:`Connection` (``octopis run`` attaches thousands of subscribers this way).

Protocol: :mod:`octopis.wire` (requests are maps tagged by ``op``; replies echo ``req``;
failures are ``{"op": "error", "message"}`` and raise :class:`BrokerError`; a delivery is
``[names, NOTIFY body]``). The SDK trusts the broker's match: a subscriber receives each
notification once, whichever of its subscriptions matched (paper §6), and every stream
of that subscriber sees it. Connections send heartbeats at a quarter of the broker's
client timeout, so a live but quiet subscriber is never dropped (DESIGN §7).

Example::

    sub = await Subscriber.connect("tcp://127.0.0.1:17001", "alice")
    stream = await sub.subscribe("[class,eq,'STOCK'],[symbol,eq,'MSFT']")
    pub = await Publisher.connect("tcp://127.0.0.1:17004", "feed")
    await pub.publish({"class": "STOCK", "symbol": "MSFT", "close": 27.9})
    async for n in stream:
        print(n.publisher, n.seq, n.publication)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import zmq
import zmq.asyncio

from octopis.filters import Publication, Subscription, as_subscription
from octopis.keys import DEFAULT_CLIENT, Keys, connect_securely
from octopis.logs import RateLimitedLog
from octopis.wire import LEFT_AT, delivery_fields, pack, unpack

T = TypeVar("T")
log = logging.getLogger("octopis.client")


def _send_nowait(socket: zmq.asyncio.Socket, message: dict[str, Any]) -> None:
    """Send if ZeroMQ takes it now (a broker left behind may be gone: nothing waits)."""
    with contextlib.suppress(zmq.Again):
        zmq.Socket.shadow(socket.underlying).send(pack(message), zmq.NOBLOCK)


class BrokerError(Exception):
    """The broker refused a request; the message is the broker's."""


class DroppedError(BrokerError):
    """The broker dropped this connection (a slow consumer, DESIGN §8); the message is
    its reason. Its subscriptions are withdrawn; connect again to go on."""


DEFAULT_LIVENESS = 1.5
"""Seconds of a broker's silence (three heartbeats unanswered) before a connection fails
over."""
READ_BATCH = 64
"""Deliveries the reader handles before it yields to the application's tasks."""


@dataclass(frozen=True, slots=True)
class Received:
    """A delivered notification with its accounting fields. Times are ``time.time()``
    (the real-time clock) of the publisher (``published_at``), of the broker that
    delivered it as the message left (``left_broker_at``; NaN if it did not say) and of
    this process as the SDK took the message (``received_at``, just before the callback).
    On one host they read the same clock; across hosts their differences are only as
    good as the hosts' clock synchronisation."""

    subscriber: str
    publisher: str
    seq: int
    published_at: float
    received_at: float
    publication: Publication
    left_broker_at: float = math.nan

    @property
    def overlay_delay(self) -> float:
        """Seconds from publishing to leaving the last broker (the overlay's share)."""
        return self.left_broker_at - self.published_at

    @property
    def client_delay(self) -> float:
        """Seconds from leaving the last broker to the SDK (the client side's share:
        the hop, and any wait in this process's input)."""
        return self.received_at - self.left_broker_at


NotificationHandler = Callable[[str, str, int, float, Publication, float, float], None]
"""Called with (client name, publisher, seq, published_at, publication, received_at,
left_broker_at)."""
Resume = Callable[["Connection"], Coroutine[Any, Any, None]]
"""What a client does after its connection failed over (given that connection)."""


DeliveryKey = tuple[str, str, int, int]
"""(client, publisher, publisher session, seq): one delivery."""


class ConnectionGroup:
    """Connections that serve one application's clients (DESIGN §9): at most one to each
    broker, so that clients moving to a broker share the connection there, and one
    record of the deliveries of the last ``horizon`` seconds, so that a client served by
    two of them during a move (or a fail-over) can drop what it got twice (every
    delivery is checked: a repeat is never legitimate, and one set lookup costs less
    than knowing when a repeat may come). A copy can
    come that much later only if the two paths differ by that much: the horizon should
    exceed the connections' ``linger``. At most ``limit`` deliveries are remembered
    after each frame (:meth:`forget_old`); one forgotten before its time is counted in
    :attr:`forgotten_early`. Warnings that may
    repeat (stale move orders, notices for clients gone) are written at most once per
    ``log_interval`` seconds per kind, with the count of those suppressed."""

    def __init__(
        self, horizon: float = 30.0, limit: int = 262_144, log_interval: float = 10.0
    ) -> None:
        if horizon <= 0 or limit < 1:
            raise ValueError("a connection group needs a positive horizon and limit")
        self.warn = RateLimitedLog(log, log_interval)
        """The group's rate-limited warnings."""
        self.connections: dict[str, Connection] = {}
        """Broker endpoint → the group's connection to it."""
        self.horizon = horizon
        self.limit = limit
        self.forgotten_early = 0
        """Deliveries forgotten within the horizon to stay within ``limit``."""
        self.seen: set[DeliveryKey] = set()
        """The deliveries remembered; a connection adds each one it hands over, with its
        time in :attr:`recent`."""
        self.recent: deque[tuple[float, DeliveryKey]] = deque()
        """``(time, key)`` of each delivery in :attr:`seen`, oldest first."""

    def forget_old(self, now: float) -> None:
        """Forget the deliveries past the horizon at time ``now``, and the oldest beyond
        the limit."""
        recent = self.recent
        oldest = now - self.horizon
        while recent and (recent[0][0] < oldest or len(recent) > self.limit):
            at, old = recent.popleft()
            if at >= oldest:
                self.forgotten_early += 1
            self.seen.discard(old)


class Connection:
    """One DEALER connection to a broker, shared by named clients, that fails over.

    ``endpoints`` lists the brokers to use, in order of preference (the same cluster first,
    DESIGN §7: :func:`octopis.topology.failover_endpoints` makes such a list). The
    connection heartbeats every ``liveness / 3`` seconds; when three heartbeats over at
    least ``liveness`` seconds went unanswered it connects to the next broker in the list, re-sends
    every request still unanswered (unacknowledged publications among them), lets each
    client re-issue its subscriptions, and records the outage in :attr:`outages` (and the
    log). The session at the broker it leaves is kept: that socket is read and
    heartbeated until ``linger`` seconds after the clients re-subscribed at the new
    broker, then it says bye. A broker that was only stalled so keeps its subscriptions
    and delivers what it routed here (copies its neighbours held for it among them)
    until the new subscriptions have spread through the overlay, and a delivery seen
    twice meanwhile (within the ``group``'s horizon) is dropped and counted in
    :attr:`duplicates_absorbed`; so a fail-over away from a live broker loses nothing.
    At most ``max_pending`` requests wait for replies; a further :meth:`submit`
    waits for room, so a publisher is slowed, never silently dropped (the broker answers a
    publication once its neighbours hold it, so this window is the publish credit that
    backpressure reaches, DESIGN §8).

    Memory is bounded: ZeroMQ holds at most ``receive_buffer`` incoming messages; a
    subscription stream holds at most its ``buffer`` and, when full, the reader stops
    until the application takes from it (the broker then queues, and its slow-consumer
    policy applies). The reader yields to other tasks every :data:`READ_BATCH` messages.

    ``keys`` is a keys directory (:mod:`octopis.keys`; default ``$OCTOPIS_KEYS``): the
    connection speaks CurveZMQ with client key pair ``key_name``, each broker known by
    the public key ``endpoints.json`` gives its endpoint. Without either it connects in
    the clear, which only a broker run ``--insecure`` accepts.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        context: zmq.asyncio.Context | None = None,
        liveness: float = DEFAULT_LIVENESS,
        linger: float = 10.0,
        max_pending: int = 1000,
        receive_buffer: int = 10_000,
        keys: str | os.PathLike | None = None,
        key_name: str = DEFAULT_CLIENT,
        group: ConnectionGroup | None = None,
    ) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints:
            raise ValueError("a connection needs at least one broker endpoint")
        self._options: dict[str, Any] = {
            "liveness": liveness,
            "linger": linger,
            "max_pending": max_pending,
            "receive_buffer": receive_buffer,
            "keys": keys,
            "key_name": key_name,
        }
        self.group = group or ConnectionGroup()
        """The connections this one's clients may move to, and the deliveries they saw."""
        self.group.connections.setdefault(self.endpoints[0], self)
        self._siblings: list[Connection] = []
        """Connections this one opened for clients that moved (:meth:`sibling`); closed
        with it (or before, once idle: :meth:`_close_if_idle`)."""
        self._parent: Connection | None = None
        """The connection that opened this one for moves, if one did."""
        self.endpoint = self.endpoints[0]
        self.liveness = liveness
        self.linger = linger
        self._background: set[asyncio.Task] = set()
        """Sessions kept at brokers left at a fail-over, and clients resuming."""
        self._left_sessions: set[asyncio.Task] = set()
        """The sessions kept at brokers left at a fail-over that have not ended."""
        self.duplicates_absorbed = 0
        """Deliveries dropped as already seen during a fail-over or move."""
        self.unclaimed = 0
        """Deliveries for a client this connection does not serve (one that moved on
        while the broker still named it here)."""
        self.receive_buffer = receive_buffer
        found = Keys.find(keys)
        self._curve = (
            None
            if found is None
            else (found.client(key_name), {e: found.server_key(e) for e in self.endpoints})
        )
        """This client's key pair and each endpoint's broker key, or None (in the clear)."""
        self._ctx = context or zmq.asyncio.Context.instance()
        self.socket = self._connect(self.endpoint)
        self._reqs = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future, bytes]] = {}
        self._room = asyncio.Semaphore(max_pending)
        self._handlers: dict[str, NotificationHandler] = {}
        self._notices: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._resumers: list[Resume] = []
        self._reader: asyncio.Task | None = None
        self._heartbeat: asyncio.Task | None = None
        self._heard = time.monotonic()
        self._stalls: list[asyncio.Event] = []
        self.reading_paused = False
        """The reader waits for the application to take from a full stream."""
        self._on_drop: list[Callable[[str], None]] = []
        self.dropped: str | None = None
        """Why the broker dropped this connection, once it has."""
        self.overflowed = 0
        """Deliveries the broker dropped for this connection under the drop-oldest policy."""
        self.errors: deque[str] = deque(maxlen=1000)
        """Refusals of requests nobody awaited (the last 1,000)."""
        self.broker: dict[str, Any] = {}
        self.outages: deque[dict[str, Any]] = deque(maxlen=1000)
        """One record per fail-over (the last 1,000): from, to, started (wall time),
        seconds away."""

    def _connect(self, endpoint: str) -> zmq.asyncio.Socket:
        socket = self._ctx.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, self.receive_buffer)
        socket.setsockopt(zmq.SNDHWM, 0)
        if self._curve is not None:
            pair, server_keys = self._curve
            connect_securely(socket, pair, server_keys[endpoint])
        socket.connect(endpoint)
        return socket

    async def open(self, timeout: float = 10.0) -> dict[str, Any]:
        """Start reading and handshake; returns the broker's welcome."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        self.broker = await self.request({"op": "hello", "client": "-"}, timeout)
        if self._heartbeat is None:
            interval = min(float(self.broker.get("timeout", 10.0)) / 4, self.liveness / 3)
            self._heartbeat = asyncio.create_task(self._beat(interval))
        return self.broker

    def register(self, name: str, handler: NotificationHandler) -> None:
        """Route deliveries for client ``name`` to ``handler``."""
        self._handlers[name] = handler

    def on_failover(self, resume: Resume) -> None:
        """Run ``resume(self)`` after each fail-over (a subscriber re-issues its
        subscriptions)."""
        self._resumers.append(resume)

    def on_dropped(self, notify: Callable[[str], None]) -> None:
        """Call ``notify(reason)`` if the broker drops this connection."""
        self._on_drop.append(notify)

    def on_notice(self, name: str, notice: Callable[[dict[str, Any]], None]) -> None:
        """Call ``notice(message)`` with what the broker tells client ``name`` unasked:
        ``move`` (go to another broker) and ``released`` (a moved subscription is no
        longer delivered here), DESIGN §9."""
        self._notices[name] = notice

    def forget(
        self,
        name: str,
        resume: Resume,
        notify: Callable[[str], None],
    ) -> None:
        """Client ``name`` has moved to another connection: stop serving it here. Its
        deliveries are still handled until every session left at a fail-over has ended:
        such a session may yet deliver what its broker routed for ``name`` (a broker
        stalled past the liveness catches up once it runs again)."""
        handler = self._handlers.get(name)
        self._notices.pop(name, None)
        if resume in self._resumers:
            self._resumers.remove(resume)
        if notify in self._on_drop:
            self._on_drop.remove(notify)
        if handler is not None and self._left_sessions:
            sessions = list(self._left_sessions)
            self._in_background(self._forget_after(name, handler, sessions))
        else:
            self._handlers.pop(name, None)
            self._close_if_idle()

    async def _forget_after(
        self, name: str, handler: NotificationHandler, sessions: list[asyncio.Task]
    ) -> None:
        """Stop handling ``name``'s deliveries once ``sessions`` have ended, unless it has
        registered again meanwhile."""
        await asyncio.gather(*sessions, return_exceptions=True)
        if self._handlers.get(name) is handler:
            del self._handlers[name]
            self._close_if_idle()

    def _close_if_idle(self) -> None:
        """Close this connection if it was opened for moves (:meth:`sibling`), serves no
        client and waits for nothing, and the group reaches its broker another way (it
        failed over elsewhere, and a newer one was opened there): so failing over and
        moving for weeks does not pile up connections. Its bye withdraws what its broker
        still held for clients that have left it."""
        parent = self._parent
        if (
            parent is None
            or self._handlers
            or self._pending
            or self._left_sessions
            or self.group.connections.get(self.endpoints[0]) is self
        ):
            return
        parent._siblings.remove(self)
        self._parent = None
        for sibling in self._siblings:  # they serve clients: the parent closes them
            sibling._parent = parent
        parent._siblings += self._siblings
        self._siblings = []
        parent.duplicates_absorbed += self.duplicates_absorbed
        parent.unclaimed += self.unclaimed
        parent.overflowed += self.overflowed
        parent.errors.extend(self.errors)
        parent.outages.extend(self.outages)
        parent._in_background(self.close())

    @property
    def reading_left_sessions(self) -> bool:
        """Whether a session left at a fail-over is still read (it may yet deliver)."""
        return bool(self._left_sessions)

    @property
    def siblings(self) -> list[Connection]:
        """The connections this one opened for clients that moved (and has not closed:
        an idle one's counts, outages and errors are added to this one's)."""
        return list(self._siblings)

    @property
    def family(self) -> list[Connection]:
        """This connection, its siblings, theirs, and so on."""
        found = [self]
        for connection in found:
            found += [s for s in connection._siblings if all(s is not f for f in found)]
        return found

    async def sibling(self, endpoint: str) -> Connection:
        """An open connection to ``endpoint`` for a client that moves there: the group's
        (:class:`ConnectionGroup`) that is connected there now (one opened for it may have
        failed over elsewhere), or one opened now (failing over to this one's brokers),
        joined to the group and closed with this one."""
        for found in (self.group.connections.get(endpoint), *self.group.connections.values()):
            if found is not None and found.dropped is None and found.endpoint == endpoint:
                return found
        others = [e for e in self.endpoints if e != endpoint]
        sibling = Connection(
            [endpoint, *others], context=self._ctx, group=self.group, **self._options
        )
        self.group.connections[endpoint] = sibling
        self._siblings.append(sibling)
        sibling._parent = self
        await sibling.open()
        return sibling

    def stall_until(self, room: asyncio.Event) -> None:
        """Stop reading after the current message until ``room`` is set (a full stream)."""
        self._stalls.append(room)

    async def submit(self, message: dict[str, Any], timeout: float | None = None) -> asyncio.Future:
        """Send a request; returns the future of its reply (waits while ``max_pending``
        requests are unanswered, raising ``TimeoutError`` after ``timeout`` seconds). A
        refusal sets :class:`BrokerError` on the future.

        Always yields to the event loop once: a send that ZeroMQ takes at once completes
        without yielding, so a tight loop of ``publish(wait=False)`` would otherwise keep
        this connection's reader and heartbeat from running until the broker drops it."""
        if self.dropped is not None:
            raise DroppedError(self.dropped)
        if self._room.locked() and timeout is not None:
            try:
                await asyncio.wait_for(self._room.acquire(), timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no credit from {self.endpoint} within {timeout} s: "
                    f"{len(self._pending)} requests unanswered"
                ) from None
        else:
            await self._room.acquire()
        req = next(self._reqs)
        future = asyncio.get_running_loop().create_future()
        payload = pack({**message, "req": req})
        self._pending[req] = (future, payload)
        future.add_done_callback(lambda _: self._answered(req))
        await self.socket.send(payload)
        await asyncio.sleep(0)
        return future

    def _answered(self, req: int) -> None:
        if self._pending.pop(req, None) is not None:
            self._room.release()

    async def request(
        self, message: dict[str, Any], timeout: float | None = 10.0
    ) -> dict[str, Any]:
        """Send a request and wait for its reply (``timeout`` None: however long);
        :class:`BrokerError` on refusal."""
        future = await self.submit(message)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"no reply from {self.endpoint} to {message['op']} within {timeout} s"
            ) from None

    async def send(self, message: dict[str, Any]) -> None:
        """Send without asking for a reply (refusals land in :attr:`errors`)."""
        await self.socket.send(pack(message))

    async def close(self) -> None:
        """Say bye to the broker (it withdraws this connection's subscriptions at once,
        not at its client timeout), stop reading and heartbeats, and close the socket."""
        if self.dropped is None and self._reader is not None:
            with contextlib.suppress(TimeoutError, BrokerError):
                await self.request({"op": "bye", "client": "-"}, self.liveness)
        for sibling in list(self._siblings):
            await sibling.close()
        tasks = [t for t in (self._reader, self._heartbeat, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for future, _ in list(self._pending.values()):
            future.cancel()
        self.socket.close()

    # -- liveness and fail-over ----------------------------------------------------------

    async def _beat(self, interval: float) -> None:
        """Heartbeat the broker; fail over once three heartbeats in a row, the first sent
        ``liveness`` seconds ago or more, were followed by nothing at all from it. Counting
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
            if first_unanswered is not None and self._heard >= first_unanswered:
                first_unanswered, missed = None, 0
            if first_unanswered is not None and self._unread():
                first_unanswered, missed = None, 0  # it did answer: this process is behind
            if first_unanswered is not None:
                missed += 1
                if missed >= 3 and time.monotonic() - first_unanswered >= self.liveness:
                    await self._failover()
                    first_unanswered, missed = None, 0
                    continue
            await self.socket.send(pack({"op": "heartbeat", "client": "-", "req": next(beats)}))
            if first_unanswered is None:
                first_unanswered = time.monotonic()

    def _unread(self) -> bool:
        """Whether something from the broker waits unread in the socket."""
        return bool(self.socket.get(zmq.EVENTS) & zmq.POLLIN)

    async def _failover(self) -> None:
        """Move to the next broker that answers and re-send what is unanswered; the
        clients resume there in the background (heartbeats go on meanwhile)."""
        t0 = self._heard
        away_from, started = self.endpoint, time.time() - (time.monotonic() - t0)
        log.warning("broker at %s silent for %.1f s; failing over", away_from, self.liveness)
        start = self.endpoints.index(self.endpoint)
        order = self.endpoints[start + 1 :] + self.endpoints[: start + 1]
        settled = asyncio.Event()
        left = self._leave(settled)
        while True:
            for endpoint in order:
                if await self._switch(endpoint, left):
                    break
            else:
                await asyncio.sleep(self.liveness)
                continue
            break
        for _, payload in list(self._pending.values()):
            await self.socket.send(payload)
        record = {"from": away_from, "to": self.endpoint, "started": started}
        self._in_background(self._resume(record, t0, settled))

    async def _resume(self, record: dict[str, Any], t0: float, settled: asyncio.Event) -> None:
        """Let every client resume (re-subscribe) at the new broker; then record the
        outage and let the socket left behind start its last :attr:`linger` seconds."""
        try:
            results = await asyncio.gather(
                *(resume(self) for resume in self._resumers), return_exceptions=True
            )
            for failed in (r for r in results if isinstance(r, BaseException)):
                log.error("a client could not resume at %s: %s", self.endpoint, failed)
        finally:
            settled.set()
        away = time.monotonic() - t0
        self.outages.append({**record, "seconds": away})
        log.warning("moved from %s to %s after %.2f s away", record["from"], record["to"], away)

    def _leave(self, settled: asyncio.Event) -> zmq.asyncio.Socket | None:
        """Stop reading the current socket; returns it if its session is kept (see
        :meth:`_keep_left`; it is then left open when the next one is connected)."""
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        old = self.socket
        if self.linger <= 0:
            return None
        session = self._in_background(self._keep_left(old, self.endpoint, settled))
        self._left_sessions.add(session)
        session.add_done_callback(self._left_sessions.discard)
        return old

    def _in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Run ``work`` as a task that :meth:`close` cancels."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _keep_left(
        self, socket: zmq.asyncio.Socket, endpoint: str, settled: asyncio.Event
    ) -> None:
        """Keep the session at a broker left at a fail-over: read what it still delivers
        and heartbeat it until :attr:`linger` seconds after the clients resumed at the
        new broker (``settled``), so that its subscriptions stay in place until the new
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
                _send_nowait(socket, {"op": "heartbeat", "client": "-", "req": next(beats)})
                late += await self._read_left(socket, min(deadline, loop.time() + interval))
            _send_nowait(socket, {"op": "bye", "client": "-", "req": next(beats)})
            late += await self._read_left(socket, loop.time() + self.liveness, until_op="bye")
        finally:
            socket.close()
            if late:
                log.warning("%d deliveries came from %s after leaving it", late, endpoint)

    async def _read_left(
        self, socket: zmq.asyncio.Socket, until: float, *, until_op: str | None = None
    ) -> int:
        """Handle what arrives on a socket left at a fail-over until loop time ``until``,
        or until a reply ``until_op``: that one follows every delivery the broker had
        queued for this connection (a broker short of capacity may hold many, DESIGN §8),
        so the wait goes on while they keep coming. Returns the number of deliveries."""
        loop = asyncio.get_running_loop()
        deliveries = 0
        while (left := until - loop.time()) > 0:
            try:
                parts = await asyncio.wait_for(socket.recv_multipart(), left)
            except TimeoutError:
                break
            deliveries += len(parts) // 2
            if until_op is not None:
                until = max(until, loop.time() + self.liveness)
            try:
                self._on_frame(parts, left_behind=True)
            except Exception:
                log.exception("client dropped a frame it could not handle")
            if until_op is not None and len(parts) == 1 and unpack(parts[0]).get("op") == until_op:
                break
        return deliveries

    async def _switch(self, endpoint: str, left: zmq.asyncio.Socket | None) -> bool:
        """Connect to ``endpoint`` and handshake; False if it does not answer in time.
        The current socket is closed unless it is ``left`` (read elsewhere)."""
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self.socket is not left:
            self.socket.close()
        self.socket = self._connect(endpoint)
        self.endpoint = endpoint
        self._reader = asyncio.create_task(self._read())
        req = next(self._reqs)
        future = asyncio.get_running_loop().create_future()
        self._pending[req] = (future, b"")
        try:
            await self.socket.send(pack({"op": "hello", "client": "-", "req": req}))
            for _ in range(3):  # an answer waiting unread is not silence: wait for it
                done, _ = await asyncio.wait([future], timeout=self.liveness)
                if done or not self._unread():
                    break
            if not future.done():
                return False
            self.broker = future.result()
        finally:
            self._pending.pop(req, None)
        self._heard = time.monotonic()
        return True

    # -- input ---------------------------------------------------------------------------

    async def _read(self) -> None:
        handled = 0
        while True:
            parts = await self.socket.recv_multipart()
            self._heard = time.monotonic()
            try:
                self._on_frame(parts)
            except Exception:
                log.exception("client of %s dropped a frame it could not handle", self.endpoint)
            handled += 1
            if self._stalls:
                self.reading_paused = True
                while self._stalls:
                    await self._stalls.pop().wait()
                self.reading_paused = False
                self._heard = time.monotonic()
            elif handled >= READ_BATCH:
                handled = 0
                await asyncio.sleep(0)

    def _on_deliveries(self, parts: list[bytes]) -> None:
        """A frame of deliveries, ``[names, body, ..., stamp]``: each NOTIFY ``body``
        for the clients ``names`` of this connection, a repeat dropped (the one loop every
        delivery takes in the SDK, hence the local names)."""
        now = time.time()
        left_at = LEFT_AT.unpack(parts[-1])[0] if len(parts) % 2 else math.nan
        group = self.group
        seen, recent, handlers = group.seen, group.recent, self._handlers
        for i in range(0, len(parts) - 1, 2):
            publisher, seq, published_at, publication, session = delivery_fields(parts[i + 1])
            for name in unpack(parts[i]):
                handler = handlers.get(name)
                if handler is None:
                    self.unclaimed += 1
                    continue
                key = (name, publisher, session, seq)
                if key in seen:
                    self.duplicates_absorbed += 1
                    continue
                seen.add(key)
                recent.append((now, key))
                handler(name, publisher, seq, published_at, publication, now, left_at)
        group.forget_old(now)

    def _on_frame(self, parts: list[bytes], left_behind: bool = False) -> None:
        if len(parts) > 1:
            self._on_deliveries(parts)
            return
        data = unpack(parts[0])
        op = data.get("op")
        if op == "dropped" and left_behind:
            return  # the broker we left let us go: not this connection's state
        if op == "dropped":
            self._dropped(str(data.get("reason", "no reason given")))
            return
        if op in ("move", "released"):
            notice = self._notices.get(data.get("client"))
            if notice is None:
                self.group.warn.warning(
                    "unknown-client notice",
                    "a %s notice for client %r, unknown at %s",
                    op,
                    data.get("client"),
                    self.endpoint,
                )
            else:
                notice(data)
            return
        if op == "overflow":
            self.overflowed += int(data.get("dropped", 0))
            log.warning(
                "broker at %s dropped %d deliveries to this slow connection (%d in all)",
                self.endpoint,
                data.get("dropped", 0),
                self.overflowed,
            )
            return
        pending = self._pending.get(data.get("req"))
        future = pending[0] if pending is not None else None
        if data.get("op") == "error":
            if future is not None and not future.done():
                future.set_exception(BrokerError(data.get("message", "error")))
            else:
                self.errors.append(data.get("message", "error"))
        elif future is not None and not future.done():
            future.set_result(data)

    def _dropped(self, reason: str) -> None:
        """The broker dropped us: fail what waits, stop heartbeats, tell the clients."""
        if self.dropped is not None:
            return
        self.dropped = reason
        log.error("broker at %s dropped this connection: %s", self.endpoint, reason)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for future, _ in list(self._pending.values()):
            if not future.done():
                future.set_exception(DroppedError(reason))
        for notify in self._on_drop:
            notify(reason)


class SubscriptionStream:
    """An async iterator over the notifications delivered to its subscriber (the broker
    delivers each matching notification once per subscriber, DESIGN §3)."""

    def __init__(
        self, owner: Subscriber, sub_id: str, subscription: Subscription, buffer: int
    ) -> None:
        self.owner = owner
        self.sub_id = sub_id
        self.subscription = subscription
        self.buffer = buffer
        self.queue: asyncio.Queue[Received | DroppedError] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()

    def offer(self, received: Received | DroppedError) -> None:
        """Queue a delivery; at ``buffer`` the connection's reader stops until there is room."""
        self.queue.put_nowait(received)
        if self.queue.qsize() >= self.buffer and self._room.is_set():
            self._room.clear()
            self.owner.connection.stall_until(self._room)

    def __aiter__(self) -> AsyncIterator[Received]:
        return self

    async def __anext__(self) -> Received:
        return await self.get()

    async def get(self, timeout: float | None = None) -> Received:
        """The next notification, waiting at most ``timeout`` seconds; raises
        :class:`DroppedError` after the last one if the broker dropped the connection."""
        item = await asyncio.wait_for(self.queue.get(), timeout)
        if self.queue.qsize() < self.buffer:
            self._room.set()
        if isinstance(item, DroppedError):
            self.queue.put_nowait(item)  # every later call raises too
            raise item
        return item

    async def unsubscribe(self) -> None:
        """Withdraw this subscription."""
        await self.owner.unsubscribe(self)


class _Client:
    def __init__(self, name: str, connection: Connection) -> None:
        self.name = name
        self.connection = connection
        self._origin = connection
        """The connection given or opened first (a move's new ones are its siblings)."""
        self._owns_connection = False

    @classmethod
    async def connect(
        cls,
        endpoints: str | Sequence[str],
        name: str,
        *,
        keys: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> Any:
        """Open a connection of its own as client ``name`` (to the first of ``endpoints``,
        failing over to the others in order), with ``keys`` as :class:`Connection` takes
        them."""
        connection = Connection(endpoints, keys=keys)
        await connection.open()
        client = cls(name, connection, **kwargs)
        client._owns_connection = True
        return client

    async def close(self) -> None:
        """Close the connection (and those it opened for moves) if this client opened it."""
        if self._owns_connection:
            await self._origin.close()


class Subscriber(_Client):
    """A named subscriber. ``on_notification`` (if given) receives every delivery instead
    of the per-subscription streams (used for bulk accounting)."""

    def __init__(
        self,
        name: str,
        connection: Connection,
        on_notification: Callable[[Received], None] | None = None,
        buffer: int = 10_000,
    ) -> None:
        super().__init__(name, connection)
        self.buffer = buffer
        """Notifications each stream holds before the connection stops reading."""
        self._streams: dict[str, SubscriptionStream] = {}
        self._subscriptions: dict[str, Subscription] = {}
        self._callback = on_notification
        self._releases: dict[str, asyncio.Event] = {}
        self._moving: asyncio.Task | None = None
        self._next_move: dict[str, Any] | None = None
        self.moves: deque[dict[str, Any]] = deque(maxlen=1000)
        """One record per move (the last 1,000): from, to, inside, sub ids, seconds."""
        self.stale_moves = 0
        """Move orders ignored: from a broker this subscriber has left, or naming
        subscriptions it no longer holds (the broker's view was older than the client's)."""
        self._serve_on(connection)

    def _serve_on(self, connection: Connection) -> None:
        self.connection = connection
        connection.register(self.name, self._on_notify)
        connection.on_notice(self.name, lambda message: self._on_notice(message, connection))
        connection.on_failover(self._resume_after_failover)
        connection.on_dropped(self._dropped)

    @property
    def moving(self) -> bool:
        """Whether a move is under way or ordered."""
        return self._next_move is not None or (self._moving is not None and not self._moving.done())

    def _on_notice(self, message: dict[str, Any], connection: Connection) -> None:
        """``released`` ends a move's wait; ``move`` starts one, or queues it behind the
        move under way, if it comes from the current connection."""
        if message["op"] == "move":
            message = {**message, "connection": connection}
        if message["op"] == "released":
            event = self._releases.get(message.get("sub_id"))
            if event is not None:
                event.set()
            return
        if self._moving is not None and not self._moving.done():
            log.info("%s is told to move while moving: it moves again after", self.name)
            self._next_move = message
            return
        self._start_move(message)

    def _start_move(self, message: dict[str, Any]) -> None:
        """Move as ``message`` says, unless it is stale (:meth:`_stale`)."""
        sub_ids = list(message["sub_ids"])
        stale = self._stale(message["connection"], str(message["to"]), sub_ids)
        if stale is None:
            work = self._move(str(message["to"]), bool(message["inside"]), sub_ids)
            self._moving = asyncio.get_running_loop().create_task(work)
            return
        self.stale_moves += 1
        self.connection.group.warn.warning(
            "stale move order",
            "%s ignores a move order from %s to %s for %s: %s",
            self.name,
            message["connection"].endpoint,
            message["to"],
            ", ".join(sub_ids),
            stale,
        )

    def _stale(self, sender: Connection, to: str, sub_ids: list[str]) -> str | None:
        """Why a move to ``to`` of ``sub_ids``, ordered on ``sender``, is stale, or None:
        the order came on a connection that is no longer this subscriber's (a broker it
        left still names it until it lets go), names subscriptions it no longer holds,
        or sends it where its connection already is (it failed over there). Acting on one
        would withdraw what it does not replace."""
        if sender is not self.connection:
            return "it has left that broker"
        if not set(sub_ids) <= set(self._subscriptions):
            return "it no longer holds those subscriptions"
        if to == sender.endpoint:
            return "it is connected there already (it failed over)"
        return None

    async def _move(self, to: str, inside: bool, sub_ids: list[str]) -> None:
        """Move to the broker at ``to`` as its current broker told (DESIGN §9), make before
        break: inside the cluster each subscription is adopted there and the old broker
        releases it once the path has turned; else each is made again there and the
        old one withdrawn ``linger`` seconds later. Both brokers deliver meanwhile, and
        a delivery had twice is dropped (the group's record, counted in
        ``Connection.duplicates_absorbed``). A move ordered meanwhile starts when this
        one is done."""
        old = self.connection
        started = time.monotonic()
        new = await old.sibling(to)
        stale = "it failed over meanwhile" if new is old else self._stale(old, to, sub_ids)
        if stale is not None:
            self.stale_moves += 1
            old.group.warn.warning(
                "stale move order", "%s drops a move to %s: %s", self.name, to, stale
            )
            self._after_move()
            return
        let_go = True
        try:
            self._serve_on(new)
            across = [sub_id for sub_id in sub_ids if not inside or not await self._adopt(sub_id)]
            waits = [self._releases[s].wait() for s in sub_ids if s in self._releases]
            try:
                await asyncio.wait_for(asyncio.gather(*waits), old.linger + old.liveness * 4)
            except TimeoutError:
                let_go = False  # it may still deliver: keep reading it, repeats dropped
                log.warning(
                    "%s: %s did not release %d moved subscriptions; both are read",
                    self.name,
                    old.endpoint,
                    sum(not e.is_set() for e in self._releases.values()),
                )
            if across:
                await self._resubscribe(across)
                await asyncio.sleep(old.linger)  # the new subscriptions spread meanwhile
                for sub_id in across:
                    try:
                        await old.request(
                            {"op": "unsubscribe", "client": self.name, "sub_id": sub_id}
                        )
                    except BrokerError as exc:  # withdrawn there already (a fail-over)
                        log.warning("%s: %s", self.name, exc)
            if let_go:
                old.forget(self.name, self._resume_after_failover, self._dropped)
            self.moves.append(
                {
                    "from": old.endpoint,
                    "to": to,
                    "inside": inside and not across,
                    "sub_ids": sub_ids,
                    "seconds": time.monotonic() - started,
                    "released": let_go,
                }
            )
            log.info("%s moved %d subscriptions to %s", self.name, len(sub_ids), to)
        finally:
            self._releases.clear()
            self._after_move()

    def _after_move(self) -> None:
        """Start the move ordered while one was under way, if any."""
        if self._next_move is not None:
            message, self._next_move = self._next_move, None
            asyncio.get_running_loop().call_soon(self._start_move, message)

    async def _adopt(self, sub_id: str) -> bool:
        """Ask the new broker to take ``sub_id`` over; False if it cannot (not there yet)."""
        self._releases[sub_id] = asyncio.Event()
        try:
            await self.connection.request({"op": "adopt", "client": self.name, "sub_id": sub_id})
        except BrokerError as exc:
            log.warning("%s could not adopt %s: %s; subscribing afresh", self.name, sub_id, exc)
            del self._releases[sub_id]
            return False
        return True

    async def subscribe(
        self, spec: str | dict | Subscription, timeout: float = 10.0
    ) -> SubscriptionStream:
        """Subscribe (PADRES text, dict form or :class:`Subscription`); returns its stream."""
        subscription = as_subscription(spec)
        sub_id = await self._subscribe(subscription, timeout)
        stream = SubscriptionStream(self, sub_id, subscription, self.buffer)
        self._streams[sub_id] = stream
        return stream

    async def _subscribe(self, subscription: Subscription, timeout: float | None) -> str:
        reply = await self.connection.request(
            {"op": "subscribe", "client": self.name, "filter": subscription.to_text()}, timeout
        )
        self._subscriptions[reply["sub_id"]] = subscription
        return reply["sub_id"]

    async def _resume_after_failover(self, connection: Connection) -> None:
        """``connection`` failed over: every subscription again at its new broker
        (DESIGN §7), unless this subscriber is moving away from it (the move makes them
        at the new host before the session left behind ends)."""
        if connection is self.connection:
            await self._resubscribe()

    async def _resubscribe(self, only: Sequence[str] | None = None) -> None:
        """After a fail-over: every subscription (or those of ids ``only``) again at the
        current broker (DESIGN §7). No timeout: a request the broker does not answer is
        re-sent at the next fail-over."""
        held = {s: f for s, f in self._subscriptions.items() if only is None or s in only}
        for sub_id in held:
            del self._subscriptions[sub_id]
        new_ids = await asyncio.gather(*(self._subscribe(f, None) for f in held.values()))
        for old_id, new_id in zip(held, new_ids, strict=True):
            stream = self._streams.pop(old_id, None)
            if stream is not None:
                stream.sub_id = new_id
                self._streams[new_id] = stream

    async def unsubscribe(self, stream: SubscriptionStream | str, timeout: float = 10.0) -> None:
        """Withdraw a subscription by stream or id."""
        sub_id = stream if isinstance(stream, str) else stream.sub_id
        await self.connection.request(
            {"op": "unsubscribe", "client": self.name, "sub_id": sub_id}, timeout
        )
        self._streams.pop(sub_id, None)
        self._subscriptions.pop(sub_id, None)

    def _on_notify(
        self,
        name: str,
        publisher: str,
        seq: int,
        published_at: float,
        publication: Publication,
        received_at: float,
        left_at: float,
    ) -> None:
        received = Received(name, publisher, seq, published_at, received_at, publication, left_at)
        if self._callback is not None:
            self._callback(received)
            return
        for stream in self._streams.values():
            stream.offer(received)

    def _dropped(self, reason: str) -> None:
        for stream in self._streams.values():
            stream.queue.put_nowait(DroppedError(reason))


class Publisher(_Client):
    """A named publisher numbering its notifications 1, 2, 3, ... within its session: a
    random number drawn here, so that brokers tell this publisher from an earlier one of
    the same name (whose numbers it repeats) and never take its notifications for
    repeats."""

    def __init__(self, name: str, connection: Connection) -> None:
        super().__init__(name, connection)
        self.seq = 0
        self.session = secrets.randbits(63)
        self._unacknowledged: set[asyncio.Future] = set()
        self.refused: deque[str] = deque(maxlen=1000)
        """Why publications sent without ``wait`` were refused (the last 1,000)."""

    async def publish(
        self,
        publication: Publication | str,
        *,
        wait: bool = True,
        seq: int | None = None,
        timeout: float = 10.0,
    ) -> int:
        """Publish; returns the sequence number.

        With ``wait`` the broker's acceptance is awaited (a refusal raises
        :class:`BrokerError`); without it refusals collect in :attr:`refused` and
        :meth:`flush` waits for everything sent so far to be acknowledged. Either way a
        publication stays unacknowledged until the broker's neighbours hold it, and is sent
        again after a fail-over; when the connection's window of unanswered requests (its
        publish credit) is full, this waits: backpressure slows the publisher. After
        ``timeout`` seconds of waiting (for credit, and with ``wait`` for the answer too)
        it raises ``TimeoutError`` and nothing was sent.
        """
        self.seq = seq if seq is not None else self.seq + 1
        message = {
            "op": "publish",
            "client": self.name,
            "seq": self.seq,
            "session": self.session,
            "published_at": time.time(),
            "publication": publication,
        }
        future = await self.connection.submit(message, timeout)
        if wait:
            await asyncio.wait_for(future, timeout)
        else:
            self._unacknowledged.add(future)
            future.add_done_callback(self._acknowledged)
        return self.seq

    def _acknowledged(self, future: asyncio.Future) -> None:
        self._unacknowledged.discard(future)
        if not future.cancelled() and future.exception() is not None:
            self.refused.append(str(future.exception()))

    async def flush(self, timeout: float = 30.0) -> None:
        """Return once every publication sent so far is acknowledged (or refused)."""
        if self._unacknowledged:
            await asyncio.wait_for(
                asyncio.gather(*self._unacknowledged, return_exceptions=True), timeout
            )


class _LoopThread:
    """A private event loop in a daemon thread for the blocking wrapper."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="octopis-client"
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class _Blocking:
    """A client connection driven from a loop thread; a context manager that closes it."""

    def __init__(self, connect: Coroutine[Any, Any, Any]) -> None:
        self._loop = _LoopThread()
        self._client = self._loop.run(connect)

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        self._loop.run(self._client.close())
        self._loop.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingSubscriber(_Blocking):
    """Blocking wrapper of :class:`Subscriber` for scripts and shells."""

    def __init__(self, endpoint: str, name: str, keys: str | os.PathLike | None = None) -> None:
        super().__init__(Subscriber.connect(endpoint, name, keys=keys))
        self._sub: Subscriber = self._client

    def subscribe(self, spec: str | dict | Subscription) -> BlockingStream:
        """Subscribe and return a blocking iterator over its notifications."""
        return BlockingStream(self._loop, self._loop.run(self._sub.subscribe(spec)))

    def unsubscribe(self, stream: BlockingStream) -> None:
        """Withdraw a subscription."""
        self._loop.run(self._sub.unsubscribe(stream.stream))


class BlockingStream:
    """Iterate notifications; :meth:`get` with a timeout raises ``TimeoutError``."""

    def __init__(self, loop: _LoopThread, stream: SubscriptionStream) -> None:
        self._loop = loop
        self.stream = stream
        self.sub_id = stream.sub_id

    def get(self, timeout: float | None = None) -> Received:
        """The next notification."""
        return self._loop.run(self.stream.get(timeout))

    def __iter__(self) -> Iterator[Received]:
        while True:
            yield self.get()


class BlockingPublisher(_Blocking):
    """Blocking wrapper of :class:`Publisher`."""

    def __init__(self, endpoint: str, name: str, keys: str | os.PathLike | None = None) -> None:
        super().__init__(Publisher.connect(endpoint, name, keys=keys))
        self._pub: Publisher = self._client

    def publish(self, publication: Publication | str) -> int:
        """Publish and wait for the broker to accept; returns the sequence number."""
        return self._loop.run(self._pub.publish(publication))
