"""Custody of one directed peer link (DESIGN §7), sans-IO: what a sender keeps of what it
sent, when the receiver's acknowledgement settles it, the limit, and what goes back to
the sender's core when the link goes down. The broker process's output link and the
simulator's links keep their copies in the very same :class:`Custody`; the receiver's
side of the rule (what it takes, what it acknowledges, and when) is :func:`take` and
:func:`acknowledgement`.

- Routing messages sent on a link after a handshake are numbered 1, 2, …; a handshake
  starts the count again (:meth:`Custody.greeted`). Of them, notifications are *kept*:
  ``(number, sent at, copy)``, in sending order (:meth:`Custody.sent`).
- The receiver acknowledges the count of routing messages it has taken (cumulative):
  at once when the sender asks (an ASK frame ahead of a copy a publisher's confirm waits
  for), when ``ack_every`` are owed or for any other routing message than a
  notification, else within ``ack_delay`` (:func:`take`). An
  acknowledgement of ``count`` *settles* the kept entries numbered up to it: they leave
  the unacknowledged list for the *retained* window, which keeps those sent less than
  ``retain`` seconds before the acknowledgement (at most ``retain_limit``, the oldest
  evicted first and counted): the receiver may die before passing them on. Only
  acknowledgements prune the window, so a receiver that dies leaves the sender its last
  ``retain`` seconds.
- The limit: with ``limit`` entries unacknowledged (kept and pending) the link has no
  :meth:`Custody.room` and sends no routing message (they wait on the sender, in
  order) until an acknowledgement makes room; each time a link stops for it is counted
  (:meth:`Custody.stopped`). A limit of 0 turns custody off (nothing is kept: a failure
  loses what was in flight).
- Link down (or the receiver restarted): :meth:`Custody.take_back` empties the window
  and the unacknowledged list and returns their copies, oldest first — retained, then
  unacknowledged; the sender routes the notifications again with the link down
  (:meth:`~octopis.core.notification_routing.NotificationRouting.reroute`), and edge
  dedup absorbs those that had arrived.
- The other routing messages (subscription, advertisement, move and replay messages)
  are *pending* until acknowledged (never retained): a cut that outlasts TCP's timeout
  aborts the connection, and what was in it — always the tail of what was sent — is
  lost. When the link heals with the same incarnation on the other side, the sender
  first says how many it numbered and sends its pending messages again with their
  numbers (:meth:`Custody.resend`, a RESENT link frame); the receiver takes those it
  had not taken and ends with the sender's count (:func:`resent`), so nothing is lost,
  nothing arrives twice, and the counts agree again. A new incarnation of the receiver
  ends the session: the pending messages go back to the sender's node
  (:meth:`Custody.give_up`), which hands them to the new process ahead of what it held.
  Notifications need none of this: they were given back at the detection, which comes
  first (``links.down_after`` is below TCP's timeout).
- A local publication's confirm (:class:`PublishReceipt`) waits for every copy of it
  kept on its way: each copy a link keeps in custody until the neighbour acknowledges
  it, the retention store's copy until its commit, and the node's hold until it routes;
  with none kept it is answered at once, and a store that refuses its copy says why.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any, TypeVar

from octopis.core.messages import ProtocolError
from octopis.core.neighbours import Neighbour
from octopis.defaults import ACK_EVERY

T = TypeVar("T")

Entry = tuple[int, float, Any]
"""A kept copy: ``(number, sent at, copy)``."""
Pending = tuple[int, Any]
"""A routing message other than a notification, sent and not acknowledged:
``(number, copy)``."""

_NUMBER, _SENT_AT = itemgetter(0), itemgetter(1)


class PublishReceipt:
    """The answer owed to a local publisher (DESIGN §7): given once every copy of its
    publication kept on its way is held — a copy in a link's custody once the neighbour
    acknowledges it, the retention store's once it commits, the node's hold once it
    routes — so from then on the neighbours and the store hold it and the host may die
    without losing it. With no copy kept (:attr:`waits` False after routing) the shell
    answers at once; ``answer`` is called when the last kept copy is held."""

    __slots__ = ("_answer", "alone", "copies", "refusal")

    def __init__(self, answer: Callable[[], None], alone: bool = True) -> None:
        self.copies = 0
        """Copies kept and not yet held."""
        self._answer = answer
        self.alone = alone
        """No other publication of its connection awaits an answer, nor came after it
        before its answer (an awaited publish; the shell clears it when another comes):
        the store commits it as soon as the input is idle, not within a delay."""
        self.refusal: str | None = None
        """Why the publication could not be kept as promised (the answer is an error)."""

    @property
    def waits(self) -> bool:
        """Whether the answer waits for a kept copy to be held (else: answer now)."""
        return self.copies > 0

    def keep(self) -> None:
        """One more copy is kept on its way: the answer waits for it (:meth:`held`)."""
        self.copies += 1

    def goes(self, custody: Custody, notification: bool) -> bool:
        """A copy goes on a link with ``custody``: kept, and waited for (:meth:`keep`),
        if it is the ``notification`` itself and the link keeps custody; a link without
        custody (its limit 0) gives no acknowledgement to wait for. Returns whether the
        copy is kept (the link then hands its entry to :meth:`held` when settled)."""
        if notification and custody.keeps:
            self.keep()
            return True
        return False

    def refuse(self, reason: str) -> None:
        """The retention store could not keep the publication: answered with ``reason``
        (its copies still travel; the publisher is told it is not kept for replay)."""
        self.refusal = reason
        self.held()

    def held(self) -> None:
        """One kept copy is held (in a neighbour's custody, committed, routed, or gone
        for good, counted elsewhere); the last one answers."""
        self.copies -= 1
        if self.copies == 0:
            self._answer()

    def committed(self, refusal: str | None) -> None:
        """The store's commit that was to keep it ended: its copy is held, or, the disk
        refused (``refusal``, what the publisher is told), :meth:`refuse`."""
        if refusal is None:
            self.held()
        else:
            self.refuse(refusal)


def settle_receipts(
    entries: list[Entry],
    receipt_of: Callable[[Any], PublishReceipt | None],
    bare: Callable[[Any], Any],
) -> int:
    """Acknowledged custody entries (DESIGN §7): a local publication's copy that carries
    its publisher's receipt (``receipt_of``) counts as held (:meth:`PublishReceipt.held`)
    and its entry keeps the copy without it (``bare``); returns how many did."""
    settled = 0
    for i, (number, sent_at, copy) in enumerate(entries):
        receipt = receipt_of(copy)
        if receipt is not None:
            receipt.held()
            entries[i] = (number, sent_at, bare(copy))
            settled += 1
    return settled


class Unanswered:
    """A client connection's publications taken and not yet answered (DESIGN §7): how
    many (:attr:`count`, what ``clients.publish_window`` bounds), and whether a new one
    is :attr:`~PublishReceipt.alone`. A publication taken while none is unanswered is
    alone; one taken while another waits makes that one not alone (its publisher
    pipelines), so the store need not commit at once for it."""

    __slots__ = ("_last", "count")

    def __init__(self) -> None:
        self.count = 0
        self._last: PublishReceipt | None = None

    def receipt(self, answer: Callable[[], None]) -> PublishReceipt:
        """The receipt of a publication taken now, whose ``answer`` is sent when it is
        held (then it is no longer unanswered)."""
        if self._last is not None and self.count:
            self._last.alone = False

        def answered() -> None:
            self.count -= 1
            answer()

        return PublishReceipt(answered, alone=not self.count)

    def waits(self, receipt: PublishReceipt) -> bool:
        """Whether ``receipt``, its publication routed, waits for its answer (it is
        unanswered until then); else the shell answers at once."""
        if receipt.waits:
            self.count += 1
            self._last = receipt
        return receipt.waits


class Custody:
    """The custody of one directed link (see the module docstring). ``limit``: entries
    unacknowledged at most (0: custody off); ``retain``: seconds an acknowledged entry
    stays retained; ``retain_limit``: retained entries at most; ``settle``: called with
    the entries an acknowledgement settles, before they are retained (it may replace
    them, e.g. without what the sender no longer needs of them)."""

    __slots__ = (
        "evicted",
        "keeps",
        "limit",
        "numbered",
        "pending",
        "retain",
        "retain_limit",
        "retained",
        "settle",
        "stopped_at",
        "stops",
        "unacked",
    )

    def __init__(
        self,
        limit: int,
        retain: float = 0.0,
        retain_limit: int = 0,
        settle: Callable[[list[Entry]], None] | None = None,
    ) -> None:
        if limit < 0 or retain < 0 or retain_limit < 0:
            raise ValueError("custody limit, retain and retain limit must not be negative")
        self.keeps = limit > 0
        """Custody on (a limit of 0 turns it off: a failure loses what was in flight)."""
        self.limit: float = limit if self.keeps else math.inf
        self.retain = retain
        self.retain_limit = retain_limit
        self.settle = settle
        self.numbered = 0
        """Routing messages sent since the last handshake (the last number given)."""
        self.unacked: list[Entry] = []
        """Notifications sent and not yet acknowledged, in sending order."""
        self.pending: list[Pending] = []
        """The other routing messages sent and not yet acknowledged, in sending order."""
        self.retained: list[Entry] = []
        """Acknowledged notifications sent less than ``retain`` seconds before the latest
        acknowledgement, in sending order."""
        self.evicted = 0
        """Retained entries dropped early to stay within ``retain_limit``."""
        self.stops = 0
        """Times the link stopped sending because custody was full."""
        self.stopped_at = -1
        """The number last sent when the last stop was counted (:meth:`stopped`)."""

    def __len__(self) -> int:
        """Routing messages unacknowledged: notifications kept and messages pending."""
        return len(self.unacked) + len(self.pending)

    def greeted(self) -> None:
        """A handshake went on the link: the numbering starts again."""
        self.numbered = 0
        self.stopped_at = -1

    def sent(self, copy: Any, now: float, kept: bool) -> None:
        """A routing message went on the link at ``now``: numbered, and, with custody on,
        kept if ``kept`` (a notification), else pending. (The process's send path books
        whole batches the same way, :func:`octopis.transport.zmqio.book_sent`.)"""
        self.numbered += 1
        if self.keeps:
            if kept:
                self.unacked.append((self.numbered, now, copy))
            else:
                self.pending.append((self.numbered, copy))

    def room(self) -> float:
        """Routing messages the link may send now (``inf`` with custody off): the limit
        bounds the notifications kept and the messages pending together."""
        return self.limit - len(self.unacked) - len(self.pending)

    @property
    def full(self) -> bool:
        """No room: routing messages wait until an acknowledgement makes some."""
        return len(self.unacked) + len(self.pending) >= self.limit

    def stopped(self) -> None:
        """The link stopped sending because custody is full: counted once per stop, not
        again while it waits for room (nothing was sent since the stop last counted), so
        a shell may say so each time it finds the link held (the process's sender wakes
        on every put and acknowledgement) or only once (the simulator)."""
        if self.numbered != self.stopped_at:
            self.stopped_at = self.numbered
            self.stops += 1

    def acknowledge(self, count: int, now: float) -> bool:
        """The receiver has taken the first ``count`` routing messages of this session
        (heard at ``now``): settle the entries numbered up to ``count`` into the retained
        window and prune it, and drop the pending messages numbered up to it (see the
        module docstring). The lists are in sending order, so what leaves each is found
        by bisection. Returns whether custody was full before (the link may send
        again)."""
        was_full = self.full
        pending = self.pending
        if pending and pending[0][0] <= count:
            del pending[: bisect_right(pending, count, key=_NUMBER)]
        unacked = self.unacked
        settled = bisect_right(unacked, count, key=_NUMBER) if unacked else 0
        if settled:
            entries = unacked[:settled]
            del unacked[:settled]
            if self.settle is not None:
                self.settle(entries)
            if self.retain > 0:
                self.retained += entries
        retained = self.retained
        if retained:
            expired = bisect_left(retained, now - self.retain, key=_SENT_AT)
            drop = max(expired, len(retained) - self.retain_limit)
            if drop > 0:
                self.evicted += drop - expired
                del retained[:drop]
        return was_full

    def settles(self, count: int) -> bool:
        """Whether an acknowledgement of ``count`` settles an entry kept now (or drops a
        pending message)."""
        unacked, pending = self.unacked, self.pending
        return (bool(unacked) and unacked[0][0] <= count) or (
            bool(pending) and pending[0][0] <= count
        )

    def prunes(self, at: float) -> bool:
        """Whether an acknowledgement heard at ``at`` prunes the retained window as it is
        now (an entry sent more than ``retain`` seconds before, or one over the limit)."""
        retained = self.retained
        return bool(retained) and (
            retained[0][1] < at - self.retain or len(retained) > self.retain_limit
        )

    def take_back(self) -> list[Any]:
        """Empty the retained window and the unacknowledged list; their copies, oldest
        first (retained, then unacknowledged)."""
        copies = [copy for _, _, copy in self.retained]
        copies += [copy for _, _, copy in self.unacked]
        self.retained.clear()
        self.unacked.clear()
        return copies

    def resend(self) -> tuple[int, list[Pending]]:
        """The link healed with the same incarnation on the other side: the count of
        routing messages numbered and the pending ones, to send again (they stay
        pending until acknowledged)."""
        return self.numbered, list(self.pending)

    def give_up(self) -> list[Any]:
        """The receiver restarted (its session is over): the pending copies, oldest
        first; none stays pending."""
        copies = [copy for _, copy in self.pending]
        self.pending.clear()
        return copies


STALE, TAKEN, FIRST, NOW = range(4)
"""What a receiver makes of routing messages from a neighbour (:func:`take`): dropped as
stale; taken, an acknowledgement already due; taken, the first since the last
acknowledgement (acknowledged within ``ack_delay``); taken and acknowledged at once."""


def take(
    record: Neighbour,
    count: int,
    counts: Counter[str],
    every: int = ACK_EVERY,
    *,
    notifications: bool = True,
) -> int:
    """The receiver's rule for ``count`` routing messages from the neighbour of ``record``,
    the one both shells carry out (DESIGN §7): :data:`STALE` unless the neighbour is
    :attr:`~Neighbour.reachable` (down, or its handshake has not named this incarnation of
    ours: they were meant for an earlier process, and are dropped and counted in
    ``counts`` as ``stale_frames`` rather than replayed into an empty table); else they
    are taken (:func:`took`) and acknowledged:

    - :data:`NOW`, before they are routed, when the sender asked (:attr:`~Neighbour.asked`:
      a copy its publisher's confirm waits for is among them, so the confirm costs a round
      trip, never a timer), when ``every`` or more are owed (:func:`acknowledge_every`), or
      when they are not ``notifications`` (subscription, advertisement, move and replay
      messages: one the receiver passed on and died before acknowledging is handed again
      to its next process, which passes it on a second time; at once, that window is a
      round trip, as it was for every message);
    - else within ``ack_delay`` seconds: :data:`FIRST` when they are the first since the
      last acknowledgement (the shell starts that wait), :data:`TAKEN` otherwise. Nobody
      waits on these, and one acknowledgement then covers what a hop took meanwhile: an
      acknowledgement per run wakes the sender once per notification at low rates."""
    if not record.reachable:
        counts["stale_frames"] += count
        return STALE
    first = took(record, count)
    if not notifications or record.asked or record.received - record.acked >= every:
        record.asked = False
        return NOW
    return FIRST if first else TAKEN


def ask(record: Neighbour) -> None:
    """The neighbour of ``record`` sent an ASK: the routing messages that follow hold a
    copy its publisher's confirm waits for, and :func:`take` acknowledges them at once
    (both shells call this for an ASK)."""
    record.asked = True


def acknowledge_every(every: int, custody_limit: int) -> int:
    """How many routing messages owed make a receiver acknowledge at once (:func:`take`):
    ``every`` (``[links] ack_every``), but at most half of ``custody_limit`` (set alike on
    every broker), so a sender never stops for room only to wait out ``ack_delay``."""
    return max(1, min(every, custody_limit // 2)) if custody_limit > 0 else every


def took(record: Neighbour, count: int) -> bool:
    """The receiver took ``count`` routing messages from the neighbour of ``record``;
    returns whether they are the first since its last acknowledgement (:func:`take` says
    when they are acknowledged)."""
    first = record.received == record.acked
    record.received += count
    return first


def resent(record: Neighbour, numbered: int, numbers: list[int]) -> list[bool]:
    """The neighbour of ``record`` sent again, after a heal, the routing messages
    ``numbers`` (increasing) and says it numbered ``numbered`` (:meth:`Custody.resend`):
    whether to take each (one numbered past what was taken from it; the others arrived
    before the connection died). What was taken becomes ``numbered``: the numbers in
    between were notifications, which the sender gave back at its detection.
    :class:`ProtocolError` if the numbers go back or past ``numbered``, or ``numbered``
    is below what was taken."""
    taken = record.received
    ordered = all(a < b for a, b in zip([0, *numbers], [*numbers, numbered + 1], strict=True))
    if numbered < taken or not ordered:
        raise ProtocolError(f"resent messages numbered {numbers} of {numbered}, {taken} taken")
    record.received = numbered
    return [number > taken for number in numbers]


def resent_taken(
    record: Neighbour, numbered: int, messages: Sequence[tuple[int, T]], counts: Counter[str]
) -> tuple[list[T], bool]:
    """The messages of a RESENT (``(number, message)`` pairs, :func:`resent`) that the
    receiver takes, in order, and whether it acknowledges at once, after routing them:
    the rule both shells carry out. Those it drops are counted in ``counts``: taken
    before (``links.resent_dropped``), or stale, all of them, when the sender is not
    :attr:`~Neighbour.reachable` (down, or its handshake has not named us: they were
    meant for an earlier session, ``stale_frames``; the count of what was taken from it
    stays as it was). A RESENT is acknowledged at once when anything is owed: what it
    carries is pending on the sender (subscription, move and replay messages), and its
    count settles what the cut left unacknowledged."""
    taken: list[T] = []
    if record.reachable:
        takes = resent(record, numbered, [number for number, _ in messages])
        taken = [message for (_, message), take in zip(messages, takes, strict=True) if take]
    stale = 0 if record.reachable else len(messages)
    counts["links.resent_dropped"] += len(messages) - len(taken) - stale
    counts["stale_frames"] += stale
    return taken, owed(record)


def counts_for(names: int, incarnation: int) -> bool:
    """Whether an acknowledgement that names the sender's incarnation ``names`` (a
    heartbeat's count, :func:`acknowledgement`) settles the custody of the sender running
    as ``incarnation``: one meant for an earlier process of it counted frames numbered in
    a session that ended, and settles nothing. The rule both shells follow (DESIGN §7)."""
    return names == incarnation


def owed(record: Neighbour) -> bool:
    """Whether routing messages were taken from the neighbour and not acknowledged."""
    return record.received != record.acked


def owed_neighbours(records: Iterable[tuple[str, Neighbour]]) -> list[tuple[str, Neighbour]]:
    """The neighbours a broker's acknowledgement timer acknowledges when it fires
    (``ack_delay`` after a :data:`FIRST`, one timer per broker, not per link): every one
    owed anything then (:func:`owed`), so one timer covers what every neighbour sent
    meanwhile. Both shells arm it and carry it out."""
    return [(name, record) for name, record in records if owed(record)]


def heartbeat_due(record: Neighbour, idle: float, heartbeat: float, sending: bool) -> bool:
    """Whether a heartbeat, with its acknowledgement, goes to the neighbour of ``record``
    now: what was taken from it is unacknowledged, or the link to it has sent nothing for
    ``idle`` ≥ ``heartbeat`` seconds and nothing is about to leave on it (``sending``;
    a queue held back must not silence the link). Each heartbeat that arrives settles
    and prunes the neighbour's custody (:meth:`Custody.acknowledge`), so its retained
    window keeps the last ``retain`` seconds even while the link is idle."""
    return owed(record) or (idle >= heartbeat and not sending)


def acknowledgement(record: Neighbour, withheld: bool) -> int:
    """The count an acknowledgement to the neighbour of ``record`` carries: all taken
    from it, unless backpressure ``withheld`` it (DESIGN §8), which repeats the count
    last acknowledged, so the neighbour's custody fills and it stops sending."""
    if not withheld:
        record.acked = record.received
    return record.acked
