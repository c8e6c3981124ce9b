"""The SDK's connection to a broker (DESIGN §4, §7): one DEALER socket shared by named
clients, heartbeats, the publish credit, and fail-over along a broker list; the
connection group that drops a delivery received twice during a move or a fail-over; the
base of named clients."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Self

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from octopis.client_policy import failover_order
from octopis.defaults import CLIENT_LIVENESS
from octopis.filters.language import Publication
from octopis.keys import DEFAULT_CLIENT, KeyPair, Keys, connect_securely
from octopis.logs import RateLimitedLog
from octopis.overlay import KeysChoice, Overlay, is_endpoint
from octopis.wire import LEFT_AT, delivery_fields, pack, unpack

log = logging.getLogger("octopis.client")


def _send_nowait(socket: zmq.asyncio.Socket, message: dict[str, Any]) -> None:
    """Send if ZeroMQ takes it now (a broker left behind may be gone: nothing waits)."""
    with contextlib.suppress(zmq.Again):
        zmq.Socket.shadow(socket.underlying).send(pack(message), zmq.NOBLOCK)


class BrokerError(Exception):
    """The broker refused a request; the message is the broker's."""


class UnadvertisedError(BrokerError):
    """The broker refused a publication outside every advertisement its publisher made
    (the overlay runs with advertisements on): advertise a filter it matches first
    (:meth:`Publisher.advertise`)."""


class DroppedError(BrokerError):
    """The broker dropped this connection (a slow consumer, DESIGN §8); the message is
    its reason. Its subscriptions are withdrawn; connect again to go on."""


class ConnectError(ConnectionError):
    """A connection could not be opened; the message says why and what to do next."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        """The endpoint the connection tried."""


class HandshakeFailed(ConnectError):
    """The socket's security handshake failed: the broker wants CurveZMQ keys and the
    client has none, it refused the client's key, the client's keys are another
    overlay's, or the broker runs without keys and the client has some."""


class NotAClientSocket(ConnectError):
    """The endpoint is not a broker's client socket (a broker's peer socket, say)."""


class NothingListening(ConnectError):
    """Nothing accepts connections at the endpoint (no broker runs there)."""


class NoReply(ConnectError, TimeoutError):
    """A connection was made (or is still being made) but nothing answered in time; the
    message says how far it got."""


DIAGNOSIS_WAIT = 2.0
"""Seconds :meth:`Connection.open` waits for a first TCP connection before it reports
that nothing listens (a broker starting up may take a moment to bind)."""
PROBE_WAIT = 1.0
"""Seconds a diagnostic probe waits for its handshake."""
_WATCHED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
"""The socket monitor's events that tell how far opening a connection got."""


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
    session: int = 0
    """The publisher's session (a publisher started again numbers from 1 in a new one)."""
    replayed: bool = False
    """Delivered from the overlay's retention after a fail-over (DESIGN §11)."""

    @property
    def overlay_delay(self) -> float:
        """Seconds from publishing to leaving the last broker (the overlay's share)."""
        return self.left_broker_at - self.published_at

    @property
    def client_delay(self) -> float:
        """Seconds from leaving the last broker to the SDK (the client side's share:
        the hop, and any wait in this process's input)."""
        return self.received_at - self.left_broker_at


NOTICES = frozenset(
    {"move", "released", "replayed", "replay_done", "withdrawn", "composite", "composite_dropped"}
)
"""What a broker tells a client unasked."""

NotificationHandler = Callable[[str, str, int, float, Publication, float, float, int, int], None]
"""Called with (client name, publisher, seq, published_at, publication, received_at,
left_broker_at, size, session): ``size`` is the delivery's encoded length in bytes,
``session`` the publisher's session."""
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
    applies). The reader yields to other tasks every :data:`READ_BATCH` messages.

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
        linger: float = 10.0,
        max_pending: int = 1000,
        receive_buffer: int = 64,
        keys: KeysChoice = None,
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
        found = None if keys is False else Keys.find(keys)
        self._keys = found
        self._curve = (
            None
            if found is None
            else (found.client(key_name), {e: found.server_key(e) for e in self.endpoints})
        )
        """This client's key pair and each endpoint's broker key, or None (in the clear)."""
        self._ctx = context or zmq.asyncio.Context.instance()
        self._watch: zmq.asyncio.Socket | None = None
        """The first socket's monitor, read while :meth:`open` waits for the broker."""
        self.socket = self._connect(self.endpoint, watch=True)
        self._reqs = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future, bytes]] = {}
        self._room = asyncio.Semaphore(max_pending)
        self._handlers: dict[str, NotificationHandler] = {}
        self._notices: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._resumers: list[Resume] = []
        self._first: list[bytes] = []
        """Requests sent again, unanswered, at each fail-over before anything else (a
        publisher's advertisements, which its publications need at the new broker)."""
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
        self.silent_since: float | None = None
        """Wall time the broker left at the last fail-over went silent."""
        self.outages: deque[dict[str, Any]] = deque(maxlen=1000)
        """One record per fail-over (the last 1,000): from, to, started (wall time),
        seconds away."""

    def _connect(self, endpoint: str, *, watch: bool = False) -> zmq.asyncio.Socket:
        socket = self._ctx.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, self.receive_buffer)
        socket.setsockopt(zmq.SNDHWM, 0)
        if self._curve is not None:
            pair, server_keys = self._curve
            connect_securely(socket, pair, server_keys[endpoint])
        if watch:
            self._watch = socket.get_monitor_socket(_WATCHED)
        socket.connect(endpoint)
        return socket

    async def open(self, timeout: float = 10.0) -> dict[str, Any]:
        """Start reading and handshake; returns the broker's welcome.

        If the broker does not answer, a :class:`ConnectError` says why as soon as that
        is known: :class:`HandshakeFailed` (keys wanted, refused or another overlay's),
        :class:`NotAClientSocket`, :class:`NothingListening` (within
        :data:`DIAGNOSIS_WAIT` seconds), else :class:`NoReply` after ``timeout``. The
        connection is then closed."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        try:
            self.broker = await self._hello(timeout)
        except BaseException:
            await self._abandon()
            raise
        finally:
            self._unwatch()
        if self._heartbeat is None:
            interval = min(float(self.broker.get("timeout", 10.0)) / 4, self.liveness / 3)
            self._heartbeat = asyncio.create_task(self._beat(interval))
        return self.broker

    async def _hello(self, timeout: float) -> dict[str, Any]:
        """Say hello and wait up to ``timeout`` seconds for the welcome, reading the
        socket's monitor meanwhile: a failure it shows is raised as soon as it is known."""
        started = time.monotonic()
        reply = asyncio.ensure_future(self.request({"op": "hello", "client": "-"}, None))
        progress: set[int] = set()
        diagnosis = asyncio.ensure_future(self._diagnose(progress))
        try:
            done, _ = await asyncio.wait(
                {reply, diagnosis}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if reply in done:
                return reply.result()
            if diagnosis in done and (error := diagnosis.result()) is not None:
                raise error
            left = max(0.0, timeout - (time.monotonic() - started))
            done, _ = await asyncio.wait({reply}, timeout=left)
            if reply in done:
                return reply.result()
            raise NoReply(self.endpoint, self._silence(progress, timeout))
        finally:
            for task in (reply, diagnosis):
                task.cancel()
            await asyncio.gather(reply, diagnosis, return_exceptions=True)

    async def _diagnose(self, progress: set[int]) -> ConnectError | None:
        """Read the first socket's monitor until it tells how opening goes: None once the
        handshake succeeded (whatever comes next is the broker's answer), else the error
        that says why no answer can come. ``progress`` collects the events seen."""
        if self._watch is None:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DIAGNOSIS_WAIT
        patient = False
        while True:
            connected = zmq.EVENT_CONNECTED in progress
            wait = None if patient or connected else max(0.0, deadline - loop.time())
            try:
                frames = await asyncio.wait_for(self._watch.recv_multipart(), wait)
            except TimeoutError:
                if progress & {zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CLOSED}:
                    return NothingListening(
                        self.endpoint,
                        f"nothing listens at {self.endpoint} (connection refused for "
                        f"{DIAGNOSIS_WAIT:g} s): is the overlay up (`octopis status`), and is "
                        "this a broker's client endpoint?",
                    )
                patient = True  # the TCP connection is still pending: a slow or far host
                continue
            kind = parse_monitor_message(frames)["event"]
            progress.add(kind)
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return None
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                return self._refused()
            if kind in (
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                zmq.EVENT_DISCONNECTED,
            ):
                return await self._why_not()

    def _refused(self) -> HandshakeFailed:
        """The broker's key check refused this client's key."""
        at = self.endpoint
        key = (
            f"{self._keys.directory}/clients/{self._options['key_name']}.key" if self._keys else ""
        )
        where = f" ({key})" if key else ""
        return HandshakeFailed(
            at,
            f"{at} refused this client's key{where}: the keys directory is not this "
            f"overlay's (use its own: keys=DIR, or run_dir= for one `octopis up` started), "
            "or the endpoint is not a broker's client socket (a control socket lets only "
            "the admin key in)",
        )

    async def _why_not(self) -> ConnectError:
        """The handshake failed with no reason given: probes with another socket type
        and without keys tell a peer socket, a broker in the clear and keys that do not
        fit apart."""
        at = self.endpoint
        curve = None if self._curve is None else (self._curve[0], self._curve[1][at])
        if await _gets_through(self._ctx, at, zmq.PUSH, curve):
            return NotAClientSocket(
                at,
                f"{at} is not a broker's client socket: it takes pushed messages, as a "
                "broker's peer socket does. Connect to the broker's client endpoint, or by "
                "broker id (run_dir= or topology=), which finds it",
            )
        if curve is None:
            return HandshakeFailed(
                at,
                f"{at} refused a connection in the clear: the broker wants CurveZMQ keys. "
                "Give the overlay's keys directory (keys=DIR, $OCTOPIS_KEYS, or run_dir= "
                "for an overlay `octopis up` started), or check that the endpoint is a "
                "broker's client socket",
            )
        if await _gets_through(self._ctx, at, zmq.DEALER, None):
            return HandshakeFailed(
                at,
                f"{at} runs without CurveZMQ (its overlay was started --insecure): connect "
                "without keys (keys=False)",
            )
        return HandshakeFailed(
            at,
            f"the CurveZMQ handshake with {at} failed: the broker's key in "
            f"{self._keys.directory if self._keys else '?'}/endpoints.json is not the one it "
            "serves with (keys of another overlay, or of an earlier one on these ports?), "
            "or the endpoint is not a broker's client socket",
        )

    def _silence(self, progress: set[int], timeout: float) -> str:
        """Why the broker at the endpoint did not answer in ``timeout`` seconds, as far
        as the socket's monitor tells."""
        at = self.endpoint
        if zmq.EVENT_HANDSHAKE_SUCCEEDED in progress:
            return (
                f"{at} accepted the connection but did not answer hello within {timeout:g} "
                "s: it is not an OctopiS broker's client socket (a control socket?), or the "
                "broker is overloaded or stopped"
            )
        if zmq.EVENT_CONNECTED in progress:
            return (
                f"{at} accepted a TCP connection but no ZeroMQ handshake followed within "
                f"{timeout:g} s: something else listens there (a broker's metrics port?), "
                "or the broker is stopped"
            )
        return (
            f"no connection to {at} within {timeout:g} s: the host does not answer (down, "
            "or a firewall drops the connection)"
        )

    def _unwatch(self) -> None:
        """Stop the first socket's monitor (once :meth:`open` is done with it)."""
        if self._watch is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.socket.disable_monitor()
            self._watch.close(0)
            self._watch = None

    async def _abandon(self) -> None:
        """Stop reading and close the socket of a connection that did not open; the
        group forgets it."""
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        self._unwatch()
        self.socket.close()
        if self.group.connections.get(self.endpoints[0]) is self:
            del self.group.connections[self.endpoints[0]]

    def register(self, name: str, handler: NotificationHandler) -> None:
        """Route deliveries for client ``name`` to ``handler``."""
        self._handlers[name] = handler

    def on_failover(self, resume: Resume) -> None:
        """Run ``resume(self)`` after each fail-over (a subscriber re-issues its
        subscriptions)."""
        self._resumers.append(resume)

    def resend_first(self, message: dict[str, Any]) -> None:
        """Send ``message`` (without a ``req``: no answer is awaited) at every fail-over,
        before the unanswered requests are sent again."""
        self._first.append(pack(message))

    def on_dropped(self, notify: Callable[[str], None]) -> None:
        """Call ``notify(reason)`` if the broker drops this connection."""
        self._on_drop.append(notify)

    def on_notice(self, name: str, notice: Callable[[dict[str, Any]], None]) -> None:
        """Call ``notice(message)`` with what the broker tells client ``name`` unasked
        (:data:`NOTICES`): ``move`` (go to another broker) and ``released`` (a moved
        subscription is no longer delivered here), DESIGN §9; ``replayed`` and
        ``replay_done`` (a replay's answers and its end) and ``withdrawn`` (a durable
        subscription claimed by the host its client came back at), DESIGN §11;
        ``composite`` (a composite subscription's match) and ``composite_dropped`` (its
        join let publications go), DESIGN §12."""
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

    def send_soon(self, message: dict[str, Any]) -> None:
        """Queue ``message`` for sending without waiting or asking for a reply (ZeroMQ
        sends it from its own thread; refusals land in :attr:`errors`)."""
        if self.dropped is None:
            self.socket.send(pack(message))

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
        self._unwatch()
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
        order = failover_order(self.endpoints, self.endpoint)
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
        for payload in self._first:
            await self.socket.send(payload)
        for _, payload in list(self._pending.values()):
            await self.socket.send(payload)
        record = {"from": away_from, "to": self.endpoint, "started": started}
        self.silent_since = started
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
        left = LEFT_AT.unpack(parts[-1])[0] if len(parts) % 2 else math.nan
        group = self.group
        seen, recent, handlers = group.seen, group.recent, self._handlers
        for i in range(0, len(parts) - 1, 2):
            body = parts[i + 1]
            publisher, seq, published_at, publication, session = delivery_fields(body)
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
                size = len(body)
                handler(name, publisher, seq, published_at, publication, now, left, size, session)
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
        if op in NOTICES:
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
                error = UnadvertisedError if data.get("error") == "unadvertised" else BrokerError
                future.set_exception(error(data.get("message", "error")))
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


async def _gets_through(
    ctx: zmq.asyncio.Context, endpoint: str, kind: int, curve: tuple[KeyPair, bytes] | None
) -> bool:
    """Whether a socket of type ``kind`` (with ``curve``: this key pair and the server's
    key) gets past the socket-type check of a handshake with ``endpoint``: the handshake
    completes, or only the server's key check refuses it."""
    probe = ctx.socket(kind)
    probe.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        connect_securely(probe, *curve)
    events = probe.get_monitor_socket(_WATCHED)
    probe.connect(endpoint)
    try:
        async with asyncio.timeout(PROBE_WAIT):
            while True:
                event = parse_monitor_message(await events.recv_multipart())["event"]
                if event in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_AUTH):
                    return True
                if event in (
                    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                    zmq.EVENT_DISCONNECTED,
                ):
                    return False
    except TimeoutError:
        return False
    finally:
        probe.disable_monitor()
        events.close(0)
        probe.close(0)


class NamedClient:
    """A named client on a :class:`Connection` (shared, or its own with :meth:`connect`)."""

    def __init__(self, name: str, connection: Connection) -> None:
        self.name = name
        self.connection = connection
        self._origin = connection
        """The connection given or opened first (a move's new ones are its siblings)."""
        self._owns_connection = False

    @classmethod
    async def connect(
        cls,
        target: str | Sequence[str],
        name: str | None = None,
        *,
        keys: KeysChoice = None,
        run_dir: str | os.PathLike | None = None,
        topology: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> Self:
        """Open a connection of its own as client ``name`` (default: a new unique name).

        ``target`` is a broker id such as ``"f:2"``: the broker of the overlay that
        ``octopis up`` started in ``run_dir`` (default ``.octopis``), or of the
        ``topology`` file. The connection goes to that broker's client endpoint and fails
        over along the overlay's other brokers, its own cluster first, with the run
        directory's keys (with ``topology``: ``$OCTOPIS_KEYS``, else none). Or ``target``
        is an endpoint or a list of them, tried in order, reached with ``keys`` (default
        ``$OCTOPIS_KEYS``); with ``run_dir`` or ``topology`` too, an endpoint is checked
        against the topology and its broker's fail-over list and keys are used.
        ``keys=False`` connects in the clear (brokers run ``--insecure``).

        A broker that does not answer raises a :class:`ConnectError` naming why
        (:meth:`Connection.open`); a broker id the overlay does not have, or no overlay
        where one was named, :class:`octopis.overlay.OverlayError`.
        """
        endpoints, keys = locate(target, keys=keys, run_dir=run_dir, topology=topology)
        connection = Connection(endpoints, keys=keys)
        await connection.open()
        if name is None:
            name = f"{cls.__name__.lower()}-{secrets.token_hex(6)}"
        client = cls(name, connection, **kwargs)
        client._owns_connection = True
        return client

    async def close(self) -> None:
        """Close the connection (and those it opened for moves) if this client opened it."""
        if self._owns_connection:
            await self._origin.close()


def locate(
    target: str | Sequence[str],
    *,
    keys: KeysChoice = None,
    run_dir: str | os.PathLike | None = None,
    topology: str | os.PathLike | None = None,
) -> tuple[list[str], KeysChoice]:
    """The endpoints (in fail-over order) and keys :meth:`NamedClient.connect` uses for
    ``target``: broker ids are looked up in the overlay of ``run_dir`` (default
    ``.octopis``) or ``topology``; endpoints are taken as they are unless an overlay is
    named, where a socket other than a client one is refused at once
    (:class:`NotAClientSocket`). One broker (by id or client endpoint) comes with its
    fail-over list."""
    targets = [target] if isinstance(target, str) else list(target)
    if not targets:
        raise ValueError("connect needs a broker id or at least one endpoint")
    if all(map(is_endpoint, targets)) and run_dir is None and topology is None:
        return targets, keys
    overlay = Overlay.find(run_dir, topology, keys)
    brokers = [_broker_at(overlay, t) for t in targets]
    if len(targets) == 1 and brokers[0] is not None:
        endpoints = overlay.client_endpoints(brokers[0])
    else:
        clients = overlay.scot.brokers
        endpoints = [
            t if b is None else clients[b].client_endpoint
            for t, b in zip(targets, brokers, strict=True)
        ]
    return endpoints, overlay.keys if overlay.keys is not None else False


def _broker_at(overlay: Overlay, target: str) -> str | None:
    """The broker ``target`` names: a broker id, or the client endpoint of one (None: an
    endpoint the topology does not place); :class:`NotAClientSocket` for an endpoint of
    one of its other sockets."""
    if not is_endpoint(target):
        return overlay.broker(target)
    found = overlay.socket_at(target)
    if found is None:
        return None
    broker, kind = found
    if kind != "client":
        right = overlay.scot.brokers[broker].client_endpoint
        raise NotAClientSocket(
            target,
            f"{target} is {broker}'s {kind} socket in topology {overlay.scot.name}, not its "
            f"client socket: connect to {right}, or by broker id ({broker!r})",
        )
    return broker
