"""Which retained publications answer a replay request (DESIGN §11), once for every store.

A store (the broker process's SQLite file, the simulator's memory) reads what it kept in
the order it stored it and offers each row to an :class:`AnswerSelection`, which decides:
published in ``[after, until)``, past the ``since`` sequence number of its (publisher,
session), matching one of the request's filters (the compiled matcher), each (publisher,
session, seq) once, and no more than the request's bounds (``answer_max`` publications,
``answer_bytes`` encoded bytes; 0 in the request: the store's own bounds), past which the
answer is ``truncated``.

What a store dropped to stay within its own bounds (retention's, not the answer's) is
remembered per (publisher, session) with :func:`note_trimmed`, and a request that reaches
past it is told so by :func:`trimmed_gaps`: the same gaps from every store. A store whose
disk refused a commit refuses new publications for a while, by :func:`store_refusal`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from octopis.core.messages import Notification
from octopis.core.replay import Gap, Replay
from octopis.defaults import REFUSE_FOR
from octopis.filters.language import FilterError, parse_subscription
from octopis.matching import Matcher

UNBOUNDED = 1 << 62

Trimmed = dict[tuple[str, int], tuple[int, float]]
"""What a store dropped, per (publisher, session): the highest sequence number dropped
and the latest publication time among those dropped."""


def store_refusal(store: str, refused_at: float | None, now: float) -> str | None:
    """Why ``store`` refuses a new publication before it is routed at ``now``: within
    :data:`~octopis.defaults.REFUSE_FOR` seconds of the commit its disk refused at
    ``refused_at`` (after that the next commit tries again); None: accepted."""
    if refused_at is None or now - refused_at >= REFUSE_FOR:
        return None
    return (
        f"{store} cannot store publications (its disk refused a commit "
        f"{now - refused_at:.1f} s ago); publish again later"
    )


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


class AnswerSelection:
    """One store's choice of publications for ``request`` (see the module docstring);
    ``answer_max`` and ``answer_bytes`` are the store's bounds, 0 for none."""

    __slots__ = (
        "after",
        "answer_bytes",
        "answer_max",
        "bytes",
        "count",
        "matches",
        "seen",
        "since",
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
        self.seen: set[tuple[str, int, int]] = set()
        self.count = self.bytes = 0
        self.truncated = False

    def take(
        self,
        publisher: str,
        session: int,
        seq: int,
        published_at: float,
        size: int,
        decode: Callable[[], Notification],
    ) -> Notification | None:
        """The publication of this row if the answer takes it (``decode`` reads it, only
        when its key and time are wanted), else None; once :attr:`truncated`, nothing more
        is taken and the store stops reading."""
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
            self.truncated = True
            return None
        self.seen.add(key)
        self.count += 1
        self.bytes += size
        return n
