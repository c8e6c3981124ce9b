"""A subscriber's streams (DESIGN §4, §11, §12): an async iterator per subscription over
what the broker delivers for it, holding deliveries against its subscriber's buffer until
the application takes them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Protocol

from octopis.client.composite import composite_notification
from octopis.client.deliveries import Received
from octopis.client.errors import DroppedError
from octopis.client.replay import History
from octopis.filters.composite import Composite
from octopis.filters.language import Publication, Subscription
from octopis.wire import pack
from octopis.wire.client import CompositeDroppedNotice, CompositeNotice


class StreamOwner(Protocol):
    """What a stream needs of its subscriber."""

    name: str

    def hold(self, size: int) -> None:
        """A delivery of ``size`` bytes is held in a stream."""

    def taken(self, size: int) -> None:
        """The application took a delivery of ``size`` bytes."""

    def took(self, durable: str, received: Received) -> None:
        """The application took ``received`` of durable subscription ``durable``."""

    async def unsubscribe(self, stream: SubscriptionStream, timeout: float = 10.0) -> None:
        """Withdraw ``stream``'s subscription."""


class EndOfHistory(Exception):
    """A historic subscription (one with ``until``) has delivered its whole answer; its
    stream's :attr:`~SubscriptionStream.history` says whether anything is missing."""


class SubscriptionStream:
    """An async iterator over the notifications delivered to its subscriber (the broker
    delivers each matching notification once per subscriber, DESIGN §3). What it holds
    counts against its subscriber's ``buffer`` and ``buffer_bytes``."""

    def __init__(
        self,
        owner: StreamOwner,
        sub_id: str,
        subscription: Subscription | Composite,
        durable: str | None = None,
    ) -> None:
        self.owner = owner
        self.sub_id = sub_id
        self.subscription = subscription
        self.durable = durable
        """The durable subscription's name (None: not durable); what the application
        takes from this stream is acknowledged to the broker."""
        self.history: History | None = None
        """For a historic, hybrid or durable subscription: the end of its answer (is it
        complete, and if not, what is missing)."""
        self.unconfirmed: tuple[str, ...] = ()
        """Subscribed with ``everywhere``: the brokers that did not answer in time (the
        subscription may not reach past them); empty: in place at every broker."""
        self.queue: asyncio.Queue[tuple[Received | Exception, int]] = asyncio.Queue()

    def matches(self, publication: Publication) -> bool:
        """Whether a delivery of ``publication`` is this stream's: its subscriber may hold
        several subscriptions, and the broker delivers a publication once per client."""
        subscription = self.subscription
        return not isinstance(subscription, Subscription) or subscription.matches(publication)

    def offer(self, received: Received, size: int) -> None:
        """Queue a delivery of ``size`` encoded bytes (held until taken)."""
        self.queue.put_nowait((received, size))
        self.owner.hold(size)

    def end_history(self, items: list[Received], history: History) -> None:
        """A historic subscription's whole answer (bounded by the request, not counted
        in the subscriber's buffer), then :class:`EndOfHistory`."""
        self.history = history
        for received in items:
            self.queue.put_nowait((received, -1))
        self.queue.put_nowait((EndOfHistory(f"history {history.replay} delivered"), 0))

    def end(self, error: DroppedError) -> None:
        """After what is queued, every :meth:`get` raises ``error``."""
        self.queue.put_nowait((error, 0))

    def release(self) -> None:
        """Give up what is still queued (the subscription was withdrawn)."""
        while not self.queue.empty():
            item, size = self.queue.get_nowait()
            if not isinstance(item, Exception) and size >= 0:
                self.owner.taken(size)

    def __aiter__(self) -> AsyncIterator[Received]:
        return self

    async def __anext__(self) -> Received:
        try:
            return await self.get()
        except EndOfHistory:
            raise StopAsyncIteration from None

    async def get(self, timeout: float | None = None) -> Received:
        """The next notification, waiting at most ``timeout`` seconds; raises
        :class:`DroppedError` after the last one if the broker dropped the connection,
        and :class:`EndOfHistory` after a historic subscription's last one."""
        item, size = await asyncio.wait_for(self.queue.get(), timeout)
        if isinstance(item, Exception):
            self.queue.put_nowait((item, 0))  # every later call raises too
            raise item
        if size >= 0:
            self.owner.taken(size)
        if self.durable is not None:
            self.owner.took(self.durable, item)
        return item

    async def unsubscribe(self) -> None:
        """Withdraw this subscription."""
        await self.owner.unsubscribe(self)


class CompositeStream(SubscriptionStream):
    """The stream of a composite subscription (DESIGN §12): one
    :class:`~octopis.client.composite.CompositeNotification` per match. ``dropped``,
    ``late`` and ``cut`` are the latest totals its host's join reported (see there)."""

    dropped = 0
    late = 0
    cut = 0

    def notice(self, message: CompositeNotice | CompositeDroppedNotice) -> None:
        """A ``composite`` or ``composite_dropped`` notice for this subscription."""
        self.dropped = max(self.dropped, message.dropped)
        self.late = max(self.late, message.late)
        self.cut = max(self.cut, message.cut)
        if type(message) is CompositeNotice:
            match = composite_notification(self.owner.name, message, time.time())
            self.offer(match, len(pack(message)))  # type: ignore[arg-type]
