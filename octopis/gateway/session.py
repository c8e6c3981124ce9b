"""One STOMP connection as a client session of its broker, sans-IO (DESIGN §13).

:class:`StompSession` turns the client's frames into the broker's client requests
(:mod:`octopis.wire`, the requests the SDK sends) and the broker's replies and deliveries
back into frames. The listener moves the bytes, and hands the requests to the broker's
client sessions, which treat the connection like any other: the same limits, publish
window, slow-consumer policy, liveness and counters.

Mapping:

* ``SEND`` to ``/topic/NAME`` → one publication of class NAME (headers typed by
  :mod:`octopis.gateway.headers`) whose opaque body is the frame's body (delivered
  unchanged in each ``MESSAGE``, with its ``content-length``); a ``receipt`` is answered
  once the broker confirms the publication (custody, as the SDK's ``publish`` waits
  for).
* ``SUBSCRIBE`` (``id``, ``destination``, ``selector``, ``ack``) → the selector's PADRES
  subscriptions (:func:`octopis.gateway.selector.translate`), all under one client name
  on the connection, so a message that several of them match is delivered once; a
  ``receipt`` is answered once every one of them is in place at this broker — or, with
  ``octopis.everywhere:true``, at every broker they travel to (an empty replay round
  sent behind them: its echo comes back once every broker has them, DESIGN §11).
* ``SUBSCRIBE`` with ``activemq.subscriptionName`` (ActiveMQ's durable subscription; the
  CONNECT must have named a ``client-id``) → the same, durable
  (:mod:`octopis.gateway.durable`): what the client did not acknowledge when it went
  away, and what was published meanwhile, is delivered when it subscribes again, at
  any broker.
* ``UNSUBSCRIBE`` withdraws them (a durable subscription ends); ``DISCONNECT`` is
  answered (its receipt) and closed; ``ACK``/``NACK`` settle messages of ``client``
  (cumulative) and ``client-individual`` subscriptions, at most ``unacked`` of them
  outstanding per connection.

Refused with an ERROR frame, then closed (the specification's way): a frame before
CONNECT, a wrong login, a selector without an exact form, a bad destination or header,
transactions, a durable subscription without a ``client-id``, and any refusal by the
broker (a body longer than its ``[clients] body_bytes`` among them).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from octopis.gateway.durable import DurableRefusal, DurableSubscription, key_of
from octopis.gateway.frames import (
    Frame,
    FrameError,
    encode_tail,
    error_frame,
    header_lines,
    negotiate,
)
from octopis.gateway.headers import HeaderError, headers_of, publication_of, topic_of
from octopis.gateway.selector import SelectorError, translate
from octopis.wire import MAX_CLIENT_NAME, pack, unpack
from octopis.wire.client import (
    BrokerMessage,
    ClaimingReply,
    DroppedNotice,
    ErrorReply,
    PublishedReply,
    PublishRequest,
    ReplayDoneNotice,
    ReplayedNotice,
    ReplayingReply,
    ReplayRequest,
    ReplyError,
    SubscribedReply,
    SubscribeRequest,
    UnsubscribedReply,
    UnsubscribeRequest,
    WithdrawnNotice,
    decode_reply,
    read_notify,
)

ACK_MODES = ("auto", "client", "client-individual")
EVERYWHERE_HEADER = "octopis.everywhere"
"""SUBSCRIBE header: ``true`` answers the receipt once every broker has the subscription."""
DURABLE_HEADERS = ("activemq.subscriptionName", "durable-subscription-name")
"""SUBSCRIBE headers naming a durable subscription (ActiveMQ's, and its older name)."""
SERVER_NAME = "OctopiS"
CACHED_NOTIFICATIONS = 4096
"""Notifications whose MESSAGE parts :class:`DeliveryCache` keeps (a send pass's worth)."""


@dataclass(frozen=True)
class SessionLimits:
    """Bounds of one STOMP connection (``[stomp]`` subscriptions, selector_subscriptions,
    unacked, heartbeat)."""

    subscriptions: int
    """STOMP subscriptions one connection may hold."""
    selector_subscriptions: int
    """PADRES subscriptions one selector may become."""
    unacked: int
    """Messages delivered and not acknowledged, per connection (client ack modes)."""
    heart_beat: tuple[int, int]
    """What the server offers in CONNECTED: (sends every, wants every) in ms."""


class StompRefusal(ValueError):
    """A frame the session refuses; the connection gets an ERROR frame and is closed."""


@dataclass
class Effects:
    """What handling one input asks of the listener."""

    frames: list[Frame] = field(default_factory=list)
    """Frames to send to the client, in order."""
    requests: list[bytes] = field(default_factory=list)
    """Requests for the broker's client sessions, in order."""
    close: bool = False
    """Close the connection once the frames are out."""
    gaps: list[tuple[str, str]] = field(default_factory=list)
    """Durable subscriptions' gaps to log: (client, why)."""


@dataclass
class _Subscription:
    id: str
    name: str
    ack: str
    waiting: int
    receipt: str | None
    sub_ids: list[str] = field(default_factory=list)
    durable: DurableSubscription | None = None
    everywhere: tuple[list[str], float] | None = None
    """The filters and the time of the round that asks every broker, if asked for."""


class DeliveryCache:
    """The header lines, opaque body and encoded tail of the notifications being delivered,
    made once for every STOMP connection of a broker they go to (one asyncio loop: no
    locking). A send pass hands each connection its deliveries in turn, so the last
    :data:`CACHED_NOTIFICATIONS` notifications are kept (the oldest made room for)."""

    def __init__(self) -> None:
        self._made: OrderedDict[tuple[bytes, str], tuple[str, bytes, bytes]] = OrderedDict()

    def lines(self, body: bytes, version: str) -> tuple[str, bytes, bytes]:
        """The escaped header lines of the NOTIFY ``body``'s publication, its opaque body,
        and the bytes that end each MESSAGE of it (:attr:`Frame.tail`)."""
        key = (body, version)
        made = self._made.get(key)
        if made is None:
            notification = read_notify(body)
            shared = header_lines(headers_of(notification.publication), "MESSAGE", version)
            opaque = notification.body
            made = (shared, opaque, encode_tail(shared, opaque))
            self._made[key] = made
            if len(self._made) > CACHED_NOTIFICATIONS:
                self._made.popitem(last=False)
        return made


class StompSession:
    """The protocol state of one STOMP connection.

    ``authenticate(login, passcode)`` returns None when the CONNECT may proceed, else the
    reason it may not. ``session`` numbers the publisher's session (random, as the SDK's).
    """

    def __init__(
        self,
        authenticate: Callable[[str | None, str | None], str | None],
        session: int,
        limits: SessionLimits,
        cache: DeliveryCache | None = None,
    ) -> None:
        self.authenticate = authenticate
        self.limits = limits
        self.cache = cache or DeliveryCache()
        self.session = session
        self.version: str | None = None
        self.send_every = 0
        self.expect_every = 0
        self._req = itertools.count(1)
        self._seq = itertools.count(1)
        self._message_ids = itertools.count(1)
        self.unanswered = 0
        """Publications sent to the broker and not yet answered."""
        self._publish_receipts: dict[int, str | None] = {}
        self._subscribing: dict[int, _Subscription] = {}
        self._unsubscribing: dict[int, tuple[_Subscription, list[str | None]]] = {}
        self.subscriptions: dict[str, _Subscription] = {}
        self._by_name: dict[str, _Subscription] = {}
        self._unacked: OrderedDict[str, str] = OrderedDict()  # ack id -> subscription id
        self._durable_reqs: dict[int, _Subscription] = {}  # a claim's or replay's request
        self._durable_ids: dict[str, _Subscription] = {}  # a claim's or replay's id
        self._probes: dict[int | str, _Subscription] = {}  # an everywhere round's req, id
        self.publisher = "stomp-publisher"
        self.client_id: str | None = None

    @property
    def connected(self) -> bool:
        """Whether CONNECT has been accepted."""
        return self.version is not None

    # -- frames from the client -----------------------------------------------------------

    def received(self, frame: Frame, now: float) -> Effects:
        """Handle one frame from the client (``now``: the real-time clock, seconds)."""
        out = Effects()
        try:
            if not self.connected:
                self._connect(frame, out)
            else:
                handler = self._handlers.get(frame.command)
                if handler is None:
                    raise StompRefusal(f"{frame.command} is not supported here")
                handler(self, frame, out, now)
        except (StompRefusal, FrameError, HeaderError, SelectorError) as exc:
            out.frames.append(error_frame(str(exc), frame.headers.get("receipt")))
            out.close = True
        return out

    def _connect(self, frame: Frame, out: Effects) -> None:
        if frame.command not in ("CONNECT", "STOMP"):
            raise StompRefusal(f"expected CONNECT or STOMP as the first frame, got {frame.command}")
        negotiated = negotiate(frame.headers, self.limits.heart_beat)
        problem = self.authenticate(frame.headers.get("login"), frame.headers.get("passcode"))
        if problem is not None:
            raise StompRefusal(problem)
        self.version = negotiated.version
        self.send_every = negotiated.send_every
        self.expect_every = negotiated.expect_every
        client_id = frame.headers.get("client-id")
        if client_id:
            self.publisher = f"stomp:{client_id}"[:200]
            self.client_id = client_id
        headers = {"version": self.version, "server": SERVER_NAME}
        if self.version != "1.0":
            sx, sy = self.limits.heart_beat
            headers["heart-beat"] = f"{sx},{sy}"
        out.frames.append(Frame("CONNECTED", headers))

    def _send(self, frame: Frame, out: Effects, now: float) -> None:
        if "transaction" in frame.headers:
            raise StompRefusal("transactions are not supported")
        publication = publication_of(frame.headers)
        req = next(self._req)
        self._publish_receipts[req] = frame.headers.get("receipt")
        self.unanswered += 1
        request = PublishRequest(
            client=self.publisher,
            req=req,
            seq=next(self._seq),
            published_at=now,
            publication=publication,
            session=self.session,
            body=frame.body,
        )
        out.requests.append(pack(request))

    def _subscribe(self, frame: Frame, out: Effects, now: float) -> None:
        h = frame.headers
        sub_id = h.get("id", h.get("destination", "") if self.version == "1.0" else None)
        if not sub_id:
            raise StompRefusal("SUBSCRIBE needs an 'id' header")
        if sub_id in self.subscriptions:
            raise StompRefusal(f"subscription id {sub_id[:80]!r} is in use on this connection")
        if len(self.subscriptions) >= self.limits.subscriptions:
            raise StompRefusal(
                f"this connection holds {self.limits.subscriptions} subscriptions "
                "(stomp.subscriptions)"
            )
        ack = h.get("ack", "auto")
        if ack not in ACK_MODES:
            raise StompRefusal(f"ack mode {ack[:40]!r} is not one of {', '.join(ACK_MODES)}")
        durable = next((h[d] for d in DURABLE_HEADERS if d in h), None)
        name = f"stomp/{sub_id}"[:256] if durable is None else self._durable_name(durable)
        topic = topic_of(h.get("destination"))
        filters = [
            f.to_text()
            for f in translate(h.get("selector"), topic, self.limits.selector_subscriptions)
        ]
        sub = _Subscription(sub_id, name, ack, len(filters), h.get("receipt"))
        if h.get(EVERYWHERE_HEADER) == "true" and filters:
            sub.everywhere = (filters, now)
        if durable is not None:
            sub.durable = DurableSubscription(name, filters, self.limits.unacked)
        self.subscriptions[sub_id] = sub
        self._by_name[sub.name] = sub
        for i, text in enumerate(filters):
            req = next(self._req)
            self._subscribing[req] = sub
            request = SubscribeRequest(
                client=sub.name, req=req, filter=text, durable=None if durable is None else str(i)
            )
            out.requests.append(pack(request))
        if not filters:  # a selector that is never true
            if sub.durable is not None:
                sub.durable.step = "live"
            if sub.receipt is not None:
                out.frames.append(Frame("RECEIPT", {"receipt-id": sub.receipt}))

    def _durable_name(self, durable: str) -> str:
        """The client name of durable subscription ``durable`` of this client."""
        if not self.client_id:
            raise StompRefusal(
                "a durable subscription (activemq.subscriptionName) needs a client-id "
                "header on CONNECT"
            )
        name = f"stomp:{self.client_id}/{durable}"
        if len(name) > MAX_CLIENT_NAME:
            raise StompRefusal(
                f"client-id and subscription name together are over {MAX_CLIENT_NAME} characters"
            )
        if name in self._by_name:
            raise StompRefusal(
                f"durable subscription {durable[:80]!r} is in use on this connection"
            )
        return name

    def _unsubscribe(self, frame: Frame, out: Effects, now: float) -> None:
        h = frame.headers
        sub_id = h.get("id", h.get("destination", "") if self.version == "1.0" else None)
        sub = self.subscriptions.pop(sub_id or "", None)
        if sub is None:
            raise StompRefusal(f"no subscription {str(sub_id)[:80]!r} on this connection")
        self._by_name.pop(sub.name, None)
        receipt = h.get("receipt")
        waiting: list[str | None] = [receipt]
        for padres_id in sub.sub_ids:
            req = next(self._req)
            self._unsubscribing[req] = (sub, waiting)
            request = UnsubscribeRequest(client=sub.name, req=req, sub_id=padres_id)
            out.requests.append(pack(request))
        sub.sub_ids = []
        if len(self._unsubscribing_of(waiting)) == 0 and receipt is not None:
            out.frames.append(Frame("RECEIPT", {"receipt-id": receipt}))

    def _unsubscribing_of(self, waiting: list[str | None]) -> list[int]:
        return [req for req, (_, w) in self._unsubscribing.items() if w is waiting]

    def _ack(self, frame: Frame, out: Effects, now: float) -> None:
        h = frame.headers
        ack_id = h.get("id") if self.version == "1.2" else h.get("message-id")
        if ack_id is None or ack_id not in self._unacked:
            raise StompRefusal(f"{frame.command} of {str(ack_id)[:80]!r}: no such message waits")
        sub = self.subscriptions.get(self._unacked[ack_id])
        settled = [ack_id]
        if sub is not None and sub.ack == "client":  # cumulative: this and every earlier one
            earlier = [a for a, s in self._unacked.items() if s == sub.id]
            settled = earlier[: earlier.index(ack_id) + 1]
        for settled_id in settled:
            del self._unacked[settled_id]
        if sub is not None and sub.durable is not None:  # NACK settles too: not again
            out.requests += sub.durable.settled(settled)
        if "receipt" in h:
            out.frames.append(Frame("RECEIPT", {"receipt-id": h["receipt"]}))

    def _disconnect(self, frame: Frame, out: Effects, now: float) -> None:
        if "receipt" in frame.headers:
            out.frames.append(Frame("RECEIPT", {"receipt-id": frame.headers["receipt"]}))
        out.close = True

    _handlers: ClassVar[dict[str, Callable[[StompSession, Frame, Effects, float], None]]] = {
        "SEND": _send,
        "SUBSCRIBE": _subscribe,
        "UNSUBSCRIBE": _unsubscribe,
        "ACK": _ack,
        "NACK": _ack,
        "DISCONNECT": _disconnect,
    }

    # -- messages from the broker ---------------------------------------------------------

    def from_broker(self, parts: list[bytes]) -> Effects:
        """Handle one message the broker sends this connection: a reply ``[reply]`` or
        deliveries ``[names, body, names, body, ...]``."""
        out = Effects()
        try:
            if len(parts) == 1:
                self._reply(decode_reply(parts[0]), out)
                return out
            touched: set[DurableSubscription] = set()
            for i in range(0, len(parts) - 1, 2):
                for name in unpack(parts[i]):
                    sub = self._by_name.get(name)
                    if sub is None:  # unsubscribed meanwhile
                        continue
                    if sub.durable is None:
                        self._message(sub, parts[i + 1], out)
                    elif sub.durable.holding:
                        sub.durable.hold(parts[i + 1])
                    elif sub.durable.first_time(key_of(parts[i + 1])):
                        self._message(sub, parts[i + 1], out)
                        touched.add(sub.durable)
            for durable in touched:
                out.requests += durable.advance()
        except (DurableRefusal, ReplyError) as exc:  # a reply unread: the session cannot go on
            out.frames.append(error_frame(str(exc)))
            out.close = True
        return out

    def _message(self, sub: _Subscription, notify: bytes, out: Effects) -> None:
        """Send the NOTIFY body ``notify`` to ``sub`` as a MESSAGE."""
        shared, body, tail = self.cache.lines(notify, self.version or "1.0")
        message_id = str(next(self._message_ids))
        headers = {"subscription": sub.id, "message-id": message_id}
        if sub.ack != "auto":
            if len(self._unacked) >= self.limits.unacked:
                out.frames.append(
                    error_frame(
                        f"{len(self._unacked)} messages wait for ACK (stomp.unacked): "
                        "acknowledge what was received"
                    )
                )
                out.close = True
                return
            self._unacked[message_id] = sub.id
            if self.version == "1.2":
                headers["ack"] = message_id
        if sub.durable is not None:
            sub.durable.sent(notify, message_id, acked=sub.ack == "auto")
        out.frames.append(Frame("MESSAGE", headers, body, shared=shared, tail=tail))

    def _reply(self, reply: BrokerMessage, out: Effects) -> None:
        kind, req = type(reply), getattr(reply, "req", None)
        if kind is PublishedReply and req in self._publish_receipts:
            self.unanswered -= 1
            receipt = self._publish_receipts.pop(req)
            if receipt is not None:
                out.frames.append(Frame("RECEIPT", {"receipt-id": receipt}))
        elif kind is SubscribedReply and req in self._subscribing:
            self._subscribed(self._subscribing.pop(req), reply.sub_id, out)
        elif kind is ReplayingReply and req in self._probes:
            self._probes[reply.id] = self._probes.pop(req)
        elif kind is ReplayDoneNotice and reply.id in self._probes:
            sub = self._probes.pop(reply.id)
            if sub.receipt is not None:
                headers = {"receipt-id": sub.receipt}
                if reply.silent:  # brokers past which it may not have reached
                    headers["octopis-silent"] = ",".join(reply.silent)
                out.frames.append(Frame("RECEIPT", headers))
        elif kind in (ClaimingReply, ReplayingReply) and req in self._durable_reqs:
            self._durable_ids[reply.id] = self._durable_reqs.pop(req)
        elif kind in (ReplayedNotice, ReplayDoneNotice) and reply.id in self._durable_ids:
            self._durable_notice(reply, out)
        elif kind is WithdrawnNotice and reply.client in self._by_name:
            out.frames.append(
                error_frame("this durable subscription was claimed by another connection")
            )
            out.close = True
        elif kind is UnsubscribedReply and req in self._unsubscribing:
            _, waiting = self._unsubscribing.pop(req)
            if not self._unsubscribing_of(waiting) and waiting[0] is not None:
                out.frames.append(Frame("RECEIPT", {"receipt-id": waiting[0]}))
        elif kind is ErrorReply or kind is DroppedNotice:
            receipt = self._publish_receipts.get(req) if req is not None else None
            message = reply.message if kind is ErrorReply else reply.reason
            out.frames.append(error_frame(message or "refused by the broker", receipt))
            out.close = True

    def _subscribed(self, sub: _Subscription, sub_id: str, out: Effects) -> None:
        """The broker made one of ``sub``'s subscriptions, as ``sub_id``."""
        sub.waiting -= 1
        if self.subscriptions.get(sub.id) is sub:
            sub.sub_ids.append(sub_id)
        else:  # unsubscribed before the broker answered: withdraw it now
            unsub = UnsubscribeRequest(client=sub.name, sub_id=sub_id)
            out.requests.append(pack(unsub))
        if sub.waiting == 0 and sub.everywhere is not None:
            self._probe(sub, out)
        elif sub.waiting == 0 and sub.receipt is not None:
            out.frames.append(Frame("RECEIPT", {"receipt-id": sub.receipt}))
        if sub.waiting == 0 and sub.durable is not None and sub.durable.step == "subscribing":
            for claim_req, claim in sub.durable.claims(self._req):
                self._durable_reqs[claim_req] = sub
                out.requests.append(claim)

    def _durable_notice(self, notice: ReplayedNotice | ReplayDoneNotice, out: Effects) -> None:
        """A claim's or a replay's answer for a durable subscription."""
        sub = self._durable_ids[notice.id]
        durable = sub.durable
        assert durable is not None
        if type(notice) is ReplayedNotice:
            durable.replayed += notice.bodies
            return
        del self._durable_ids[notice.id]
        if durable.step == "claiming":
            req = next(self._req)
            out.requests += durable.claim_done(notice, req)
            if durable.gap is not None:
                out.gaps.append((durable.client, durable.gap))
            if durable.step == "replaying":
                self._durable_reqs[req] = sub
            if durable.step != "live":
                return
        if self.subscriptions.get(sub.id) is sub:  # the past, then what waited for it
            for body in durable.replay_done():
                self._message(sub, body, out)
            out.requests += durable.advance()

    def _probe(self, sub: _Subscription, out: Effects) -> None:
        """Ask every broker behind ``sub``'s subscriptions: a replay round of an empty
        window, whose echo comes once every broker they travel to has them."""
        assert sub.everywhere is not None
        filters, at = sub.everywhere
        req = next(self._req)
        self._probes[req] = sub
        probe = ReplayRequest(
            client=sub.name, req=req, filters=filters, since=[], after=at, until=at
        )
        out.requests.append(pack(probe))
