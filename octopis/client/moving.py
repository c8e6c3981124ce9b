"""A subscriber's moves to another broker (DESIGN §9): the balancer's order comes from
the subscriber's broker as a ``move`` notice; the move is made before break, and an order
that is stale (from a broker left behind, for subscriptions no longer held) is ignored."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, assert_never

from octopis.client.connection import Connection
from octopis.client.errors import BrokerError
from octopis.client_policy.moves import (
    Linger,
    Resubscribe,
    WithdrawOld,
    move_across,
    release_wait,
)
from octopis.wire.client import AdoptRequest, MoveNotice, UnsubscribeRequest

log = logging.getLogger("octopis.client")


class MovingClient(Protocol):
    """What a move needs of its subscriber."""

    name: str
    connection: Connection

    def serve_on(self, connection: Connection) -> None:
        """Take deliveries and notices from ``connection``."""

    def holds(self, sub_ids: list[str]) -> bool:
        """Whether every one of ``sub_ids`` is held."""

    def durable_of(self, sub_id: str) -> str | None:
        """The durable name of ``sub_id`` (None: not durable)."""

    async def resubscribe(self, only: Sequence[str] | None = None) -> None:
        """Make the subscriptions ``only`` again at the current broker."""

    def let_go(self, old: Connection) -> None:
        """Stop being served by ``old``."""


class Mover:
    """The moves of ``client``, one at a time: an order that comes during one is made
    after it."""

    def __init__(self, client: MovingClient) -> None:
        self.client = client
        self._releases: dict[str, asyncio.Event] = {}
        self._moving: asyncio.Task | None = None
        self._next: tuple[MoveNotice, Connection] | None = None
        self.moves: deque[dict[str, Any]] = deque(maxlen=1000)
        """One record per move (the last 1,000): from, to, inside, sub ids, seconds."""
        self.stale_moves = 0
        """Move orders ignored: from a broker the client has left, or naming
        subscriptions it no longer holds (the broker's view was older than the client's)."""

    @property
    def moving(self) -> bool:
        """Whether a move is under way or ordered."""
        return self._next is not None or (self._moving is not None and not self._moving.done())

    def released(self, sub_id: str) -> None:
        """The old broker no longer delivers moved subscription ``sub_id`` here."""
        event = self._releases.get(sub_id)
        if event is not None:
            event.set()

    def ordered(self, message: MoveNotice, connection: Connection) -> None:
        """A ``move`` notice came on ``connection``: move now, or after the move under
        way."""
        if self._moving is not None and not self._moving.done():
            log.info("%s is told to move while moving: it moves again after", self.client.name)
            self._next = (message, connection)
            return
        self._start(message, connection)

    def _start(self, message: MoveNotice, connection: Connection) -> None:
        """Move as ``message``, which came on ``connection``, says, unless it is stale
        (:meth:`_stale`)."""
        sub_ids = message.sub_ids
        stale = self._stale(connection, message.to, sub_ids)
        if stale is None:
            work = self._move(message.to, message.inside, sub_ids)
            self._moving = asyncio.get_running_loop().create_task(work)
            return
        self.stale_moves += 1
        self.client.connection.group.warn.warning(
            "stale move order",
            "%s ignores a move order from %s to %s for %s: %s",
            self.client.name,
            connection.endpoint,
            message.to,
            ", ".join(sub_ids),
            stale,
        )

    def _stale(self, sender: Connection, to: str, sub_ids: list[str]) -> str | None:
        """Why a move to ``to`` of ``sub_ids``, ordered on ``sender``, is stale, or None:
        the order came on a connection that is no longer this subscriber's (a broker it
        left still names it until it lets go), names subscriptions it no longer holds,
        or sends it where its connection already is (it failed over there). Acting on one
        would withdraw what it does not replace."""
        if sender is not self.client.connection:
            return "it has left that broker"
        if not self.client.holds(sub_ids):
            return "it no longer holds those subscriptions"
        if to == sender.endpoint:
            return "it is connected there already (it failed over)"
        return None

    async def _move(self, to: str, inside: bool, sub_ids: list[str]) -> None:
        """Move to the broker at ``to`` as its current broker told (DESIGN §9), make before
        break: inside the cluster each subscription is adopted there and the old broker
        releases it once the path has turned; else it follows the client policy's
        :func:`~octopis.client_policy.moves.move_across`: each is made again there and
        the old one withdrawn ``linger`` seconds later. Both brokers deliver meanwhile, and
        a delivery had twice is dropped (the group's record, counted in
        ``Connection.duplicates_absorbed``). A move ordered meanwhile starts when this
        one is done."""
        client = self.client
        old = client.connection
        started = time.monotonic()
        new = await old.group.sibling(old, to)
        stale = "it failed over meanwhile" if new is old else self._stale(old, to, sub_ids)
        if stale is not None:
            self.stale_moves += 1
            old.group.warn.warning(
                "stale move order", "%s drops a move to %s: %s", self.client.name, to, stale
            )
            self._after()
            return
        let_go = True
        try:
            client.serve_on(new)
            across = [sub_id for sub_id in sub_ids if not inside or not await self._adopt(sub_id)]
            waits = [self._releases[s].wait() for s in sub_ids if s in self._releases]
            waited = release_wait(old.linger, old.liveness)
            try:
                await asyncio.wait_for(asyncio.gather(*waits), waited)
            except TimeoutError:
                let_go = False  # it may still deliver: keep reading it, repeats dropped
                log.warning(
                    "%s: %s did not release %d moved subscriptions; both are read",
                    self.client.name,
                    old.endpoint,
                    sum(not e.is_set() for e in self._releases.values()),
                )
            for step in move_across(across, old.linger) if across else ():
                if isinstance(step, Resubscribe):
                    await client.resubscribe(list(step.sub_ids))
                elif isinstance(step, Linger):
                    await asyncio.sleep(step.seconds)
                elif isinstance(step, WithdrawOld):
                    await self._withdraw(old, step.sub_ids)
                else:
                    assert_never(step)
            if let_go:
                client.let_go(old)
            self.moves.append(
                {
                    "from": old.endpoint,
                    "to": to,
                    "inside": inside and not across,
                    "sub_ids": sub_ids,
                    "seconds": time.monotonic() - started,
                    "released": let_go,
                }
            )
            log.info("%s moved %d subscriptions to %s", self.client.name, len(sub_ids), to)
        finally:
            self._releases.clear()
            self._after()

    async def _withdraw(self, old: Connection, sub_ids: Sequence[str]) -> None:
        """Withdraw ``sub_ids`` at the broker ``old`` left behind by a move."""
        for sub_id in sub_ids:
            message = UnsubscribeRequest(client=self.client.name, sub_id=sub_id, moved=True)
            try:
                await old.request(message)
            except BrokerError as exc:  # withdrawn there already (a fail-over)
                log.warning("%s: %s", self.client.name, exc)

    def _after(self) -> None:
        """Start the move ordered while one was under way, if any."""
        if self._next is not None:
            (message, connection), self._next = self._next, None
            asyncio.get_running_loop().call_soon(self._start, message, connection)

    async def _adopt(self, sub_id: str) -> bool:
        """Ask the new broker to take ``sub_id`` over; False if it cannot (not there yet)."""
        self._releases[sub_id] = asyncio.Event()
        try:
            durable = self.client.durable_of(sub_id)
            message = AdoptRequest(client=self.client.name, sub_id=sub_id, durable=durable)
            await self.client.connection.request(message)
        except BrokerError as exc:
            log.warning(
                "%s could not adopt %s: %s; subscribing afresh", self.client.name, sub_id, exc
            )
            del self._releases[sub_id]
            return False
        return True
