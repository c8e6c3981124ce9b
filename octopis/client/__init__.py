"""Publisher/subscriber SDK (DESIGN §4): asyncio first, a blocking wrapper beside it.

A client connects to one broker's client socket, by the broker's id in a running overlay
(found through the run directory of ``octopis up`` or a topology file, which also give
the keys and the brokers to fail over to) or by endpoint. Several named clients may share
one :class:`Connection` (``octopis run`` attaches thousands of subscribers this way).

Protocol: :mod:`octopis.wire.client` (requests, replies and notices are maps tagged by
``op``, each declared there; replies echo ``req``; a refusal is an ``error`` reply and
raises :class:`BrokerError`; a delivery is ``[names, NOTIFY body]``). The SDK trusts the
broker's match: a subscriber receives each notification once, whichever of its
subscriptions matched (paper §6), and every stream of that subscriber sees it.
Connections send heartbeats at a quarter of the broker's client timeout, so a live but
quiet subscriber is never dropped (DESIGN §7).

Example, after ``octopis up t.json`` (the overlay in ``.octopis``)::

    sub = await Subscriber.connect("f:2", "alice", run_dir=".octopis")
    stream = await sub.subscribe("[class,eq,'STOCK'],[symbol,eq,'MSFT']")
    pub = await Publisher.connect("a:0", "feed", run_dir=".octopis")
    await pub.publish({"class": "STOCK", "symbol": "MSFT", "close": 27.9})
    async for n in stream:
        print(n.publisher, n.seq, n.publication)

Durable, historic and hybrid subscriptions are ``subscribe`` keywords (``durable=``,
``since=``, ``until=``); their stream's :class:`History` says whether the answer from the
past is complete, and a historic one ends with :class:`EndOfHistory`.

A connection that cannot open says why (:class:`ConnectError`: :class:`HandshakeFailed`,
:class:`NotAClientSocket`, :class:`NothingListening`, :class:`NoReply`).
"""

from __future__ import annotations

from octopis.client.blocking import BlockingPublisher, BlockingStream, BlockingSubscriber
from octopis.client.composite import CompositeNotification
from octopis.client.connection import Connection, ConnectionGroup, Resume
from octopis.client.deliveries import NotificationHandler, Received
from octopis.client.errors import (
    BrokerError,
    ConnectError,
    DroppedError,
    HandshakeFailed,
    NoReply,
    NotAClientSocket,
    NothingListening,
    UnadvertisedError,
)
from octopis.client.link import READ_BATCH
from octopis.client.named import NamedClient, locate
from octopis.client.publisher import Publisher
from octopis.client.replay import History, ReplayGap, parse_time
from octopis.client.streams import CompositeStream, EndOfHistory, SubscriptionStream
from octopis.client.subscriber import Subscriber
from octopis.client_policy import DeliveryKey
from octopis.overlay import OverlayError

__all__ = [
    "READ_BATCH",
    "BlockingPublisher",
    "BlockingStream",
    "BlockingSubscriber",
    "BrokerError",
    "CompositeNotification",
    "CompositeStream",
    "ConnectError",
    "Connection",
    "ConnectionGroup",
    "DeliveryKey",
    "DroppedError",
    "EndOfHistory",
    "HandshakeFailed",
    "History",
    "NamedClient",
    "NoReply",
    "NotAClientSocket",
    "NothingListening",
    "NotificationHandler",
    "OverlayError",
    "Publisher",
    "Received",
    "ReplayGap",
    "Resume",
    "Subscriber",
    "SubscriptionStream",
    "UnadvertisedError",
    "locate",
    "parse_time",
]
