"""The SDK's publisher (DESIGN §4): numbered publications within a random session, with
or without waiting for the broker's confirm."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from functools import partial

from octopis.client.connection import Connection
from octopis.client.named import NamedClient
from octopis.filters.composite import as_filter
from octopis.filters.language import Publication, Subscription
from octopis.wire.client import AdvertiseRequest, PublishRequest


class Publisher(NamedClient):
    """A named publisher numbering its notifications 1, 2, 3, ... within its session: a
    random number drawn here, so that brokers tell this publisher from an earlier one of
    the same name (whose numbers it repeats) and never take its notifications for
    repeats."""

    def __init__(self, name: str, connection: Connection) -> None:
        super().__init__(name, connection)
        self.seq = 0
        self.session = secrets.randbits(63)
        self._unacknowledged: set[asyncio.Future] = set()
        self.refused: deque[str] = deque(maxlen=1000)
        """Why publications sent without ``wait`` were refused (the last 1,000)."""
        self.refused_seqs: deque[int] = deque(maxlen=1000)
        """Their sequence numbers, in the same order."""
        self.advertisements: dict[str, Subscription] = {}
        """The advertisements made at the broker (adv_id → filter)."""

    async def advertise(self, spec: str | dict | Subscription, *, timeout: float = 10.0) -> str:
        """Tell the overlay what this publisher will publish: a filter (PADRES text, the
        dict form or a :class:`Subscription`). Where the overlay runs with advertisements
        on, subscriptions then travel toward this publisher's broker, and a publication
        no advertisement of it matches is refused (:class:`UnadvertisedError`). Returns
        the advertisement's id (at this broker); it is withdrawn when the connection
        closes. After a fail-over the connection advertises again at its new broker
        before it sends the unacknowledged publications there again."""
        advertisement = as_filter(spec)
        if not isinstance(advertisement, Subscription):
            raise ValueError("an advertisement is one atomic filter, not a composite one")
        message = AdvertiseRequest(client=self.name, filter=advertisement.to_text())
        reply = await self.connection.request(message, timeout)
        adv_id = reply.adv_id
        self.advertisements[adv_id] = advertisement
        self.connection.resend_first(message)
        return adv_id

    async def publish(
        self,
        publication: Publication | str,
        *,
        wait: bool = True,
        seq: int | None = None,
        timeout: float = 10.0,
        body: bytes = b"",
    ) -> int:
        """Publish; returns the sequence number. ``body``: the publication's opaque
        body, carried unchanged to every subscriber (``Received.body``) and never
        matched; a broker refuses one longer than its ``[clients] body_bytes``.

        With ``wait`` the broker's acceptance is awaited (a refusal raises
        :class:`BrokerError`); without it refusals collect in :attr:`refused` and
        :meth:`flush` waits for everything sent so far to be acknowledged. Either way a
        publication stays unacknowledged until the broker's neighbours hold it, and is sent
        again after a fail-over; when the connection's window of unanswered requests (its
        publish credit) is full, this waits: backpressure slows the publisher. After
        ``timeout`` seconds of waiting (for credit, and with ``wait`` for the answer too)
        it raises ``TimeoutError`` and nothing was sent.
        """
        if not isinstance(body, bytes):
            raise TypeError(f"a publication body is bytes, not {type(body).__name__}")
        self.seq = seq if seq is not None else self.seq + 1
        message = PublishRequest(
            client=self.name,
            seq=self.seq,
            session=self.session,
            published_at=time.time(),
            publication=publication,
            body=body,
        )
        future = await self.connection.submit(message, timeout)
        if wait:
            await asyncio.wait_for(future, timeout)
        else:
            self._unacknowledged.add(future)
            future.add_done_callback(partial(self._acknowledged, self.seq))
        return self.seq

    def _acknowledged(self, seq: int, future: asyncio.Future) -> None:
        self._unacknowledged.discard(future)
        if not future.cancelled() and future.exception() is not None:
            self.refused.append(str(future.exception()))
            self.refused_seqs.append(seq)

    async def flush(self, timeout: float = 30.0) -> None:
        """Return once every publication sent so far is acknowledged (or refused)."""
        if self._unacknowledged:
            await asyncio.wait_for(
                asyncio.gather(*self._unacknowledged, return_exceptions=True), timeout
            )
