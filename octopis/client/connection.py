"""The SDK's connection to a broker (DESIGN §4, §7): one DEALER socket shared by named
clients, heartbeats, and fail-over along a broker list; the connection group that
clients moving between brokers share (DESIGN §9). Its parts: :mod:`.opening` (why it
did not open), :mod:`.requests` (the publish credit), :mod:`.served` (the clients'
deliveries and notices), :mod:`.left_session` (the broker left at a fail-over)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import zmq
import zmq.asyncio

from octopis.client.deliveries import NotificationHandler
from octopis.client.errors import BrokerError, DroppedError
from octopis.client.failover import Failover
from octopis.client.link import BrokerLink
from octopis.client.opening import OpeningDiagnosis
from octopis.client.requests import Requests
from octopis.client.served import ServedClients
from octopis.client_policy import RecentDeliveries
from octopis.client_policy.silence import heartbeat_interval
from octopis.defaults import (
    CLIENT_LIVENESS,
    DELIVERIES_HORIZON,
    DELIVERIES_KNOWN,
    LINGER,
)
from octopis.keys import DEFAULT_CLIENT, Keys
from octopis.logs import RateLimitedLog
from octopis.overlay import KeysChoice
from octopis.wire import pack
from octopis.wire.client import (
    ByeRequest,
    DroppedNotice,
    ErrorReply,
    HelloRequest,
    Notice,
    OverflowNotice,
    Reply,
    ReplyError,
    Request,
    WelcomeReply,
    decode_reply,
    op_of,
)

log = logging.getLogger("octopis.client")


Resume = Callable[["Connection"], Coroutine[Any, Any, None]]
"""What a client does after its connection failed over (given that connection)."""


class ConnectionGroup(RecentDeliveries):
    """Connections that serve one application's clients (DESIGN §9): at most one to each
    broker, so that clients moving to a broker share the connection there, and the
    record of the deliveries they handed over in the last ``horizon`` seconds (at most
    ``limit``; :class:`~octopis.client_policy.RecentDeliveries`). Warnings that may
    repeat (stale move orders, notices for clients gone) are written at most once per
    ``log_interval`` seconds per kind, with the count of those suppressed."""

    def __init__(
        self,
        horizon: float = DELIVERIES_HORIZON,
        limit: int = DELIVERIES_KNOWN,
        log_interval: float = 10.0,
    ) -> None:
        super().__init__(horizon, limit)
        self.warn = RateLimitedLog(log, log_interval)
        """The group's rate-limited warnings."""
        self.connections: dict[str, Connection] = {}
        """Broker endpoint → the group's connection to it."""
        self._openers: dict[Connection, Connection] = {}
        """A connection opened for clients that moved → the connection that opened it."""

    def opened_by(self, connection: Connection) -> list[Connection]:
        """The connections ``connection`` opened for clients that moved (:meth:`sibling`)
        and that are still open."""
        return [c for c, opener in self._openers.items() if opener is connection]

    def family(self, connection: Connection) -> list[Connection]:
        """``connection``, those it opened, those they opened, and so on."""
        found = [connection]
        for member in found:
            found += [c for c in self.opened_by(member) if all(c is not f for f in found)]
        return found

    async def sibling(self, opener: Connection, endpoint: str) -> Connection:
        """An open connection to ``endpoint`` for a client of ``opener`` that moves there:
        the group's that is connected there now (one opened for it may have failed over
        elsewhere), or one opened now (failing over to ``opener``'s brokers), closed
        with ``opener``."""
        for found in (self.connections.get(endpoint), *self.connections.values()):
            if found is not None and found.dropped is None and found.endpoint == endpoint:
                return found
        others = [e for e in opener.endpoints if e != endpoint]
        sibling = Connection([endpoint, *others], group=self, **opener.options)
        self.connections[endpoint] = sibling
        self._openers[sibling] = opener
        await sibling.open()
        return sibling

    def close_if_idle(self, connection: Connection) -> None:
        """Close ``connection`` if it was opened for moves (:meth:`sibling`), is not
        :attr:`~Connection.busy`, and the group reaches its broker another way (it failed
        over elsewhere, and a newer one was opened there): so failing over and moving for
        weeks does not pile up connections. Its counts, errors and outages are added to
        its opener's, which takes over the connections it opened; its bye withdraws what
        its broker still held for clients that have left it."""
        opener = self._openers.get(connection)
        if (
            opener is None
            or connection.busy
            or self.connections.get(connection.endpoints[0]) is connection
        ):
            return
        del self._openers[connection]
        for opened in self.opened_by(connection):  # they serve clients: the opener closes them
            self._openers[opened] = opener
        opener.clients.add_counts(connection.clients)
        opener.overflowed += connection.overflowed
        opener.errors.extend(connection.errors)
        opener.outages.extend(connection.outages)
        opener.in_background(connection.close())


class Connection:
    """One DEALER connection to a broker, shared by named clients, that fails over.

    ``endpoints`` lists the brokers to use, in order of preference (the same cluster first,
    DESIGN §7: :func:`locate` makes such a list from a broker id). The
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

    Memory is bounded: ZeroMQ holds at most ``receive_buffer`` incoming messages (64 by
    default, each at most 16 deliveries); a :class:`Subscriber` holds at most its
    ``buffer`` deliveries or ``buffer_bytes`` and, past either, the reader stops until the
    application takes from it (the broker then queues, and its slow-consumer policy
    applies). The reader yields to other tasks every :data:`~.link.READ_BATCH` messages.

    ``keys`` is a keys directory (:mod:`octopis.keys`; default ``$OCTOPIS_KEYS``): the
    connection speaks CurveZMQ with client key pair ``key_name``, each broker known by
    the public key ``endpoints.json`` gives its endpoint. Without either (or with
    ``keys=False``) it connects in the clear, which only a broker run ``--insecure``
    accepts.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        context: zmq.asyncio.Context | None = None,
        liveness: float = CLIENT_LIVENESS,
        linger: float = LINGER,
        max_pending: int = 1000,
        receive_buffer: int = 64,
        keys: KeysChoice = None,
        key_name: str = DEFAULT_CLIENT,
        group: ConnectionGroup | None = None,
    ) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints:
            raise ValueError("a connection needs at least one broker endpoint")
        self.options: dict[str, Any] = {
            "context": context,
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
        self.liveness = liveness
        self.linger = linger
        self._background: set[asyncio.Task] = set()
        """Sessions kept at brokers left at a fail-over, and clients resuming."""
        self.clients = ServedClients(self.group, self.group.warn)
        """The clients served here: their deliveries, notices and drop callbacks."""
        found = None if keys is False else Keys.find(keys)
        curves = (
            None
            if found is None
            else (found.client(key_name), {e: found.server_key(e) for e in self.endpoints})
        )
        ctx = context or zmq.asyncio.Context.instance()
        self.link = BrokerLink(
            ctx,
            self.endpoints[0],
            receive_buffer=receive_buffer,
            curve=curves,
            on_frame=self._on_frame,
        )
        """The socket to the broker used now."""
        curve = None if curves is None else (curves[0], curves[1][self.endpoint])
        self._opening = OpeningDiagnosis(ctx, self.socket, self.endpoint, curve, found, key_name)
        """Why the first socket does not open, read while :meth:`open` waits for the broker."""
        self.link.connect()
        self._requests = Requests(max_pending)
        self._resumers: list[Resume] = []
        self.failover = Failover(
            self.link,
            self._requests,
            self.endpoints,
            liveness=liveness,
            linger=linger,
            on_left_frame=lambda parts: self._on_frame(parts, left_behind=True),
            in_background=self.in_background,
            resume_clients=self._resume_clients,
        )
        """How this connection leaves a silent broker, and its record of doing so."""
        self._heartbeat: asyncio.Task | None = None
        self.dropped: str | None = None
        """Why the broker dropped this connection, once it has."""
        self.overflowed = 0
        """Deliveries the broker dropped for this connection under the drop-oldest policy."""
        self.errors: deque[str] = deque(maxlen=1000)
        """Refusals of requests nobody awaited (the last 1,000)."""
        self.broker: WelcomeReply | None = None
        """The welcome of the broker this connection is open to (None: not yet)."""

    async def open(self, timeout: float = 10.0) -> WelcomeReply:
        """Start reading and handshake; returns the broker's welcome.

        If the broker does not answer, a :class:`ConnectError` says why as soon as that
        is known: :class:`HandshakeFailed` (keys wanted, refused or another overlay's),
        :class:`NotAClientSocket`, :class:`NothingListening` (within
        :data:`DIAGNOSIS_WAIT` seconds), else :class:`NoReply` after ``timeout``. The
        connection is then closed."""
        self.link.start_reading()
        try:
            hello = asyncio.ensure_future(self.request(HelloRequest(client="-"), None))
            self.broker = await self._opening.welcome(hello, timeout)
        except BaseException:
            await self._abandon()
            raise
        finally:
            self._opening.stop()
        if self._heartbeat is None:
            timeout = self.broker.timeout
            interval = heartbeat_interval(timeout, self.liveness)
            beats = self.link.heartbeat(interval, self.liveness, self._fail_over)
            self._heartbeat = asyncio.create_task(beats)
        return self.broker

    async def _abandon(self) -> None:
        """Stop reading and close the socket of a connection that did not open; the
        group forgets it."""
        reader = self.link.stop_reading()
        if reader is not None:
            await asyncio.gather(reader, return_exceptions=True)
        self._opening.stop()
        self.socket.close()
        if self.group.connections.get(self.endpoints[0]) is self:
            del self.group.connections[self.endpoints[0]]

    def register(self, name: str, handler: NotificationHandler) -> None:
        """Route deliveries for client ``name`` to ``handler``."""
        self.clients.handlers[name] = handler

    def on_failover(self, resume: Resume) -> None:
        """Run ``resume(self)`` after each fail-over (a subscriber re-issues its
        subscriptions)."""
        self._resumers.append(resume)

    def resend_first(self, message: Request) -> None:
        """Send ``message`` (without a ``req``: no answer is awaited) at every fail-over,
        before the unanswered requests are sent again."""
        self.failover.first.append(pack(message))

    def on_dropped(self, notify: Callable[[str], None]) -> None:
        """Call ``notify(reason)`` if the broker drops this connection."""
        self.clients.on_dropped(notify)

    def on_notice(self, name: str, notice: Callable[[Notice], None]) -> None:
        """Call ``notice(message)`` with what the broker tells client ``name`` unasked
        (:data:`NOTICES`): ``move`` (go to another broker) and ``released`` (a moved
        subscription is no longer delivered here), DESIGN §9; ``replayed`` and
        ``replay_done`` (a replay's answers and its end) and ``withdrawn`` (a durable
        subscription claimed by the host its client came back at), DESIGN §11;
        ``composite`` (a composite subscription's match) and ``composite_dropped`` (its
        join let publications go), DESIGN §12."""
        self.clients.on_notice(name, notice)

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
        handler = self.clients.leave(name, notify)
        if resume in self._resumers:
            self._resumers.remove(resume)
        if handler is not None and self.failover.left_sessions:
            sessions = list(self.failover.left_sessions)
            self.in_background(self._forget_after(name, handler, sessions))
        else:
            self.clients.handlers.pop(name, None)
            self.group.close_if_idle(self)

    async def _forget_after(
        self, name: str, handler: NotificationHandler, sessions: list[asyncio.Task]
    ) -> None:
        """Stop handling ``name``'s deliveries once ``sessions`` have ended, unless it has
        registered again meanwhile."""
        await asyncio.gather(*sessions, return_exceptions=True)
        if self.clients.handlers.get(name) is handler:
            del self.clients.handlers[name]
            self.group.close_if_idle(self)

    @property
    def socket(self) -> zmq.asyncio.Socket:
        """The socket to the broker used now."""
        return self.link.socket

    @property
    def endpoint(self) -> str:
        """The endpoint of the broker used now."""
        return self.link.endpoint

    @property
    def duplicates_absorbed(self) -> int:
        """Deliveries dropped as already seen during a fail-over or move."""
        return self.clients.duplicates_absorbed

    @property
    def unclaimed(self) -> int:
        """Deliveries for a client this connection does not serve (one that moved on
        while the broker still named it here)."""
        return self.clients.unclaimed

    @property
    def reading_left_sessions(self) -> bool:
        """Whether a session left at a fail-over is still read (it may yet deliver)."""
        return bool(self.failover.left_sessions)

    @property
    def busy(self) -> bool:
        """Whether this connection serves a client, waits for a reply, or reads a
        session left at a fail-over."""
        return bool(self.clients.handlers or self._requests or self.failover.left_sessions)

    @property
    def siblings(self) -> list[Connection]:
        """The connections this one opened for clients that moved (and has not closed:
        an idle one's counts, outages and errors are added to this one's)."""
        return self.group.opened_by(self)

    @property
    def family(self) -> list[Connection]:
        """This connection, its siblings, theirs, and so on."""
        return self.group.family(self)

    def stall_until(self, room: asyncio.Event) -> None:
        """Stop reading after the current message until ``room`` is set (a full stream)."""
        self.link.stall_until(room)

    async def submit(
        self, message: Request | dict[str, Any], timeout: float | None = None
    ) -> asyncio.Future:
        """Send a request (a declared :class:`~octopis.wire.client.Request`, or a raw
        map this SDK does not declare); returns the future of its reply (waits while
        ``max_pending`` requests are unanswered, raising ``TimeoutError`` after
        ``timeout`` seconds). A refusal sets :class:`BrokerError` on the future.

        Always yields to the event loop once: a send that ZeroMQ takes at once completes
        without yielding, so a tight loop of ``publish(wait=False)`` would otherwise keep
        this connection's reader and heartbeat from running until the broker drops it."""
        if self.dropped is not None:
            raise DroppedError(self.dropped)
        future, payload = await self._requests.add(message, timeout, self.endpoint)
        self.link.send(payload)
        await asyncio.sleep(0)
        return future

    async def request(
        self, message: Request | dict[str, Any], timeout: float | None = 10.0
    ) -> Reply:
        """Send a request and wait for its reply, of the kind the request asks for
        (``timeout`` None: however long);
        :class:`BrokerError` on refusal."""
        future = await self.submit(message)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"no reply from {self.endpoint} to {op_of(message)} within {timeout} s"
            ) from None

    async def send(self, message: Request) -> None:
        """Send without asking for a reply (refusals land in :attr:`errors`)."""
        self.link.send(pack(message))

    def send_soon(self, message: Request) -> None:
        """Queue ``message`` for sending without waiting or asking for a reply (ZeroMQ
        sends it from its own thread; refusals land in :attr:`errors`)."""
        if self.dropped is None:
            self.link.send(pack(message))

    async def close(self) -> None:
        """Say bye to the broker (it withdraws this connection's subscriptions at once,
        not at its client timeout), stop reading and heartbeats, and close the socket."""
        if self.dropped is None and self.link.reading:
            with contextlib.suppress(TimeoutError, BrokerError):
                await self.request(ByeRequest(client="-"), self.liveness)
        for sibling in self.siblings:
            await sibling.close()
        reader = self.link.stop_reading()
        tasks = [t for t in (reader, self._heartbeat, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._requests.cancel()
        self._opening.stop()
        self.socket.close()

    # -- liveness and fail-over ----------------------------------------------------------

    async def _fail_over(self) -> None:
        self.broker = await self.failover.run()

    async def _resume_clients(self) -> None:
        """Let every client resume (re-subscribe) after a fail-over."""
        results = await asyncio.gather(
            *(resume(self) for resume in self._resumers), return_exceptions=True
        )
        for failed in (r for r in results if isinstance(r, BaseException)):
            log.error("a client could not resume at %s: %s", self.endpoint, failed)

    @property
    def outages(self) -> deque[dict[str, Any]]:
        """One record per fail-over (the last 1,000): from, to, started (wall time),
        seconds away."""
        return self.failover.outages

    @property
    def silent_since(self) -> float | None:
        """Wall time the broker left at the last fail-over went silent."""
        return self.failover.silent_since

    def in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Run ``work`` as a task that :meth:`close` cancels."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- input ---------------------------------------------------------------------------

    def _on_frame(self, parts: list[bytes], left_behind: bool = False) -> None:
        if len(parts) > 1:
            self.clients.deliver(parts)
            return
        try:
            data = decode_reply(parts[0])
        except ReplyError as exc:
            self.errors.append(str(exc))
            self.group.warn.warning(
                "unreadable reply", "broker at %s sent what this client cannot read: %s",
                self.endpoint, exc,
            )  # fmt: skip
            return
        kind = type(data)
        if kind is DroppedNotice:
            if not left_behind:  # else the broker we left let us go: not this connection's
                self._dropped(data.reason)
            return
        if kind is OverflowNotice:
            self.overflowed += data.dropped
            log.warning(
                "broker at %s dropped %d deliveries to this slow connection (%d in all)",
                self.endpoint,
                data.dropped,
                self.overflowed,
            )
            return
        if isinstance(data, Notice):
            self.clients.notice(data, self.endpoint)
        elif not self._requests.answer(data):
            self.errors.append(data.message if kind is ErrorReply else f"unawaited {kind.__name__}")

    def _dropped(self, reason: str) -> None:
        """The broker dropped us: fail what waits, stop heartbeats, tell the clients."""
        if self.dropped is not None:
            return
        self.dropped = reason
        log.error("broker at %s dropped this connection: %s", self.endpoint, reason)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self._requests.fail(DroppedError(reason))
        self.clients.dropped(reason)
