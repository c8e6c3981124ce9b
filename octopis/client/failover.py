"""How a connection leaves a broker that fell silent (DESIGN §7): along its broker list in
the client policy's order (:func:`~octopis.client_policy.failover.failover_tries`), the session at
the broker left kept for a while (:class:`~.left_session.LeftSession`), what waits for an
answer sent again, the clients resumed, and the outage recorded."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import zmq.asyncio

from octopis.client.left_session import LeftSession
from octopis.client.link import BrokerLink
from octopis.client.requests import Requests
from octopis.client_policy.failover import failover_tries
from octopis.wire import pack
from octopis.wire.client import HelloRequest, WelcomeReply

log = logging.getLogger("octopis.client")


class Failover:
    """The fail-overs of the connection whose socket is ``link`` and whose unanswered
    requests are ``requests``, along ``endpoints``. A session left behind is read into
    ``on_left_frame`` and heartbeated until ``linger`` seconds after the clients resumed
    (``resume_clients``); tasks run through ``in_background``."""

    def __init__(
        self,
        link: BrokerLink,
        requests: Requests,
        endpoints: list[str],
        *,
        liveness: float,
        linger: float,
        on_left_frame: Callable[[list[bytes]], None],
        in_background: Callable[[Coroutine[Any, Any, None]], asyncio.Task],
        resume_clients: Callable[[], Awaitable[None]],
    ) -> None:
        self.link = link
        self.requests = requests
        self.endpoints = endpoints
        self.liveness = liveness
        self.linger = linger
        self.on_left_frame = on_left_frame
        self.in_background = in_background
        self.resume_clients = resume_clients
        self.first: list[bytes] = []
        """Requests sent again, unanswered, at each fail-over before anything else (a
        publisher's advertisements, which its publications need at the new broker)."""
        self.left_sessions: set[asyncio.Task] = set()
        """The sessions kept at brokers left at a fail-over that have not ended."""
        self.silent_since: float | None = None
        """Wall time the broker left at the last fail-over went silent."""
        self.outages: deque[dict[str, Any]] = deque(maxlen=1000)
        """One record per fail-over (the last 1,000): from, to, started (wall time),
        seconds away."""

    async def run(self) -> WelcomeReply:
        """Move to the next broker that answers and re-send what is unanswered; the
        clients resume there in the background (heartbeats go on meanwhile). Returns
        the new broker's welcome."""
        t0 = self.link.heard
        away_from = self.link.endpoint
        started = time.time() - (time.monotonic() - t0)
        log.warning("broker at %s silent for %.1f s; failing over", away_from, self.liveness)
        settled = asyncio.Event()
        left = self._leave(settled)
        for endpoint in failover_tries(self.endpoints, away_from):
            if endpoint is None:
                await asyncio.sleep(self.liveness)
            elif (welcome := await self._switch(endpoint, left)) is not None:
                break
        for payload in self.requests.resend(self.first):
            self.link.send(payload)
        record = {"from": away_from, "to": self.link.endpoint, "started": started}
        self.silent_since = started
        self.in_background(self._resume(record, t0, settled))
        return welcome

    async def _resume(self, record: dict[str, Any], t0: float, settled: asyncio.Event) -> None:
        """Let every client resume (re-subscribe) at the new broker; then record the
        outage and let the socket left behind start its last ``linger`` seconds."""
        try:
            await self.resume_clients()
        finally:
            settled.set()
        away = time.monotonic() - t0
        self.outages.append({**record, "seconds": away})
        log.warning("moved from %s to %s after %.2f s away", record["from"], record["to"], away)

    def _leave(self, settled: asyncio.Event) -> zmq.asyncio.Socket | None:
        """Stop reading the current socket; returns it if its session is kept (see
        :class:`LeftSession`; it is then left open when the next one is connected)."""
        self.link.stop_reading()
        old = self.link.socket
        if self.linger <= 0:
            return None
        kept = LeftSession(
            old,
            self.link.endpoint,
            liveness=self.liveness,
            linger=self.linger,
            on_frame=self.on_left_frame,
        )
        session = self.in_background(kept.keep(settled))
        self.left_sessions.add(session)
        session.add_done_callback(self.left_sessions.discard)
        return old

    async def _switch(self, endpoint: str, left: zmq.asyncio.Socket | None) -> WelcomeReply | None:
        """Connect to ``endpoint`` and handshake; its welcome, or None if it does not
        answer in time. The current socket is closed unless it is ``left`` (read
        elsewhere)."""
        await self.link.switch(endpoint, left)
        req, future = self.requests.expect()
        try:
            self.link.send(pack(HelloRequest(client="-", req=req)))
            for _ in range(3):  # an answer waiting unread is not silence: wait for it
                done, _ = await asyncio.wait([future], timeout=self.liveness)
                if done or not self.link.unread():
                    break
            if not future.done():
                return None
            welcome = future.result()
        finally:
            self.requests.drop(req)
        self.link.heard = time.monotonic()
        return welcome
