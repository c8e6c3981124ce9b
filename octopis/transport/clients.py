"""Client sessions of a broker: the ROUTER socket, requests, deliveries and client
liveness (DESIGN §4, §7). The protocol itself is :mod:`octopis.wire`.

A connection (one DEALER) may carry several named clients; a client's key in the routing
core is ``<connection identity hex>/<name>``, so one connection cannot act for another's
clients. Every request refreshes its connection's liveness; a connection silent for
``clients.timeout`` seconds is dropped and its subscriptions are withdrawn by the
ordinary two-step unsubscribe; one that says ``bye`` is dropped so at once.

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
deliveries waiting hold the neighbours back as a full link does (DESIGN §8). What
leaves the socket, and these bounds, are :mod:`octopis.transport.outbox`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from octopis.core import (
    Action,
    Notification,
    ProtocolError,
    UnadvertisedPublication,
)
from octopis.core.durable import DurableError, claim_of
from octopis.core.sessions import ClientTable, SessionRefused
from octopis.filters.composite import Composite, as_filter
from octopis.filters.language import (
    FilterError,
    Subscription,
    parse_publication,
    parse_subscription,
    validate_publication,
)
from octopis.logs import RateLimitedLog
from octopis.settings import BrokerSettings
from octopis.transport.links import (
    InputWaiter,
    PublishReceipt,
    SendPass,
)
from octopis.transport.outbox import ClientOutbox
from octopis.transport.security import Curve
from octopis.transport.zmqio import FastSocket
from octopis.wire import (
    AckRequest,
    AdoptRequest,
    AdvertiseRequest,
    ByeRequest,
    ClaimRequest,
    HeartbeatRequest,
    HelloRequest,
    PublishRequest,
    ReplayRequest,
    Request,
    RequestError,
    SubscribeRequest,
    UnsubscribeRequest,
    decode_request,
    pack,
    request_number,
    stamp_problem,
)

if TYPE_CHECKING:
    from octopis.transport.replaying import Replaying

log = logging.getLogger("octopis.broker.clients")


STOMP_IDENTITY = b"stomp-"
"""How the identity of a STOMP gateway's connection begins (``octopis status`` counts them)."""


class ClientError(ValueError):
    """A client request the broker cannot serve; answered with an error reply."""


class Router(Protocol):
    """What client sessions ask of the broker: the routing core behind them."""

    welcome: dict[str, object]

    def subscribe(
        self, key: str, subscription: Subscription | Composite
    ) -> tuple[str, list[Action]]:
        """Install a local subscription (a composite one: its parts); returns its id and
        the SBP actions."""

    def unsubscribe(self, key: str, sub_id: str) -> list[Action]:
        """Withdraw a local subscription; returns the SBP actions."""

    def adopt(self, key: str, sub_id: str) -> list[Action]:
        """Take over a subscription moving here from another broker of the cluster."""

    def publish(self, notification: Notification, receipt: PublishReceipt) -> None:
        """Route a local publication, its copies counting in ``receipt``."""

    def advertise(self, key: str, advertisement: Subscription) -> tuple[str, list[Action]]:
        """Install client ``key``'s advertisement; returns its id and the SBP actions."""

    def unadvertise_all(self, key: str) -> list[Action]:
        """Withdraw every advertisement of client ``key`` (it left)."""

    def check_advertised(self, key: str, publication: dict) -> None:
        """Raise :class:`UnadvertisedPublication` if advertisements are on and client
        ``key`` advertised nothing ``publication`` matches."""

    def execute(self, actions: list[Action], received: object = None, body: bytes = b"") -> None:
        """Carry out routing actions."""

    def pass_ended(self, idle: bool) -> None:
        """An input pass ended and what it sent has left; ``idle``: the input ran dry."""

    def replay(
        self,
        key: str,
        filters: list[str],
        since: list[tuple[str, int, int]],
        after: float,
        **window: Any,
    ) -> str:
        """Start a replay for client ``key`` (``window``: ``until``, ``historic``,
        ``answer_max``, ``answer_bytes``, ``claim``); returns its id."""

    @property
    def replaying(self) -> Replaying:
        """The retention store, replay rounds and durable records (DESIGN §11)."""


CLIENT_BATCH = 64
"""Requests one pass handles before the pass ends and other tasks run."""
AFTER_DELIVERIES = frozenset({"unsubscribed", "bye"})
"""Replies that follow every delivery made to their connection before them (as notices
do): a client lets a connection go once the broker has answered its withdrawal (a
subscription moved across clusters) or its bye (the connection left at a fail-over),
so nothing may still wait for it there."""


class ClientSession:
    """One client session (a DEALER connection as the broker sees it): its clients and
    their subscriptions, liveness, backlog."""

    __slots__ = ("backlog", "delivered", "keys", "last_seen", "overflowed", "unanswered")

    def __init__(self, now: float) -> None:
        self.keys: set[str] = set()
        """Its clients' keys (their subscriptions: :class:`ClientTable`)."""
        self.last_seen = now
        self.backlog: deque[list[bytes]] | None = None
        self.overflowed = 0
        """Deliveries dropped (drop-oldest policy) and not yet reported to the client."""
        self.unanswered = 0
        """Publications accepted and not yet answered (their copies not yet held)."""
        self.delivered: Counter[str] = Counter()
        """Client name → notifications delivered to it (its share of the load)."""


class ClientSessions:
    """Serves the client ROUTER of one broker."""

    def __init__(
        self,
        broker_id: str,
        bind: str,
        settings: BrokerSettings,
        ctx: zmq.asyncio.Context,
        router: Router,
        curve: Curve | None = None,
        send_pass: SendPass | None = None,
        idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.id = broker_id
        self.idle = idle
        """Called each time the requests have been read dry, before waiting for more."""
        self.settings = settings
        self.router = router
        self.send_pass = send_pass or SendPass()
        """Opened around each pass over the requests; shared with the peer links."""
        self.counters: Counter[str] = Counter()
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.SNDHWM, settings.clients.sndhwm)
        self.socket.setsockopt(zmq.LINGER, 500)
        self.socket.setsockopt(zmq.MAXMSGSIZE, settings.limits.frame_bytes)
        if curve is not None:
            curve.serve(self.socket, "client")
        self.socket.bind(bind)
        self._sync = zmq.Socket.shadow(self.socket.underlying)
        self._fast = FastSocket(self.socket)
        self._waiter: InputWaiter | None = None
        self.connections: dict[bytes, ClientSession] = {}
        self.names: dict[str, tuple[bytes, str]] = {}
        """Client key → (connection identity, client name): where deliveries go."""
        self.publishers: set[str] = set()
        """Keys of the clients that have published here (as many as :attr:`names`)."""
        self._warn = RateLimitedLog(log, settings.logs.interval)
        self.outlets: dict[bytes, Callable[[list[bytes]], bool]] = {}
        """Connections a gateway serves (DESIGN §13): identity → what takes the messages
        for it (replies ``[reply]``, deliveries ``[names, body, ...]``; False: full)."""
        self.outbox = ClientOutbox(
            broker_id,
            settings,
            self._fast,
            self.send_pass,
            self.connections,
            self.outlets,
            self.counters,
            self._warn,
            self.drop,
        )
        """What leaves the socket: deliveries, replies, notices (DESIGN §8)."""
        self.dropped = self.outbox.dropped
        self.table = ClientTable(settings.limits.subscriptions_per_client)
        """Each client's subscriptions here and the session rules: limits, withdrawal
        when gone, moves and their orphans (DESIGN §7-§9)."""
        self._handlers = {
            HelloRequest: self._hello,
            HeartbeatRequest: self._heartbeat,
            SubscribeRequest: self._subscribe,
            UnsubscribeRequest: self._unsubscribe,
            AdoptRequest: self._adopt,
            PublishRequest: self._publish,
            AdvertiseRequest: self._advertise,
            ReplayRequest: self._replay,
            ClaimRequest: self._claim,
            AckRequest: self._ack,
            ByeRequest: self._bye,
        }

    # -- requests ------------------------------------------------------------------------

    async def serve(self) -> None:
        """Read requests until cancelled, in passes of up to :data:`CLIENT_BATCH`: what a
        pass sends leaves in batches when it ends, and other tasks run between passes."""
        loop = asyncio.get_running_loop()
        self._waiter = self.outbox.waiter = InputWaiter(self._sync, loop)
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
        if reply is not None and reply["op"] in AFTER_DELIVERIES:
            self.outbox.notify(identity, reply)
        elif reply is not None:
            self.outbox.send(identity, [pack(reply)])

    def _on_request(self, identity: bytes, payload: bytes, now: float) -> dict | None:
        req = None
        try:
            try:
                request = decode_request(payload)
            except RequestError:
                req = request_number(payload)
                raise
            req = request.req
            if identity in self.dropped:  # told again, whether or not the notice got out
                self.counters["requests_refused.dropped"] += 1
                return {"op": "dropped", "reason": self.dropped[identity], "req": req}
            connection = self.connections.get(identity)
            if connection is None:
                connection = self.connections[identity] = ClientSession(now)
            connection.last_seen = now
            reply = self._handlers[type(request)](identity, connection, request)
        except UnadvertisedPublication as exc:
            self.counters["publications_refused.unadvertised"] += 1
            return {"op": "error", "req": req, "message": str(exc), "error": "unadvertised"}
        except (ClientError, SessionRefused, RequestError, FilterError, ProtocolError) as exc:
            self.counters["client_errors"] += 1
            self._warn.warning("refused", "%s refused a client request: %s", self.id, exc)
            return {"op": "error", "req": req, "message": str(exc)}
        except Exception as exc:
            self.counters["internal_errors"] += 1
            self._warn.exception("internal", "%s failed on a client request", self.id)
            return {"op": "error", "req": req, "message": f"internal error: {exc}"}
        if reply is not None and req is not None:
            reply["req"] = req
            return reply
        return None

    def _key(self, identity: bytes, connection: ClientSession, request: Request) -> str:
        key = f"{identity.hex()}/{request.client}"
        if key not in connection.keys:
            connection.keys.add(key)
            self.names[key] = (identity, request.client)
        return key

    def _hello(self, identity: bytes, connection: ClientSession, request: HelloRequest) -> dict:
        return {"op": "welcome", **self.router.welcome}

    def _heartbeat(self, identity: bytes, connection: ClientSession, request: Request) -> dict:
        return {"op": "alive"}

    def _bye(self, identity: bytes, connection: ClientSession, request: Request) -> dict:
        self.drop(identity, "it said bye", left=True)
        return {"op": "bye"}

    def _subscribe(
        self, identity: bytes, connection: ClientSession, request: SubscribeRequest
    ) -> dict:
        key = self._room_for_one_more(identity, connection, request)
        subscription = as_filter(request.filter)
        if request.durable is not None and isinstance(subscription, Composite):
            raise ClientError("a composite subscription cannot be durable")
        if request.durable is not None:
            try:
                self.router.replaying.durables.room(request.client, request.durable)
            except DurableError as exc:
                raise ClientError(str(exc)) from None
        sub_id, actions = self.router.subscribe(key, subscription)
        if request.durable is not None:
            self.router.replaying.durable_attach(
                request.client, request.durable, key, sub_id, (subscription.to_text(),)
            )
        self.table.attach(key, sub_id)
        self.router.execute(actions)
        return {"op": "subscribed", "sub_id": sub_id}

    def _unsubscribe(
        self, identity: bytes, connection: ClientSession, request: UnsubscribeRequest
    ) -> dict:
        key = self._key(identity, connection, request)
        if request.sub_id not in self.table.subscriptions(key):
            raise ClientError(f"{request.client} holds no subscription {request.sub_id}")
        self.router.execute(self.router.unsubscribe(key, request.sub_id))
        self.table.detach(key, request.sub_id)
        if request.moved:
            self.router.replaying.durable_moved(request.sub_id)
        elif self.router.replaying.durable_ended(request.sub_id):
            self.counters["durable.ended"] += 1
        return {"op": "unsubscribed", "sub_id": request.sub_id}

    def _room_for_one_more(
        self, identity: bytes, connection: ClientSession, request: SubscribeRequest | AdoptRequest
    ) -> str:
        """The client's key, if it may hold one more subscription (else a refusal)."""
        key = self._key(identity, connection, request)
        self.table.room(key, request.client)
        return key

    def _adopt(self, identity: bytes, connection: ClientSession, request: AdoptRequest) -> dict:
        key = self._room_for_one_more(identity, connection, request)
        actions = self.router.adopt(key, request.sub_id)
        if request.durable is not None:
            self.router.replaying.durable_attach(
                request.client, request.durable, key, request.sub_id, ()
            )
        self.table.attach(key, request.sub_id)
        self.counters["moves.adopted"] += 1
        self.router.execute(actions)
        return {"op": "adopted", "sub_id": request.sub_id}

    # -- moves (DESIGN §9) -----------------------------------------------------------------

    def order_move(self, client: str, to: str, inside: bool) -> list[str]:
        """Tell every connection holding a client named ``client`` (or ``name@conn``, as
        the load analysis names one: ``conn`` starts its connection's identity in hex)
        to move its subscriptions to the broker at client endpoint ``to``: inside this
        cluster by adopting them there, else by subscribing there afresh; returns the
        sub ids."""
        client, _, conn = client.partition("@")
        keys = [
            key
            for key, (identity, name) in self.names.items()
            if name == client and identity.hex().startswith(conn)
        ]
        if not keys:
            raise ClientError(f"{self.id} serves no client named {client!r}")
        deadline = asyncio.get_running_loop().time() + self.settings.clients.move_timeout
        moved: list[str] = []
        for key, sub_ids in self.table.order_move(keys, deadline, inside).items():
            identity, _ = self.names[key]
            self.outbox.notify(
                identity,
                {"op": "move", "client": client, "to": to, "inside": inside, "sub_ids": sub_ids},
            )
            moved += sub_ids
        return moved

    def released(self, key: str, sub_id: str) -> None:
        """``sub_id`` moved on from this broker: tell its client, after everything this
        broker delivered to it before (its last delivery from here)."""
        self.router.replaying.durable_moved(sub_id)
        if self.table.released(key, sub_id):
            identity, name = self.names[key]
            self.outbox.notify(identity, {"op": "released", "client": name, "sub_id": sub_id})

    def _expire_moves(self, now: float) -> None:
        """Withdraw what orphaned move orders kept past their deadline
        (:meth:`ClientTable.expire`)."""
        for key, sub_id in self.table.expire(now):
            self.router.execute(self.router.unsubscribe(key, sub_id))

    def _replay(self, identity: bytes, connection: ClientSession, request: ReplayRequest) -> dict:
        for text in request.filters:
            parse_subscription(text)  # a FilterError names the problem; nothing starts
        key = self._key(identity, connection, request)
        req_id = self.router.replay(
            key,
            request.filters,
            request.since,
            float(request.after),
            until=float("inf") if request.until is None else float(request.until),
            historic=request.historic,
            answer_max=request.answer_max,
            answer_bytes=request.answer_bytes,
        )
        return {"op": "replaying", "id": req_id}

    def _claim(self, identity: bytes, connection: ClientSession, request: ClaimRequest) -> dict:
        key = self._key(identity, connection, request)
        req_id = self.router.replay(
            key, [], [], 0.0, historic=True, claim=claim_of(request.client, request.durable)
        )
        return {"op": "claiming", "id": req_id}

    def _ack(self, identity: bytes, connection: ClientSession, request: AckRequest) -> dict:
        acked = self.router.replaying.durable_ack(
            request.client, request.durable, request.since, request.after
        )
        if not acked:
            raise ClientError(f"{self.id} keeps no durable subscription {request.durable!r}")
        return {"op": "acked"}

    def withdraw(self, key: str, sub_id: str) -> None:
        """End local subscription ``sub_id`` of client ``key``: its durable record was
        claimed by the host its client came back at (the old connection is not dropped
        yet). The client, if still there, is told ``withdrawn``."""
        client = self.names.get(key)
        if client is None or not self.table.detach(key, sub_id):
            return
        self.router.execute(self.router.unsubscribe(key, sub_id))
        self.counters["subscriptions_withdrawn"] += 1
        self.outbox.notify(client[0], {"op": "withdrawn", "client": client[1], "sub_id": sub_id})

    def notify_client(self, key: str, message: dict) -> bool:
        """Send a notice to local client ``key`` (behind its deliveries); False if it has
        gone."""
        client = self.names.get(key)
        if client is None or client[0] not in self.connections:
            return False
        self.outbox.notify(client[0], {**message, "client": client[1]})
        return True

    def _publish(
        self, identity: bytes, connection: ClientSession, request: PublishRequest
    ) -> dict | None:
        problem = stamp_problem(request.seq, float(request.published_at))
        if problem is not None:
            raise ClientError(problem)
        limit = self.settings.clients.body_bytes
        if len(request.body) > limit:
            self.counters["publications_refused.body_bytes"] += 1
            raise ClientError(
                f"a publication body of {len(request.body)} bytes is longer than "
                f"clients.body_bytes = {limit}"
            )
        text = request.publication
        publication = (
            parse_publication(text) if isinstance(text, str) else validate_publication(text)
        )
        window = self.settings.clients.publish_window
        if connection.unanswered >= window:
            self.counters["publications_refused.window"] += 1
            raise ClientError(
                f"{connection.unanswered} publications of this connection are unanswered "
                f"(clients.publish_window = {window}); wait for their answers"
            )
        if self.outbox.paced_deliveries >= self.settings.clients.queue_limit:
            self.counters["publications_refused.deliveries_waiting"] += 1
            raise ClientError(
                f"{self.outbox.paced_deliveries} deliveries wait for this broker's capacity "
                f"(clients.capacity = {self.settings.clients.capacity:g}/s, clients.queue_limit "
                f"= {self.settings.clients.queue_limit}); publish again later"
            )
        key = self._key(identity, connection, request)
        self.router.check_advertised(key, publication)
        self.publishers.add(key)
        n = Notification(
            request.client,
            request.seq,
            request.published_at,
            publication,
            session=request.session,
            body=request.body,
        )
        self.counters["publications"] += 1
        reply = {"op": "published", "seq": request.seq}
        answer = pack({**reply, "req": request.req})

        def answered() -> None:
            connection.unanswered -= 1
            if receipt.refusal is not None:
                refused = {"op": "error", "req": request.req, "message": receipt.refusal}
                self.outbox.send(identity, [pack({**refused, "error": "not_kept"})])
                return
            self.outbox.send(identity, [answer])

        receipt = PublishReceipt(answered, alone=connection.unanswered == 0)
        self.router.publish(n, receipt)
        if receipt.copies == 0:
            return reply
        connection.unanswered += 1
        return None

    def _advertise(
        self, identity: bytes, connection: ClientSession, request: AdvertiseRequest
    ) -> dict:
        """An advertisement (DESIGN §12): it spreads, and the client may publish what it
        matches; it is withdrawn when the client's connection goes."""
        key = self._key(identity, connection, request)
        advertisement = as_filter(request.filter)
        if isinstance(advertisement, Composite):
            raise ClientError("an advertisement is one atomic filter, not a composite one")
        adv_id, actions = self.router.advertise(key, advertisement)
        self.router.execute(actions)
        return {"op": "advertised", "adv_id": adv_id}

    # -- liveness ------------------------------------------------------------------------

    async def expire(self) -> None:
        """Drop connections silent past the timeout, withdrawing their subscriptions.
        Silence is judged only with every request that reached us read, and time this
        process spent not running (a tick that comes late, a stall) is nobody's silence."""
        loop = asyncio.get_running_loop()
        timeout = self.settings.clients.timeout
        tick = timeout / 4
        woke = loop.time()
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            late, woke = now - woke - tick, now
            if late > tick:
                for connection in self.connections.values():
                    connection.last_seen += late
            self._expire_moves(now)
            if self._waiter is None or self._waiter.poke():
                continue  # requests wait unread: they may be these connections' heartbeats
            for identity in [i for i, c in self.connections.items() if now - c.last_seen > timeout]:
                self.drop(identity, f"silent for more than {timeout:g} s")

    def drop(self, identity: bytes, reason: str, *, left: bool = False) -> ClientSession | None:
        """Forget a connection: withdraw every subscription of its clients. ``left``: it
        said bye (counted in ``clients_left``, logged at INFO), else ``clients_dropped``."""
        connection = self.connections.pop(identity, None)
        if connection is None:
            return None
        heard = time.time() - (time.monotonic() - connection.last_seen)
        withdrawn = 0
        for key in sorted(connection.keys):
            for sub_id in self.table.gone(key):
                self.router.execute(self.router.unsubscribe(key, sub_id))
                self.router.replaying.durable_detached(sub_id, heard)
                withdrawn += 1
            self.names.pop(key, None)
            self.publishers.discard(key)
            self.router.execute(self.router.unadvertise_all(key))
        self.counters["clients_left" if left else "clients_dropped"] += 1
        log.log(
            logging.INFO if left else logging.WARNING,
            "%s dropped client connection %s (%s): %d clients, %d subscriptions withdrawn",
            self.id,
            identity.hex(),
            reason,
            len(connection.keys),
            withdrawn,
        )
        return connection

    # -- deliveries ----------------------------------------------------------------------

    def delivered(self) -> Counter[str]:
        """Notifications delivered to each client of a live connection, as
        ``name@connection`` (the connection's identity, 8 hex digits)."""
        return Counter(
            {
                f"{name}@{identity.hex()[:8]}": n
                for identity, connection in self.connections.items()
                for name, n in connection.delivered.items()
            }
        )

    def attached(
        self, interests: Callable[[str], frozenset[str]]
    ) -> dict[str, dict[str, int | bool | list[str]]]:
        """Every named client of a live connection, as ``name@connection`` (as
        :meth:`delivered` names it): the number of its subscriptions here, whether it
        has published here, and the ``interests`` of its subscriptions (by sub id)."""
        attached: dict[str, dict[str, int | bool | list[str]]] = {}
        for key, (identity, name) in self.names.items():
            if name == "-" or identity not in self.connections:
                continue
            sub_ids = self.table.subscriptions(key)
            attached[f"{name}@{identity.hex()[:8]}"] = {
                "subscriptions": len(sub_ids),
                "publisher": key in self.publishers,
                "interests": sorted(set().union(*map(interests, sub_ids))),
            }
        return attached

    def close(self) -> None:
        """Stop watching the socket and pacing deliveries."""
        self.outbox.close()
        if self._waiter is not None:
            self._waiter.close()
