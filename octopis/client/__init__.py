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

from octopis.client.blocking import BlockingPublisher, BlockingStream, BlockingSubscriber
from octopis.client.composite import CompositeNotification
from octopis.client.connection import (
    DEFAULT_LIVENESS,
    READ_BATCH,
    BrokerError,
    Connection,
    ConnectionGroup,
    DeliveryKey,
    DroppedError,
    NamedClient,
    NotificationHandler,
    Received,
    Resume,
)
from octopis.client.publisher import Publisher
from octopis.client.subscriber import CompositeStream, Subscriber, SubscriptionStream

__all__ = [
    "DEFAULT_LIVENESS",
    "READ_BATCH",
    "BlockingPublisher",
    "BlockingStream",
    "BlockingSubscriber",
    "BrokerError",
    "CompositeNotification",
    "CompositeStream",
    "Connection",
    "ConnectionGroup",
    "DeliveryKey",
    "DroppedError",
    "NamedClient",
    "NotificationHandler",
    "Publisher",
    "Received",
    "Resume",
    "Subscriber",
    "SubscriptionStream",
]
