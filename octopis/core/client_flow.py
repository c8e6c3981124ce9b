"""The flow control of a broker's client side (DESIGN §8), sans-IO: which publications are
refused, which deliveries wait for ``clients.capacity`` and when each may leave, what a
connection whose pipe is full may queue, and what a slow consumer loses.

- A publication is refused, naming the limit, when its body is longer than
  ``clients.body_bytes``, when ``clients.publish_window`` of its connection's
  publications are unanswered, or when ``clients.queue_limit`` deliveries wait for
  ``clients.capacity``.
- With ``clients.capacity`` set, deliveries leave no faster than that, in order: a
  message that finds none waiting and a free slot leaves at once; any other waits
  (:class:`ClientFlow` books its slots when it reaches the head). Notices queue behind
  the deliveries before them.
- A connection whose pipe is full gets a backlog of up to ``clients.backlog_limit``
  messages (a reply may use the publish window beyond it); one more applies
  ``clients.slow_policy``: ``drop_oldest`` drops its oldest queued delivery (replies
  are kept: a request must be answered; the count is told once its backlog drains),
  ``disconnect`` drops the connection and everything queued for it, with a reason it
  is told then and with every later request (the last :data:`DROPPED_KEPT` are
  remembered).

A message is a list of parts: one part is a reply or a notice, more are deliveries
(``names, body`` pairs). The process sends, sleeps and polls; every limit, order and
count is decided here.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from octopis.core.capacity import SendRate
from octopis.wire.client import DroppedNotice, OverflowNotice

DROPPED_KEPT = 1000
"""Dropped connections remembered, so that their later requests are told why."""

SLOW_POLICIES = ("disconnect", "drop_oldest")
"""What a broker does with a client connection whose backlog reaches its limit."""

T = TypeVar("T")


@dataclass(frozen=True)
class Overflow:
    """What a full backlog's slow-consumer policy decided: ``reason`` None: its oldest
    delivery was dropped (``dropped`` deliveries); else the connection is to be dropped
    for ``reason`` (``dropped`` deliveries in all lost with it)."""

    dropped: int
    reason: str | None

    @property
    def notice(self) -> DroppedNotice | None:
        """What the connection is told, queued where its backlog was (None: nothing
        now, its drops are told once it drains, :meth:`ClientFlow.drained`)."""
        return None if self.reason is None else DroppedNotice(reason=self.reason)


class ClientLimits(Protocol):
    """What the flow control reads of the ``[clients]`` settings (the section itself):
    ``capacity`` (deliveries per second, 0: unpaced), ``queue_limit`` (deliveries waiting
    for it beyond which publications are refused), ``publish_window`` (unanswered
    publications per connection), ``backlog_limit`` (messages queued for a full pipe),
    ``body_bytes`` (the longest publication body), ``slow_policy`` and ``timeout``
    (seconds of silence after which a client is gone)."""

    capacity: float
    queue_limit: int
    publish_window: int
    backlog_limit: int
    body_bytes: int
    slow_policy: str
    timeout: float


class ClientFlow(Generic[T]):
    """The client side's flow control (see the module docstring), for messages of type
    ``T`` (the process's: a connection and its parts). ``limits``: the ``[clients]``
    settings; ``slack``: how early a booked slot may leave (the event loop's slack);
    ``counters`` is where refusals, pacing and drops are counted."""

    def __init__(
        self, broker_id: str, limits: ClientLimits, slack: float, counters: Counter[str]
    ) -> None:
        slow_policy = limits.slow_policy
        if slow_policy not in SLOW_POLICIES:
            raise ValueError(
                f"clients.slow_policy must be one of {SLOW_POLICIES}, not {slow_policy!r}"
            )
        self.broker_id = broker_id
        self.capacity = capacity = limits.capacity
        self.queue_limit = limits.queue_limit
        self.publish_window = limits.publish_window
        self.backlog_limit = limits.backlog_limit
        self.body_bytes = limits.body_bytes
        self.slow_policy = slow_policy
        self.timeout = limits.timeout
        self.counters = counters
        self.pacer = SendRate(capacity, slack) if capacity else None
        """``clients.capacity``: the slots deliveries leave in, when set."""
        self.paced: deque[tuple[T, int, float | None]] = deque()
        """Messages waiting for :attr:`pacer`, in order: (message, deliveries in it,
        departure once booked)."""
        self.paced_deliveries = 0
        """Deliveries in :attr:`paced` (``clients.queue_limit`` applies to it)."""
        self.paced_peak = 0
        """The most deliveries :attr:`paced` has held at once."""
        self.dropped: OrderedDict[bytes, str] = OrderedDict()
        """Connections dropped as slow consumers → the reason (the last :data:`DROPPED_KEPT`)."""

    # -- publications ---------------------------------------------------------------------

    def refuse_body(self, size: int) -> str | None:
        """Why a publication body of ``size`` bytes is refused (counted), or None."""
        if size <= self.body_bytes:
            return None
        self.counters["publications_refused.body_bytes"] += 1
        return (
            f"a publication body of {size} bytes is longer than "
            f"clients.body_bytes = {self.body_bytes}"
        )

    def refuse_publication(self, unanswered: int) -> str | None:
        """Why a publication from a connection with ``unanswered`` publications cannot be
        taken now (counted), or None: ``clients.publish_window`` of them are unanswered,
        or ``clients.queue_limit`` deliveries wait for ``clients.capacity``."""
        window = self.publish_window
        if unanswered >= window:
            self.counters["publications_refused.window"] += 1
            return (
                f"{unanswered} publications of this connection are unanswered "
                f"(clients.publish_window = {window}); wait for their answers"
            )
        if self.paced_deliveries >= self.queue_limit:
            self.counters["publications_refused.deliveries_waiting"] += 1
            return (
                f"{self.paced_deliveries} deliveries wait for this broker's capacity "
                f"(clients.capacity = {self.capacity:g}/s, clients.queue_limit "
                f"= {self.queue_limit}); publish again later"
            )
        return None

    # -- pacing at clients.capacity ----------------------------------------------------------

    def admit(self, message: T, count: int, now: float) -> bool:
        """A message of ``count`` deliveries at ``now``: True if it leaves now (no pacing,
        or none waiting and a slot free); else it waits (:meth:`due`)."""
        pacer = self.pacer
        if pacer is None:
            return True
        leave = None
        if not self.paced:
            leave = pacer.book(now, count)
            if leave <= now:
                return True
        self.wait(message, count, leave)
        return False

    def wait(self, message: T, count: int, leave: float | None = None) -> None:
        """Queue ``message`` (``count`` deliveries; 0: a notice) behind those waiting;
        ``leave``: its departure, if already booked."""
        self.paced.append((message, count, leave))
        self.paced_deliveries += count
        self.paced_peak = max(self.paced_peak, self.paced_deliveries)
        self.counters["deliveries_paced"] += count

    def due(self, now: float) -> float:
        """Seconds from ``now`` until the first waiting message may leave (0: now); its
        slots are booked when it reaches the head. Only while some wait."""
        message, count, leave = self.paced[0]
        if leave is None and count:
            assert self.pacer is not None
            leave = self.pacer.book(now, count)
            self.paced[0] = (message, count, leave)
        return max(leave - now, 0.0) if leave is not None else 0.0

    def release(self) -> T:
        """The first waiting message, to send now (after :meth:`due` said so)."""
        message, count, _ = self.paced.popleft()
        self.paced_deliveries -= count
        return message

    # -- backlogs and slow consumers ----------------------------------------------------------

    def backlog_takes(self, queued: int, parts: list[bytes]) -> bool:
        """Whether a backlog of ``queued`` messages takes ``parts`` (a reply may use the
        publish window beyond ``clients.backlog_limit``)."""
        limit = self.backlog_limit
        return queued < limit or (len(parts) == 1 and queued < limit + self.publish_window)

    def refusal(self, identity: bytes) -> DroppedNotice | None:
        """The answer to a request from connection ``identity`` if it was dropped as a slow
        consumer (counted): told why again, whether or not its notice got out. None: it
        was not."""
        reason = self.dropped.get(identity)
        if reason is None:
            return None
        self.counters["requests_refused.dropped"] += 1
        return Overflow(0, reason).notice

    def drained(self, overflowed: int) -> OverflowNotice | None:
        """The notice a connection whose backlog drained is sent: how many of its
        deliveries the drop-oldest policy dropped meanwhile (``overflowed``; None: none)."""
        return OverflowNotice(dropped=overflowed) if overflowed else None

    def keeps_waiting(self, connected: bool, idle: float) -> bool:
        """Whether a backlog whose pipe is full is still waited for: its connection is
        live (the slow-consumer policy bounds its backlog), or, dropped, it took
        something within ``clients.timeout`` (``idle``: seconds since it last did) to
        take its notice; else what is left is undeliverable."""
        return connected or idle < self.timeout

    def overflow(
        self, identity: bytes, backlog: deque[list[bytes]], parts: list[bytes]
    ) -> Overflow:
        """``parts`` found connection ``identity``'s ``backlog`` full: apply
        ``clients.slow_policy`` (drop-oldest takes ``parts`` and drops from ``backlog``;
        disconnect empties ``backlog``, ``parts`` not taken: the caller drops the
        connection and queues :attr:`Overflow.notice`), counted."""
        if self.slow_policy == "drop_oldest" and len(parts) > 1:
            backlog.append(parts)
            while len(oldest := backlog.popleft()) == 1:  # replies are kept: a request
                backlog.append(oldest)  # must be answered; the new delivery ends the loop
            dropped = len(oldest) // 2
            self.counters["deliveries_dropped.slow_consumer"] += dropped
            return Overflow(dropped, None)
        reason = (
            f"slow consumer: {len(backlog)} messages queued at {self.broker_id} "
            f"(clients.backlog_limit = {self.backlog_limit}, clients.slow_policy = disconnect)"
        )
        dropped = sum(len(queued) // 2 for queued in (*backlog, parts))
        self.counters["slow_consumers_dropped"] += 1
        self.counters["deliveries_dropped.slow_consumer"] += dropped
        self.dropped[identity] = reason
        while len(self.dropped) > DROPPED_KEPT:
            self.dropped.popitem(last=False)
        backlog.clear()
        return Overflow(dropped, reason)
