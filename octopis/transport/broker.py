"""One broker process: the routing core in an asyncio/ZeroMQ shell (DESIGN §2, §4).

Sockets
  - peer input: one PULL bound at ``endpoint``; each neighbour pushes frames into it;
  - peer output: one PUSH per neighbour with a low send high-water mark, fed from an
    application-level output queue by a sender task using non-blocking sends, so
    backpressure grows the queue (which the Link Status Table measures) and never drops;
    an optional per-link capacity (messages/s) paces the sender to reproduce congestion;
  - clients: one ROUTER at ``client_endpoint`` (msgpack maps, see :mod:`octopis.client`);
  - control: aiozmq RPC at ``control_endpoint``: ``status``, ``stats``,
    ``subscriptions``, ``shutdown``.

A bad frame from a peer or a client is counted, logged and answered with an error where
there is someone to answer; the broker goes on serving everyone else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, ClassVar

import aiozmq.rpc
import msgspec
import zmq
import zmq.asyncio

from octopis.core import (
    Deliver,
    Forward,
    LinkStatusTable,
    Notification,
    ProtocolError,
    Subscribe,
    make_broker,
)
from octopis.filters import FilterError, as_subscription, parse_publication, validate_publication
from octopis.matching import Matcher
from octopis.topology import Scot
from octopis.transport.settings import BrokerSettings
from octopis.transport.wire import (
    Hello,
    WireError,
    decode_peer,
    encode_body,
    encode_peer,
    pack,
    unpack,
)

log = logging.getLogger("octopis.broker")

PEER_BATCH = 64
"""Frames handled before yielding to the event loop, so senders keep draining."""
YIELDS_BEFORE_POLL = 4
"""Loop turns a blocked sender waits for ZeroMQ's pipe before an asyncio poll."""

NOBLOCK, EVENTS, POLLIN, POLLOUT = (
    int(zmq.NOBLOCK),
    int(zmq.EVENTS),
    int(zmq.POLLIN),
    int(zmq.POLLOUT),
)
SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
"""Plain ints: pyzmq's flag enums cost an enum construction per call on the hot path."""
send_part = zmq.backend.Socket.send
"""pyzmq's compiled send, without the Python wrapper of ``zmq.Socket.send`` (which
only adds DRAFT routing ids and groups): half the cost per part on the forwarding path."""


def send_now(sock: zmq.Socket, frame: list[bytes]) -> None:
    """Send a two-part frame without blocking; ``zmq.Again`` (nothing sent) if the pipe is
    full. The second part cannot fail: ZeroMQ takes a message whole once its first part
    is in."""
    send_part(sock, frame[0], SNDMORE_NOBLOCK)
    send_part(sock, frame[1])


def receive_now(recv: Callable[..., zmq.Frame]) -> list[bytes]:
    """The parts of the next message, read with ``recv`` (a socket's); ``zmq.Again`` if none
    is waiting. Parts come as ``zmq.Frame``, whose ``more`` flag is read in C at receipt,
    where ``getsockopt(RCVMORE)`` would build a pyzmq enum per part (1.9 vs 3.4 µs for a
    two-part message)."""
    part = recv(NOBLOCK, copy=False)
    parts = [part.bytes]
    while part.more:  # the rest of a multipart message is already here
        part = recv(copy=False)
        parts.append(part.bytes)
    return parts


class BrokerFailure(RuntimeError):
    """A serving loop of the broker ended with an error; the broker shut down."""


class MatchClock:
    """Accumulated time spent in matchers (the paper's matching delay, §7.2)."""

    __slots__ = ("calls", "seconds")

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0


class TimedMatcher:
    """A :class:`~octopis.matching.Matcher` that adds its ``match`` time to a clock."""

    __slots__ = ("_clock", "_matcher")

    def __init__(self, clock: MatchClock) -> None:
        self._matcher = Matcher()
        self._clock = clock

    def add(self, key: Any, subscription: Any, group: int | None = None) -> None:
        self._matcher.add(key, subscription, group)

    def remove(self, key: Any) -> None:
        self._matcher.remove(key)

    def match_groups(self, publication: dict) -> dict:
        started = time.perf_counter()
        groups = self._matcher.match_groups(publication)
        self._clock.seconds += time.perf_counter() - started
        self._clock.calls += 1
        return groups

    def __len__(self) -> int:
        return len(self._matcher)


class InputWaiter:
    """Wakes a coroutine when a ZeroMQ socket has input, through one persistent
    ``loop.add_reader`` on the socket's event FD rather than a poll registration (and its
    futures) per wait: most messages reach an idle broker, so the wake-up is the cost.

    ZeroMQ signals its FD edge-wise and any operation on the socket may consume the
    signal; whoever sends on a socket that is also read this way calls :meth:`poke`
    afterwards, so input that arrived meanwhile is never left unnoticed.
    """

    def __init__(self, sock: zmq.Socket, loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._ready = asyncio.Event()
        self._fd = sock.getsockopt(zmq.FD)
        self._loop = loop
        loop.add_reader(self._fd, self.poke)

    def poke(self) -> None:
        """Mark input ready if there is some (also resets ZeroMQ's FD signal)."""
        if self._sock.getsockopt(EVENTS) & POLLIN:
            self._ready.set()

    async def wait(self) -> None:
        """Return once the socket has input (the caller has read it dry)."""
        self._ready.clear()
        self.poke()
        await self._ready.wait()

    def close(self) -> None:
        """Stop watching the FD."""
        self._loop.remove_reader(self._fd)


class Pacer:
    """At most ``rate`` sends per second (a token bucket with a 10 ms burst), shared by
    every link that uses it: one per link for a link capacity, one per broker for a
    broker capacity (paper §6.3: limited bandwidth, an overwhelmed broker)."""

    __slots__ = ("gap", "next_slot")

    def __init__(self, rate: float) -> None:
        self.gap = 1.0 / rate
        self.next_slot = 0.0

    def reserve(self, now: float) -> float:
        """Book the next send slot; returns when it starts."""
        slot = max(self.next_slot, now - 0.01)
        self.next_slot = slot + self.gap
        return slot


class OutputLink:
    """An outgoing peer link: output queue, paced non-blocking sender, LST feed."""

    def __init__(
        self,
        name: str,
        endpoint: str,
        ctx: zmq.asyncio.Context,
        lst: LinkStatusTable,
        sndhwm: int,
        pacers: tuple[Pacer, ...],
        activity: asyncio.Event,
    ) -> None:
        self.name = name
        self.socket = ctx.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, sndhwm)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.connect(endpoint)
        self._sync = zmq.Socket.shadow(self.socket.underlying)
        self.queue: deque[list[bytes]] = deque()
        self.pacers = pacers
        self.sent = 0
        self._lst = lst
        self._wake = asyncio.Event()
        self._activity = activity

    def put(self, frame: list[bytes], now: float) -> None:
        """Enqueue one frame (counted as n_in). An empty, unpaced queue whose pipe has
        room sends it at once (counted as n_out too) without waking the sender task.
        A non-empty queue is left to the sender task: trying the pipe on every put would
        raise ``zmq.Again`` per frame while it is full, and pyzmq's exceptions cost more
        than the sends (~7 µs each)."""
        self._lst.enqueued(self.name, now)
        self._activity.set()
        if not self.queue and not self.pacers:
            try:
                send_now(self._sync, frame)
            except zmq.Again:
                pass
            else:
                self.sent += 1
                self._lst.sent(self.name, now)
                return
        self.queue.append(frame)
        self._wake.set()

    async def run(self) -> None:
        """Send queued frames in order, each in a slot booked with every pacer."""
        loop = asyncio.get_running_loop()
        booked = False
        while True:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.pacers and not booked:
                now = loop.time()
                start = max(p.reserve(now) for p in self.pacers)
                booked = True
                if start > now:
                    await asyncio.sleep(start - now)
            try:
                send_now(self._sync, self.queue[0])
            except zmq.Again:
                await self._writable()
                continue
            booked = False
            self.queue.popleft()
            self.sent += 1
            self._lst.sent(self.name, loop.time())

    async def _writable(self) -> None:
        """Wait until the socket takes frames again. ZeroMQ's I/O thread usually drains
        the pipe within microseconds, so yield to the loop a few times before paying for
        an asyncio poll registration (which matters with a low high-water mark)."""
        for _ in range(YIELDS_BEFORE_POLL):
            await asyncio.sleep(0)
            if self._sync.getsockopt(EVENTS) & POLLOUT:
                return
        await self.socket.poll(None, zmq.POLLOUT)

    async def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the queue to empty."""
        deadline = time.monotonic() + timeout
        while self.queue and time.monotonic() < deadline:
            await asyncio.sleep(0.01)


class Broker:
    """A running broker: core, sockets, output links, LST, clients and control RPC."""

    def __init__(self, scot: Scot, broker_id: str, mode: str, settings: BrokerSettings) -> None:
        self.scot = scot
        self.info = scot.brokers[broker_id]
        self.id = broker_id
        self.mode = mode
        self.settings = settings
        self.clock = MatchClock()
        self.core = make_broker(scot, broker_id, mode, lambda: TimedMatcher(self.clock))
        self.counters: Counter[str] = Counter()
        self.received: Counter[type] = Counter()
        self._sender = broker_id.encode()
        self.subscription_delay: dict[str, float] = {}
        self.inbound_up: set[str] = set()
        self._neighbours = {n.id for n in self.info.neighbours}
        self._clients: dict[str, tuple[bytes, str]] = {}
        self._client_backlog: dict[bytes, deque[bytes]] = {}
        self._stopping = asyncio.Event()
        self._broker_pacer: Pacer | None = None
        self._waiters: dict[str, InputWaiter] = {}
        self._failure: str | None = None

        self.queue_seen = [0, 0, 0]
        """Notification copies enqueued: [count, sum of the queue lengths they joined, max]."""
        self.link_activity = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.started = time.time()

    # -- lifecycle -----------------------------------------------------------------------

    async def serve(self) -> None:
        """Bind, connect, run until :meth:`stop`, then flush and close."""
        loop = self._loop = asyncio.get_running_loop()

        self.ctx = zmq.asyncio.Context()
        self.peer_in = self.ctx.socket(zmq.PULL)
        self.peer_in.setsockopt(zmq.RCVHWM, 1000)
        self.peer_in.bind(self.info.endpoint)
        self.client_sock = self.ctx.socket(zmq.ROUTER)
        self.client_sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.client_sock.setsockopt(zmq.SNDHWM, self.settings.client_sndhwm)
        self.client_sock.setsockopt(zmq.LINGER, 500)
        self.client_sock.bind(self.info.client_endpoint)
        self._client_sync = zmq.Socket.shadow(self.client_sock.underlying)
        self._waiters["clients"] = InputWaiter(self._client_sync, loop)
        self.lst = LinkStatusTable(
            [n.id for n in self.info.neighbours],
            self.settings.window,
            self.settings.queue_threshold,
            start=loop.time(),
        )
        endpoints = {b.id: b.endpoint for b in self.scot.brokers.values()}
        self.links = {
            n.id: OutputLink(
                n.id,
                endpoints[n.id],
                self.ctx,
                self.lst,
                self.settings.sndhwm,
                self._pacers(n.id),
                self.link_activity,
            )
            for n in self.info.neighbours
        }
        self.rpc = await aiozmq.rpc.serve_rpc(ControlHandler(self), bind=self.info.control_endpoint)
        for link in self.links.values():
            link.put(encode_peer(self.id, Hello()), loop.time())
        self._tasks = [
            asyncio.create_task(link.run(), name=f"link {link.name}")
            for link in self.links.values()
        ]
        self._tasks += [
            asyncio.create_task(self._peer_loop(), name="peers"),
            asyncio.create_task(self._client_loop(), name="clients"),
            asyncio.create_task(self._tick_loop(), name="lst"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)
        log.info(
            "%s serving (%s) peers %s clients %s control %s",
            self.id,
            self.mode,
            self.info.endpoint,
            self.info.client_endpoint,
            self.info.control_endpoint,
        )
        await self._stopping.wait()
        await asyncio.gather(*(link.flush(1.0) for link in self.links.values()))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.rpc.close()
        await self.rpc.wait_closed()
        for waiter in self._waiters.values():
            waiter.close()
        self.ctx.destroy(linger=200)
        if self._failure is not None:
            raise BrokerFailure(self._failure)
        log.info("%s stopped", self.id)

    def _task_ended(self, task: asyncio.Task) -> None:
        """A serving loop never ends on its own: if one does, log why and shut down, so the
        broker exits non-zero instead of serving with, say, no peer input."""
        if task.cancelled():
            return
        exc = task.exception()
        self._failure = f"{self.id}: task {task.get_name()!r} ended: {exc!r}"
        log.error("%s", self._failure, exc_info=exc)
        self.stop()

    def stop(self) -> None:
        """Begin a clean shutdown."""
        self._stopping.set()

    def _pacers(self, neighbour: str) -> tuple[Pacer, ...]:
        """The link's own pacer (link capacity) and the broker's shared one, if set."""
        pacers = []
        if rate := self.settings.capacity_of(self.id, neighbour):
            pacers.append(Pacer(rate))
        if self.settings.broker_capacity:
            if self._broker_pacer is None:
                self._broker_pacer = Pacer(self.settings.broker_capacity)
            pacers.append(self._broker_pacer)
        return tuple(pacers)

    @property
    def ready(self) -> bool:
        """Every neighbour's link to us has delivered its handshake."""
        return self.inbound_up == self._neighbours

    # -- peers ---------------------------------------------------------------------------

    async def _peer_loop(self) -> None:
        sync = zmq.Socket.shadow(self.peer_in.underlying)
        waiter = self._waiters["peers"] = InputWaiter(sync, self._loop)
        recv = sync.recv
        handled = 0
        while True:
            try:
                frame = receive_now(recv)
            except zmq.Again:
                handled = 0
                await waiter.wait()
                continue
            self._on_peer_frame(frame)
            handled += 1
            if handled >= PEER_BATCH:
                handled = 0
                await asyncio.sleep(0)

    def _on_peer_frame(self, frame: list[bytes]) -> None:
        try:
            sender, message = decode_peer(frame)
            kind = type(message)
            if kind is Hello:
                if sender not in self._neighbours:
                    raise ProtocolError(f"handshake from {sender}, which is not a neighbour")
                self.inbound_up.add(sender)
                return
            self.received[kind] += 1
            if kind is Subscribe:
                stored = len(self.core.table)
                actions = self.core.receive(sender, message, self.lst)
                if len(self.core.table) > stored:
                    self.subscription_delay[message.sub_id] = time.time() - message.issued_at
            else:
                actions = self.core.receive(sender, message, self.lst)
            self._execute(actions, message, frame[1])
        except WireError as exc:
            self.counters["wire_errors"] += 1
            log.warning("%s dropped a malformed peer frame: %s", self.id, exc)
        except ProtocolError as exc:
            self.counters["protocol_errors"] += 1
            log.warning("%s dropped a message that breaks the protocol: %s", self.id, exc)
        except Exception:
            self.counters["internal_errors"] += 1
            log.exception("%s failed on a peer frame", self.id)

    def _execute(self, actions: list, received: object = None, body: bytes = b"") -> None:
        """Carry out the core's actions. A forwarded message that is the ``received`` one
        goes out with the ``body`` it arrived in; others are encoded once each."""
        now = self._loop.time()
        frames: dict[int, list[bytes]] = {}
        if received is not None:
            frames[id(received)] = [self._sender, body]
        deliveries: dict[bytes, list[str]] = {}
        notification = None
        for action in actions:
            if type(action) is Forward:
                message = action.message
                frame = frames.get(id(message))
                if frame is None:
                    frame = frames[id(message)] = [self._sender, encode_body(message)]
                link = self.links[action.link]
                if type(message) is Notification:
                    seen = self.queue_seen
                    ahead = len(link.queue)
                    seen[0] += 1
                    seen[1] += ahead
                    if ahead > seen[2]:
                        seen[2] = ahead
                link.put(frame, now)

            elif type(action) is Deliver:
                identity, name = self._clients[action.subscriber]
                deliveries.setdefault(identity, []).append(name)
                notification = action.notification
        if deliveries:
            self._deliver(deliveries, notification)

    # -- clients -------------------------------------------------------------------------

    def _deliver(self, deliveries: dict[bytes, list[str]], n: Notification) -> None:
        for identity, names in deliveries.items():
            frame = pack(["notify", names, n.publisher, n.seq, n.published_at, n.publication])
            self.counters["deliveries"] += len(names)
            self._send_client(identity, frame)

    def _send_client(self, identity: bytes, frame: bytes) -> None:
        """Send to a client now, or queue behind its backlog when its pipe is full.

        The ROUTER is also read through an :class:`InputWaiter`; every send pokes it, so
        a send that consumes ZeroMQ's edge-triggered event cannot strand a request.
        """
        backlog = self._client_backlog.get(identity)
        if backlog:
            backlog.append(frame)
            return
        problem = self._try_send_client(identity, frame)
        if isinstance(problem, zmq.Again):
            self._client_backlog[identity] = deque([frame])
            asyncio.get_running_loop().create_task(self._drain_client(identity))
        elif problem is not None:
            self.counters["undeliverable"] += 1
            log.warning("%s cannot reach client %r: %s", self.id, identity, problem)

    def _try_send_client(self, identity: bytes, frame: bytes) -> BaseException | None:
        try:
            self._client_sync.send(identity, SNDMORE_NOBLOCK)
        except zmq.ZMQError as exc:
            return exc
        else:
            self._client_sync.send(frame)
            return None
        finally:
            self._waiters["clients"].poke()

    async def _drain_client(self, identity: bytes) -> None:
        backlog = self._client_backlog[identity]
        while backlog:
            problem = self._try_send_client(identity, backlog[0])
            if problem is None:
                backlog.popleft()
            elif isinstance(problem, zmq.Again):
                await asyncio.sleep(0.001)
            else:
                self.counters["undeliverable"] += len(backlog)
                log.warning(
                    "%s lost client %r with %d frames queued: %s",
                    self.id,
                    identity,
                    len(backlog),
                    problem,
                )
                backlog.clear()
        del self._client_backlog[identity]

    async def _client_loop(self) -> None:
        recv = self._client_sync.recv
        while True:
            try:
                parts = receive_now(recv)
            except zmq.Again:
                await self._waiters["clients"].wait()
                continue
            if len(parts) != 2:
                self.counters["client_errors"] += 1
                log.warning("%s got a client frame with %d parts", self.id, len(parts))
                continue
            identity, payload = parts
            reply = self._on_client_request(identity, payload)
            if reply is not None:
                self._send_client(identity, pack(reply))

    def _on_client_request(self, identity: bytes, payload: bytes) -> dict | None:
        req = None
        try:
            try:
                request = unpack(payload)
            except msgspec.DecodeError as exc:
                raise ClientError(f"request is not msgpack: {exc}") from None
            if not isinstance(request, dict):
                raise ClientError("request must be a map with an 'op'")
            req = request.get("req")
            op = request.get("op")
            handler = self._client_ops.get(op)
            if handler is None:
                raise ClientError(f"unknown op {op!r}")
            reply = handler(self, identity, request)
        except (ClientError, FilterError, ProtocolError) as exc:
            self.counters["client_errors"] += 1
            log.info("%s rejected a client request: %s", self.id, exc)
            return {"op": "error", "req": req, "message": str(exc)}
        except Exception as exc:
            self.counters["internal_errors"] += 1
            log.exception("%s failed on a client request", self.id)
            return {"op": "error", "req": req, "message": f"internal error: {exc}"}
        if reply is not None and req is not None:
            reply["req"] = req
        return reply

    def _client_key(self, identity: bytes, request: dict) -> tuple[str, str]:
        name = request.get("client")
        if not isinstance(name, str) or not name:
            raise ClientError("'client' must be a non-empty string")
        key = f"{identity.hex()}/{name}"
        self._clients.setdefault(key, (identity, name))
        return key, name

    def _op_hello(self, identity: bytes, request: dict) -> dict:
        return {
            "op": "welcome",
            "broker": self.id,
            "mode": self.mode,
            "cluster": self.info.cluster,
            "region": self.info.region,
        }

    def _op_subscribe(self, identity: bytes, request: dict) -> dict:
        key, _ = self._client_key(identity, request)
        spec = request.get("filter")
        if not isinstance(spec, (str, dict)):
            raise ClientError("'filter' must be PADRES text or a map")
        subscription = as_subscription(spec)
        sub_id, actions = self.core.subscribe(key, subscription, time.time())
        self.subscription_delay[sub_id] = 0.0
        self._execute(actions)
        return {"op": "subscribed", "sub_id": sub_id}

    def _op_unsubscribe(self, identity: bytes, request: dict) -> dict:
        key, _ = self._client_key(identity, request)
        sub_id = request.get("sub_id")
        if not isinstance(sub_id, str):
            raise ClientError("'sub_id' must be a string")
        self._execute(self.core.unsubscribe(key, sub_id))
        return {"op": "unsubscribed", "sub_id": sub_id}

    def _op_publish(self, identity: bytes, request: dict) -> dict | None:
        _, name = self._client_key(identity, request)
        seq, published_at, body = (request.get(k) for k in ("seq", "published_at", "publication"))
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ClientError("'seq' must be an integer")
        if not isinstance(published_at, (int, float)) or isinstance(published_at, bool):
            raise ClientError("'published_at' must be a number")
        publication = (
            parse_publication(body) if isinstance(body, str) else validate_publication(body)
        )
        n = Notification(name, seq, float(published_at), publication)
        self.counters["publications"] += 1
        self._execute(self.core.publish(n, self.lst))
        return {"op": "published", "seq": seq} if request.get("req") is not None else None

    _client_ops: ClassVar[dict[str, Callable[..., dict | None]]] = {
        "hello": _op_hello,
        "subscribe": _op_subscribe,
        "unsubscribe": _op_unsubscribe,
        "publish": _op_publish,
    }

    # -- LST and stats -------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        """Close LST windows every Δt while links are active; sleep while all are idle.

        The table also rolls its windows on every enqueue and send, so ticks only keep CE
        fresh between events; an idle broker costs no wake-ups.
        """
        loop = asyncio.get_running_loop()
        while True:
            await self.link_activity.wait()
            self.link_activity.clear()
            await asyncio.sleep(self.settings.window)
            self.lst.advance(loop.time())

    def status(self) -> dict[str, Any]:
        """Identity and readiness."""
        return {
            "id": self.id,
            "mode": self.mode,
            "ready": self.ready,
            "links_up": len(self.inbound_up),
            "neighbours": len(self._neighbours),
            "pid": os.getpid(),
        }

    def subscriptions(self) -> dict[str, list]:
        """Per stored subscription: [seconds from issue to storage here, hops from host]."""
        entries = self.core.table.entries
        return {
            sub_id: [self.subscription_delay.get(sub_id, 0.0), entry.hops]
            for sub_id, entry in entries.items()
        }

    def stats(self) -> dict[str, Any]:
        """Messages by kind, routing-table size, LST, queue lengths, matching time."""
        self.lst.advance(asyncio.get_running_loop().time())
        core = dict(self.core.stats)
        return {
            **self.status(),
            "uptime": time.time() - self.started,
            "routing_table_size": len(self.core.table),
            "counters": dict(self.counters),
            "received": {kind.__name__.lower(): n for kind, n in self.received.items()},
            "core": core,
            "lst": self.lst.snapshot(),
            "queue_lengths": {name: len(link.queue) for name, link in self.links.items()},
            "client_backlog": sum(len(b) for b in self._client_backlog.values()),
            "queue_seen": {
                "copies": self.queue_seen[0],
                "total": self.queue_seen[1],
                "max": self.queue_seen[2],
            },
            "matching": {
                "calls": self.clock.calls,
                "seconds": self.clock.seconds,
                "routing_steps": core.get("matching", 0),
            },
        }


class ClientError(ValueError):
    """A client request the broker cannot serve; answered with an error reply."""


class ControlHandler(aiozmq.rpc.AttrHandler):
    """The control-plane RPC of one broker."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    @aiozmq.rpc.method
    def status(self) -> dict:
        """Identity and readiness (all inbound links handshaken)."""
        return self._broker.status()

    @aiozmq.rpc.method
    def stats(self) -> dict:
        """Counters, routing-table size, LST, queue lengths, matching time."""
        return self._broker.stats()

    @aiozmq.rpc.method
    def subscriptions(self) -> dict:
        """Per stored subscription: [seconds from issue to storage here, hops from host]."""
        return self._broker.subscriptions()

    @aiozmq.rpc.method
    def shutdown(self) -> bool:
        """Flush output queues and exit."""
        asyncio.get_running_loop().call_soon(self._broker.stop)
        return True


async def run_broker(scot: Scot, broker_id: str, mode: str, settings: BrokerSettings) -> None:
    """Serve until SIGTERM/SIGINT or an RPC ``shutdown``."""
    broker = Broker(scot, broker_id, mode, settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, broker.stop)
    await broker.serve()
