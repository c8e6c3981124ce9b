"""A broker's retention store (DESIGN §11): what its own publishers published, on disk.

SQLite in WAL mode, one file per broker (``<data dir>/<broker>.retention.sqlite``): no
server to run, and a transaction committed before a publication is confirmed survives a
``kill -9`` of the broker (WAL with ``synchronous=NORMAL`` loses only what the operating
system had not written when the *machine* failed). Bounded by ``[retention] max_bytes``
and ``max_age``: the oldest rows go first (the node's rule,
:class:`~octopis.core.answer.RetentionBound`), and what was trimmed is remembered per
(publisher, session) so that a replay reaching past it reports a gap instead of
skipping it silently. Which rows answer a replay is the node's
:class:`~octopis.core.answer.AnswerSelection`'s; this module reads and writes.

The kept publications are a plain log in the order they were stored: one row per commit
(SQLite's rowid), its publications packed in one blob with their stored times' range
beside it, and no index to keep up on the hot path (a row per publication cost the edge
broker ~5 µs of CPU each, a packed commit ~1-2 µs: ``bench/retention_formats.py``). A
replay finds where its window starts by a binary search over the rowids (stored times grow
with them) and reads from there; a publication sent twice (a publisher's re-send after a
fail-over) is answered once. A store written with a row per publication is packed when
opened.
"""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Callable, Iterator
from functools import partial
from math import inf
from pathlib import Path

from octopis.core.answer import (
    AnswerSelection,
    CommitRefusals,
    Kept,
    RetentionBound,
    Trimmed,
    note_trimmed,
    trimmed_gaps,
)
from octopis.core.durable import WriteRefused
from octopis.core.messages import Notification
from octopis.core.replay import Gap, Replay
from octopis.settings import Retention

SCHEMA = """
CREATE TABLE IF NOT EXISTS packed (
    first_at REAL NOT NULL,
    last_at REAL NOT NULL,
    rows INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    records BLOB NOT NULL
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


RECORD = struct.Struct("<qqddII")
"""A packed publication's header: session, seq, published at, stored at, the lengths of
the publisher's name and of the body; the name (UTF-8) and the body follow."""
_pack_record = RECORD.pack

PACK_ROWS = 256
"""Publications per packed row when a store kept a row per publication is packed."""

Row = tuple[str, int, int, float, float, bytes]
"""A kept publication: publisher, session, seq, published at, stored at, body."""


def pack(rows: list[Row]) -> bytes:
    """``rows`` as one blob of records (:data:`RECORD`)."""
    parts: list[bytes] = []
    header = RECORD.pack
    for publisher, session, seq, published_at, stored_at, body in rows:
        name = publisher.encode()
        parts += (header(session, seq, published_at, stored_at, len(name), len(body)), name, body)
    return b"".join(parts)


def unpack(records: bytes) -> Iterator[Row]:
    """The rows of a blob :func:`pack` made, in order."""
    header, size = RECORD.unpack_from, RECORD.size
    offset, end = 0, len(records)
    while offset < end:
        session, seq, published_at, stored_at, name_length, body_length = header(records, offset)
        offset += size
        publisher = records[offset : offset + name_length].decode()
        offset += name_length
        yield (
            publisher,
            session,
            seq,
            published_at,
            stored_at,
            records[offset : offset + body_length],
        )
        offset += body_length


AGE_EVERY = 1.0
"""Seconds between two looks at the oldest row's age after a commit (a query each)."""


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
        self.bound = RetentionBound(settings.max_bytes, settings.max_age)
        """``[retention]``'s ``max_bytes`` and ``max_age``: the node's rule of what goes."""
        self._decode = decode
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={settings.sync.upper()}")
            self.db.executescript(SCHEMA)
            self._pack_rows()
            self._recount()
        except (OSError, sqlite3.Error) as exc:
            raise RetentionError(f"cannot open the retention store {path}: {exc}") from None
        self.pending = 0
        """Publications :meth:`add` queued for the next :meth:`commit`."""
        self._queued = bytearray()
        """Their records (:data:`RECORD`), packed as they come."""
        self._queued_bytes = 0
        self._first_at, self._last_at = inf, -inf
        self._age_checked = -inf
        self.refusals = CommitRefusals(f"the retention store {path.name}")
        """When the disk last refused a commit, and what that refuses."""
        self.stats: dict[str, int] = {
            "retention.refused": 0,
            "retention.stored": 0,
            "retention.trimmed": 0,
            "retention.commits": 0,
            "retention.replayed": 0,
            "retention.trims_refused": 0,
        }

    def add(self, n: Notification, body: bytes, now: float) -> None:
        """Queue ``n`` (encoded as ``body``) to be kept from ``now`` (wall time): its
        record goes onto the next commit's blob at once (no row kept to pack at the
        commit: ~0.1 µs less per publication, ``bench/retention.py``'s edge broker pays
        this per notification)."""
        name = n.publisher.encode()
        queued = self._queued
        queued += _pack_record(n.session, n.seq, n.published_at, now, len(name), len(body))
        queued += name
        queued += body
        self.pending += 1
        self._queued_bytes += len(body)
        if now < self._first_at:
            self._first_at = now
        if now > self._last_at:
            self._last_at = now

    def commit(self, now: float) -> int:
        """Write what :meth:`add` queued in one transaction, then trim to the bounds;
        returns how many were written. :class:`RetentionError` if the disk refuses (full,
        or failing): none of them is written, what was committed before stays, and
        :attr:`refusals` says when (publications are refused for a while)."""
        rows, size, records = self.pending, self._queued_bytes, self._queued
        first_at, last_at = self._first_at, self._last_at
        self.pending, self._queued_bytes, self._queued = 0, 0, bytearray()
        self._first_at, self._last_at = inf, -inf
        if rows:
            try:  # one statement: its own transaction
                self._insert(first_at, last_at, rows, size, records)
            except sqlite3.Error as exc:
                self.refusals.refused(now)
                self.stats["retention.refused"] += rows
                raise RetentionError(
                    f"the retention store {self.path} cannot store {rows} publications: {exc}"
                ) from None
            self.refusals.committed()
            self.rows += rows
            self.bytes += size
            self.stats["retention.stored"] += rows
            self.stats["retention.commits"] += 1
        oldest = inf
        if now >= self._age_checked + AGE_EVERY:
            self._age_checked, oldest = now, self._oldest()
        if self.bound.over(self.bytes, oldest, now):
            try:
                self.trim(now)
            except sqlite3.Error:  # what was written stays; trimmed at a later commit
                self.stats["retention.trims_refused"] += 1
        return rows

    def refusal(self, now: float) -> str | None:
        """Why a new publication is refused now (:meth:`CommitRefusals.refusal`); None:
        accepted."""
        return self.refusals.refusal(now)

    def trim(self, now: float) -> int:
        """Drop the packed rows :meth:`RetentionBound.cut` says go (a commit's
        publications go together); remember the last (seq, time) dropped of each
        (publisher, session)."""
        rows = self.db.execute("SELECT rowid, bytes, last_at FROM packed ORDER BY rowid")
        dropped = self.bound.cut(rows, self.bytes, now)
        rows.close()  # read no further than the rule did
        end = dropped[-1] + 1 if dropped else 0
        last: Trimmed = {}
        count = 0
        for (records,) in self.db.execute("SELECT records FROM packed WHERE rowid < ?", (end,)):
            for publisher, session, seq, published_at, _, _ in unpack(records):
                count += 1
                note_trimmed(last, publisher, session, seq, published_at)
        if not count:
            return 0
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM packed WHERE rowid < ?", (end,))
            self.db.executemany(
                "INSERT INTO trimmed VALUES (?, ?, ?, ?) ON CONFLICT (publisher, session) "
                "DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq), "
                "last_published_at = MAX(last_published_at, excluded.last_published_at)",
                [(p, s, q, t) for (p, s), (q, t) in last.items()],
            )
        self.stats["retention.trimmed"] += count
        self._recount()
        return count

    def first_rowid_stored(self, at: float) -> int:
        """The first packed row with a publication stored at or after ``at`` (one past
        the last if none): a binary search, stored times growing with rowids."""
        low, high = self.db.execute("SELECT MIN(rowid), MAX(rowid) FROM packed").fetchone()
        if low is None:
            return 0
        high += 1
        while low < high:
            middle = (low + high) // 2
            row = self.db.execute(
                "SELECT rowid, last_at FROM packed WHERE rowid >= ? ORDER BY rowid LIMIT 1",
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
        """The ranges retention dropped that ``request`` asks for (the node's
        :func:`trimmed_gaps`)."""
        rows = self.db.execute(
            "SELECT publisher, session, last_seq, last_published_at FROM trimmed"
        )
        return trimmed_gaps(request, {(p, s): (q, t) for p, s, q, t in rows})

    def oldest(self) -> float | None:
        """When the oldest kept publication was published (None: none kept)."""
        row = self.db.execute("SELECT records FROM packed ORDER BY rowid LIMIT 1").fetchone()
        return RECORD.unpack_from(row[0])[2] if row is not None else None

    def save_durables(self, records: dict[tuple[str, str], bytes | None]) -> None:
        """Write durable records (encoded) and delete those given as None, in one
        transaction. :class:`~octopis.core.durable.WriteRefused` if the disk refuses
        (full, or failing): none of them is written, what was written before stays."""
        try:
            with self.db:
                self.db.execute("BEGIN")
                for (client, name), record in records.items():
                    if record is None:
                        self.db.execute(
                            "DELETE FROM durable WHERE client = ? AND name = ?", (client, name)
                        )
                    else:
                        self.db.execute(
                            "INSERT OR REPLACE INTO durable VALUES (?, ?, ?)",
                            (client, name, record),
                        )
        except sqlite3.Error as exc:
            raise WriteRefused(
                f"the retention store {self.path} cannot write {len(records)} durable "
                f"records: {exc}"
            ) from None

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
        row = self.db.execute("SELECT first_at FROM packed ORDER BY rowid LIMIT 1").fetchone()
        return row[0] if row is not None else inf

    def _recount(self) -> None:
        self.bytes, self.rows = self.db.execute(
            "SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(rows), 0) FROM packed"
        ).fetchone()

    def _pack_rows(self) -> None:
        """A store written with a row per publication (table ``kept``): pack its rows,
        :data:`PACK_ROWS` to a packed row, in one transaction, and drop the table."""
        if not self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'kept'").fetchone():
            return
        with self.db:
            self.db.execute("BEGIN")
            rows: list[Row] = []
            for row in self.db.execute(
                "SELECT publisher, session, seq, published_at, stored_at, body FROM kept "
                "ORDER BY rowid"
            ).fetchall():
                rows.append(row)
                if len(rows) == PACK_ROWS:
                    self._insert_packed(rows)
                    rows = []
            if rows:
                self._insert_packed(rows)
            self.db.execute("DROP TABLE kept")

    def _insert_packed(self, rows: list[Row]) -> None:
        """Insert ``rows`` as one packed row."""
        times = [r[4] for r in rows]
        size = sum(len(r[5]) for r in rows)
        self._insert(min(times), max(times), len(rows), size, pack(rows))

    def _insert(
        self, first_at: float, last_at: float, rows: int, size: int, records: bytes | bytearray
    ) -> None:
        """Insert one packed row: ``rows`` publications stored from ``first_at`` to
        ``last_at``, ``size`` bytes of bodies, their ``records``."""
        self.db.execute(
            "INSERT INTO packed VALUES (?, ?, ?, ?, ?)", (first_at, last_at, rows, size, records)
        )


class StoreAnswer:
    """One store's answer to ``request``, read page by page so that a large one does not
    hold the broker's loop: the kept publications in the order they were stored, from
    where ``after`` starts, handed to the node's :class:`AnswerSelection` (which decides
    what answers, when the store stops reading, and when the answer is cut:
    ``truncated``). Rows trimmed between pages are reported with the gaps."""

    def __init__(
        self, store: RetentionStore, request: Replay, answer_max: int, answer_bytes: int
    ) -> None:
        """``answer_max`` and ``answer_bytes``: the store's bounds (``[retention]``'s),
        0 for none."""
        self.store = store
        self.request = request
        self.selection = AnswerSelection(request, answer_max, answer_bytes)
        self.next_rowid = store.first_rowid_stored(self.selection.start_at)
        self.skip = 0
        """Publications of the packed row ``next_rowid`` read by earlier pages."""
        self.read_all = False
        """Every kept row was read (the last page ended with the store's)."""
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
        found = self.selection.choose(self._rows(rows))
        if self.read_all or self.selection.ended:
            self._finish()
        self.store.stats["retention.replayed"] += len(found)
        return found

    def _rows(self, rows: int) -> Iterator[Kept]:
        """The next ``rows`` kept publications (:data:`Kept`) from where the last page
        stopped, as the selection reads them; :attr:`read_all` once none is left."""
        decode, db = self.store._decode, self.store.db
        read = 0
        while True:
            row = db.execute(
                "SELECT rowid, records FROM packed WHERE rowid >= ? ORDER BY rowid LIMIT 1",
                (self.next_rowid,),
            ).fetchone()
            if row is None:
                self.read_all = True
                return
            rowid, records = row
            if rowid != self.next_rowid:  # trimmed meanwhile: the gaps say so
                self.next_rowid, self.skip = rowid, 0
            for index, kept in enumerate(unpack(records)):
                if index < self.skip:
                    continue
                if read == rows:
                    self.skip = index
                    return
                read += 1
                publisher, session, seq, published_at, stored_at, body = kept
                yield (publisher, session, seq, published_at, stored_at, len(body),
                       partial(decode, body))  # fmt: skip
            self.next_rowid, self.skip = rowid + 1, 0

    def _finish(self) -> None:
        self.done = True
        self.gaps = self.store.gaps(self.request)
        self.selection.seen = set()
