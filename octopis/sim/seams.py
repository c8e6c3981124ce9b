"""A subscriber's side of its replays in the simulator, as the SDK's (DESIGN §7, §11):
its record of recent deliveries (:class:`~octopis.client_policy.RecentDeliveries`),
against which each delivery to a checked subscriber is taken or dropped as a repeat;
the seam (:class:`~octopis.client_policy.Seam`) where a replay's answer and the live
deliveries held meanwhile join (:func:`~octopis.client_policy.join_at_seam`); the late
parts (:class:`~octopis.client_policy.LateAnswers`) and what the replays left untold.
:mod:`octopis.sim.replaying` asks for the replays and carries out their rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from octopis.client_policy import (
    RecentDeliveries,
    Seam,
    SubscriberReplays,
    publisher_order,
)
from octopis.core import Notification
from octopis.core.replay import Gap, ReplayEcho
from octopis.defaults import BUFFER


def told_at_seam(seam: Seam[Notification, Notification, ReplayEcho]) -> set[str]:
    """What the replay ``seam`` waited for tells its subscriber once answered, as the
    SDK tells it, besides its silent brokers (its replay gaps, narrowed by late parts)
    and the ranges its stores no longer hold (its store gaps): why it falls short as a
    whole (:meth:`~octopis.client_policy.Seam.shortfall`) and the brokers without a
    store. (A replay cut short is the SDK's "no answer": the simulator keeps every
    broker silent for it, narrowed by late parts.)"""
    echo = seam.summary
    if echo is None:
        return set()
    told = {f"unstored: {b}" for b in echo.unstored}
    if (why := seam.shortfall(truncated=echo.truncated)) is not None:
        told.add(why)
    return told


class ReplaySeams:
    """The :class:`~octopis.sim.engine.Simulator`'s subscribers' seams and records of
    recent deliveries (a mixin beside :class:`~octopis.sim.replaying.SubscriberFailover`).

    It keeps the state :meth:`_init_seams` makes and nothing else; of its host it reads
    the clock (``now``, ``events``), the ``ledger`` (its deliveries), ``clients``
    (when each first subscribed), the counters ``replay_counts``, ``moves`` and
    ``failure_counts``, and the fail-over's ``failed_over``, ``lost_answers``,
    ``historic_received`` and ``left_at_replay`` (whose session left behind it lets go,
    ``_left``, once the replay ends). A host may override :meth:`_taken` and :meth:`_repeated`
    (durable clients do) to see each delivery taken or dropped."""

    def _init_seams(self) -> None:
        """Every subscriber's record, seam and replays: none yet."""
        self.store_gaps: dict[str, set[Gap]] = {}
        """Per client, the ranges its replays' stores reported they no longer hold (a
        retention gap: trimmed, or lost at a power failure)."""
        self.replay_gaps: dict[str, set[str]] = {}
        """Per subscriber, the brokers its replays reported silent and never heard from
        (of its :attr:`replaying`)."""
        self.records: dict[str, RecentDeliveries] = {}
        """Per subscriber, the SDK's record of recent deliveries (each at its time, in its
        publisher's session, forgotten past the horizon), kept as its from-points are,
        from the first failure scheduled on (:meth:`saw`), else from a move
        (:meth:`record_of`) until it ends."""
        self.checked: set[str] = set()
        """Subscribers whose every delivery is checked against their record (they failed
        over, are moving, or are durable), as the SDK checks each (:meth:`take`)."""
        self.seams: dict[str, Seam[Notification, Notification, ReplayEcho]] = {}
        """Per subscriber whose replay is under way, its seam (the SDK's,
        :class:`~octopis.client_policy.Seam`)."""
        self.seam_limit = BUFFER
        """Live deliveries a seam holds (the SDK's ``buffer``)."""
        self.seam_gaps: dict[str, set[str]] = {}
        """Per subscriber, what its replays told it besides its replay and store gaps
        (:func:`told_at_seam`)."""
        self.replaying: dict[str, SubscriberReplays] = {}
        """Per subscriber, the SDK's side of its replays: where the next asks from, kept
        from the first failure scheduled on (:meth:`saw`), and those waiting for late
        answers (:meth:`_replaying`)."""

    def saw(self, subscriber: str, n: Notification) -> None:
        """``subscriber`` took ``n`` now: its side of its replays
        (:meth:`~octopis.client_policy.SubscriberReplays.delivered`) and its record of
        recent deliveries (:class:`~octopis.client_policy.RecentDeliveries`) note it."""
        self._replaying(subscriber).delivered(n.publisher, n.session, n.seq, self.events.now)
        record = self.records.get(subscriber)
        if record is None:
            record = self.records[subscriber] = RecentDeliveries()
        record.took((subscriber, *publisher_order(n)), self.events.now)

    def record_of(self, subscriber: str) -> RecentDeliveries:
        """``subscriber``'s record of recent deliveries, against which each delivery to it
        is checked from now on (it fails over or moves). One not kept yet (a run without
        failures) begins with what it took so far, the ledger's, remembered from now (in
        session 0, the simulated publishers' only one)."""
        self.checked.add(subscriber)
        record = self.records.get(subscriber)
        if record is None:
            record = self.records[subscriber] = RecentDeliveries()
            for s, publisher, seq in self.ledger.received:
                if s == subscriber:
                    record.first_time((s, publisher, 0, seq), self.now)
        return record

    def take(self, subscriber: str, n: Notification) -> None:
        """A live delivery to ``subscriber``, which is checked (it failed over, is moving
        or is durable): a repeat is dropped (:meth:`_repeated`), the rest held while a
        replay is under way (if its seam holds it, :meth:`Seam.hold`), else taken
        (:meth:`_taken`)."""
        seam = self.seams.get(subscriber)
        if not self.records[subscriber].took((subscriber, *publisher_order(n)), self.now):
            self._repeated(subscriber, 1, live=True)
        elif seam is None or not seam.hold(n):
            self._taken(subscriber, n, replayed=False)

    def _repeated(self, subscriber: str, count: int, *, live: bool) -> None:
        """``count`` deliveries to ``subscriber`` were dropped as repeats: counted
        ``moves.absorbed`` if ``live`` and it never failed over, else ``replay.repeats``."""
        if live and subscriber not in self.failed_over:
            self.moves["absorbed"] += count
        else:
            self.replay_counts["repeats"] += count

    def _taken(self, subscriber: str, n: Notification, *, replayed: bool) -> None:
        """``subscriber`` takes ``n`` now (``replayed``: from a replay's answer)."""
        self.ledger.delivered(subscriber, n.publisher, n.seq, self.now - n.published_at)
        self.saw(subscriber, n)

    def _replayed(self, subscriber: str, req_id: str, notifications: list[Notification]) -> None:
        """A part of request ``req_id``'s answer came to ``subscriber``: its seam's, held
        there, or a late part, joined at once (as the SDK's ``ReplayLog.late_answer``:
        what was delivered since its replay is not delivered again,
        :meth:`~octopis.client_policy.LateAnswers.fresh`)."""
        seam = self.seams.get(subscriber)
        if self._answer_lost(subscriber, req_id):
            return
        if seam is not None and seam.replay == req_id:
            seam.part(req_id, notifications)
        else:
            late = self._replaying(subscriber).late
            self._join(subscriber, [], notifications, late.fresh(req_id))

    def _replay_ended(self, subscriber: str, req_id: str, echo: ReplayEcho) -> None:
        """Request ``req_id``'s answer to ``subscriber`` ended with ``echo``: its seam's
        (:meth:`_end_seam`), or a late part's or a request's that no seam waited for,
        which narrows the gap (:meth:`~octopis.client_policy.LateAnswers.answered`); the
        ranges its stores no longer hold are reported to it too."""
        if req_id not in self.historic_received and self._answer_lost(subscriber, req_id):
            return
        if echo.gaps:
            self.store_gaps.setdefault(subscriber, set()).update(echo.gaps)
        late = self._replaying(subscriber).late
        seam = self.seams.get(subscriber)
        if seam is not None and seam.end(req_id, echo):
            self._end_seam(subscriber, echo.silent)
        else:
            late.answered(req_id, echo.answered, echo.silent)
        self.replay_gaps[subscriber] = late.outstanding.silent()

    def _replaying(self, subscriber: str) -> SubscriberReplays:
        """``subscriber``'s side of its replays, made when first needed (it first
        subscribed when the simulated clients say)."""
        replaying = self.replaying.get(subscriber)
        if replaying is None:
            first = self.clients.first_subscribed.get(subscriber)
            replaying = self.replaying[subscriber] = SubscriberReplays(first)
        return replaying

    def _answer_lost(self, subscriber: str, req_id: str) -> bool:
        """Whether the answer to request ``req_id`` is lost: it comes over a connection of
        ``subscriber``'s that failed (to the request's host, which names it ``host/n``;
        asked by the failure, ``lost_answers``), as a delivery on it is; the SDK never
        reads it, its replay stays a gap. A request asked on a new connection there
        since is answered on that one."""
        if not self.lost_answers:
            return False
        host, _, number = req_id.partition("/")
        asked = self.lost_answers.get((subscriber, host))
        if asked is None or int(number) > asked:
            return False
        self.failure_counts["answers_to_cut_clients"] += 1
        return True

    def _end_seam(self, subscriber: str, silent: Iterable[str] | None) -> None:
        """``subscriber``'s request under way ended (or was cut short): held and replayed
        deliveries join at the seam. A replay's (``silent``: the brokers missing, every
        one if cut short; None: it was a claim) waits for late answers if one is
        (:meth:`~octopis.client_policy.LateAnswers.ended`)."""
        seam = self.seams.pop(subscriber, None)
        if (left := self.left_at_replay.pop(subscriber, None)) is not None:
            self._left(subscriber, left)  # the SDK's resume ends: its linger starts
        if seam is None:
            return
        if seam.overflowed:
            self.replay_counts["seam_overflowed"] += 1
        joined = self._join(subscriber, seam.live, seam.answer)
        if silent is not None and seam.replay is not None:
            late = self._replaying(subscriber).late
            late.ended(seam.replay, map(publisher_order, joined), silent)
            self.replay_gaps[subscriber] = late.outstanding.silent()
        if silent is not None and (told := told_at_seam(seam)):
            self.seam_gaps.setdefault(subscriber, set()).update(told)

    def _join(
        self,
        subscriber: str,
        live: list[Notification],
        replayed: list[Notification],
        also: Callable[[tuple[str, int, int]], bool] = lambda _: True,
    ) -> list[Notification]:
        """The seam (:meth:`~octopis.client_policy.RecentDeliveries.join`): ``live`` and
        ``replayed`` deliveries to ``subscriber`` (those ``also`` lets through), each
        once, in publisher order; returns them."""
        record = self.records[subscriber]
        joined, repeats = record.join(subscriber, live, replayed, publisher_order, self.now, also)
        self._repeated(subscriber, repeats, live=False)
        from_replay = {n.key for n in replayed}
        for n in joined:
            self._taken(subscriber, n, replayed=n.key in from_replay)
        return joined
