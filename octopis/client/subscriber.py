"""The SDK's subscriber (DESIGN §4, §7, §11): subscriptions and their streams,
resubscribing and replaying after a fail-over, durable, historic and hybrid
subscriptions; its moves (§9) are :mod:`.moving`'s."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from octopis.client.connection import Connection, log
from octopis.client.deliveries import Received
from octopis.client.durable_acks import DurableAcks
from octopis.client.errors import DroppedError
from octopis.client.moving import Mover
from octopis.client.named import NamedClient
from octopis.client.past import PastRequests
from octopis.client.replay import ReplayGap, parse_time
from octopis.client.replay_log import ReplayLog
from octopis.client.streams import CompositeStream, SubscriptionStream
from octopis.client_policy import SubscriberReplays
from octopis.defaults import BUFFER
from octopis.filters.composite import Composite, as_filter
from octopis.filters.language import Publication, Subscription
from octopis.wire.client import (
    CompositeDroppedNotice,
    CompositeNotice,
    MoveNotice,
    Notice,
    ReleasedNotice,
    ReplayDoneNotice,
    ReplayedNotice,
    SubscribeRequest,
    UnsubscribeRequest,
    WithdrawnNotice,
)

REPLAY_WAIT = 10.0
"""Seconds a subscriber waits for a replay's answer before it reports the gap as unknown
(the brokers' own budget, ``[retention] replay_budget``, is far shorter)."""


class Subscriber(NamedClient):
    """A named subscriber. ``on_notification`` (if given) receives every delivery instead
    of the per-subscription streams (used for bulk accounting).

    After a fail-over (its broker died or restarted) the subscriber makes its
    subscriptions again at the new broker and then, with ``replay`` on, asks the overlay
    for what it missed meanwhile (DESIGN §11): each publication is delivered once, in
    publisher order across the seam, and what could not be replayed is reported to
    ``on_gap`` and kept in :attr:`gaps`; ``on_gap_filled`` is told ``(gap, left)`` when
    brokers a gap named silent answered later (:class:`~.replay_log.ReplayLog`).

    Its parts: :class:`~.streams.SubscriptionStream` per subscription,
    :class:`~.durable_acks.DurableAcks`, :class:`~.replay_log.ReplayLog` and
    :class:`~.moving.Mover`."""

    def __init__(
        self,
        name: str,
        connection: Connection,
        on_notification: Callable[[Received], None] | None = None,
        buffer: int = BUFFER,
        buffer_bytes: int = 64 * 2**20,
        *,
        replay: bool = True,
        on_gap: Callable[[ReplayGap], None] | None = None,
        on_gap_filled: Callable[[ReplayGap, ReplayGap | None], None] | None = None,
    ) -> None:
        super().__init__(name, connection)
        self.replay_on_failover = replay
        self.replay_log = ReplayLog(name, connection.group, self.deliver, on_gap, on_gap_filled)
        """What each replay delivered and left, and the late answers that narrow its gap."""
        self.replaying = SubscriberReplays(late=self.replay_log.late)
        """When it first subscribed, where a replay asks from, its replays' late answers."""
        if buffer < 1 or buffer_bytes < 1:
            raise ValueError("a subscriber's buffer and buffer_bytes must be positive")
        self.buffer = buffer
        """Deliveries its streams hold, not yet taken, before the connection stops reading."""
        self.buffer_bytes = buffer_bytes
        """Encoded bytes of those deliveries before the connection stops reading."""
        self.held = 0
        """Deliveries held in the streams now (one per stream a delivery is queued on)."""
        self.held_bytes = 0  # their encoded bytes
        self.stalls = 0
        """Times a full buffer stopped the connection's reader."""
        self._room = asyncio.Event()
        self._room.set()
        self._streams: dict[str, SubscriptionStream] = {}
        self._subscriptions: dict[str, Subscription | Composite] = {}
        self._durable_of: dict[str, str] = {}  # sub id -> its durable subscription's name
        self.acks = DurableAcks(name, lambda message: self.connection.send_soon(message))
        """What the application took of each durable subscription, acknowledged."""
        self.past = PastRequests(self, self.replay_log, self.acks)
        """Its requests for the past: replays, claims, historic answers."""
        self._callback = on_notification
        self.mover = Mover(self)
        """This subscriber's moves to other brokers, as its broker orders them."""
        self.serve_on(connection)

    def hold(self, size: int) -> None:
        """A stream took a delivery of ``size`` bytes: past ``buffer`` or
        ``buffer_bytes`` the connection's reader stops until there is room."""
        self.held += 1
        self.held_bytes += size
        if (self.held >= self.buffer or self.held_bytes >= self.buffer_bytes) and (
            self._room.is_set()
        ):
            self._room.clear()
            self.stalls += 1
            self.connection.stall_until(self._room)

    def taken(self, size: int) -> None:
        """The application took a delivery of ``size`` bytes from a stream."""
        self.held -= 1
        self.held_bytes -= size
        if self.held < self.buffer and self.held_bytes < self.buffer_bytes:
            self._room.set()

    def took(self, durable: str, received: Received) -> None:
        """The application took ``received`` of durable subscription ``durable``: it is
        acknowledged to the broker at the loop's next pass (with what else was taken)."""
        self.acks.took(durable, received)

    @property
    def since(self) -> float | None:
        """When it first subscribed: a replay's start for publishers never heard from."""
        return self.replaying.first

    @property
    def gaps(self) -> deque[ReplayGap]:
        """What replays could not fill and is still missing (the last 1,000): a gap
        whose silent brokers answer later is narrowed, or withdrawn once filled."""
        return self.replay_log.gaps

    @property
    def replays(self) -> deque[dict[str, Any]]:
        """One record per replay (the last 1,000): id, replayed, repeats, seconds, gap."""
        return self.replay_log.replays

    @property
    def moving(self) -> bool:
        """Whether a move is under way or ordered."""
        return self.mover.moving

    @property
    def moves(self) -> deque[dict[str, Any]]:
        """One record per move (the last 1,000): from, to, inside, sub ids, seconds."""
        return self.mover.moves

    @property
    def stale_moves(self) -> int:
        """Move orders ignored: from a broker this subscriber has left, or naming
        subscriptions it no longer holds (the broker's view was older than the client's)."""
        return self.mover.stale_moves

    def serve_on(self, connection: Connection) -> None:
        """Take deliveries, notices, fail-overs and drops from ``connection`` (a move's
        new one, or the first)."""
        self.connection = connection
        connection.register(self.name, self._on_notify)
        connection.on_notice(self.name, lambda message: self._on_notice(message, connection))
        connection.on_failover(self._resume_after_failover)
        connection.on_dropped(self._dropped)

    def holds(self, sub_ids: list[str]) -> bool:
        """Whether this subscriber holds every one of ``sub_ids``."""
        return set(sub_ids) <= set(self._subscriptions)

    def durable_of(self, sub_id: str) -> str | None:
        """The durable name of subscription ``sub_id`` (None: not durable)."""
        return self._durable_of.get(sub_id)

    def durables(self) -> set[str]:
        """The names of the durable subscriptions held."""
        return set(self._durable_of.values())

    def let_go(self, old: Connection) -> None:
        """Stop being served by ``old`` (a move away from it is complete)."""
        old.forget(self.name, self._resume_after_failover, self._dropped)

    def _on_notice(self, message: Notice, connection: Connection) -> None:
        """``released`` ends a move's wait; ``move`` starts one, or queues it behind the
        move under way, if it comes from the current connection."""
        kind = type(message)
        if kind is WithdrawnNotice:
            self._withdrawn(message.sub_id, connection)
        elif kind is CompositeNotice or kind is CompositeDroppedNotice:
            stream = self._streams.get(message.sub_id)
            if isinstance(stream, CompositeStream):
                stream.notice(message)
        elif kind is ReplayedNotice or kind is ReplayDoneNotice:
            if not self.replay_log.answer(message) and self.past.seam is not None:
                self.past.seam.notice(message)
        elif kind is ReleasedNotice:
            self.mover.released(message.sub_id)
        elif kind is MoveNotice:
            self.mover.ordered(message, connection)

    async def subscribe(
        self,
        spec: str | dict | Subscription | Composite,
        timeout: float = 10.0,
        *,
        durable: str | None = None,
        since: str | float | datetime | None = None,
        until: str | float | datetime | None = None,
        answer_max: int = 0,
        answer_bytes: int = 0,
        everywhere: bool = False,
    ) -> SubscriptionStream:
        """Subscribe (PADRES text, dict form or :class:`Subscription`); returns its stream.

        ``durable="name"``: the subscription outlives this connection (DESIGN §11). While
        this client is away (a restart, a deploy) what it would have received is owed to
        it, for ``[durable] keep`` seconds and within retention; subscribing again under
        the same client name and durable name, at any broker, delivers what it missed
        exactly once, in publisher order, then live traffic. What the application takes
        from the stream is acknowledged; :meth:`unsubscribe` ends it.

        ``since=T`` (seconds since the epoch, a datetime, ``"all"``, ``"10m"`` or an ISO
        8601 time): first the retained publications that match and were published since
        ``T``, then live ones, each once across the seam (a hybrid subscription); with
        ``until=U`` only those published in ``[T, U)`` (a historic one: the stream ends
        with :class:`EndOfHistory`). ``answer_max`` and ``answer_bytes`` bound each store's
        answer (0: the brokers' ``[retention] answer_max``, ``answer_bytes``). The
        stream's :attr:`~SubscriptionStream.history` says whether the answer is
        complete. The call returns once the past has been delivered to the stream.

        A composite subscription (text ``{...} & {...} within 5s`` or its dict form,
        :func:`~octopis.filters.composite.composite_from_dict`) returns a :class:`CompositeStream`
        of one :class:`~octopis.client.composite.CompositeNotification` per match, joined
        at the broker; it is live only (no ``durable``, ``since``, ``until``).

        ``everywhere=True``: return only once the subscription is in place at every
        broker it travels to, so that a publisher anywhere that publishes after this
        returns reaches it (an empty replay round sent behind it, whose echo comes back
        once every broker has it, DESIGN §11); brokers that did not answer within the
        replay budget are in the stream's :attr:`~SubscriptionStream.unconfirmed` (a
        durable or hybrid one is in place everywhere anyway: its round goes behind it)."""
        subscription = as_filter(spec)
        if isinstance(subscription, Composite):
            if durable is not None or since is not None or until is not None:
                raise ValueError("a composite subscription is live only: no durable, since, until")
            sub_id = await self._subscribe(subscription, timeout)
            stream = self._streams[sub_id] = CompositeStream(self, sub_id, subscription)
            return stream
        after, end = past_window(durable, since, until)
        self.replaying.subscribed(time.time())
        if end is not None:
            stream = SubscriptionStream(self, f"history:{after}:{end}", subscription)
            stream.end_history(
                *await self.past.historic(subscription, after, end, answer_max, answer_bytes)
            )
            return stream
        if durable is None and after is None:
            sub_id = await self._subscribe(subscription, timeout)
            stream = self._streams[sub_id] = SubscriptionStream(self, sub_id, subscription)
            if everywhere:
                stream.unconfirmed = await self.past.everywhere(subscription, time.time())
            return stream
        async with self.past.lock:
            seam = self.past.open_seam()
            try:
                sub_id = await self._subscribe(subscription, timeout, durable)
            except BaseException:
                self.past.let_go(seam)
                raise
            stream = SubscriptionStream(self, sub_id, subscription, durable)
            self._streams[sub_id] = stream
            if durable is not None:
                stream.history = await self.past.claim(seam, subscription, durable)
            else:
                message = {"filters": [subscription.to_text()], "since": [], "after": after}
                limits = {"answer_max": answer_max, "answer_bytes": answer_bytes}
                stream.history = await self.past.window(seam, {**message, **limits})
            stream.unconfirmed = stream.history.silent  # its rounds went behind it
        return stream

    async def _subscribe(
        self,
        subscription: Subscription | Composite,
        timeout: float | None,
        durable: str | None = None,
    ) -> str:
        message = SubscribeRequest(client=self.name, filter=subscription.to_text(), durable=durable)
        sub_id = (await self.connection.request(message, timeout)).sub_id
        self._subscriptions[sub_id] = subscription
        if durable is not None:
            self._durable_of[sub_id] = durable
        return sub_id

    def _withdrawn(self, sub_id: str, connection: Connection) -> None:
        """The broker withdrew ``sub_id``: this durable subscription was claimed by the
        host its client came back at (another process under this client's name)."""
        if connection is not self.connection or sub_id not in self._subscriptions:
            return
        log.warning(
            "%s: durable subscription %s was claimed by another connection under this "
            "name; this one no longer gets it",
            self.name,
            self._durable_of.get(sub_id, sub_id),
        )
        self._subscriptions.pop(sub_id, None)
        self._durable_of.pop(sub_id, None)
        stream = self._streams.pop(sub_id, None)
        if stream is not None:
            stream.end(DroppedError(f"durable subscription {stream.durable} claimed elsewhere"))

    async def _resume_after_failover(self, connection: Connection) -> None:
        """``connection`` failed over: every subscription again at its new broker
        (DESIGN §7), unless this subscriber is moving away from it (the move makes them
        at the new host before the session left behind ends)."""
        if connection is self.connection:
            replaying = self.replay_on_failover and bool(self._replayable())
            if not (replaying and self.since is not None):
                await self.resubscribe()
                return
            # Hold live deliveries: the new broker's must not move the replay's start. The
            # replay asks what its durables' records owe from (one since list, one start).
            seam = self.past.open_seam()
            since, after = self.replaying.failed_over(
                self._silent(), self.acks.progress(self.durables())
            )
            try:
                await self.resubscribe()
            except BaseException:
                if self.past.seam is seam:  # no replay: let go of the seam
                    self.past.let_go(seam)
                raise
            await self.past.replay(seam, self._replayable(), since, after, REPLAY_WAIT)

    async def replay(self, timeout: float = REPLAY_WAIT) -> ReplayGap | None:
        """Ask the overlay for the retained publications this subscriber may have missed
        (:meth:`~octopis.client_policy.FromPoints.replay`: after the last delivered of
        each publisher it knows, published since ``replay_after``) and deliver them with
        the live ones held meanwhile, each once, in publisher order; returns the gap left,
        if any."""
        seam = self.past.open_seam()
        since, after = self.replaying.replay(self._silent())
        return await self.past.replay(seam, self._replayable(), since, after, timeout)

    def _silent(self) -> float:
        """When the broker left at the last fail-over went silent (now, if none did)."""
        return self.connection.silent_since or time.time()

    def _replayable(self) -> list[str]:
        """The texts of the subscriptions a replay asks for: the atomic ones (a composite
        subscription's join starts afresh at its new host)."""
        return [f.to_text() for f in self._subscriptions.values() if isinstance(f, Subscription)]

    async def resubscribe(self, only: Sequence[str] | None = None) -> None:
        """After a fail-over: every subscription (or those of ids ``only``) again at the
        current broker (DESIGN §7). No timeout: a request the broker does not answer is
        re-sent at the next fail-over."""
        held = {s: f for s, f in self._subscriptions.items() if only is None or s in only}
        durable = {s: self._durable_of.pop(s) for s in held if s in self._durable_of}
        for sub_id in held:
            del self._subscriptions[sub_id]
        new_ids = await asyncio.gather(
            *(self._subscribe(f, None, durable.get(s)) for s, f in held.items())
        )
        for old_id, new_id in zip(held, new_ids, strict=True):
            stream = self._streams.pop(old_id, None)
            if stream is not None:
                stream.sub_id = new_id
                self._streams[new_id] = stream
        if durable:
            self.acks.ack_all(self.durables())

    async def unsubscribe(self, stream: SubscriptionStream | str, timeout: float = 10.0) -> None:
        """Withdraw a subscription by stream or id."""
        sub_id = stream if isinstance(stream, str) else stream.sub_id
        await self.connection.request(UnsubscribeRequest(client=self.name, sub_id=sub_id), timeout)
        gone = self._streams.pop(sub_id, None)
        if gone is not None:
            gone.release()
        self._subscriptions.pop(sub_id, None)
        self._durable_of.pop(sub_id, None)

    def _on_notify(
        self,
        name: str,
        publisher: str,
        seq: int,
        published_at: float,
        publication: Publication,
        received_at: float,
        left_at: float,
        size: int,
        session: int,
        body: bytes,
    ) -> None:
        received = Received(
            name,
            publisher,
            seq,
            published_at,
            received_at,
            publication,
            left_at,
            session,
            body=body,
        )
        seam = self.past.seam
        if seam is not None and seam.hold((received, size)):
            return
        self.deliver(received, size)

    def deliver(self, received: Received, size: int) -> None:
        """Hand ``received`` (of ``size`` encoded bytes) to the streams, or the callback."""
        self.replaying.delivered(
            received.publisher, received.session, received.seq, received.received_at
        )
        if self._callback is not None:
            self._callback(received)  # taken once the callback returns
            if self._durable_of:
                for durable in set(self._durable_of.values()):
                    self.took(durable, received)
            return
        publication = received.publication
        for stream in self._streams.values():  # a delivery for this client: to the streams
            if not isinstance(stream, CompositeStream) and stream.matches(publication):
                self.acks.offer(stream, received, size)

    def _dropped(self, reason: str) -> None:
        for stream in self._streams.values():
            stream.end(DroppedError(reason))


def past_window(
    durable: str | None, since: str | float | datetime | None, until: str | float | datetime | None
) -> tuple[float | None, float | None]:
    """The window of the past a subscription asks for, ``since`` and ``until`` read as
    times (None: not asked); :class:`ValueError` if they contradict each other or a
    ``durable`` subscription (which starts where it left off)."""
    if durable is not None and (since is not None or until is not None):
        raise ValueError("a durable subscription starts where it left off: no since/until")
    if until is not None and since is None:
        raise ValueError("until needs since: the window of the past is [since, until)")
    after = parse_time(since) if since is not None else None
    end = parse_time(until) if until is not None else None
    if after is not None and end is not None and end <= after:
        raise ValueError(f"until ({end}) must come after since ({after})")
    return after, end
