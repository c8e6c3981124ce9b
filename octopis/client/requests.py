"""Requests a connection sent that await the broker's reply (DESIGN §4, §8): at most a
given number at a time, so that a publisher waiting for room is slowed by the broker's
backpressure (the publish credit), never silently dropped; each keeps its encoded form,
sent again after a fail-over, as the client policy says
(:class:`~octopis.client_policy.failover.Unanswered`)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from msgspec.structs import replace

from octopis.client.errors import BrokerError, UnadvertisedError
from octopis.client_policy.failover import Unanswered
from octopis.wire import pack
from octopis.wire.client import ErrorReply, Reply, Request


class Requests:
    """The requests awaiting a reply, at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self._reqs = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._sent: Unanswered[int, bytes] = Unanswered()
        """The encoded form of each request awaiting its reply, sent again at a fail-over."""
        self._room = asyncio.Semaphore(limit)

    def __len__(self) -> int:
        return len(self._pending)

    async def add(
        self, message: Request | dict[str, Any], timeout: float | None, endpoint: str
    ) -> tuple[asyncio.Future, bytes]:
        """Number ``message`` and await its reply: its future and its encoded form. Waits
        while ``limit`` requests are unanswered, raising ``TimeoutError`` after
        ``timeout`` seconds (None: however long); ``endpoint`` names the broker in
        its message."""
        if self._room.locked() and timeout is not None:
            try:
                await asyncio.wait_for(self._room.acquire(), timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no credit from {endpoint} within {timeout} s: "
                    f"{len(self._pending)} requests unanswered"
                ) from None
        else:
            await self._room.acquire()
        req = next(self._reqs)
        future = asyncio.get_running_loop().create_future()
        raw = not isinstance(message, Request)  # a map this SDK does not declare
        payload = pack({**message, "req": req} if raw else replace(message, req=req))
        self._pending[req] = future
        self._sent.sent(req, payload)
        future.add_done_callback(lambda _: self._answered(req))
        return future, payload

    def _answered(self, req: int) -> None:
        self._sent.answered(req)
        if self._pending.pop(req, None) is not None:
            self._room.release()

    def expect(self) -> tuple[int, asyncio.Future]:
        """A request number whose reply is awaited outside the credit (a fail-over's
        hello, never sent again); :meth:`drop` it once done."""
        req = next(self._reqs)
        future = asyncio.get_running_loop().create_future()
        self._pending[req] = future
        return req, future

    def drop(self, req: int) -> None:
        """Stop awaiting the reply to :meth:`expect`'s ``req``."""
        self._pending.pop(req, None)

    def answer(self, data: Reply) -> bool:
        """Hand a reply to its request; False for a refusal nobody awaits (a request sent
        without a number, or one given up)."""
        future = self._pending.get(data.req)
        if type(data) is ErrorReply:
            if future is None or future.done():
                return False
            error = UnadvertisedError if data.error == "unadvertised" else BrokerError
            future.set_exception(error(data.message))
        elif future is not None and not future.done():
            future.set_result(data)
        return True

    def resend(self, first: list[bytes]) -> list[bytes]:
        """What a fail-over sends again (:meth:`Unanswered.resend`): ``first``, then the
        encoded requests still awaiting a reply, in the order sent."""
        return self._sent.resend(first)

    def fail(self, error: BaseException) -> None:
        """Fail every request still waiting with ``error``."""
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(error)

    def cancel(self) -> None:
        """Cancel every request still waiting."""
        for future in list(self._pending.values()):
            future.cancel()
