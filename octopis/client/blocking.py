"""Blocking wrappers of the SDK's clients for scripts and shells: each drives its
asyncio client from a private event loop in a daemon thread, and connects the same way
(``BlockingSubscriber.connect("f:2", run_dir=".octopis")``)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, Self, TypeVar

from octopis.client.deliveries import Received
from octopis.client.named import NamedClient
from octopis.client.publisher import Publisher
from octopis.client.streams import SubscriptionStream
from octopis.client.subscriber import Subscriber
from octopis.filters.language import Publication, Subscription
from octopis.overlay import KeysChoice

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
    """A client of its own connection driven from a loop thread; a context manager that
    closes it. Made with the arguments of the asyncio client's ``connect``."""

    _kind: type[NamedClient]

    def __init__(
        self,
        target: str | Sequence[str],
        name: str | None = None,
        keys: KeysChoice = None,
        *,
        run_dir: str | os.PathLike | None = None,
        topology: str | os.PathLike | None = None,
        **options: Any,
    ) -> None:
        connect = self._kind.connect(
            target, name, keys=keys, run_dir=run_dir, topology=topology, **options
        )
        self._loop = _LoopThread()
        try:
            self._client = self._loop.run(connect)
        except BaseException:
            self._loop.stop()
            raise
        self.name: str = self._client.name
        """The client's name (a new unique one unless given)."""

    @classmethod
    def connect(
        cls,
        target: str | Sequence[str],
        name: str | None = None,
        *,
        keys: KeysChoice = None,
        run_dir: str | os.PathLike | None = None,
        topology: str | os.PathLike | None = None,
        **options: Any,
    ) -> Self:
        """Connect as the asyncio client's ``connect`` does (a broker id with ``run_dir``
        or ``topology``, or endpoints), blocking until connected; the same errors."""
        return cls(target, name, keys, run_dir=run_dir, topology=topology, **options)

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        self._loop.run(self._client.close())
        self._loop.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingSubscriber(_Blocking):
    """Blocking wrapper of :class:`Subscriber` for scripts and shells::

    with BlockingSubscriber.connect("f:2", run_dir=".octopis") as sub:
        for n in sub.subscribe("[class,eq,'STOCK']"):
            print(n.publication)
    """

    _kind = Subscriber

    def subscribe(self, spec: str | dict | Subscription, **options: Any) -> BlockingStream:
        """Subscribe (``options`` as :meth:`Subscriber.subscribe` takes them) and return a
        blocking iterator over its notifications."""
        sub: Subscriber = self._client
        return BlockingStream(self._loop, self._loop.run(sub.subscribe(spec, **options)))

    def unsubscribe(self, stream: BlockingStream) -> None:
        """Withdraw a subscription."""
        self._loop.run(self._client.unsubscribe(stream.stream))


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

    _kind = Publisher

    def publish(self, publication: Publication | str, **options: Any) -> int:
        """Publish (``options`` as :meth:`Publisher.publish` takes them, ``body=`` among
        them; by default it waits for the broker to accept); returns the sequence number."""
        return self._loop.run(self._client.publish(publication, **options))
