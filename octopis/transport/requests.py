"""What a broker does with each client request (DESIGN §4, §11, §12): one handler per
request of :mod:`octopis.wire`, each returning the reply (None: it follows later).

A publication's answer waits until every copy kept in a link's custody is acknowledged
(DESIGN §7); a publication is refused, naming the limit, when the client side's flow
control says so (:class:`~octopis.core.client_flow.ClientFlow`: its body's size, the
publish window, the deliveries waiting).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from octopis.core import Action, Notification
from octopis.core.durable import DurableError, claim_of
from octopis.core.sessions import adopt, advertise, check_advertised
from octopis.filters.composite import as_filter
from octopis.filters.language import (
    parse_publication,
    parse_subscription,
    validate_publication,
)
from octopis.transport.connections import ClientConnections, ClientError, ClientSession, Router
from octopis.transport.links import PublishReceipt
from octopis.transport.outbox import ClientOutbox
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
    SubscribeRequest,
    UnsubscribeRequest,
    pack,
    stamp_problem,
)

Handler = Callable[[bytes, ClientSession, Request], "dict | None"]


class RequestHandlers:
    """The handlers of one broker's client requests, by request type (:attr:`by_type`);
    each takes the connection's identity, its session and the request."""

    def __init__(
        self,
        broker_id: str,
        router: Router,
        connections: ClientConnections,
        outbox: ClientOutbox,
        counters: Counter[str],
    ) -> None:
        self.id = broker_id
        self.router = router
        self.connections = connections
        self.table = connections.table
        self.outbox = outbox
        self.counters = counters
        self.by_type: dict[type, Handler] = {
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

    def _key(self, identity: bytes, connection: ClientSession, request: Request) -> str:
        return self.connections.key(identity, connection, request.client)

    def _hello(self, identity: bytes, connection: ClientSession, request: HelloRequest) -> dict:
        return {"op": "welcome", **self.router.welcome}

    def _heartbeat(self, identity: bytes, connection: ClientSession, request: Request) -> dict:
        return {"op": "alive"}

    def _bye(self, identity: bytes, connection: ClientSession, request: Request) -> dict:
        self.connections.drop(identity, "it said bye", left=True)
        return {"op": "bye"}

    # -- subscriptions ---------------------------------------------------------------------

    def _subscribe(
        self, identity: bytes, connection: ClientSession, request: SubscribeRequest
    ) -> dict:
        key = self._key(identity, connection, request)
        subscription = as_filter(request.filter)

        def make() -> tuple[str, list[Action]]:
            if request.durable is not None:
                try:
                    self.router.replaying.durables.room(
                        request.client, request.durable, subscription
                    )
                except DurableError as exc:
                    raise ClientError(str(exc)) from None
            return self.router.composites.local_subscribe(key, subscription, time.time())

        sub_id, actions = self.table.subscribe(key, request.client, make)
        if request.durable is not None:
            self.router.replaying.durable_attach(
                request.client, request.durable, key, sub_id, (subscription.to_text(),)
            )
        self.router.execute(actions)
        return {"op": "subscribed", "sub_id": sub_id}

    def _unsubscribe(
        self, identity: bytes, connection: ClientSession, request: UnsubscribeRequest
    ) -> dict:
        key = self._key(identity, connection, request)
        withdraw = self.router.composites.local_unsubscribe
        self.router.execute(self.table.unsubscribe(key, request.client, request.sub_id, withdraw))
        self.router.replaying.durable_unsubscribed(request.sub_id, request.moved)
        return {"op": "unsubscribed", "sub_id": request.sub_id}

    def _adopt(self, identity: bytes, connection: ClientSession, request: AdoptRequest) -> dict:
        key = self._key(identity, connection, request)
        core, composites = self.router.node.core, self.router.composites
        actions = adopt(core, self.table, key, request.client, request.sub_id, composites)
        if request.durable is not None:
            self.router.replaying.durable_attach(
                request.client, request.durable, key, request.sub_id, ()
            )
        self.counters["moves.adopted"] += 1
        self.router.execute(actions)
        return {"op": "adopted", "sub_id": request.sub_id}

    def _advertise(
        self, identity: bytes, connection: ClientSession, request: AdvertiseRequest
    ) -> dict:
        """An advertisement (DESIGN §12): it spreads, and the client may publish what it
        matches; it is withdrawn when the client's connection goes."""
        key = self._key(identity, connection, request)
        adv_id, actions = advertise(self.router.node.core, key, as_filter(request.filter))
        self.router.execute(actions)
        return {"op": "advertised", "adv_id": adv_id}

    # -- replays and durable records (DESIGN §11) ---------------------------------------------

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

    # -- publications --------------------------------------------------------------------

    def _publish(
        self, identity: bytes, connection: ClientSession, request: PublishRequest
    ) -> dict | None:
        problem = stamp_problem(request.seq, float(request.published_at))
        if problem is not None:
            raise ClientError(problem)
        problem = self.outbox.flow.refuse_body(len(request.body))
        if problem is not None:
            raise ClientError(problem)
        text = request.publication
        publication = (
            parse_publication(text) if isinstance(text, str) else validate_publication(text)
        )
        problem = self.outbox.flow.refuse_publication(connection.unanswered)
        if problem is not None:
            raise ClientError(problem)
        key = self._key(identity, connection, request)
        check_advertised(self.router.node.core, key, publication)
        self.connections.publishers.add(key)
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
