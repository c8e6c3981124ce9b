"""A broker's retention store (DESIGN §11): what its own publishers published, on disk.

SQLite in WAL mode, one file per broker (``<data dir>/<broker>.retention.sqlite``): no
server to run, and a transaction committed before a publication is confirmed survives a
``kill -9`` of the broker (WAL with ``synchronous=NORMAL`` loses only what the operating
system had not written when the *machine* failed). Bounded by ``[retention] max_bytes``
and ``max_age``: the oldest rows go first, and what was trimmed is remembered per
(publisher, session) so that a replay reaching past it reports a gap instead of
skipping it silently.

The table is a plain log in the order rows were stored (SQLite's rowid), with no index
to keep up on the hot path: a replay finds where its window starts by a binary search
over the rowids (stored times grow with them) and reads from there; a publication sent
twice (a publisher's re-send after a fail-over) is answered once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial
from pathlib import Path

from octopis.core.answer import AnswerSelection
from octopis.core.messages import Notification
from octopis.core.replay import Gap, Replay
from octopis.settings import Retention

SCHEMA = """
CREATE TABLE IF NOT EXISTS kept (
    publisher TEXT NOT NULL,
    session INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    published_at REAL NOT NULL,
    stored_at REAL NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS durable (
    client TEXT NOT NULL,
    name TEXT NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (client, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trimmed (
    publisher TEXT NOT NULL,
    session INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    last_published_at REAL NOT NULL,
    PRIMARY KEY (publisher, session)
) WITHOUT ROWID;
"""


REFUSE_FOR = 1.0
"""Seconds new publications are refused after the disk refused a commit."""

CLOCK_SLACK = 60.0
"""Seconds a publisher's clock may run ahead of its broker's: the store finds rows by the
broker's time of storing, a replay asks by the publisher's time of publishing."""


class RetentionError(RuntimeError):
    """The store cannot be opened or written (the message names the file and why)."""


class RetentionStore:
    """Publications kept for replay, bounded by ``[retention]``'s ``max_bytes`` (of
    bodies) and ``max_age`` seconds. :meth:`add` queues a publication; :meth:`commit` writes every
    queued one in one transaction (the broker commits at the end of each input pass,
    before the pass's confirms can leave)."""

    def __init__(
        self,
        path: Path,
        settings: Retention,
        decode: Callable[[bytes], Notification],
    ) -> None:
        """``settings.sync``: ``normal`` (a commit is safe from a crash of the process) or
        ``full`` (from a power failure too: fsync per commit)."""
        self.path = path
        self.max_bytes = settings.max_bytes
        self.max_age = settings.max_age
        self._decode = decode
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={settings.sync.upper()}")
            self.db.executescript(SCHEMA)
            self.bytes, self.rows = self.db.execute(
                "SELECT COALESCE(SUM(LENGTH(body)), 0), COUNT(*) FROM kept"
            ).fetchone()
        except (OSError, sqlite3.Error) as exc:
            raise RetentionError(f"cannot open the retention store {path}: {exc}") from None
        self.pending: list[tuple[str, int, int, float, float, bytes]] = []
        self._age_checked = -float("inf")
        self.refused_at: float | None = None
        """When the disk last refused a commit (None: the last one went through)."""
        self.stats: dict[str, int] = {
            "retention.refused": 0,
            "retention.stored": 0,
            "retention.trimmed": 0,
            "retention.commits": 0,
            "retention.replayed": 0,
        }

    def add(self, n: Notification, body: bytes, now: float) -> None:
        """Queue ``n`` (encoded as ``body``) to be kept from ``now`` (wall time)."""
        self.pending.append((n.publisher, n.session, n.seq, n.published_at, now, body))

    def commit(self, now: float) -> int:
        """Write what :meth:`add` queued in one transaction, then trim to the bounds;
        returns how many were written. :class:`RetentionError` if the disk refuses (full,
        or failing): none of them is written, what was committed before stays, and
        :attr:`refused_at` says when (publications are refused for a while)."""
        rows, self.pending = self.pending, []
        if rows:
            try:
                with self.db:
                    self.db.execute("BEGIN")
                    self.db.executemany("INSERT INTO kept VALUES (?, ?, ?, ?, ?, ?)", rows)
            except sqlite3.Error as exc:
                self.refused_at = now
                self.stats["retention.refused"] += len(rows)
                raise RetentionError(
                    f"the retention store {self.path} cannot store {len(rows)} publications: {exc}"
                ) from None
            self.refused_at = None
            self.rows += len(rows)
            self.bytes += sum(len(r[5]) for r in rows)
            self.stats["retention.stored"] += len(rows)
            self.stats["retention.commits"] += 1
        if self.bytes > self.max_bytes or (now >= self._age_checked + 1.0 and self._aged(now)):
            self.trim(now)
        return len(rows)

    def refusal(self, now: float) -> str | None:
        """Why a new publication is refused now: within :data:`REFUSE_FOR` seconds of a
        commit the disk refused (after that the next one tries again); None: accepted."""
        if self.refused_at is None or now - self.refused_at >= REFUSE_FOR:
            return None
        return (
            f"the retention store {self.path.name} cannot store publications (its disk "
            f"refused a commit {now - self.refused_at:.1f} s ago); publish again later"
        )

    def _aged(self, now: float) -> bool:
        """Whether the oldest row is past ``max_age`` (asked at most once a second)."""
        self._age_checked = now
        return bool(self.rows) and self._oldest() < now - self.max_age

    def trim(self, now: float) -> int:
        """Drop the rows older than ``max_age`` and, oldest first, those over
        ``max_bytes``; remember the last (seq, time) dropped of each (publisher, session)."""
        end = self._first_rowid_stored(now - self.max_age)
        excess = self.bytes - self.max_bytes
        if excess > 0:
            for rowid, size in self.db.execute(
                "SELECT rowid, LENGTH(body) FROM kept ORDER BY rowid"
            ):
                if excess <= 0:
                    break
                end = max(end, rowid + 1)
                excess -= size
        dropped = self.db.execute(
            "SELECT publisher, session, MAX(seq), MAX(published_at), COUNT(*) FROM kept "
            "WHERE rowid < ? GROUP BY publisher, session",
            (end,),
        ).fetchall()
        if not dropped:
            return 0
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM kept WHERE rowid < ?", (end,))
            self.db.executemany(
                "INSERT INTO trimmed VALUES (?, ?, ?, ?) ON CONFLICT (publisher, session) "
                "DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq), "
                "last_published_at = MAX(last_published_at, excluded.last_published_at)",
                [(p, s, q, t) for p, s, q, t, _ in dropped],
            )
        count = sum(r[4] for r in dropped)
        self.stats["retention.trimmed"] += count
        self._recount()
        return count

    def _first_rowid_stored(self, at: float) -> int:
        """The first rowid stored at or after ``at`` (one past the last if none): a
        binary search, stored times growing with rowids."""
        low, high = self.db.execute("SELECT MIN(rowid), MAX(rowid) FROM kept").fetchone()
        if low is None:
            return 0
        high += 1
        while low < high:
            middle = (low + high) // 2
            row = self.db.execute(
                "SELECT rowid, stored_at FROM kept WHERE rowid >= ? ORDER BY rowid LIMIT 1",
                (middle,),
            ).fetchone()
            if row is None or row[1] >= at:
                high = middle
            else:
                low = row[0] + 1
        return low

    def answer(self, request: Replay) -> tuple[list[Notification], list[Gap]]:
        """The kept publications ``request`` asks for, at once (see :class:`StoreAnswer`)."""
        answer = StoreAnswer(self, request, 0, 0)
        found: list[Notification] = []
        while not answer.done:
            found += answer.page(1 << 30)
        return found, answer.gaps

    def gaps(self, request: Replay) -> list[Gap]:
        """The ranges retention dropped that ``request`` asks for."""
        since = {(p, s): q for p, s, q in request.since}
        gaps: list[Gap] = []
        for publisher, session, last_seq, last_at in self.db.execute(
            "SELECT publisher, session, last_seq, last_published_at FROM trimmed"
        ):
            last = since.get((publisher, session))
            if last_at < request.after:
                continue
            if last is None:
                gaps.append((publisher, session, 1, last_seq))
            elif last_seq > last:
                gaps.append((publisher, session, last + 1, last_seq))
        return gaps

    def oldest(self) -> float | None:
        """When the oldest kept publication was published (None: none kept)."""
        row = self.db.execute("SELECT published_at FROM kept ORDER BY rowid LIMIT 1").fetchone()
        return row[0] if row is not None else None

    def save_durables(self, records: dict[tuple[str, str], bytes | None]) -> None:
        """Write durable records (encoded) and delete those given as None."""
        with self.db:
            self.db.execute("BEGIN")
            for (client, name), record in records.items():
                if record is None:
                    self.db.execute(
                        "DELETE FROM durable WHERE client = ? AND name = ?", (client, name)
                    )
                else:
                    self.db.execute(
                        "INSERT OR REPLACE INTO durable VALUES (?, ?, ?)", (client, name, record)
                    )

    def durables(self) -> list[tuple[str, str, bytes]]:
        """The durable records written: (client, durable name, encoded record)."""
        return list(self.db.execute("SELECT client, name, record FROM durable"))

    def close(self) -> None:
        """Write what is queued and close the file."""
        try:
            if self.pending:
                self.commit(0.0)
        finally:
            self.db.close()

    def _oldest(self) -> float:
        row = self.db.execute("SELECT stored_at FROM kept ORDER BY rowid LIMIT 1").fetchone()
        return row[0] if row is not None else float("inf")

    def _recount(self) -> None:
        self.bytes, self.rows = self.db.execute(
            "SELECT COALESCE(SUM(LENGTH(body)), 0), COUNT(*) FROM kept"
        ).fetchone()


class StoreAnswer:
    """One store's answer to ``request``, read page by page so that a large one does not
    hold the broker's loop: the kept rows in the order they were stored, from where
    ``after`` starts, each offered to the node's :class:`AnswerSelection` (which decides
    what answers, and when the answer is cut: ``truncated``). Rows trimmed between pages
    are reported with the gaps."""

    def __init__(
        self, store: RetentionStore, request: Replay, answer_max: int, answer_bytes: int
    ) -> None:
        """``answer_max`` and ``answer_bytes``: the store's bounds (``[retention]``'s),
        0 for none."""
        self.store = store
        self.request = request
        self.selection = AnswerSelection(request, answer_max, answer_bytes)
        self.next_rowid = store._first_rowid_stored(request.after - CLOCK_SLACK)
        self.stop_at = request.until + CLOCK_SLACK
        self.done = False
        self.gaps: list[Gap] = []

    @property
    def truncated(self) -> bool:
        """The answer was cut at its bounds."""
        return self.selection.truncated

    def page(self, rows: int) -> list[Notification]:
        """The publications the selection takes among the next ``rows`` kept ones; sets
        ``done`` (and ``gaps``) after the last."""
        if self.done:
            return []
        take, decode = self.selection.take, self.store._decode
        found: list[Notification] = []
        read = 0
        for rowid, publisher, session, seq, published_at, stored_at, body in self.store.db.execute(
            "SELECT rowid, publisher, session, seq, published_at, stored_at, body FROM kept "
            "WHERE rowid >= ? ORDER BY rowid LIMIT ?",
            (self.next_rowid, rows),
        ):
            read += 1
            self.next_rowid = rowid + 1
            if stored_at > self.stop_at:
                read = -1
                break
            n = take(publisher, session, seq, published_at, len(body), partial(decode, body))
            if n is not None:
                found.append(n)
            elif self.selection.truncated:
                read = -1
                break
        if read < rows:
            self.done = True
            self.gaps = self.store.gaps(self.request)
            self.selection.seen = set()
        self.store.stats["retention.replayed"] += len(found)
        return found
