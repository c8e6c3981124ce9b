"""A broker's retention store (DESIGN §11): what its own publishers published, on disk.

SQLite in WAL mode, one file per broker (``<data dir>/<broker>.retention.sqlite``): no
server to run, and a transaction committed before a publication is confirmed survives a
``kill -9`` of the broker (WAL with ``synchronous=NORMAL`` loses only what the operating
system had not written when the *machine* failed). Bounded by ``[retention] max_bytes``
and ``max_age``: the oldest rows go first, and what was trimmed is remembered per
(publisher, session) so that a replay reaching past it reports a gap instead of
skipping it silently.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path

from octopis.core.messages import Notification
from octopis.core.replay import Gap, Replay
from octopis.filters import FilterError, Subscription, parse_subscription

SCHEMA = """
CREATE TABLE IF NOT EXISTS kept (
    publisher TEXT NOT NULL,
    session INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    published_at REAL NOT NULL,
    stored_at REAL NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (publisher, session, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kept_by_age ON kept (stored_at);
CREATE TABLE IF NOT EXISTS trimmed (
    publisher TEXT NOT NULL,
    session INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    last_published_at REAL NOT NULL,
    PRIMARY KEY (publisher, session)
) WITHOUT ROWID;
"""


CLOCK_SLACK = 60.0
"""Seconds a publisher's clock may run ahead of its broker's: the store finds rows by the
broker's time of storing, a replay asks by the publisher's time of publishing."""


class RetentionError(RuntimeError):
    """The store cannot be opened or written (the message names the file and why)."""


class RetentionStore:
    """Publications kept for replay, bounded by ``max_bytes`` (of bodies) and
    ``max_age`` seconds. :meth:`add` queues a publication; :meth:`commit` writes every
    queued one in one transaction (the broker commits at the end of each input pass,
    before the pass's confirms can leave)."""

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        max_age: float,
        decode: Callable[[bytes], Notification],
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._decode = decode
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            self.bytes, self.rows = self.db.execute(
                "SELECT COALESCE(SUM(LENGTH(body)), 0), COUNT(*) FROM kept"
            ).fetchone()
        except (OSError, sqlite3.Error) as exc:
            raise RetentionError(f"cannot open the retention store {path}: {exc}") from None
        self.pending: list[tuple[str, int, int, float, float, bytes]] = []
        self._age_checked = -float("inf")
        self.stats: dict[str, int] = {
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
        returns how many were written (a publication already kept is kept once)."""
        rows, self.pending = self.pending, []
        if rows:
            with self.db:
                self.db.execute("BEGIN")
                before = self.db.total_changes
                self.db.executemany("INSERT OR IGNORE INTO kept VALUES (?, ?, ?, ?, ?, ?)", rows)
                written = self.db.total_changes - before
            self.rows += written
            self.bytes += sum(len(r[5]) for r in rows) if written == len(rows) else 0
            if written != len(rows):
                self._recount()
            self.stats["retention.stored"] += written
            self.stats["retention.commits"] += 1
        if self.bytes > self.max_bytes or (now >= self._age_checked + 1.0 and self._aged(now)):
            self.trim(now)
        return len(rows)

    def _aged(self, now: float) -> bool:
        """Whether the oldest row is past ``max_age`` (asked at most once a second)."""
        self._age_checked = now
        return bool(self.rows) and self._oldest() < now - self.max_age

    def trim(self, now: float) -> int:
        """Drop rows older than ``max_age`` and, oldest first, those over ``max_bytes``;
        remember the last (seq, time) dropped of each (publisher, session)."""
        cutoff = now - self.max_age
        dropped: list[tuple[str, int, int, float, int]] = self.db.execute(
            "SELECT publisher, session, seq, published_at, LENGTH(body) FROM kept "
            "WHERE stored_at < ? ORDER BY stored_at",
            (cutoff,),
        ).fetchall()
        excess = self.bytes - sum(r[4] for r in dropped) - self.max_bytes
        if excess > 0:
            for row in self.db.execute(
                "SELECT publisher, session, seq, published_at, LENGTH(body) FROM kept "
                "WHERE stored_at >= ? ORDER BY stored_at",
                (cutoff,),
            ):
                if excess <= 0:
                    break
                dropped.append(row)
                excess -= row[4]
        if not dropped:
            return 0
        last: dict[tuple[str, int], tuple[int, float]] = {}
        for publisher, session, seq, published_at, _ in dropped:
            seen = last.get((publisher, session))
            if seen is None or seq > seen[0]:
                last[(publisher, session)] = (seq, published_at)
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "DELETE FROM kept WHERE publisher = ? AND session = ? AND seq = ?",
                [(p, s, q) for p, s, q, _, _ in dropped],
            )
            self.db.executemany(
                "INSERT INTO trimmed VALUES (?, ?, ?, ?) ON CONFLICT (publisher, session) "
                "DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq), "
                "last_published_at = MAX(last_published_at, excluded.last_published_at)",
                [(p, s, q, t) for (p, s), (q, t) in last.items()],
            )
        self.stats["retention.trimmed"] += len(dropped)
        self._recount()
        return len(dropped)

    def answer(self, request: Replay) -> tuple[list[Notification], list[Gap]]:
        """The kept publications ``request`` asks for that match one of its filters, in
        (publisher, session, seq) order, and the gaps retention left in what it asks
        for. A filter that does not parse matches nothing (the host checked them)."""
        filters = _filters(request.filters)
        since = {(p, s): q for p, s, q in request.since}
        rows: list[tuple[str, int, int, float, bytes]] = []
        for (publisher, session), last in sorted(since.items()):
            rows += self.db.execute(
                "SELECT publisher, session, seq, published_at, body FROM kept "
                "WHERE publisher = ? AND session = ? AND seq > ? ORDER BY seq",
                (publisher, session, last),
            )
        others = self.db.execute(
            "SELECT publisher, session, seq, published_at, body FROM kept "
            "WHERE stored_at >= ? AND published_at >= ? ORDER BY publisher, session, seq",
            (request.after - CLOCK_SLACK, request.after),
        )
        rows += (row for row in others if (row[0], row[1]) not in since)
        found: list[Notification] = []
        for *_, body in rows:
            n = self._decode(body)
            if any(f.matches(n.publication) for f in filters):
                found.append(n)
        gaps: list[Gap] = []
        for publisher, session, last_seq, last_at in self.db.execute(
            "SELECT publisher, session, last_seq, last_published_at FROM trimmed"
        ):
            last = since.get((publisher, session))
            if last is not None and last_seq > last:
                gaps.append((publisher, session, last + 1, last_seq))
            elif last is None and last_at >= request.after:
                gaps.append((publisher, session, 1, last_seq))
        self.stats["retention.replayed"] += len(found)
        return found, gaps

    def close(self) -> None:
        """Write what is queued and close the file."""
        try:
            if self.pending:
                self.commit(0.0)
        finally:
            self.db.close()

    def _oldest(self) -> float:
        row = self.db.execute("SELECT MIN(stored_at) FROM kept").fetchone()
        return row[0] if row[0] is not None else float("inf")

    def _recount(self) -> None:
        self.bytes, self.rows = self.db.execute(
            "SELECT COALESCE(SUM(LENGTH(body)), 0), COUNT(*) FROM kept"
        ).fetchone()


def _filters(texts: Iterable[str]) -> list[Subscription]:
    out = []
    for text in texts:
        try:
            out.append(parse_subscription(text))
        except FilterError:
            continue
    return out
