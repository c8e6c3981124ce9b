"""The brokers' retention stores in the simulator (DESIGN §11): what each broker's own
publishers published, kept in memory (a store survives its broker's death, as the
process's file does), and what a store answers a replay request."""

from __future__ import annotations

from collections import Counter, deque

from octopis.core import Notification
from octopis.core.answer import AnswerSelection
from octopis.core.replay import Replay

STORE_LIMIT = 1_000_000
"""Publications each broker's store keeps in the simulator."""


class RetentionStores:
    """Each broker's store, up to ``limit`` publications (the oldest go first, counted
    ``retention.trimmed`` in ``counts``)."""

    def __init__(self, counts: Counter[str], limit: int = STORE_LIMIT) -> None:
        self.kept: dict[str, deque[Notification]] = {}
        """Each broker's store: what its own publishers published, in order."""
        self._counts = counts
        self._limit = limit

    def keep(self, broker: str, notification: Notification) -> None:
        """``broker`` accepted ``notification`` from a local publisher: its store keeps it."""
        store = self.kept.get(broker)
        if store is None:
            store = self.kept[broker] = deque(maxlen=self._limit)
        if len(store) == self._limit:
            self._counts["retention.trimmed"] += 1
        store.append(notification)

    def answer(self, broker: str, request: Replay) -> tuple[list[Notification], bool]:
        """What ``broker``'s store answers ``request``: its kept publications, in the
        order kept, as the node's :class:`AnswerSelection` chooses them (the simulator
        keeps no encoded bodies: answers are bounded by count, not bytes), and whether
        the answer was cut."""
        store = self.kept.get(broker)
        if not store:  # nothing to choose from: no selection to build
            return [], False
        selection = AnswerSelection(request)
        found = []
        for n in store:
            taken = selection.take(n.publisher, n.session, n.seq, n.published_at, 0, lambda n=n: n)
            if taken is not None:
                found.append(taken)
            elif selection.truncated:
                break
        return found, selection.truncated
