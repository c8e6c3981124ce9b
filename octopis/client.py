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

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from octopis.filters import Publication, Subscription, as_subscription
from octopis.wire import delivery_fields, pack, unpack

T = TypeVar("T")
log = logging.getLogger("octopis.client")


class BrokerError(Exception):
    """The broker refused a request; the message is the broker's."""


@dataclass(frozen=True, slots=True)
class Received:
    """A delivered notification with its accounting fields."""

    subscriber: str
    publisher: str
    seq: int
    published_at: float
    received_at: float
    publication: Publication


NotificationHandler = Callable[[str, str, int, float, Publication, float], None]
"""Called with (client name, publisher, seq, published_at, publication, received_at)."""


class Connection:
    """One DEALER connection to a broker, shared by named clients."""

    def __init__(self, endpoint: str, *, context: zmq.asyncio.Context | None = None) -> None:
        self.endpoint = endpoint
        self._ctx = context or zmq.asyncio.Context.instance()
        self.socket = self._ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.connect(endpoint)
        self._reqs = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._handlers: dict[str, NotificationHandler] = {}
        self._reader: asyncio.Task | None = None
        self._heartbeat: asyncio.Task | None = None
        self.errors: list[str] = []
        self.broker: dict[str, Any] = {}

    async def open(self, timeout: float = 10.0) -> dict[str, Any]:
        """Start reading and handshake; returns the broker's welcome."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        self.broker = await self.request({"op": "hello", "client": "-"}, timeout)
        if self._heartbeat is None:
            interval = float(self.broker.get("timeout", 10.0)) / 4
            self._heartbeat = asyncio.create_task(self._beat(interval))
        return self.broker

    async def _beat(self, interval: float) -> None:
        """Tell the broker this connection is alive, whatever its clients do."""
        while True:
            await asyncio.sleep(interval)
            await self.socket.send(pack({"op": "heartbeat", "client": "-"}))

    def register(self, name: str, handler: NotificationHandler) -> None:
        """Route deliveries for client ``name`` to ``handler``."""
        self._handlers[name] = handler

    async def request(self, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """Send a request and wait for its reply; :class:`BrokerError` on refusal."""
        req = next(self._reqs)
        future = asyncio.get_running_loop().create_future()
        self._pending[req] = future
        await self.socket.send(pack({**message, "req": req}))
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"no reply from {self.endpoint} to {message['op']} within {timeout} s"
            ) from None
        finally:
            self._pending.pop(req, None)

    async def send(self, message: dict[str, Any]) -> None:
        """Send without waiting for a reply (refusals land in :attr:`errors`)."""
        await self.socket.send(pack(message))

    async def close(self) -> None:
        """Stop reading and heartbeats, and close the socket."""
        tasks = [t for t in (self._reader, self._heartbeat) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.socket.close()

    async def _read(self) -> None:
        while True:
            parts = await self.socket.recv_multipart()
            try:
                self._on_frame(parts)
            except Exception:
                log.exception("client of %s dropped a frame it could not handle", self.endpoint)

    def _on_frame(self, parts: list[bytes]) -> None:
        if len(parts) == 2:
            now = time.time()
            publisher, seq, published_at, publication = delivery_fields(parts[1])
            for name in unpack(parts[0]):
                handler = self._handlers.get(name)
                if handler is not None:
                    handler(name, publisher, seq, published_at, publication, now)
            return
        data = unpack(parts[0])
        future = self._pending.get(data.get("req"))
        if data.get("op") == "error":
            if future is not None and not future.done():
                future.set_exception(BrokerError(data.get("message", "error")))
            else:
                self.errors.append(data.get("message", "error"))
        elif future is not None and not future.done():
            future.set_result(data)


class SubscriptionStream:
    """An async iterator over the notifications delivered to its subscriber (the broker
    delivers each matching notification once per subscriber, DESIGN §3)."""

    def __init__(self, owner: Subscriber, sub_id: str, subscription: Subscription) -> None:
        self.owner = owner
        self.sub_id = sub_id
        self.subscription = subscription
        self.queue: asyncio.Queue[Received] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[Received]:
        return self

    async def __anext__(self) -> Received:
        return await self.queue.get()

    async def get(self, timeout: float | None = None) -> Received:
        """The next notification, waiting at most ``timeout`` seconds."""
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def unsubscribe(self) -> None:
        """Withdraw this subscription."""
        await self.owner.unsubscribe(self)


class _Client:
    def __init__(self, name: str, connection: Connection) -> None:
        self.name = name
        self.connection = connection
        self._owns_connection = False

    @classmethod
    async def connect(cls, endpoint: str, name: str, **kwargs: Any) -> Any:
        """Open a connection of its own to ``endpoint`` as client ``name``."""
        connection = Connection(endpoint)
        await connection.open()
        client = cls(name, connection, **kwargs)
        client._owns_connection = True
        return client

    async def close(self) -> None:
        """Close the connection if this client opened it."""
        if self._owns_connection:
            await self.connection.close()


class Subscriber(_Client):
    """A named subscriber. ``on_notification`` (if given) receives every delivery instead
    of the per-subscription streams (used for bulk accounting)."""

    def __init__(
        self,
        name: str,
        connection: Connection,
        on_notification: Callable[[Received], None] | None = None,
    ) -> None:
        super().__init__(name, connection)
        self._streams: dict[str, SubscriptionStream] = {}
        self._callback = on_notification
        connection.register(name, self._on_notify)

    async def subscribe(
        self, spec: str | dict | Subscription, timeout: float = 10.0
    ) -> SubscriptionStream:
        """Subscribe (PADRES text, dict form or :class:`Subscription`); returns its stream."""
        subscription = as_subscription(spec)
        reply = await self.connection.request(
            {"op": "subscribe", "client": self.name, "filter": subscription.to_text()}, timeout
        )
        stream = SubscriptionStream(self, reply["sub_id"], subscription)
        self._streams[stream.sub_id] = stream
        return stream

    async def unsubscribe(self, stream: SubscriptionStream | str, timeout: float = 10.0) -> None:
        """Withdraw a subscription by stream or id."""
        sub_id = stream if isinstance(stream, str) else stream.sub_id
        await self.connection.request(
            {"op": "unsubscribe", "client": self.name, "sub_id": sub_id}, timeout
        )
        self._streams.pop(sub_id, None)

    def _on_notify(
        self,
        name: str,
        publisher: str,
        seq: int,
        published_at: float,
        publication: Publication,
        received_at: float,
    ) -> None:
        received = Received(name, publisher, seq, published_at, received_at, publication)
        if self._callback is not None:
            self._callback(received)
            return
        for stream in self._streams.values():
            stream.queue.put_nowait(received)


class Publisher(_Client):
    """A named publisher numbering its notifications 1, 2, 3, ..."""

    def __init__(self, name: str, connection: Connection) -> None:
        super().__init__(name, connection)
        self.seq = 0

    async def publish(
        self,
        publication: Publication | str,
        *,
        wait: bool = True,
        seq: int | None = None,
        timeout: float = 10.0,
    ) -> int:
        """Publish; returns the sequence number.

        With ``wait`` the broker's acceptance is awaited (a refusal raises
        :class:`BrokerError`); without it refusals collect in ``connection.errors`` and
        :meth:`flush` waits for everything sent so far to be handled.
        """
        self.seq = seq if seq is not None else self.seq + 1
        message = {
            "op": "publish",
            "client": self.name,
            "seq": self.seq,
            "published_at": time.time(),
            "publication": publication,
        }
        if wait:
            await self.connection.request(message, timeout)
        else:
            await self.connection.send(message)
        return self.seq

    async def flush(self, timeout: float = 30.0) -> None:
        """Return once the broker has handled every publish sent before this call."""
        await self.connection.request({"op": "hello", "client": self.name}, timeout)


class _LoopThread:
    """A private event loop in a daemon thread for the blocking wrapper."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="octopis-client"
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class BlockingSubscriber:
    """Blocking wrapper of :class:`Subscriber` for scripts and shells."""

    def __init__(self, endpoint: str, name: str) -> None:
        self._loop = _LoopThread()
        self._sub: Subscriber = self._loop.run(Subscriber.connect(endpoint, name))

    def subscribe(self, spec: str | dict | Subscription) -> BlockingStream:
        """Subscribe and return a blocking iterator over its notifications."""
        return BlockingStream(self._loop, self._loop.run(self._sub.subscribe(spec)))

    def unsubscribe(self, stream: BlockingStream) -> None:
        """Withdraw a subscription."""
        self._loop.run(self._sub.unsubscribe(stream.stream))

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        self._loop.run(self._sub.close())
        self._loop.stop()

    def __enter__(self) -> BlockingSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingStream:
    """Iterate notifications; :meth:`get` with a timeout raises ``TimeoutError``."""

    def __init__(self, loop: _LoopThread, stream: SubscriptionStream) -> None:
        self._loop = loop
        self.stream = stream
        self.sub_id = stream.sub_id

    def get(self, timeout: float | None = None) -> Received:
        """The next notification."""
        return self._loop.run(self.stream.get(timeout))

    def __iter__(self) -> Iterator[Received]:
        while True:
            yield self.get()


class BlockingPublisher:
    """Blocking wrapper of :class:`Publisher`."""

    def __init__(self, endpoint: str, name: str) -> None:
        self._loop = _LoopThread()
        self._pub: Publisher = self._loop.run(Publisher.connect(endpoint, name))

    def publish(self, publication: Publication | str) -> int:
        """Publish and wait for the broker to accept; returns the sequence number."""
        return self._loop.run(self._pub.publish(publication))

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        self._loop.run(self._pub.close())
        self._loop.stop()

    def __enter__(self) -> BlockingPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
