"""Which retained publications answer a replay request (DESIGN §11), once for every store.

A store (the broker process's SQLite file, the simulator's memory) reads what it kept in
the order it stored it and offers each row to an :class:`AnswerSelection`, which decides:
published in ``[after, until)``, past the ``since`` sequence number of its (publisher,
session), matching one of the request's filters (the compiled matcher), each (publisher,
session, seq) once, and no more than the request's bounds (``answer_max`` publications,
``answer_bytes`` encoded bytes; 0 in the request: the store's own bounds), past which the
answer is ``truncated``.
"""

from __future__ import annotations

from collections.abc import Callable

from octopis.core.messages import Notification
from octopis.core.replay import Replay
from octopis.filters.language import FilterError, parse_subscription
from octopis.matching import Matcher

UNBOUNDED = 1 << 62


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
