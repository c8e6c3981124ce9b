"""Blocking wrappers of the SDK's clients for scripts and shells: each drives its
asyncio client from a private event loop in a daemon thread."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, Self, TypeVar

from octopis.client.connection import Received
from octopis.client.publisher import Publisher
from octopis.client.subscriber import Subscriber, SubscriptionStream
from octopis.filters import Publication, Subscription

T = TypeVar("T")


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


class _Blocking:
    """A client connection driven from a loop thread; a context manager that closes it."""

    def __init__(self, connect: Coroutine[Any, Any, Any]) -> None:
        self._loop = _LoopThread()
        self._client = self._loop.run(connect)

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        self._loop.run(self._client.close())
        self._loop.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingSubscriber(_Blocking):
    """Blocking wrapper of :class:`Subscriber` for scripts and shells."""

    def __init__(self, endpoint: str, name: str, keys: str | os.PathLike | None = None) -> None:
        super().__init__(Subscriber.connect(endpoint, name, keys=keys))
        self._sub: Subscriber = self._client

    def subscribe(self, spec: str | dict | Subscription) -> BlockingStream:
        """Subscribe and return a blocking iterator over its notifications."""
        return BlockingStream(self._loop, self._loop.run(self._sub.subscribe(spec)))

    def unsubscribe(self, stream: BlockingStream) -> None:
        """Withdraw a subscription."""
        self._loop.run(self._sub.unsubscribe(stream.stream))


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


class BlockingPublisher(_Blocking):
    """Blocking wrapper of :class:`Publisher`."""

    def __init__(self, endpoint: str, name: str, keys: str | os.PathLike | None = None) -> None:
        super().__init__(Publisher.connect(endpoint, name, keys=keys))
        self._pub: Publisher = self._client

    def publish(self, publication: Publication | str) -> int:
        """Publish and wait for the broker to accept; returns the sequence number."""
        return self._loop.run(self._pub.publish(publication))
