"""The client requests of a broker process (DESIGN §4, §11, §12): one handler per request
of :mod:`octopis.wire`, each returning the reply (None: it follows later). What each
request may do, what is refused and what the client is told are the node's rules
(:mod:`octopis.core.client_requests`); a handler decodes, asks them, and carries out
what they say: the actions, the durable records written, a replay started, a
publication's receipt.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from msgspec.structs import replace

from octopis.core import Notification
from octopis.core import client_requests as rules
from octopis.core.client_requests import DurableRequest
from octopis.core.durable import claim_of
from octopis.core.replay import check_replay_filters
from octopis.core.sessions import check_advertised
from octopis.transport.connections import ClientConnections, ClientError, ClientSession, Router
from octopis.transport.outbox import ClientOutbox
from octopis.wire import pack, stamp_problem
from octopis.wire.client import (
    AckedReply,
    AckRequest,
    AdoptedReply,
    AdoptRequest,
    AdvertisedReply,
    AdvertiseRequest,
    AliveReply,
    ByeReply,
    ByeRequest,
    ClaimingReply,
    ClaimRequest,
    HeartbeatRequest,
    HelloRequest,
    PublishRequest,
    ReplayingReply,
    ReplayRequest,
    Reply,
    Request,
    SubscribedReply,
    SubscribeRequest,
    UnsubscribedReply,
    UnsubscribeRequest,
    WelcomeReply,
)

Handler = Callable[[bytes, ClientSession, Request], "Reply | None"]


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

    def _hello(self, identity: bytes, connection: ClientSession, request: HelloRequest) -> Reply:
        return WelcomeReply(**self.router.welcome)

    def _heartbeat(self, identity: bytes, connection: ClientSession, request: Request) -> Reply:
        return AliveReply()

    def _bye(self, identity: bytes, connection: ClientSession, request: Request) -> Reply:
        self.connections.drop(identity, "it said bye", left=True)
        return ByeReply()

    # -- subscriptions (the rules: octopis.core.client_requests) ----------------------------

    def _durable(self, key: str, name: str | None) -> DurableRequest | None:
        return None if name is None else DurableRequest(self.router.replaying.durables, name, key)

    def _subscribe(
        self, identity: bytes, connection: ClientSession, request: SubscribeRequest
    ) -> Reply:
        key = self._key(identity, connection, request)
        durable = self._durable(key, request.durable)
        local_subscribe = self.router.composites.local_subscribe
        sub_id, actions = rules.subscribe(
            self.table, key, request.client, request.filter, local_subscribe, time.time(), durable
        )
        if durable is not None:
            self.router.replaying.save_durables()
        self.router.execute(actions)
        return SubscribedReply(sub_id=sub_id)

    def _unsubscribe(
        self, identity: bytes, connection: ClientSession, request: UnsubscribeRequest
    ) -> Reply:
        key = self._key(identity, connection, request)
        withdraw, replaying = self.router.node.withdraw, self.router.replaying
        actions, claim = rules.unsubscribe(
            self.table,
            key,
            request.client,
            request.sub_id,
            withdraw,
            replaying.durables,
            request.moved,
        )
        self.router.execute(actions)
        replaying.save_durables()
        if claim is not None:  # another copy of its record is claimed, nobody answered
            replaying.start(None, [], [], time.time(), claim=claim)
        return UnsubscribedReply(sub_id=request.sub_id)

    def _adopt(self, identity: bytes, connection: ClientSession, request: AdoptRequest) -> Reply:
        key = self._key(identity, connection, request)
        core, composites = self.router.node.core, self.router.composites
        durable = self._durable(key, request.durable)
        actions = rules.adopt(
            core, self.table, key, request.client, request.sub_id, composites, durable, time.time()
        )
        if durable is not None:
            self.router.replaying.save_durables()
        self.counters["moves.adopted"] += 1
        self.router.execute(actions)
        return AdoptedReply(sub_id=request.sub_id)

    def _advertise(
        self, identity: bytes, connection: ClientSession, request: AdvertiseRequest
    ) -> Reply:
        """An advertisement (DESIGN §12): it spreads, and the client may publish what it
        matches; it is withdrawn when the client's connection goes."""
        key = self._key(identity, connection, request)
        adv_id, actions = rules.advertise(self.router.node.core, key, request.filter)
        self.router.execute(actions)
        return AdvertisedReply(adv_id=adv_id)

    # -- replays and durable records (DESIGN §11) ---------------------------------------------

    def _replay(self, identity: bytes, connection: ClientSession, request: ReplayRequest) -> Reply:
        check_replay_filters(request.filters)
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
        return ReplayingReply(id=req_id)

    def _claim(self, identity: bytes, connection: ClientSession, request: ClaimRequest) -> Reply:
        key = self._key(identity, connection, request)
        req_id = self.router.replay(
            key, [], [], 0.0, claim=claim_of(request.client, request.durable)
        )
        return ClaimingReply(id=req_id)

    def _ack(self, identity: bytes, connection: ClientSession, request: AckRequest) -> Reply:
        records = self.router.replaying.durables
        rules.acknowledge(
            records, request.client, request.durable, request.since, time.time(), request.after
        )
        return AckedReply()

    # -- publications --------------------------------------------------------------------

    def _publish(
        self, identity: bytes, connection: ClientSession, request: PublishRequest
    ) -> Reply | None:
        problem = stamp_problem(request.seq, float(request.published_at))
        if problem is not None:  # the wire's bounds (decoding)
            raise ClientError(problem)
        flow, publication, unanswered = self.outbox.flow, request.publication, connection.unanswered
        publication = rules.admit_publication(
            flow, publication, len(request.body), unanswered.count
        )
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

        def answered() -> None:
            answer = rules.published(request.seq, receipt.refusal)
            self.outbox.send(identity, [pack(replace(answer, req=request.req))])

        receipt = unanswered.receipt(answered)
        self.router.publish(n, receipt)
        return None if unanswered.waits(receipt) else rules.published(request.seq)
