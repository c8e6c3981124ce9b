"""The client policy (DESIGN §2, §7, §11), sans-IO: the rules a subscriber follows across
a fail-over, used alike by the SDK (``octopis.client``), the brokers' durable records
(``octopis.core.durable``) and the simulator's clients (``octopis.sim``): both clients
feed it what happens and perform its answers.

- :mod:`~octopis.client_policy.failover`: where a connection goes when its broker falls
  silent, and how it goes round its list until one answers;
- :mod:`~octopis.client_policy.moves`: how a subscriber moves to a broker of another
  cluster (make before break, ``linger`` seconds of overlap);
- :func:`replay_after`: from when a replay asks for what was missed (one
  :data:`~octopis.defaults.LOOKBACK`, and not before the subscription less the publishers'
  clock skew, :data:`~octopis.defaults.CLOCK_SKEW`);
- :func:`owed_after_failover`: from when a durable record at a fail-over's new host owes
  what its client has not taken (the fail-over replay's start);
- :class:`LastSeen`: the last sequence number taken of each (publisher, session), what a
  durable record says was taken;
- :func:`claim_gap`: when a durable record's claim leaves a gap, and why;
- :func:`still_silent`: which brokers a replay's gap still names once a late part answers,
  and :class:`ReplayGaps`, those of each replay request; :class:`LateAnswers`, those of
  a subscriber's replays, and what was delivered since (a late part repeats none of it);
- :class:`DurableProgress`: a durable subscription's progress at its client: what was
  taken, what a claimed record covers, from when its host's record owes the rest, what
  is acknowledged, and what a claim's answer decides
  (:meth:`~DurableProgress.claim_answered`, :class:`ClaimAnswer`);
- :class:`FromPoints`: of each (publisher, session), the last sequence number taken that
  nothing earlier can still overtake, the ``since`` of a replay request (and with
  :func:`replay_after`, the whole of a fail-over's, :meth:`FromPoints.replay`);
  :class:`SubscriberReplays`, a subscriber's from-points, late answers and the replay
  it asks for after a fail-over, with the start its durable records owe from;
- :func:`each_once`: a historic answer, each publication once (two stores may keep one
  its publisher sent again after a fail-over);
- :class:`Seam`: a request for the past under way, the live deliveries held meanwhile
  (up to :data:`~octopis.defaults.BUFFER`), its answer and why it falls short
  (:meth:`Seam.shortfall`); :func:`join_at_seam`: how they join, each
  publication once, in publisher order (:func:`publisher_order`);
- :class:`RecentDeliveries`: the deliveries of the last seconds, against which every
  delivery is checked (a repeat during a move or a fail-over is dropped).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from octopis.defaults import (
    BUFFER,
    CLOCK_SKEW,
    DELIVERIES_HORIZON,
    DELIVERIES_KNOWN,
    LATE_KEPT,
    LATE_WAITING,
    LOOKBACK,
    PUBLISHERS_KNOWN,
    REORDER,
)

T = TypeVar("T")
DeliveryKey = tuple[str, str, int, int]
"""(client, publisher, publisher session, seq): one delivery."""


class Ordered(Protocol):
    """What :func:`publisher_order` reads of a delivery."""

    @property
    def publisher(self) -> str:
        """Its publisher."""

    @property
    def session(self) -> int:
        """Its publisher's session."""

    @property
    def seq(self) -> int:
        """Its sequence number in that session."""


def publisher_order(n: Ordered) -> tuple[str, int, int]:
    """A delivery's place in publisher order (DESIGN §11): publisher, session, sequence
    number."""
    return n.publisher, n.session, n.seq


def join_at_seam(
    live: Iterable[T],
    replayed: Iterable[T],
    order: Callable[[T], tuple[str, int, int]],
    first_time: Callable[[T], bool],
) -> tuple[list[T], int]:
    """The seam of a replay (DESIGN §11): the ``live`` deliveries held while the answer
    came, with the ``replayed`` ones not delivered before (``first_time`` says, and
    records them), in publisher order (``order``: an item's publisher, session and
    sequence number); and how many replayed ones were repeats."""
    fresh: list[T] = []
    repeats = 0
    for item in replayed:
        if first_time(item):
            fresh.append(item)
        else:
            repeats += 1
    joined = [*live, *fresh]
    joined.sort(key=order)
    return joined, repeats


def each_once(items: Iterable[T], order: Callable[[T], tuple]) -> list[T]:
    """A historic subscription's answer as its subscriber takes it (DESIGN §11): each
    publication once, in publisher order (``order``: an item's publisher, session and
    sequence number). Two stores may both keep one: its publisher sent it again at
    another broker after a fail-over (DESIGN §7), and each broker's store kept its copy."""
    found: dict[tuple, T] = {}
    for item in items:
        found.setdefault(order(item), item)
    return [found[key] for key in sorted(found)]


def replay_after(first: float | None, silent: float, skew: float = CLOCK_SKEW) -> float:
    """The start time of a replay asked for by a subscriber whose broker went silent at
    ``silent``: :data:`LOOKBACK` seconds before, and not before it first subscribed at
    ``first`` (None: unknown) less ``skew`` (the start is compared with the publishers'
    clocks: one running behind the subscriber's stamps what it published after the
    subscription earlier). A durable record's claim passes 0: it owes exactly what was
    published since its subscription, by the record's own start."""
    return max(first - skew if first is not None else silent, silent - LOOKBACK)


def owed_after_failover(owed: float | None, replay_start: float) -> float:
    """From when a durable subscription's record at a fail-over's new host owes its
    client any publisher's publications it has not taken: the start of the replay the
    fail-over asks for (``replay_start``, :func:`replay_after`), or ``owed``, a claimed
    record's start, if earlier. The new record itself begins at the fail-over; until the
    replay is answered only the record keeps what it still owes, so a client that leaves
    or dies before the answer claims it back from there (its old host's copy, which
    begins earlier, may be silent to that claim)."""
    return replay_start if owed is None else min(owed, replay_start)


class ClaimedCopy(Protocol):
    """What :func:`resume_from` reads of a claimed durable record."""

    @property
    def since(self) -> Sequence[tuple[str, int, int]]:
        """The last sequence number acknowledged of each (publisher, session)."""

    @property
    def after(self) -> float:
        """From when any publisher's publications are owed."""

    @property
    def updated(self) -> float:
        """When the record was last updated."""


C = TypeVar("C", bound=ClaimedCopy)


def resume_from(claimed: Sequence[C]) -> tuple[C, list[tuple[str, int, int]], float]:
    """Of the copies of a durable record a claim found (non-empty), the one to resume
    from (the freshest: its filters), what was taken (of each publisher's session the
    highest sequence number any copy acknowledges) and from when any publisher's
    publications are owed (the earliest start of any). A copy made where the client
    failed over began then; one its old host kept (written before it died) begins when
    the subscription did, and what publishers the client never heard from published in
    between is owed too. The freshest copy may lack acknowledgements an older one holds:
    a fail-over acknowledges the whole record again at its new host, which may die
    before it writes them."""
    best = max(claimed, key=lambda c: c.updated)
    taken = LastSeen()
    for copy in sorted(claimed, key=lambda c: c.updated):
        taken.saw_all(copy.since)
    return best, taken.since(), min(c.after for c in claimed)


class LastSeen(OrderedDict[tuple[str, int], int]):
    """The last sequence number taken per (publisher, session), the least recently heard
    forgotten first past :data:`PUBLISHERS_KNOWN`."""

    def saw(self, publisher: str, session: int, seq: int) -> None:
        """``seq`` of ``publisher``'s ``session`` was taken."""
        key = (publisher, session)
        last = self.get(key)
        if last is None:
            self[key] = seq
            if len(self) > PUBLISHERS_KNOWN:
                self.popitem(last=False)
        elif seq > last:
            self[key] = seq
            self.move_to_end(key)

    def saw_all(self, taken: Iterable[tuple[str, int, int]]) -> None:
        """Each (publisher, session, seq) of ``taken``."""
        for publisher, session, seq in taken:
            self.saw(publisher, session, seq)

    def since(self) -> list[tuple[str, int, int]]:
        """A replay request's ``since``: ``(publisher, session, seq)`` each."""
        return [(p, s, q) for (p, s), q in self.items()]


def claim_gap(found: bool, silent: Sequence[str], error: str | None = None) -> str | None:
    """Why a claim of a durable record leaves its client a gap (None: it does not): the
    claim failed (``error``) and found nothing, or brokers stayed ``silent`` (one may keep
    the record, or a fresher copy of the one ``found``)."""
    if not silent and not (error and not found):
        return None
    return error or (
        "a fresher copy of its record may be kept at a broker that did not answer"
        if found
        else "its record may be kept at a broker that did not answer"
    )


def still_silent(outstanding: set[str], answered: Iterable[str], silent: Iterable[str]) -> None:
    """A late answer to a replay whose brokers ``outstanding`` had stayed silent: those it
    names ``answered`` are heard from, those it names ``silent`` (and not answered) are
    missing too (a late part may be silent past itself)."""
    heard = set(answered)
    outstanding.difference_update(heard)
    outstanding.update(set(silent) - heard)


class ReplayGaps(dict[str, set[str]]):
    """A subscriber's replay gaps (DESIGN §11): per request, the brokers its answer named
    silent and not heard from since. Only a late part of the same request narrows its
    gap (another replay asks from elsewhere, for other ranges)."""

    def left(self, req_id: str, silent: Iterable[str]) -> None:
        """Request ``req_id``'s answer ended (or never came) with ``silent`` missing."""
        if missing := set(silent):
            self[req_id] = missing
        else:
            self.pop(req_id, None)

    def answered(self, req_id: str, answered: Iterable[str], silent: Iterable[str]) -> None:
        """A part of request ``req_id``'s answer ended, late or not: its brokers
        ``answered`` are heard from, those ``silent`` missing (:func:`still_silent`)."""
        gap = self.setdefault(req_id, set())
        still_silent(gap, answered, silent)
        if not gap:  # nothing missing: nothing to keep for this request
            del self[req_id]

    def silent(self) -> set[str]:
        """The brokers some request is still missing."""
        return set().union(*self.values())


@dataclass(frozen=True, slots=True)
class ClaimAnswer(Generic[C]):
    """What a durable subscription's claim decides (:meth:`DurableProgress.claim_answered`):
    ``gap``, why it leaves one (None: it does not); the copy resumed from (None: no record
    was found, nothing to replay); and the replay to ask: of each (publisher, session)
    what follows ``since``, of any other publisher what was published from ``after``."""

    gap: str | None
    resumed: C | None = None
    since: list[tuple[str, int, int]] = field(default_factory=list)
    after: float = 0.0


Key = tuple[str, int, int]
"""(publisher, session, seq): one publication."""


class LateAnswers:
    """A subscriber's replays that ended with brokers silent (DESIGN §11): per request,
    those not heard from since (:attr:`outstanding`); and while one is, what was
    delivered since its replay began (at most ``kept``, for the last ``waiting``
    replays, an older one forgets it), so that a late part of its answer, however late,
    repeats none of it (:meth:`fresh`)."""

    def __init__(self, kept: int = LATE_KEPT, waiting: int = LATE_WAITING) -> None:
        self.kept = kept
        self.waiting = waiting
        self.outstanding = ReplayGaps()
        self._delivered: OrderedDict[str, set[Key]] = OrderedDict()

    @property
    def awaiting(self) -> bool:
        """Whether a replay waits for late answers with its memory of deliveries."""
        return bool(self._delivered)

    def ended(self, req_id: str, delivered: Iterable[Key], silent: Iterable[str]) -> None:
        """Request ``req_id``'s replay ended, having ``delivered`` (with the live ones
        held), with the brokers ``silent`` missing (every one, if it was cut short)."""
        self.outstanding.left(req_id, silent)
        if req_id in self.outstanding:
            self._delivered[req_id] = set(delivered)
            while len(self._delivered) > self.waiting:
                self._delivered.popitem(last=False)  # its late answers may repeat

    def delivered(self, key: Key) -> None:
        """``key`` was delivered: a late answer to a waiting replay must not repeat it."""
        for delivered in self._delivered.values():
            if len(delivered) < self.kept:
                delivered.add(key)

    def fresh(self, req_id: str) -> Callable[[Key], bool]:
        """Whether a publication of a late part of request ``req_id``'s answer was not
        delivered since its replay (the record of recent deliveries decides the rest)."""
        delivered = self._delivered.get(req_id, set())
        return lambda key: key not in delivered

    def answered(self, req_id: str, answered: Iterable[str], silent: Iterable[str]) -> None:
        """A part of request ``req_id``'s answer ended late (or a request the seam did
        not wait for): :meth:`ReplayGaps.answered`; once nothing is missing the memory
        of deliveries goes."""
        self.outstanding.answered(req_id, answered, silent)
        if req_id not in self.outstanding:
            self._delivered.pop(req_id, None)

    def forget(self, req_id: str) -> None:
        """Request ``req_id`` is no longer followed: its late answers are not awaited."""
        self.outstanding.pop(req_id, None)
        self._delivered.pop(req_id, None)


class DurableProgress:
    """A durable subscription's progress at its client (DESIGN §11): what the application
    took of each (publisher, session) (:attr:`taken`, acknowledged to the host), what the
    record this process claimed says an earlier one took (:attr:`record`: a live delivery
    it covers is dropped) and from when the record at the host owes any other publisher's
    publications (:attr:`owed_after`, sent with the acknowledgements; None: from its own
    start)."""

    __slots__ = ("owed_after", "record", "taken")

    def __init__(self) -> None:
        self.taken = LastSeen()
        self.record: LastSeen | None = None
        self.owed_after: float | None = None

    def claimed(self, since: Iterable[tuple[str, int, int]], after: float) -> None:
        """The record was found (:func:`resume_from`): it says ``since`` was taken, and
        other publishers' publications are owed from ``after``."""
        since = list(since)
        self.taken.saw_all(since)
        self.record = LastSeen(((p, s), q) for p, s, q in since)
        self.owed_after = after

    def took(self, publisher: str, session: int, seq: int) -> int:
        """The application took ``seq`` of ``publisher``'s ``session``: the sequence
        number to acknowledge for that pair (the highest taken)."""
        self.taken.saw(publisher, session, seq)
        return self.taken[(publisher, session)]

    def whole(self) -> list[tuple[str, int, int]] | None:
        """What to acknowledge again to a new host, which keeps a record of its own
        after a fail-over, a move or a claim: everything taken (None: nothing to tell,
        nothing taken and no start owed from)."""
        if not self.taken and self.owed_after is None:
            return None
        return self.taken.since()

    def failed_over(self, replay_start: float) -> None:
        """The client failed over and replays from ``replay_start``: the record at the
        new host owes from then (:func:`owed_after_failover`)."""
        self.owed_after = owed_after_failover(self.owed_after, replay_start)

    def claim_answered(
        self, claimed: Sequence[C], silent: Sequence[str], error: str | None = None
    ) -> ClaimAnswer[C]:
        """The claim of this subscription's record ended (DESIGN §11) with the copies
        ``claimed`` (empty: none found, a new record), the brokers ``silent`` and the
        failure ``error`` (None: it was answered): the gap it leaves (:func:`claim_gap`)
        and, if a copy came, what it says (:func:`resume_from`, taken as
        :meth:`claimed`): the replay the client asks for next, from what the record
        says was taken; the client then acknowledges :meth:`whole` to its host."""
        gap = claim_gap(bool(claimed), silent, error)
        if not claimed:
            return ClaimAnswer(gap)
        best, since, after = resume_from(claimed)
        self.claimed(since, after)
        return ClaimAnswer(gap, best, since, after)

    def covers(self, publisher: str, session: int, seq: int) -> bool:
        """Whether the claimed record says a process before this one took ``seq`` of
        ``publisher``'s ``session`` (a late copy, dropped)."""
        last = self.record.get((publisher, session)) if self.record is not None else None
        return last is not None and seq <= last


SPANS_KEPT = 10
"""Finished spans of takes :class:`FromPoints` keeps per (publisher, session)."""


@dataclass(slots=True)
class _Spans:
    """One (publisher, session)'s takes for :class:`FromPoints`: the newest span's highest
    seq, its last take and when it began, and the finished spans before it as
    ``(highest seq, last take)``, oldest first (at most :data:`SPANS_KEPT`)."""

    seq: int
    at: float
    began: float
    done: list[tuple[int, float]]


class FromPoints:
    """A subscriber's replay from-points (DESIGN §11): of each (publisher, session), the
    highest sequence number taken at least ``settle`` seconds before its broker went
    silent.

    Through failures copies do not keep publisher order: one taken back from custody and
    routed again arrives up to :data:`~octopis.defaults.REORDER` seconds late, after later
    ones were taken, and a replay from the last one taken would skip it. What was published
    before a publication taken at ``t`` arrives by ``t + settle``, so a from-point taken that
    long before the silence has nothing earlier still in flight; what was taken since comes
    again with the replay, and the record of recent deliveries drops it.

    Takes go on after the silence (from the broker left behind, or from a move's other
    connection) until the replay is asked, so the points before it must outlive them: per
    pair the takes are kept as spans of at least :attr:`span` seconds (``settle``, or
    ``reach`` over :data:`SPANS_KEPT` less two if longer), each its highest seq and last
    take, the last :data:`SPANS_KEPT` of them; a replay asked up to ``reach`` seconds after
    the silence finds its from-point, no more than one span before the last one it could
    take. At most ``known`` pairs, the least recently heard forgotten first (a replay asks
    for a forgotten one by time)."""

    def __init__(
        self, settle: float = REORDER, known: int = PUBLISHERS_KNOWN, reach: float = LOOKBACK
    ) -> None:
        if settle < 0 or known < 1 or reach <= 0:
            raise ValueError(
                "from-points need a settle time >= 0, room for a publisher and a reach > 0"
            )
        self.settle = settle
        self.known = known
        self.span = max(settle, reach / (SPANS_KEPT - 2))
        """Seconds a span of takes lasts at least."""
        self._pairs: OrderedDict[tuple[str, int], _Spans] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pairs)

    def __contains__(self, pair: object) -> bool:
        return pair in self._pairs

    def saw(self, publisher: str, session: int, seq: int, now: float) -> None:
        """``seq`` of ``publisher``'s ``session`` was taken at ``now``."""
        key = (publisher, session)
        spans = self._pairs.get(key)
        if spans is None:
            self._pairs[key] = _Spans(seq, now, now, [])
            if len(self._pairs) > self.known:
                self._pairs.popitem(last=False)
            return
        self._pairs.move_to_end(key)
        if now - spans.began >= self.span:  # the newest span is long enough: a new one
            done = spans.done
            done.append((spans.seq, spans.at))
            if len(done) > SPANS_KEPT:
                del done[0]
            spans.seq, spans.began = seq, now
        elif seq > spans.seq:
            spans.seq = seq
        spans.at = now

    def replay(
        self, first: float | None, silent: float
    ) -> tuple[list[tuple[str, int, int]], float]:
        """What a replay after a fail-over from a broker silent since ``silent`` asks for
        (DESIGN §11): ``since``, these from-points (:meth:`since`), and ``after``,
        :func:`replay_after` of when the subscriber first subscribed, ``first``."""
        return self.since(silent), replay_after(first, silent)

    def since(self, silent: float) -> list[tuple[str, int, int]]:
        """A replay request's ``since`` for a broker silent since ``silent``:
        ``(publisher, session, seq)`` of each pair with a from-point taken by
        ``silent - settle`` (a pair without one is asked for by time)."""
        cutoff = silent - self.settle
        points = []
        for (publisher, session), spans in self._pairs.items():
            best = spans.seq if spans.at <= cutoff else None
            for seq, at in spans.done:
                if at <= cutoff and (best is None or seq > best):
                    best = seq
            if best is not None:
                points.append((publisher, session, best))
        return points


class SubscriberReplays:
    """A subscriber's side of its replays (DESIGN §11), which the SDK and the simulator's
    subscribers each keep: when it first subscribed (:attr:`first`), where its next
    replay asks from (:attr:`last_seen`, :class:`FromPoints`) and its replays waiting for
    late answers (:attr:`late`, :class:`LateAnswers`, a new process's may carry on an
    earlier one's). Every delivery notes both (:meth:`delivered`)."""

    __slots__ = ("first", "last_seen", "late")

    def __init__(self, first: float | None = None, late: LateAnswers | None = None) -> None:
        self.first = first
        self.last_seen = FromPoints()
        self.late = late if late is not None else LateAnswers()

    def subscribed(self, now: float) -> None:
        """It subscribed at ``now`` (the first time counts)."""
        if self.first is None:
            self.first = now

    def delivered(self, publisher: str, session: int, seq: int, now: float) -> None:
        """``seq`` of ``publisher``'s ``session`` was delivered at ``now``."""
        self.last_seen.saw(publisher, session, seq, now)
        if self.late.awaiting:
            self.late.delivered((publisher, session, seq))

    def replay(self, silent: float) -> tuple[list[tuple[str, int, int]], float]:
        """What a replay for a broker silent since ``silent`` asks for
        (:meth:`FromPoints.replay`)."""
        return self.last_seen.replay(self.first, silent)

    def failed_over(
        self, silent: float, durables: Iterable[DurableProgress] = ()
    ) -> tuple[list[tuple[str, int, int]], float]:
        """It failed over from a broker silent since ``silent`` (DESIGN §7, §11): what its
        replay asks for (:meth:`replay`); the record of each of its ``durables`` at the
        new host owes from that start (:meth:`DurableProgress.failed_over`), so that a
        process ending before the answer is owed it by its next claim."""
        since, after = self.replay(silent)
        for progress in durables:
            progress.failed_over(after)
        return since, after


L = TypeVar("L")
R = TypeVar("R")
S = TypeVar("S")

NO_ANSWER = "no answer from the overlay"
"""Why a seam whose request's answer never ended leaves a gap."""
SEAM_FILLED = "live deliveries filled the seam before the answer came"
"""Why a seam that overflowed leaves a gap (live deliveries went through unordered)."""


class Seam(Generic[L, R, S]):
    """A subscriber's request for the past under way (DESIGN §11): a fail-over's replay,
    a hybrid subscription's window, a durable claim and the replay from its record. Live
    deliveries wait in :attr:`live` while it is under way (if ``hold_live``; at most
    ``limit``, past which the seam has :attr:`overflowed` and a delivery goes through),
    beside the parts of the answers by request id (one may come before the request is
    named) and the summaries their ends carry; once the request's end is in, both join
    (:meth:`RecentDeliveries.join`)."""

    def __init__(
        self, limit: int = BUFFER, *, hold_live: bool = True, replay: str | None = None
    ) -> None:
        self.limit = limit
        self.hold_live = hold_live
        self.replay = replay
        """The request whose answer the seam waits for (None: not named yet)."""
        self.live: list[L] = []
        self.overflowed = False
        self.answers: dict[str, list[R]] = {}
        self.done: dict[str, S] = {}
        self.progress = 0
        """Parts of answers taken (a large answer is waited for while they come)."""

    def hold(self, item: L) -> bool:
        """Whether live ``item`` waits here: not past ``limit`` (then it goes through,
        and the seam has overflowed: a gap), nor if live deliveries do not wait."""
        if not self.hold_live:
            return False
        if len(self.live) >= self.limit:
            self.overflowed = True
            return False
        self.live.append(item)
        return True

    def part(self, req_id: str, items: Iterable[R]) -> None:
        """A part of request ``req_id``'s answer came."""
        self.answers.setdefault(req_id, []).extend(items)
        self.progress += 1

    def end(self, req_id: str, summary: S) -> bool:
        """Request ``req_id``'s answer ended with ``summary``: whether the seam's is in."""
        self.done[req_id] = summary
        return self.named(self.replay)

    def named(self, replay: str | None) -> bool:
        """The seam waits for request ``replay``: whether its answer is in."""
        self.replay = replay
        return replay is not None and replay in self.done

    def next_request(self) -> S | None:
        """The summary of the request waited for (a claim's), and wait for the next one
        (its replay) with the same live deliveries held."""
        summary = self.summary
        self.replay = None
        return summary

    def shortfall(self, error: str | None = None, truncated: Sequence[str] = ()) -> str | None:
        """Why the request waited for falls short as a whole, a gap whatever its end says
        of silent, unstored and trimmed parts (None: it does not): the shell's own
        ``error``, no end (:data:`NO_ANSWER`), stores that cut their answer at its
        bounds (``truncated``, read from :attr:`summary`), or live deliveries that
        :attr:`overflowed` the seam (:data:`SEAM_FILLED`)."""
        if error is not None:
            return error
        if self.summary is None:
            return NO_ANSWER
        if truncated:
            return f"stores cut their answer at its bounds: {', '.join(truncated)}"
        return SEAM_FILLED if self.overflowed else None

    @property
    def summary(self) -> S | None:
        """The end of the request waited for (None: not in)."""
        return self.done.get(self.replay or "")

    @property
    def answer(self) -> list[R]:
        """The parts of the answer to the request waited for come so far."""
        return self.answers.get(self.replay or "", [])


class RecentDeliveries:
    """The deliveries of the last ``horizon`` seconds to the clients of one application,
    so that a client served by two connections during a move (or a fail-over) can drop
    what it got twice (every delivery is checked: a repeat is never legitimate, and one
    set lookup costs less than knowing when a repeat may come). A copy can come that much
    later only if the two paths differ by that much: the horizon should exceed the
    connections' ``linger``. At most ``limit`` deliveries are remembered after each frame
    (:meth:`forget_old`); one forgotten before its time is counted in
    :attr:`forgotten_early`."""

    def __init__(self, horizon: float = DELIVERIES_HORIZON, limit: int = DELIVERIES_KNOWN) -> None:
        if horizon <= 0 or limit < 1:
            raise ValueError("a connection group needs a positive horizon and limit")
        self.horizon = horizon
        self.limit = limit
        self.forgotten_early = 0
        """Deliveries forgotten within the horizon to stay within ``limit``."""
        self.seen: set[DeliveryKey] = set()
        """The deliveries remembered; a connection adds each one it hands over, with its
        time in :attr:`recent`."""
        self.recent: deque[tuple[float, DeliveryKey]] = deque()
        """``(time, key)`` of each delivery in :attr:`seen`, oldest first."""

    def first_time(self, key: DeliveryKey, now: float) -> bool:
        """Whether delivery ``key`` comes for the first time (within the horizon); it is
        remembered from ``now`` if so."""
        if key in self.seen:
            return False
        self.seen.add(key)
        self.recent.append((now, key))
        return True

    def took(self, key: DeliveryKey, now: float) -> bool:
        """A live delivery ``key`` at ``now``: whether it comes for the first time (then
        remembered, and what is past the horizon forgotten); False for a repeat."""
        if not self.first_time(key, now):
            return False
        self.forget_old(now)
        return True

    def forget_old(self, now: float) -> None:
        """Forget the deliveries past the horizon at time ``now``, and the oldest beyond
        the limit."""
        recent = self.recent
        oldest = now - self.horizon
        while recent and (recent[0][0] < oldest or len(recent) > self.limit):
            at, old = recent.popleft()
            if at >= oldest:
                self.forgotten_early += 1
            self.seen.discard(old)

    def join(
        self,
        client: str,
        live: Iterable[T],
        replayed: Iterable[T],
        order: Callable[[T], tuple[str, int, int]],
        now: float,
        also: Callable[[tuple[str, int, int]], bool] = lambda _: True,
    ) -> tuple[list[T], int]:
        """Client ``client``'s seam (:func:`join_at_seam`) at ``now``: the ``live``
        deliveries held, with the ``replayed`` ones this record has not seen (and that
        ``also``, given publisher, session and sequence number, lets through), recorded
        from now, in publisher order (``order``); and how many replayed ones were
        repeats. What is past the horizon is forgotten after."""

        def first_time(item: T) -> bool:
            key = order(item)
            return self.first_time((client, *key), now) & also(key)

        joined = join_at_seam(live, replayed, order, first_time)
        self.forget_old(now)
        return joined
