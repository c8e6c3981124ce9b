"""Client sessions of a broker: the ROUTER socket and its requests (DESIGN §4, §7). The
protocol itself is :mod:`octopis.wire`. Three parts with one job each serve it:

- :class:`~octopis.transport.connections.ClientConnections`: the connections, the
  clients they carry, their liveness, what their going or moving withdraws;
- :class:`~octopis.transport.requests.RequestHandlers`: carries out each request by the
  node's rules (:mod:`octopis.core.client_requests`);
- :class:`~octopis.transport.outbox.ClientOutbox`: deliveries, replies and notices, and
  the flow control below.

Memory per connection is bounded (DESIGN §8): ZeroMQ holds ``clients.sndhwm`` messages
for it, the broker at most ``clients.backlog_limit`` more; a connection that lets its
backlog reach the limit is a slow consumer, handled by ``clients.slow_policy``: dropped
(subscriptions withdrawn, told why, its later requests refused with that reason) or its
oldest queued deliveries dropped (counted, and the count sent to it once its backlog
drains). At most ``clients.publish_window`` publications per connection wait for their
answer (the publish credit backpressure reaches); more are refused.

``clients.capacity`` (deliveries per second, 0 = unlimited) makes the broker an
overwhelmed one on its client side (issue 17): deliveries then leave no faster than
that, in the order they were made, queued in the broker meanwhile (notices keep their
place behind them; replies to requests do not wait); more than ``clients.queue_limit``
deliveries waiting hold the neighbours back as a full link does (DESIGN §8). These
bounds are the node's rules (:mod:`octopis.core.client_flow`); what leaves the socket is
:mod:`octopis.transport.outbox`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from msgspec.structs import replace

from octopis.core.client_requests import RequestRefused
from octopis.core.client_requests import refusal as client_refusal
from octopis.logs import RateLimitedLog
from octopis.settings import BrokerSettings, Clients
from octopis.transport.connections import ClientConnections, ClientSession, Router
from octopis.transport.links import InputWaiter, SendPass
from octopis.transport.outbox import ClientOutbox
from octopis.transport.requests import RequestHandlers
from octopis.transport.security import Curve
from octopis.transport.zmqio import FastSocket
from octopis.wire import pack
from octopis.wire.client import (
    AFTER_DELIVERIES,
    DroppedNotice,
    ErrorReply,
    Reply,
    RequestError,
    decode_request,
    request_number,
)

log = logging.getLogger("octopis.broker.clients")


STOMP_IDENTITY = b"stomp-"
"""How the identity of a STOMP gateway's connection begins (``octopis status`` counts them)."""
CLIENT_BATCH = 64
"""Requests one pass handles before the pass ends and other tasks run."""


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What a broker's client sessions read of its settings: the ``[clients]`` section,
    ``limits.frame_bytes``, and ``logs.interval`` for their warnings (the node keeps
    ``limits.subscriptions_per_client``)."""

    clients: Clients
    frame_bytes: int
    log_interval: float

    @classmethod
    def of(cls, settings: BrokerSettings) -> ClientSettings:
        """The client sessions' part of ``settings``."""
        return cls(
            settings.clients,
            settings.limits.frame_bytes,
            settings.logs.interval,
        )


class ClientSessions:
    """Serves the client ROUTER of one broker: reads its requests in passes and hands
    each to its handler (see the module docstring for the parts)."""

    def __init__(
        self,
        broker_id: str,
        bind: str,
        settings: ClientSettings,
        ctx: zmq.asyncio.Context,
        router: Router,
        curve: Curve | None = None,
        send_pass: SendPass | None = None,
        idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.id = broker_id
        self.idle = idle
        """Called each time the requests have been read dry, before waiting for more."""
        self.router = router
        self.send_pass = send_pass or SendPass()
        """Opened around each pass over the requests; shared with the peer links."""
        self.counters: Counter[str] = Counter()
        clients = settings.clients
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.SNDHWM, clients.sndhwm)
        self.socket.setsockopt(zmq.LINGER, 500)
        self.socket.setsockopt(zmq.MAXMSGSIZE, settings.frame_bytes)
        if curve is not None:
            curve.serve(self.socket, "client")
        self.socket.bind(bind)
        self._fast = FastSocket(self.socket)
        self._waiter: InputWaiter | None = None
        self._warn = RateLimitedLog(log, settings.log_interval)
        self.sessions = ClientConnections(
            broker_id,
            router,
            lambda identity, message: self.outbox.notify(identity, message),
            self.counters,
        )
        self.connections = self.sessions.connections
        self.names = self.sessions.names
        self.table = self.sessions.table
        self.outlets: dict[bytes, Callable[[list[bytes]], bool]] = {}
        """Connections a gateway serves (DESIGN §13): identity → what takes the messages
        for it (replies ``[reply]``, deliveries ``[names, body, ...]``; False: full)."""
        self.outbox = ClientOutbox(
            broker_id,
            clients,
            self._fast,
            self.send_pass,
            self.connections,
            self.outlets,
            self.counters,
            self._warn,
            self.sessions.drop,
        )
        """What leaves the socket: deliveries, replies, notices (DESIGN §8)."""
        self.dropped = self.outbox.dropped
        self._handlers = RequestHandlers(
            broker_id,
            router,
            self.sessions,
            self.outbox,
            self.counters,
        ).by_type

    async def serve(self) -> None:
        """Read requests until cancelled, in passes of up to :data:`CLIENT_BATCH`: what a
        pass sends leaves in batches when it ends, and other tasks run between passes."""
        loop = asyncio.get_running_loop()
        self._waiter = self.outbox.waiter = InputWaiter(self._fast, loop)
        receive = self._fast.receive
        send_pass = self.send_pass
        handled = 0
        try:
            while True:
                messages = receive(CLIENT_BATCH - handled)
                if not messages:
                    send_pass.end(loop.time())
                    self.router.pass_ended(True)  # commits while the frames travel
                    handled = 0
                    self.idle()
                    await self._waiter.wait()
                    continue
                send_pass.open = True
                for parts in messages:
                    self._on_message(parts, loop.time())
                handled += len(messages)
                if handled >= CLIENT_BATCH:
                    send_pass.end(loop.time())
                    self.router.pass_ended(False)
                    handled = 0
                    await asyncio.sleep(0)
        finally:
            send_pass.end(loop.time())  # whatever stopped the loop, nothing stays held
            self.router.pass_ended(True)

    def requests(self, identity: bytes, payloads: list[bytes]) -> None:
        """Requests from a connection a gateway serves, handled as one pass."""
        now = asyncio.get_running_loop().time()
        self.send_pass.open = True
        for payload in payloads:
            self._on_message([identity, payload], now)
        self.send_pass.end(now)
        self.router.pass_ended(True)

    def _on_message(self, parts: list[bytes], now: float) -> None:
        """One message from a client connection: ``[identity, request]``."""
        if len(parts) != 2:
            self.counters["client_errors"] += 1
            self._warn.warning("parts", "%s got a client frame with %d parts", self.id, len(parts))
            return
        identity, payload = parts
        reply = self._on_request(identity, payload, now)
        if isinstance(reply, AFTER_DELIVERIES):
            self.outbox.notify(identity, reply)
        elif reply is not None:
            self.outbox.send(identity, [pack(reply)])

    def _on_request(
        self, identity: bytes, payload: bytes, now: float
    ) -> Reply | DroppedNotice | None:
        req = None
        try:
            try:
                request = decode_request(payload)
            except RequestError as exc:
                req = request_number(payload)
                raise RequestRefused(str(exc)) from None
            req = request.req
            refusal = self.outbox.flow.refusal(identity)
            if refusal is not None:
                return replace(refusal, req=req)
            connection = self.sessions.heard(identity, now)
            reply = self._handlers[type(request)](identity, connection, request)
        except Exception as exc:
            refused = client_refusal(exc)
            if refused is None:
                self.counters["internal_errors"] += 1
                self._warn.exception("internal", "%s failed on a client request", self.id)
                return ErrorReply(req=req, message=f"internal error: {exc}")
            self.counters[refused.counter] += 1
            if refused.warn:
                self._warn.warning("refused", "%s refused a client request: %s", self.id, exc)
            return replace(refused.reply, req=req)
        return None if reply is None or req is None else replace(reply, req=req)

    # -- what the broker and its gateways ask of the sessions --------------------------------

    async def expire(self) -> None:
        """Drop connections silent past ``clients.timeout``
        (:meth:`ClientConnections.expire`)."""
        await self.sessions.expire(lambda: self._waiter)

    def drop(self, identity: bytes, reason: str, *, left: bool = False) -> ClientSession | None:
        """Forget a connection (:meth:`ClientConnections.drop`)."""
        return self.sessions.drop(identity, reason, left=left)

    def close(self) -> None:
        """Stop watching the socket and pacing deliveries."""
        self.outbox.close()
        if self._waiter is not None:
            self._waiter.close()
