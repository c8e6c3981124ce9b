"""The SDK's subscriber (DESIGN §4, §9): subscriptions and their streams, resubscribing
after a fail-over, and moving to another broker when the balancer says so."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from octopis.client.composite import composite_notification
from octopis.client.connection import (
    BrokerError,
    Connection,
    DroppedError,
    NamedClient,
    Received,
    log,
)
from octopis.client.replay import (
    History,
    ReplayGap,
    Seam,
    parse_time,
    unseen,
)
from octopis.client_policy import LastSeen, replay_after
from octopis.filters.composite import Composite, as_filter
from octopis.filters.language import Publication, Subscription
from octopis.wire import claimed_records, pack

LATE_KEPT = 10_000
"""Deliveries a subscriber remembers per replay that waits for late answers (beyond it,
the connection group's record of the last 30 s still drops repeats)."""
LATE_WAITING = 16
"""Replays of one subscriber that wait for late answers with their memory of
deliveries; an older one forgets it."""
REPLAY_WAIT = 10.0
"""Seconds a subscriber waits for a replay's answer before it reports the gap as unknown
(the brokers' own budget, ``[retention] replay_budget``, is far shorter)."""
HISTORIC_WAIT = 40.0
"""Seconds a subscriber waits for a historic, hybrid or durable subscription's answer (the
brokers' own budget, ``[retention] historic_budget``, is 30 s)."""


class EndOfHistory(Exception):
    """A historic subscription (one with ``until``) has delivered its whole answer; its
    stream's :attr:`~SubscriptionStream.history` says whether anything is missing."""


class SubscriptionStream:
    """An async iterator over the notifications delivered to its subscriber (the broker
    delivers each matching notification once per subscriber, DESIGN §3). What it holds
    counts against its subscriber's ``buffer`` and ``buffer_bytes``."""

    def __init__(
        self,
        owner: Subscriber,
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

    def notice(self, message: dict[str, Any]) -> None:
        """A ``composite`` or ``composite_dropped`` notice for this subscription."""
        self.dropped = max(self.dropped, int(message.get("dropped", 0)))
        self.late = max(self.late, int(message.get("late", 0)))
        self.cut = max(self.cut, int(message.get("cut", 0)))
        if message["op"] == "composite":
            match = composite_notification(self.owner.name, message, time.time())
            self.offer(match, len(pack(message)))  # type: ignore[arg-type]


class Subscriber(NamedClient):
    """A named subscriber. ``on_notification`` (if given) receives every delivery instead
    of the per-subscription streams (used for bulk accounting).

    After a fail-over (its broker died or restarted) the subscriber makes its
    subscriptions again at the new broker and then, with ``replay`` on, asks the overlay
    for what it missed meanwhile (DESIGN §11): each publication is delivered once, in
    publisher order across the seam, and what could not be replayed is reported to
    ``on_gap`` and kept in :attr:`gaps`."""

    def __init__(
        self,
        name: str,
        connection: Connection,
        on_notification: Callable[[Received], None] | None = None,
        buffer: int = 10_000,
        buffer_bytes: int = 64 * 2**20,
        *,
        replay: bool = True,
        on_gap: Callable[[ReplayGap], None] | None = None,
        on_gap_filled: Callable[[ReplayGap, ReplayGap | None], None] | None = None,
    ) -> None:
        super().__init__(name, connection)
        self.replay_on_failover = replay
        self.on_gap = on_gap
        self.on_gap_filled = on_gap_filled
        """Told ``(gap, left)`` when brokers a gap named silent answered later and their
        publications were delivered: ``left`` is what is still missing (None: nothing),
        and :attr:`gaps` holds ``left`` instead of ``gap``."""
        self.last_seen = LastSeen()
        """The last sequence number delivered per (publisher, session)."""
        self.since: float | None = None
        """When this subscriber first subscribed: a replay asks for the publications of
        publishers it never heard from since then."""
        self.gaps: deque[ReplayGap] = deque(maxlen=1000)
        """What replays could not fill and is still missing (the last 1,000): a gap
        whose silent brokers answer later is narrowed, or withdrawn once filled."""
        self.replays: deque[dict[str, Any]] = deque(maxlen=1000)
        """One record per replay (the last 1,000): id, replayed, repeats, seconds, gap."""
        self._seam: Seam | None = None
        self._awaiting_late: list[dict[str, Any]] = []
        """Replay records with silent parts not yet answered late."""
        self._replay_records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """The records of :attr:`replays` by request id: late answers are added to them."""
        if buffer < 1 or buffer_bytes < 1:
            raise ValueError("a subscriber's buffer and buffer_bytes must be positive")
        self.buffer = buffer
        """Deliveries this subscriber's streams hold, not yet taken, before its connection
        stops reading (the broker then queues, and its slow-consumer policy applies)."""
        self.buffer_bytes = buffer_bytes
        """Encoded bytes of those deliveries before the connection stops reading."""
        self.held = 0
        """Deliveries held in the streams now (one per stream a delivery is queued on)."""
        self.held_bytes = 0
        """Their encoded bytes."""
        self.stalls = 0
        """Times a full buffer stopped the connection's reader."""
        self._room = asyncio.Event()
        self._room.set()
        self._streams: dict[str, SubscriptionStream] = {}
        self._subscriptions: dict[str, Subscription | Composite] = {}
        self._durable_of: dict[str, str] = {}
        """Sub id → the name of the durable subscription it is."""
        self._taken: dict[str, LastSeen] = {}
        """Per durable name: the last sequence number the application took of each
        (publisher, session), acknowledged to the broker."""
        self._unacked: dict[str, dict[tuple[str, int], int]] = {}
        """Per durable name: what was taken and not acknowledged yet."""
        self._owed_after: dict[str, float] = {}
        """Per durable name claimed from a record: the time from which other publishers'
        publications are owed (sent with the acknowledgements to the new record)."""
        self._ack_soon: asyncio.Handle | None = None
        self._past_lock = asyncio.Lock()
        """One historic, hybrid or durable answer at a time."""
        self._callback = on_notification
        self._releases: dict[str, asyncio.Event] = {}
        self._moving: asyncio.Task | None = None
        self._next_move: dict[str, Any] | None = None
        self.moves: deque[dict[str, Any]] = deque(maxlen=1000)
        """One record per move (the last 1,000): from, to, inside, sub ids, seconds."""
        self.stale_moves = 0
        """Move orders ignored: from a broker this subscriber has left, or naming
        subscriptions it no longer holds (the broker's view was older than the client's)."""
        self._serve_on(connection)

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
        key = (received.publisher, received.session)
        taken = self._taken.setdefault(durable, LastSeen())
        taken.saw(received.publisher, received.session, received.seq)
        self._unacked.setdefault(durable, {})[key] = taken[key]
        if self._ack_soon is None:
            self._ack_soon = asyncio.get_running_loop().call_soon(self._send_acks)

    def _send_acks(self) -> None:
        self._ack_soon = None
        unacked, self._unacked = self._unacked, {}
        for durable, taken in unacked.items():
            message = {
                "op": "ack",
                "client": self.name,
                "durable": durable,
                "since": [[p, s, q] for (p, s), q in taken.items()],
            }
            if durable in self._owed_after:
                message["after"] = self._owed_after[durable]
            self.connection.send_soon(message)

    def _ack_all(self) -> None:
        """Acknowledge every durable subscription's whole record again (its new host
        keeps a record of its own after a fail-over or a move)."""
        for durable in set(self._durable_of.values()):
            taken = self._taken.get(durable)
            if taken or durable in self._owed_after:
                self._unacked.setdefault(durable, {}).update(taken or {})
        if self._unacked and self._ack_soon is None:
            self._ack_soon = asyncio.get_running_loop().call_soon(self._send_acks)

    def _serve_on(self, connection: Connection) -> None:
        self.connection = connection
        connection.register(self.name, self._on_notify)
        connection.on_notice(self.name, lambda message: self._on_notice(message, connection))
        connection.on_failover(self._resume_after_failover)
        connection.on_dropped(self._dropped)

    @property
    def moving(self) -> bool:
        """Whether a move is under way or ordered."""
        return self._next_move is not None or (self._moving is not None and not self._moving.done())

    def _on_notice(self, message: dict[str, Any], connection: Connection) -> None:
        """``released`` ends a move's wait; ``move`` starts one, or queues it behind the
        move under way, if it comes from the current connection."""
        if message["op"] == "withdrawn":
            self._withdrawn(str(message.get("sub_id")), connection)
            return
        if message["op"] in ("composite", "composite_dropped"):
            stream = self._streams.get(str(message.get("sub_id")))
            if isinstance(stream, CompositeStream):
                stream.notice(message)
            return
        if message["op"] in ("replayed", "replay_done"):
            record = self._replay_records.get(str(message.get("id")))
            if record is not None:
                self._late_answer(record, message)
            elif self._seam is not None:
                self._seam.notice(message)
            return
        if message["op"] == "move":
            message = {**message, "connection": connection}
        if message["op"] == "released":
            event = self._releases.get(message.get("sub_id"))
            if event is not None:
                event.set()
            return
        if self._moving is not None and not self._moving.done():
            log.info("%s is told to move while moving: it moves again after", self.name)
            self._next_move = message
            return
        self._start_move(message)

    def _start_move(self, message: dict[str, Any]) -> None:
        """Move as ``message`` says, unless it is stale (:meth:`_stale`)."""
        sub_ids = list(message["sub_ids"])
        stale = self._stale(message["connection"], str(message["to"]), sub_ids)
        if stale is None:
            work = self._move(str(message["to"]), bool(message["inside"]), sub_ids)
            self._moving = asyncio.get_running_loop().create_task(work)
            return
        self.stale_moves += 1
        self.connection.group.warn.warning(
            "stale move order",
            "%s ignores a move order from %s to %s for %s: %s",
            self.name,
            message["connection"].endpoint,
            message["to"],
            ", ".join(sub_ids),
            stale,
        )

    def _stale(self, sender: Connection, to: str, sub_ids: list[str]) -> str | None:
        """Why a move to ``to`` of ``sub_ids``, ordered on ``sender``, is stale, or None:
        the order came on a connection that is no longer this subscriber's (a broker it
        left still names it until it lets go), names subscriptions it no longer holds,
        or sends it where its connection already is (it failed over there). Acting on one
        would withdraw what it does not replace."""
        if sender is not self.connection:
            return "it has left that broker"
        if not set(sub_ids) <= set(self._subscriptions):
            return "it no longer holds those subscriptions"
        if to == sender.endpoint:
            return "it is connected there already (it failed over)"
        return None

    async def _move(self, to: str, inside: bool, sub_ids: list[str]) -> None:
        """Move to the broker at ``to`` as its current broker told (DESIGN §9), make before
        break: inside the cluster each subscription is adopted there and the old broker
        releases it once the path has turned; else each is made again there and the
        old one withdrawn ``linger`` seconds later. Both brokers deliver meanwhile, and
        a delivery had twice is dropped (the group's record, counted in
        ``Connection.duplicates_absorbed``). A move ordered meanwhile starts when this
        one is done."""
        old = self.connection
        started = time.monotonic()
        new = await old.sibling(to)
        stale = "it failed over meanwhile" if new is old else self._stale(old, to, sub_ids)
        if stale is not None:
            self.stale_moves += 1
            old.group.warn.warning(
                "stale move order", "%s drops a move to %s: %s", self.name, to, stale
            )
            self._after_move()
            return
        let_go = True
        try:
            self._serve_on(new)
            across = [sub_id for sub_id in sub_ids if not inside or not await self._adopt(sub_id)]
            waits = [self._releases[s].wait() for s in sub_ids if s in self._releases]
            try:
                await asyncio.wait_for(asyncio.gather(*waits), old.linger + old.liveness * 4)
            except TimeoutError:
                let_go = False  # it may still deliver: keep reading it, repeats dropped
                log.warning(
                    "%s: %s did not release %d moved subscriptions; both are read",
                    self.name,
                    old.endpoint,
                    sum(not e.is_set() for e in self._releases.values()),
                )
            if across:
                await self._resubscribe(across)
                await asyncio.sleep(old.linger)  # the new subscriptions spread meanwhile
                for sub_id in across:
                    try:
                        await old.request(
                            {
                                "op": "unsubscribe",
                                "client": self.name,
                                "sub_id": sub_id,
                                "moved": True,
                            }
                        )
                    except BrokerError as exc:  # withdrawn there already (a fail-over)
                        log.warning("%s: %s", self.name, exc)
            if let_go:
                old.forget(self.name, self._resume_after_failover, self._dropped)
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
            log.info("%s moved %d subscriptions to %s", self.name, len(sub_ids), to)
        finally:
            self._releases.clear()
            self._after_move()

    def _after_move(self) -> None:
        """Start the move ordered while one was under way, if any."""
        if self._next_move is not None:
            message, self._next_move = self._next_move, None
            asyncio.get_running_loop().call_soon(self._start_move, message)

    async def _adopt(self, sub_id: str) -> bool:
        """Ask the new broker to take ``sub_id`` over; False if it cannot (not there yet)."""
        self._releases[sub_id] = asyncio.Event()
        try:
            message = {"op": "adopt", "client": self.name, "sub_id": sub_id}
            if sub_id in self._durable_of:
                message["durable"] = self._durable_of[sub_id]
            await self.connection.request(message)
        except BrokerError as exc:
            log.warning("%s could not adopt %s: %s; subscribing afresh", self.name, sub_id, exc)
            del self._releases[sub_id]
            return False
        return True

    async def subscribe(
        self,
        spec: str | dict | Subscription | Composite,
        timeout: float = 10.0,
        *,
        durable: str | None = None,
        since: str | float | datetime | None = None,
        until: str | float | datetime | None = None,
        max_count: int = 0,
        max_bytes: int = 0,
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
        with :class:`EndOfHistory`). ``max_count`` and ``max_bytes`` bound each store's
        answer (0: the brokers' ``[retention] answer_max``, ``answer_bytes``). The
        stream's :attr:`~SubscriptionStream.history` says whether the answer is
        complete. The call returns once the past has been delivered to the stream.

        A composite subscription (text ``{...} & {...} within 5s`` or its dict form,
        :func:`~octopis.filters.composite.composite_from_dict`) returns a :class:`CompositeStream`
        of one :class:`~octopis.client.composite.CompositeNotification` per match, joined
        at the broker; it is live only (no ``durable``, ``since``, ``until``)."""
        subscription = as_filter(spec)
        if isinstance(subscription, Composite):
            if durable is not None or since is not None or until is not None:
                raise ValueError("a composite subscription is live only: no durable, since, until")
            sub_id = await self._subscribe(subscription, timeout)
            stream = self._streams[sub_id] = CompositeStream(self, sub_id, subscription)
            return stream
        if durable is not None and (since is not None or until is not None):
            raise ValueError("a durable subscription starts where it left off: no since/until")
        if until is not None and since is None:
            raise ValueError("until needs since: the window of the past is [since, until)")
        after = parse_time(since) if since is not None else None
        end = parse_time(until) if until is not None else None
        if after is not None and end is not None and end <= after:
            raise ValueError(f"until ({end}) must come after since ({after})")
        if self.since is None:
            self.since = time.time()
        if end is not None:
            return await self._historic(subscription, after, end, max_count, max_bytes)
        if durable is None and after is None:
            sub_id = await self._subscribe(subscription, timeout)
            stream = self._streams[sub_id] = SubscriptionStream(self, sub_id, subscription)
            return stream
        async with self._past_lock:
            seam = self._seam = Seam(self.buffer)
            try:
                sub_id = await self._subscribe(subscription, timeout, durable)
            except BaseException:
                self._let_go(seam)
                raise
            stream = SubscriptionStream(self, sub_id, subscription, durable)
            self._streams[sub_id] = stream
            if durable is not None:
                stream.history = await self._claim(seam, subscription, durable)
            else:
                message = {"filters": [subscription.to_text()], "since": [], "after": after}
                limits = {"max_count": max_count, "max_bytes": max_bytes}
                stream.history = await self._past(seam, {**message, **limits}, HISTORIC_WAIT)
        return stream

    def _let_go(self, seam: Seam) -> None:
        """End ``seam`` without an answer: deliver the live deliveries it held."""
        if self._seam is seam:
            self._seam = None
        for received, size in seam.joined(self.name, self.connection.group)[0]:
            self._deliver(received, size)

    async def _claim(self, seam: Seam, subscription: Subscription, durable: str) -> History:
        """Find durable ``durable``'s record (wherever its last host kept it) and replay
        from what this client acknowledged last; a new durable has none."""
        error = await self._ask(
            seam, {"op": "claim", "client": self.name, "durable": durable}, HISTORIC_WAIT
        )
        summary = seam.next_request() or {}
        claimed = summary.get("claimed", [])
        if not claimed:
            self._let_go(seam)
            silent = tuple(summary.get("silent", ()))
            history = History(None, time.time(), None, 0, 0, silent=silent, error=error)
            if silent or error:
                why = error or "its record may be kept at a broker that did not answer"
                self._report(ReplayGap(self.name, None, time.time(), silent, error=why))
            log.info("%s: durable %s is new here (no record found)", self.name, durable)
            return history
        best = max(claimed_records(claimed), key=lambda c: c.updated)
        record_since = list(best.since)
        taken = self._taken.setdefault(durable, LastSeen())
        for p, s, q in record_since:
            taken.saw(p, s, q)
        self._owed_after[durable] = best.after
        self._ack_all()
        log.info(
            "%s: durable %s claimed from %s (%d publishers known)",
            self.name,
            durable,
            best.broker,
            len(record_since),
        )
        message = {
            "filters": [subscription.to_text()],
            "since": [list(x) for x in record_since],
            "after": best.after,
        }
        return await self._past(seam, message, HISTORIC_WAIT)

    async def _ask(self, seam: Seam, message: dict[str, Any], timeout: float) -> str | None:
        """Send a replay or claim request and wait for its ``replay_done`` (at most
        ``timeout`` seconds from the request or from the last answer that came); returns
        why it failed, if it did."""
        try:
            reply = await self.connection.request(message, timeout)
            seam.named(str(reply["id"]))
            while True:  # waited for ``timeout`` from the request or the last answer
                progress = seam.progress
                try:
                    await asyncio.wait_for(seam.finished.wait(), timeout)
                    break
                except TimeoutError:
                    if seam.progress == progress:
                        raise
        except (TimeoutError, BrokerError) as exc:
            return f"{message['op']} failed: {exc or type(exc).__name__}"
        return None

    async def _past(self, seam: Seam, fields: dict[str, Any], timeout: float) -> History:
        """A window of the past into the live streams (a hybrid or durable subscription)."""
        message = {"op": "replay", "client": self.name, "historic": True, **fields}
        return (await self._replayed(seam, message, timeout))[1]

    async def _historic(
        self,
        subscription: Subscription,
        after: float | None,
        until: float,
        max_count: int,
        max_bytes: int,
    ) -> SubscriptionStream:
        """A historic subscription: the answer alone, in publisher order, each
        publication once, then :class:`EndOfHistory`."""
        stream = SubscriptionStream(self, f"history:{after}:{until}", subscription)
        message = {
            "op": "replay",
            "client": self.name,
            "filters": [subscription.to_text()],
            "since": [],
            "after": after,
            "until": until,
            "historic": True,
            "max_count": max_count,
            "max_bytes": max_bytes,
        }
        async with self._past_lock:
            seam = self._seam = Seam(self.buffer, hold_live=False)
            try:
                error = await self._ask(seam, message, HISTORIC_WAIT)
            finally:
                self._seam = None
        items = seam.answered(self.name)
        stream.end_history(items, self._history(seam, after or 0.0, until, len(items), error))
        return stream

    def _history(
        self, seam: Seam, after: float, until: float | None, delivered: int, error: str | None
    ) -> History:
        summary = seam.done.get(seam.replay or "")
        if summary is None:
            return History(seam.replay, after, until, 0, delivered, error=error or "no answer")
        return History(
            seam.replay,
            after,
            until,
            int(summary.get("published", 0)),
            delivered,
            tuple(summary.get("silent", ())),
            tuple(summary.get("unstored", ())),
            tuple((str(p), int(s), int(a), int(b)) for p, s, a, b in summary.get("gaps", ())),
            tuple(summary.get("truncated", ())),
            error,
        )

    async def _subscribe(
        self,
        subscription: Subscription | Composite,
        timeout: float | None,
        durable: str | None = None,
    ) -> str:
        message = {"op": "subscribe", "client": self.name, "filter": subscription.to_text()}
        if durable is not None:
            message["durable"] = durable
        reply = await self.connection.request(message, timeout)
        self._subscriptions[reply["sub_id"]] = subscription
        if durable is not None:
            self._durable_of[reply["sub_id"]] = durable
        return reply["sub_id"]

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
            seam = None
            if replaying and self.since is not None:
                # Hold live deliveries from now: what the new broker delivers (detours
                # included) must not move the point the replay asks from.
                seam = self._seam = Seam(self.buffer)
            try:
                await self._resubscribe()
            except BaseException:
                if seam is not None and self._seam is seam:  # no replay: let go of the seam
                    self._seam = None
                    for received, size in seam.joined(self.name, self.connection.group)[0]:
                        self._deliver(received, size)
                raise
            if seam is not None:
                await self.replay(seam=seam)

    async def replay(
        self, timeout: float = REPLAY_WAIT, *, seam: Seam | None = None
    ) -> ReplayGap | None:
        """Ask the overlay for the retained publications this subscriber may have missed
        (after the last delivered of each publisher it knows, all of them published since
        :data:`LOOKBACK` seconds before its broker went silent, and not before it first
        subscribed) and deliver them with the live ones held meanwhile, each once, in
        publisher order; returns the gap left, if any (also reported)."""
        silent = self.connection.silent_since or time.time()
        after = replay_after(self.since, silent)
        if seam is None:
            seam = self._seam = Seam(self.buffer)
        message = {
            "op": "replay",
            "client": self.name,
            "filters": self._replayable(),
            "since": self.last_seen.since(),
            "after": after,
        }
        gap, _ = await self._replayed(seam, message, timeout)
        return gap

    def _replayable(self) -> list[str]:
        """The texts of the subscriptions a replay asks for: the atomic ones (a composite
        subscription's join starts afresh at its new host)."""
        return [f.to_text() for f in self._subscriptions.values() if isinstance(f, Subscription)]

    async def _replayed(
        self, seam: Seam, message: dict[str, Any], timeout: float
    ) -> tuple[ReplayGap | None, History]:
        """Send replay request ``message``, deliver its answer with the live deliveries
        ``seam`` held, each once, in publisher order; record and report what it left."""
        after = float(message["after"])
        error = await self._ask(seam, message, timeout)
        self._seam = None
        items, repeats = seam.joined(self.name, self.connection.group)
        for received, size in items:
            self._deliver(received, size)
        gap = seam.gap(self.name, after, error)
        replayed = sum(1 for received, _ in items if received.replayed)
        record = {
            "id": seam.replay,
            "replayed": replayed,
            "repeats": repeats,
            "seconds": time.monotonic() - seam.started,
            "gap": gap,
            "late_replayed": 0,
            "late_parts": [],
            "outstanding": set(gap.silent) if gap is not None else set(),
            "delivered": {(r.publisher, r.session, r.seq) for r, _ in items},
        }
        """``outstanding``: the silent brokers not yet answered late; while any is,
        ``delivered`` keeps what was delivered since the fail-over (at most
        :data:`LATE_KEPT`), so that a late answer, however late, repeats none of it."""
        self.replays.append(record)
        if record["outstanding"]:
            self._awaiting_late.append(record)
            while len(self._awaiting_late) > LATE_WAITING:
                self._awaiting_late.pop(0)["delivered"] = set()  # its late answers may repeat
        else:
            record["delivered"] = set()
        if seam.replay is not None:
            self._replay_records[seam.replay] = record
            while len(self._replay_records) > self.replays.maxlen:  # type: ignore[operator]
                self._replay_records.popitem(last=False)
        log.info("%s replayed %d publications (%d repeats)", self.name, replayed, repeats)
        if gap is not None:
            self._report(gap)
        return gap, self._history(seam, after, message.get("until"), replayed, error)

    def _narrow(self, record: dict[str, Any]) -> None:
        """A replay's silent brokers answered late (their publications are delivered):
        its gap shrinks to the brokers still silent, and goes once nothing is missing;
        :attr:`gaps` and ``on_gap_filled`` are told."""
        gap = record["gap"]
        if gap is None:
            return
        silent = tuple(b for b in gap.silent if b in record["outstanding"])
        if silent == gap.silent:
            return
        left = replace(gap, silent=silent)
        if not (silent or left.unstored or left.trimmed or left.error):
            left = None
        record["gap"] = left
        kept = [left if g is gap else g for g in self.gaps]
        self.gaps = deque((g for g in kept if g is not None), maxlen=self.gaps.maxlen)
        log.info("%s: a replay's gap was filled late: %s, left %s", self.name, gap, left)
        if self.on_gap_filled is not None:
            self.on_gap_filled(gap, left)

    def _report(self, gap: ReplayGap) -> None:
        log.warning("%s: a replay left a gap: %s", self.name, gap)
        self.gaps.append(gap)
        if self.on_gap is not None:
            self.on_gap(gap)

    async def _resubscribe(self, only: Sequence[str] | None = None) -> None:
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
            self._ack_all()

    async def unsubscribe(self, stream: SubscriptionStream | str, timeout: float = 10.0) -> None:
        """Withdraw a subscription by stream or id."""
        sub_id = stream if isinstance(stream, str) else stream.sub_id
        await self.connection.request(
            {"op": "unsubscribe", "client": self.name, "sub_id": sub_id}, timeout
        )
        gone = self._streams.pop(sub_id, None)
        if gone is not None:
            gone.release()
        self._subscriptions.pop(sub_id, None)
        self._durable_of.pop(sub_id, None)

    def _late_answer(self, record: dict[str, Any], message: dict[str, Any]) -> None:
        """An answer to a finished replay from a part that was silent then (a broker
        that restarted and took the request with the subscriptions held for it): its
        publications not delivered before are delivered now (after the live ones that
        came meanwhile), and the part is noted in the replay's record."""
        if message["op"] == "replayed":
            fresh, repeats = unseen(self.name, self.connection.group, message.get("bodies", ()))
            delivered = record["delivered"]
            fresh = [
                item
                for item in fresh
                if (item[0].publisher, item[0].session, item[0].seq) not in delivered
            ]
            repeats += len(message.get("bodies", ())) - repeats - len(fresh)
            fresh.sort(key=lambda item: (item[0].publisher, item[0].session, item[0].seq))
            for received, size in fresh:
                self._deliver(received, size)
            record["late_replayed"] += len(fresh)
            record["repeats"] += repeats
            return
        record["late_parts"].append(
            {k: message.get(k) for k in ("answered", "silent", "unstored", "gaps", "published")}
        )
        outstanding = record["outstanding"]
        outstanding.difference_update(message.get("answered", ()))
        outstanding.update(set(message.get("silent", ())) - set(message.get("answered", ())))
        if not outstanding and record in self._awaiting_late:
            self._awaiting_late.remove(record)
            record["delivered"] = set()
        self._narrow(record)
        log.info(
            "%s: replay %s answered late by %s (%d publications)",
            self.name,
            record["id"],
            message.get("answered"),
            message.get("published", 0),
        )

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
    ) -> None:
        received = Received(
            name, publisher, seq, published_at, received_at, publication, left_at, session
        )
        seam = self._seam
        if seam is not None and seam.hold_live and seam.hold(received, size):
            return
        self._deliver(received, size)

    def _deliver(self, received: Received, size: int) -> None:
        self.last_seen.saw(received.publisher, received.session, received.seq)
        if self._awaiting_late:
            key = (received.publisher, received.session, received.seq)
            for record in self._awaiting_late:
                if len(record["delivered"]) < LATE_KEPT:
                    record["delivered"].add(key)
        if self._callback is not None:
            self._callback(received)  # taken once the callback returns
            if self._durable_of:
                for durable in set(self._durable_of.values()):
                    self.took(durable, received)
            return
        publication = received.publication
        for stream in self._streams.values():  # a delivery for this client: to the streams
            if not isinstance(stream, CompositeStream) and stream.matches(publication):
                stream.offer(received, size)

    def _dropped(self, reason: str) -> None:
        for stream in self._streams.values():
            stream.end(DroppedError(reason))
