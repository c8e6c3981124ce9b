"""The brokers' retention stores in the simulator (DESIGN §11): what each broker's own
publishers published, kept in memory (a store survives its broker's death, as the
process's file does), and what a store answers a replay request: the node's
:class:`~octopis.core.answer.AnswerSelection` within the brokers' default answer bounds,
and the ranges the store dropped as gaps (:func:`~octopis.core.answer.trimmed_gaps`), as
the process's store answers.

The simulator keeps no encoded bodies: a store is bounded by a count of publications
(``limit``) rather than ``[retention] max_bytes``, and an answer by ``answer_max`` only
(``answer_bytes`` is passed on but never reached: each publication counts 0 bytes)."""

from __future__ import annotations

from collections import Counter, deque

from octopis.core import Notification
from octopis.core.answer import AnswerSelection, Trimmed, note_trimmed, trimmed_gaps
from octopis.core.replay import Gap, Replay
from octopis.defaults import ANSWER_BYTES, ANSWER_MAX

STORE_LIMIT = 1_000_000
"""Publications each broker's store keeps in the simulator (its memory's bound, in place
of the process's ``[retention] max_bytes``)."""


class RetentionStores:
    """Each broker's store, up to ``limit`` publications (the oldest go first, counted
    ``retention.trimmed`` in ``counts`` and remembered for the gaps), answering at most
    ``answer_max`` publications (``answer_bytes`` bytes) to one request."""

    def __init__(
        self,
        counts: Counter[str],
        limit: int = STORE_LIMIT,
        answer_max: int = ANSWER_MAX,
        answer_bytes: int = ANSWER_BYTES,
    ) -> None:
        self.kept: dict[str, deque[Notification]] = {}
        """Each broker's store: what its own publishers published, in order."""
        self.trimmed: dict[str, Trimmed] = {}
        """Each broker's record of what its store dropped."""
        self._counts = counts
        self._limit = limit
        self._answer_max = answer_max
        self._answer_bytes = answer_bytes

    def keep(self, broker: str, notification: Notification) -> None:
        """``broker`` accepted ``notification`` from a local publisher: its store keeps it."""
        store = self.kept.get(broker)
        if store is None:
            store = self.kept[broker] = deque()
        if len(store) >= self._limit:
            old = store.popleft()
            note_trimmed(
                self.trimmed.setdefault(broker, {}),
                old.publisher,
                old.session,
                old.seq,
                old.published_at,
            )
            self._counts["retention.trimmed"] += 1
        store.append(notification)

    def answer(self, broker: str, request: Replay) -> tuple[list[Notification], list[Gap], bool]:
        """What ``broker``'s store answers ``request``: its kept publications, in the
        order kept, as the node's :class:`AnswerSelection` chooses them, the ranges it
        dropped that the request asks for, and whether the answer was cut."""
        gaps = trimmed_gaps(request, self.trimmed.get(broker, {}))
        store = self.kept.get(broker)
        if not store:  # nothing to choose from: no selection to build
            return [], gaps, False
        selection = AnswerSelection(request, self._answer_max, self._answer_bytes)
        found = []
        for n in store:
            taken = selection.take(n.publisher, n.session, n.seq, n.published_at, 0, lambda n=n: n)
            if taken is not None:
                found.append(taken)
            elif selection.truncated:
                break
        return found, gaps, selection.truncated
