"""The brokers' retention stores in the simulator (DESIGN §11): what each broker's own
publishers published, kept in memory (a store survives its broker's death, as the
process's file does), and what a store answers a replay request: the node's
:class:`~octopis.core.answer.AnswerSelection` within the brokers' default answer bounds,
and the ranges the store dropped as gaps (:func:`~octopis.core.answer.trimmed_gaps`), as
the process's store answers.

Two faults of the process's store are the simulator's too (:mod:`octopis.nemesis.scenarios`
draws them):

- **A full disk** (:meth:`RetentionStores.fill` until :meth:`~RetentionStores.free`): the
  process routes a publication in the input pass that took it and commits it after; the
  commit the disk refuses refuses the publications it held, routed already (their
  publishers are told so, by name: they may have been delivered), and new publications
  are refused before they are routed for :data:`~octopis.defaults.REFUSE_FOR` seconds,
  after which the next commit tries again. Nothing committed before is touched.
- **A power failure** (:meth:`RetentionStores.power_loss`): with ``[retention] sync =
  "normal"`` a commit is in the operating system's cache, not on disk, and a confirm
  does not wait for the disk: what was committed in the last ``unsynced`` seconds is
  lost, confirmed as it was. The store remembers what it lost, names it with the reason
  (:attr:`RetentionStores.lost`), and answers a request that reaches it with a gap, as
  for what it trimmed. With ``sync = "full"`` a confirm waits for fsync, and nothing
  confirmed is lost (what was not committed yet was never confirmed; a simulated
  commit is at once).

A publication is confirmed to its publisher when its
:class:`~octopis.core.custody.PublishReceipt` answers (:meth:`RetentionStores.receipt`),
the rule the process's confirm follows: once its store's copy is committed and every
copy a link keeps in custody is acknowledged.

The simulator keeps no encoded bodies: a store is bounded by a count of publications
(``limit``) rather than ``[retention] max_bytes``, and an answer by ``answer_max`` only
(``answer_bytes`` is passed on but never reached: each publication counts 0 bytes)."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable
from itertools import islice

from octopis.core import Notification
from octopis.core.answer import (
    AnswerSelection,
    CommitRefusals,
    RetentionBound,
    Trimmed,
    note_trimmed,
    trimmed_gaps,
)
from octopis.core.custody import PublishReceipt
from octopis.core.replay import Gap, Replay
from octopis.defaults import ANSWER_BYTES, ANSWER_MAX, PAGE_ROWS

Key = tuple[str, int]
"""A publication: (publisher, seq)."""

STORE_LIMIT = 1_000_000
"""Publications each broker's store keeps in the simulator (its memory's bound, in place
of the process's ``[retention] max_bytes``)."""


class RetentionStores:
    """Each broker's store, up to ``limit`` publications (the oldest go first, by the
    node's :class:`~octopis.core.answer.RetentionBound`, counted ``retention.trimmed`` in
    ``counts`` and remembered for the gaps), answering at most
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
        self.published: dict[str, list[Notification]] = {}
        """Each broker's publishers' publications that it routed, in order, whether its
        store kept them or not (the history a checker reads)."""
        self.confirmed: dict[Key, str] = {}
        """Publications confirmed to their publishers (their receipt's answer,
        :meth:`receipt`): the broker they were published at."""
        self.refused: dict[Key, str] = {}
        """Publications routed and then refused to their publishers, with the reason they
        were told (the commit that would have kept them failed; told with the answer)."""
        self.lost: dict[Key, str] = {}
        """Confirmed publications a store lost, each with the store and why."""
        self._kept_at: dict[str, deque[float]] = {}
        """When each kept publication was committed (beside :attr:`kept`)."""
        self._full: Counter[str] = Counter()
        """Brokers whose disk is full now (overlapping faults counted)."""
        self._refusals: dict[str, CommitRefusals] = {}
        """Each broker's store's record of its disk's refusals."""
        self._counts = counts
        self._limit = limit
        self._bound = RetentionBound(limit)
        """The node's rule of what a store drops, over a count of publications."""
        self._answer_max = answer_max
        self._answer_bytes = answer_bytes

    def refusal(self, broker: str, now: float) -> str | None:
        """Why ``broker``'s store refuses a new publication before routing it now
        (:meth:`~octopis.core.answer.CommitRefusals.refusal`; its node counts the refusal,
        :meth:`BrokerNode.publish`), or None."""
        return self._refusals_of(broker).refusal(now)

    def _refusals_of(self, broker: str) -> CommitRefusals:
        refusals = self._refusals.get(broker)
        if refusals is None:
            refusals = self._refusals[broker] = CommitRefusals(f"{broker}'s retention store")
        return refusals

    def fill(self, broker: str) -> None:
        """``broker``'s disk is full from now on (until :meth:`free`)."""
        self._full[broker] += 1

    def restarted(self, broker: str) -> None:
        """``broker`` starts again: a new process, whose store refuses nothing until a
        commit of its own fails (the process's record of refusals starts empty)."""
        self._refusals.pop(broker, None)

    def full(self, broker: str) -> bool:
        """Whether ``broker``'s disk is full now (every write to its store refused)."""
        return broker in self._full

    def free(self, broker: str) -> None:
        """One fault that filled ``broker``'s disk ends."""
        self._full[broker] -= 1
        if not self._full[broker]:
            del self._full[broker]

    def receipt(
        self, broker: str, key: Key, told: Callable[[Key], None] = lambda key: None
    ) -> PublishReceipt:
        """The receipt of publication ``key`` published at ``broker``
        (:class:`~octopis.core.custody.PublishReceipt`, the process's own): its answer
        confirms it (:attr:`confirmed`) or, the store's commit refused, refuses it
        (:attr:`refused`), when the receipt's rule says, as the process answers; its
        publisher is ``told`` either way."""

        def answered() -> None:
            if receipt.refusal is None:
                self.confirmed[key] = broker
            else:
                self.refused[key] = receipt.refusal
            told(key)

        receipt = PublishReceipt(answered)
        return receipt

    def keep(self, broker: str, notification: Notification, now: float = 0.0) -> str | None:
        """``broker`` routed ``notification`` of a local publisher: its store commits it
        (None), or the disk is full and the commit fails, routed already (returns why, as
        the process's store raises it; :class:`~octopis.core.answer.CommitWaits` tells
        the publisher)."""
        self.published.setdefault(broker, []).append(notification)
        if broker in self._full:
            self._refusals_of(broker).refused(now)
            self._counts["retention.refused"] += 1
            return f"{broker}'s retention store cannot store it: its disk is full"
        self._refusals_of(broker).committed()
        store = self.kept.get(broker)
        if store is None:
            store = self.kept[broker] = deque()
            self._kept_at[broker] = deque()
        kept_at = self._kept_at[broker]
        store.append(notification)
        kept_at.append(now)
        for _ in self._bound.cut(((None, 1, at) for at in kept_at), len(store), now):
            kept_at.popleft()
            old = store.popleft()
            note_trimmed(
                self.trimmed.setdefault(broker, {}),
                old.publisher,
                old.session,
                old.seq,
                old.published_at,
            )
            self._counts["retention.trimmed"] += 1
            if (old.publisher, old.seq) in self.confirmed:
                self.lost[(old.publisher, old.seq)] = (
                    f"{broker}'s retention store dropped it past its bound ({self._limit})"
                )
        return None

    def power_loss(self, broker: str, now: float, sync: str, unsynced: float) -> None:
        """``broker``'s machine loses power at ``now``: with ``sync`` ``normal`` its store
        loses what it committed in the last ``unsynced`` seconds (confirmed, not yet on
        disk), and the confirmed among them are remembered in :attr:`lost` (the others
        were never confirmed: the broker dies with their receipts); with ``full``
        nothing. The store itself cannot tell what it lost, no more than the process's
        SQLite file can: a replay or historic answer has no gap for it."""
        store = self.kept.get(broker)
        if sync == "full" or not store:
            return
        kept_at = self._kept_at[broker]
        reason = (f"{broker}'s retention store lost it: committed within {unsynced:.3f} s of "
                  "a power failure, not yet on disk (sync normal)")  # fmt: skip
        while kept_at and kept_at[-1] > now - unsynced:
            kept_at.pop()
            n = store.pop()
            if n.key in self.confirmed:
                self.lost[n.key] = reason
            self._counts["retention.lost_unsynced"] += 1

    def answer(self, broker: str, request: Replay) -> tuple[list[Notification], list[Gap], bool]:
        """What ``broker``'s store answers ``request`` in one piece (:meth:`pages`
        joined)."""
        pages, gaps, truncated = self.pages(broker, request)
        return [n for page in pages for n in page], gaps, truncated

    def pages(
        self, broker: str, request: Replay
    ) -> tuple[list[list[Notification]], list[Gap], bool]:
        """What ``broker``'s store answers ``request``, page by page as the process's
        store reads it (:data:`~octopis.defaults.PAGE_ROWS` kept rows a page, in the
        order kept, as the node's :class:`AnswerSelection` chooses them, until it
        ends): the pages (at least one), the ranges it dropped that the request asks
        for, and whether the answer was cut."""
        gaps = trimmed_gaps(request, self.trimmed.get(broker, {}))
        store = self.kept.get(broker)
        if not store:  # nothing to choose from: no selection to build
            return [[]], gaps, False
        selection = AnswerSelection(request, self._answer_max, self._answer_bytes)
        kept_at = self._kept_at[broker]
        start = bisect_left(kept_at, selection.start_at)  # where the process's read starts
        rows = (
            (n.publisher, n.session, n.seq, n.published_at, at, 0, lambda n=n: n)
            for n, at in islice(zip(store, kept_at, strict=True), start, None)
        )
        pages = []
        for _ in range(max(1, -(-(len(store) - start) // PAGE_ROWS))):  # read as needed
            pages.append(selection.choose(islice(rows, PAGE_ROWS)))
            if selection.ended:
                break
        return pages, gaps, selection.truncated


def in_gaps(gaps: set[Gap], n: Notification) -> bool:
    """Whether ``n`` falls in one of the retention ``gaps`` a store reported."""
    return any(
        p == n.publisher and s == n.session and first <= n.seq <= last for p, s, first, last in gaps
    )
