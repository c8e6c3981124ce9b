"""A subscriber's requests for the past (DESIGN §11): the replay after a fail-over, a
hybrid subscription's window, a durable subscription's claim of its record and a
historic subscription's answer, one at a time; while one is under way live deliveries
wait at its :class:`~octopis.client.replay.Seam` and join its answer, each once, in
publisher order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from octopis.client.connection import Connection
from octopis.client.deliveries import Received
from octopis.client.durable_acks import DurableAcks
from octopis.client.errors import BrokerError
from octopis.client.replay import History, ReplayGap, Seam
from octopis.client.replay_log import ReplayLog
from octopis.filters.language import Subscription
from octopis.wire.client import ClaimRequest, ReplayRequest, op_of

log = logging.getLogger("octopis.client")

HISTORIC_WAIT = 40.0
"""Seconds a subscriber waits for a historic, hybrid or durable subscription's answer (the
brokers' own budget, ``[retention] historic_budget``, is 30 s)."""


class PastClient(Protocol):
    """What a request for the past needs of its subscriber."""

    name: str
    connection: Connection
    buffer: int

    def deliver(self, received: Received, size: int) -> None:
        """Hand ``received`` to the application."""

    def durables(self) -> Iterable[str]:
        """The names of the durable subscriptions held."""


class PastRequests:
    """The requests for the past of ``client``: what they leave goes to ``replay_log``,
    a claimed durable record to ``acks``. :attr:`seam` is the one under way."""

    def __init__(self, client: PastClient, replay_log: ReplayLog, acks: DurableAcks) -> None:
        self.client = client
        self.replay_log = replay_log
        self.acks = acks
        self.seam: Seam | None = None
        """The seam of the request under way, if any."""
        self.lock = asyncio.Lock()
        """One historic, hybrid or durable answer at a time."""

    def open_seam(self, *, hold_live: bool = True) -> Seam:
        """A new seam, the current one (live deliveries wait in it if ``hold_live``)."""
        self.seam = Seam(self.client.buffer, hold_live=hold_live)
        return self.seam

    def let_go(self, seam: Seam) -> None:
        """End ``seam`` without an answer: deliver the live deliveries it held."""
        if self.seam is seam:
            self.seam = None
        for received, size in seam.joined(self.client.name, self.client.connection.group)[0]:
            self.client.deliver(received, size)

    async def claim(self, seam: Seam, subscription: Subscription, durable: str) -> History:
        """Find durable ``durable``'s record (wherever its last host kept it) and replay
        from what this client acknowledged last; a new durable has none."""
        name = self.client.name
        error = await self.ask(seam, ClaimRequest(client=name, durable=durable))
        summary = seam.next_request()
        silent = tuple(summary.silent) if summary is not None else ()
        claimed = summary.claimed if summary is not None else []
        answer = self.acks.claim_answered(durable, claimed, silent, error)
        if answer.gap is not None:
            self.replay_log.report(ReplayGap(name, None, time.time(), silent, error=answer.gap))
        if answer.resumed is None:
            self.let_go(seam)
            log.info("%s: durable %s is new here (no record found)", name, durable)
            return History(None, time.time(), None, 0, 0, silent=silent, error=error)
        self.acks.ack_all(self.client.durables())
        log.info(
            "%s: durable %s claimed from %s (%d publishers known)",
            name,
            durable,
            answer.resumed.broker,
            len(answer.since),
        )
        fields = {"filters": [subscription.to_text()], "since": answer.since, "after": answer.after}
        return await self.window(seam, fields)

    async def ask(
        self, seam: Seam, message: ReplayRequest | ClaimRequest, timeout: float = HISTORIC_WAIT
    ) -> str | None:
        """Send a replay or claim request and wait for its ``replay_done`` (at most
        ``timeout`` seconds from the request or from the last answer that came); returns
        why it failed, if it did."""
        try:
            reply = await self.client.connection.request(message, timeout)
            seam.named(reply.id)
            while True:  # waited for ``timeout`` from the request or the last answer
                progress = seam.progress
                try:
                    await asyncio.wait_for(seam.finished.wait(), timeout)
                    break
                except TimeoutError:
                    if seam.progress == progress:
                        raise
        except (TimeoutError, BrokerError) as exc:
            return f"{op_of(message)} failed: {exc or type(exc).__name__}"
        return None

    async def window(self, seam: Seam, fields: dict[str, Any]) -> History:
        """A window of the past into the live streams (a hybrid or durable subscription)."""
        message = ReplayRequest(client=self.client.name, historic=True, **fields)
        return (await self.replayed(seam, message, HISTORIC_WAIT))[1]

    async def everywhere(self, subscription: Subscription, now: float) -> tuple[str, ...]:
        """Wait until ``subscription``, just made, is in place at every broker it travels
        to: a replay round of the empty window ``[now, now)`` travels behind it and its
        echo comes back once every broker has it. Returns the brokers that did not
        answer within the budget (empty: every one has it)."""
        seam, error = await self.alone(self.window_of(subscription, now, now))
        if error is not None:
            raise TimeoutError(f"{self.client.name}: no answer from every broker ({error})")
        return tuple(seam.summary.silent) if seam.summary is not None else ()

    async def historic(
        self,
        subscription: Subscription,
        after: float | None,
        until: float,
        answer_max: int,
        answer_bytes: int,
    ) -> tuple[list[Received], History]:
        """A historic subscription's answer alone, in publisher order, each publication
        once, and its end."""
        limits = {"answer_max": answer_max, "answer_bytes": answer_bytes}
        message = self.window_of(subscription, after, until, historic=True, **limits)
        seam, error = await self.alone(message)
        items = seam.answered(self.client.name)
        return items, self.history(seam, after or 0.0, until, len(items), error)

    def window_of(
        self,
        subscription: Subscription,
        after: float | None,
        until: float,
        **limits: int,
    ) -> ReplayRequest:
        """A replay request for what ``subscription`` matches of ``[after, until)``;
        ``limits``: ``historic`` and the answer's bounds (``answer_max``,
        ``answer_bytes``)."""
        filters = [subscription.to_text()]
        return ReplayRequest(
            client=self.client.name, filters=filters, since=[], after=after, until=until, **limits
        )

    async def alone(self, message: ReplayRequest) -> tuple[Seam, str | None]:
        """Send replay request ``message`` and wait for its answer, taken alone (live
        deliveries do not wait for it); its seam, and why it failed if it did."""
        async with self.lock:
            seam = self.open_seam(hold_live=False)
            try:
                error = await self.ask(seam, message)
            finally:
                self.seam = None
        return seam, error

    def history(
        self, seam: Seam, after: float, until: float | None, delivered: int, error: str | None
    ) -> History:
        """The end of the answer ``seam`` waited for: what was delivered and what is
        missing."""
        summary = seam.summary
        if summary is None:
            return History(seam.replay, after, until, 0, delivered, error=error or "no answer")
        return History(
            seam.replay,
            after,
            until,
            summary.published,
            delivered,
            tuple(summary.silent),
            tuple(summary.unstored),
            tuple(summary.gaps),
            tuple(summary.truncated),
            error,
        )

    async def replay(
        self,
        seam: Seam,
        filters: list[str],
        since: list[tuple[str, int, int]],
        after: float,
        timeout: float,
    ) -> ReplayGap | None:
        """Ask the overlay for what a subscriber of ``filters`` may have missed (of each
        publisher's session what follows ``since``, of any other publisher what was
        published from ``after``), its answer joined at ``seam`` (:meth:`replayed`); the
        gap it leaves, if any."""
        message = ReplayRequest(client=self.client.name, filters=filters, since=since, after=after)
        gap, _ = await self.replayed(seam, message, timeout)
        return gap

    async def replayed(
        self, seam: Seam, message: ReplayRequest, timeout: float
    ) -> tuple[ReplayGap | None, History]:
        """Send replay request ``message``, deliver its answer with the live deliveries
        ``seam`` held, each once, in publisher order; record and report what it left."""
        after = message.after
        error = await self.ask(seam, message, timeout)
        self.seam = None
        items, repeats = seam.joined(self.client.name, self.client.connection.group)
        for received, size in items:
            self.client.deliver(received, size)
        gap = seam.replay_gap(self.client.name, after, error)
        replayed = self.replay_log.add(seam, items, repeats, gap)
        return gap, self.history(seam, after, message.until, replayed, error)
