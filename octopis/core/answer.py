"""Which retained publications answer a replay request (DESIGN §11), once for every store.

A store (the broker process's SQLite file, the simulator's memory) reads what it kept in
the order it stored it, from :attr:`AnswerSelection.start_at`, and hands the rows to an
:class:`AnswerSelection` (:meth:`~AnswerSelection.choose`, a page of them at a time if it
likes), which decides: stored within :data:`CLOCK_SLACK` of the
request's window (past it the store stops reading: :attr:`~AnswerSelection.ended`),
published in ``[after, until)``, past the ``since`` sequence number of its (publisher,
session), matching one of the request's filters (the compiled matcher), each (publisher,
session, seq) once, and no more than the request's bounds (``answer_max`` publications,
``answer_bytes`` encoded bytes; 0 in the request: the store's own bounds), past which the
answer is ``truncated``.

Which rows a store drops to stay within its own bounds (retention's, not the answer's) is
:class:`RetentionBound`'s rule; what it dropped is remembered per (publisher, session)
with :func:`note_trimmed`, and a request that reaches past it is told so by
:func:`trimmed_gaps`: the same gaps from every store. A store whose disk refused a commit
refuses new publications for a while (:class:`CommitRefusals`), and tells the publishers
of those the commit held what :func:`commit_refused` says; when it commits is
:func:`commit_delay`'s, over the confirms that wait for it (:class:`CommitWaits`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from math import inf
from typing import TypeVar

from octopis.core.custody import PublishReceipt
from octopis.core.messages import Notification
from octopis.core.replay import Gap, Replay
from octopis.defaults import REFUSE_FOR
from octopis.filters.language import FilterError, parse_subscription
from octopis.matching import Matcher

UNBOUNDED = 1 << 62
CLOCK_SLACK = 60.0
"""Seconds a publisher's clock may run ahead of its broker's: a store finds rows by its
time of storing, a replay asks by the publisher's time of publishing."""

COMMIT_ROWS = 256
"""Publications kept before a store commits at once, however busy the input."""
COMMIT_DELAY = 0.002
"""Seconds a store waits at most to commit an awaited publication when its input is busy
(the confirm waits too)."""
PIPELINE_DELAY = 0.005
"""Seconds a store waits at most to commit what publishers that pipeline published (their
confirms wait too, within their window of unanswered publications), so that one
transaction's 10-30 µs of CPU are shared by many: ~75 a commit for ``bench.retention``'s
publisher at ~10,000/s, where its first publication of each burst taken for an awaited one
had made them ~40 (bench/RESULTS.md, "Retention")."""

R = TypeVar("R")

Kept = tuple[str, int, int, float, float, int, Callable[[], Notification]]
"""A kept publication as a store offers it to :meth:`AnswerSelection.take`: publisher,
session, seq, published at, stored at, its encoded size, and how to read it."""

Trimmed = dict[tuple[str, int], tuple[int, float]]
"""What a store dropped, per (publisher, session): the highest sequence number dropped
and the latest publication time among those dropped."""


class CommitRefusals:
    """A store's record of its disk's refusals, the same in every store: a commit the disk
    refused (:meth:`refused`) refuses new publications for :data:`~octopis.defaults.REFUSE_FOR`
    seconds (:meth:`refusal`; after that the next commit tries again), one that went
    through (:meth:`committed`) ends that at once; a new process starts with none."""

    __slots__ = ("refused_at", "store")

    def __init__(self, store: str) -> None:
        self.store = store
        """How the store is named in what a publisher is told."""
        self.refused_at: float | None = None
        """When the disk last refused a commit (None: the last one went through)."""

    def refused(self, now: float) -> None:
        """The disk refused a commit at ``now``."""
        self.refused_at = now

    def committed(self) -> None:
        """A commit went through."""
        self.refused_at = None

    def refusal(self, now: float) -> str | None:
        """Why a new publication is refused before it is routed at ``now``, or None:
        accepted."""
        refused_at = self.refused_at
        if refused_at is None or now - refused_at >= REFUSE_FOR:
            return None
        return (
            f"{self.store} cannot store publications (its disk refused a commit "
            f"{now - refused_at:.1f} s ago); publish again later"
        )


def commit_refused(why: str) -> str:
    """What a publisher is told of its publication when the commit that was to keep it
    failed (``why``): it was routed in the input pass that took it, before the commit,
    so it may have been delivered (it is not "not published")."""
    return f"{why} (routed before the disk refused: it may have been delivered)"


def commit_delay(pending: int, idle: bool, awaited: bool) -> float:
    """Within how many seconds a store commits the ``pending`` publications it kept, as an
    input pass ends (0: now). Now when :data:`COMMIT_ROWS` wait, or when the input ran dry
    (``idle``) and a publisher waits for its only unanswered publication (``awaited``: an
    awaited publish is written at once); an awaited one on a busy input within
    :data:`COMMIT_DELAY`; what publishers that pipeline published within
    :data:`PIPELINE_DELAY`. So under load and for publishers that pipeline one
    transaction covers many passes (each costs 10-30 µs of CPU in the process's store,
    whatever it holds, and ~0.3 µs more per publication it holds)."""
    if (idle and awaited) or pending >= COMMIT_ROWS:
        return 0.0
    return COMMIT_DELAY if awaited else PIPELINE_DELAY


class CommitWaits:
    """The confirms that wait for a store's next commit (DESIGN §7, §11): each kept
    publication's :class:`~octopis.core.custody.PublishReceipt`, and whether one is
    awaited (its publisher's only unanswered publication, and none of its connection
    came after it: :attr:`~PublishReceipt.alone`), which brings the commit forward
    (:func:`commit_delay`)."""

    __slots__ = ("_alone", "_receipts")

    def __init__(self) -> None:
        self._receipts: list[PublishReceipt] = []
        self._alone: list[PublishReceipt] = []

    def kept(self, receipt: PublishReceipt) -> None:
        """The store keeps the publication of ``receipt``: its answer waits for the
        commit (:meth:`PublishReceipt.keep`)."""
        receipt.keep()
        self._receipts.append(receipt)
        if receipt.alone:
            self._alone.append(receipt)

    def delay(self, pending: int, idle: bool) -> float:
        """Within how many seconds the store commits its ``pending`` publications as an
        input pass ends (``idle``: the input ran dry; :func:`commit_delay`)."""
        return commit_delay(pending, idle, any(receipt.alone for receipt in self._alone))

    def committed(self, refusal: str | None) -> None:
        """The commit ended (``refusal``: the disk refused it, why): every receipt that
        waited for it is held or refused (:meth:`PublishReceipt.committed`)."""
        receipts, self._receipts, self._alone = self._receipts, [], []
        reason = None if refusal is None else commit_refused(refusal)
        for receipt in receipts:
            receipt.committed(reason)


def note_trimmed(trimmed: Trimmed, publisher: str, session: int, seq: int, at: float) -> None:
    """The store dropped ``publisher``'s publication ``seq`` of ``session``, published
    ``at``: ``trimmed`` remembers it."""
    seen = trimmed.get((publisher, session))
    if seen is None:
        trimmed[publisher, session] = (seq, at)
    else:
        trimmed[publisher, session] = (max(seen[0], seq), max(seen[1], at))


def trimmed_gaps(
    request: Replay, trimmed: Mapping[tuple[str, int], tuple[int, float]]
) -> list[Gap]:
    """The ranges a store dropped (``trimmed``, see :data:`Trimmed`) that ``request``
    asks for, by (publisher, session): past the request's ``since`` (from 1 without one)
    up to the last dropped, unless everything dropped of that session was published
    before ``after``. Filters cannot be checked on what is gone: a gap may hold nothing
    the request would have taken."""
    since = {(p, s): q for p, s, q in request.since}
    gaps: list[Gap] = []
    for (publisher, session), (last_seq, last_at) in trimmed.items():
        if last_at < request.after:
            continue
        last = since.get((publisher, session), 0)
        if last_seq > last:
            gaps.append((publisher, session, last + 1, last_seq))
    return sorted(gaps)


class RetentionBound:
    """A store's own bounds (DESIGN §11): at most ``max_total`` (bytes of bodies in the
    process's store, publications in the simulator's) and nothing stored more than
    ``max_age`` seconds ago. The oldest go first."""

    __slots__ = ("max_age", "max_total")

    def __init__(self, max_total: int, max_age: float = inf) -> None:
        self.max_total, self.max_age = max_total, max_age

    def over(self, total: int, oldest: float, now: float) -> bool:
        """Whether a store holding ``total``, its oldest row stored at ``oldest``, is
        past its bounds at ``now`` (then :meth:`cut` says what goes)."""
        return total > self.max_total or oldest < now - self.max_age

    def cut(self, rows: Iterable[tuple[R, int, float]], total: int, now: float) -> list[R]:
        """Which of a store's ``rows`` (``(row, size, last stored at)``, oldest first; it
        holds ``total`` in all) it drops at ``now``: every one stored wholly more than
        ``max_age`` ago, then, oldest first, as many as bring it within ``max_total``
        (the rest are not read)."""
        excess, old = total - self.max_total, now - self.max_age
        dropped = []
        for row, size, last_at in rows:
            if excess <= 0 and last_at >= old:
                break
            dropped.append(row)
            excess -= size
        return dropped


class AnswerSelection:
    """One store's choice of publications for ``request`` (see the module docstring);
    ``answer_max`` and ``answer_bytes`` are the store's bounds, 0 for none."""

    __slots__ = (
        "after",
        "answer_bytes",
        "answer_max",
        "bytes",
        "count",
        "ended",
        "matches",
        "seen",
        "since",
        "start_at",
        "stop_at",
        "truncated",
        "until",
    )

    def __init__(self, request: Replay, answer_max: int = 0, answer_bytes: int = 0) -> None:
        self.answer_max = request.answer_max or answer_max or UNBOUNDED
        self.answer_bytes = request.answer_bytes or answer_bytes or UNBOUNDED
        matcher = Matcher()
        for i, text in enumerate(request.filters):
            try:
                matcher.add(i, parse_subscription(text))
            except FilterError:  # the host checked them; one that does not parse matches nothing
                continue
        self.matches = matcher.match
        self.since = {(p, s): q for p, s, q in request.since}
        self.after, self.until = request.after, request.until
        self.start_at = request.after - CLOCK_SLACK
        """The store time from which a store reads (rows stored before it answer nothing)."""
        self.stop_at = request.until + CLOCK_SLACK
        self.seen: set[tuple[str, int, int]] = set()
        self.count = self.bytes = 0
        self.truncated = False
        self.ended = False
        """The store reads no further: a row stored past the window came, or the answer
        is :attr:`truncated`."""

    def take(
        self,
        publisher: str,
        session: int,
        seq: int,
        published_at: float,
        stored_at: float,
        size: int,
        decode: Callable[[], Notification],
    ) -> Notification | None:
        """The publication of this row (stored at ``stored_at``, ``size`` bytes encoded)
        if the answer takes it (``decode`` reads it, only when its key and time are
        wanted), else None; once :attr:`ended`, nothing more is taken and the store stops
        reading."""
        if stored_at < self.start_at:
            return None
        if stored_at > self.stop_at:
            self.ended = True
            return None
        last = self.since.get((publisher, session))
        if (
            published_at < self.after
            or published_at >= self.until
            or (last is not None and seq <= last)
        ):
            return None
        key = (publisher, session, seq)
        if key in self.seen:
            return None
        n = decode()
        if not self.matches(n.publication):
            return None
        if self.count >= self.answer_max or self.bytes + size > self.answer_bytes:
            self.truncated = self.ended = True
            return None
        self.seen.add(key)
        self.count += 1
        self.bytes += size
        return n

    def choose(self, rows: Iterable[Kept]) -> list[Notification]:
        """What the answer takes of ``rows`` (kept publications in the order stored,
        :data:`Kept`), each offered to :meth:`take`: read until they run out or the
        selection :attr:`ended` (the rest are not read)."""
        found: list[Notification] = []
        take = self.take
        for row in rows:
            n = take(*row)
            if n is not None:
                found.append(n)
            elif self.ended:
                break
        return found
