"""How a retention store's write path costs per publication, format by format, side by
side in one process (DESIGN §11):

    python -m bench.retention_formats [--count 20000] [--rounds 3]

Each store keeps ``count`` real-sized publications (the quote bodies the broker encodes)
in commits of 1, 16, 64 and 256 rows (an awaited publish on an idle broker commits one;
a busy one, what arrived within ``PIPELINE_DELAY``), each row carrying what a replay, a
historic answer and a trim need: publisher, session, seq, published and stored times,
body. Every commit reaches the operating system before it returns (it survives a
``kill -9`` of the process, as ``synchronous = NORMAL`` promises). The stores:

- ``sqlite-rows``: SQLite in WAL mode, one row per publication, one transaction per
  commit (the store up to commit 4fcd845);
- ``sqlite-packed``: :class:`~octopis.transport.retention.RetentionStore` as the broker
  runs it now, the same database with one row per commit holding the commit's
  publications packed (its first and last stored times beside them, for the window
  search);
- ``segment``: an append-only file, one ``write`` per commit of packed records, an
  in-memory index of (stored time, offset) per commit;
- ``lmdb``: LMDB (``sync=False``: written to the OS at commit, not fsynced), one key
  per publication in one write transaction per commit.

The figure of merit is CPU µs per publication (process time), each round in a fresh
directory, the formats in rotating order; the median over the rounds is printed.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lmdb

from octopis.core.codec import decode_body_in_full, encode_body
from octopis.core.messages import Notification
from octopis.settings import Retention
from octopis.transport.retention import RetentionStore, pack

BATCHES = (1, 16, 64, 256)


class SqliteRows:
    def __init__(self, root: Path) -> None:
        self.db = sqlite3.connect(root / "rows.sqlite", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(
            "CREATE TABLE kept (publisher TEXT NOT NULL, session INTEGER NOT NULL, seq INTEGER "
            "NOT NULL, published_at REAL NOT NULL, stored_at REAL NOT NULL, body BLOB NOT NULL)"
        )

    def write(self, batch: list[tuple[Notification, bytes]]) -> None:
        now = time.time()
        rows = [(n.publisher, n.session, n.seq, n.published_at, now, b) for n, b in batch]
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT INTO kept VALUES (?, ?, ?, ?, ?, ?)", rows)

    def close(self) -> None:
        self.db.close()


class SqlitePacked:
    def __init__(self, root: Path) -> None:
        self.store = RetentionStore(
            root / "packed.sqlite", Retention(), lambda body: decode_body_in_full("x", body)
        )

    def write(self, batch: list[tuple[Notification, bytes]]) -> None:
        now = time.time()
        for n, body in batch:
            self.store.add(n, body, now)
        self.store.commit(now)

    def close(self) -> None:
        self.store.close()


class Segment:
    def __init__(self, root: Path) -> None:
        self.fd = os.open(root / "kept.seg", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.offset = 0
        self.index: list[tuple[float, int]] = []

    def write(self, batch: list[tuple[Notification, bytes]]) -> None:
        now = time.time()
        rows = [(n.publisher, n.session, n.seq, n.published_at, now, b) for n, b in batch]
        packed = pack(rows)
        os.write(self.fd, packed)
        self.index.append((now, self.offset))
        self.offset += len(packed)

    def close(self) -> None:
        os.close(self.fd)


class Lmdb:
    def __init__(self, root: Path) -> None:
        self.env = lmdb.open(str(root / "kept.lmdb"), map_size=1 << 30, sync=False)
        self.key = 0

    def write(self, batch: list[tuple[Notification, bytes]]) -> None:
        now = time.time()
        rows = [(n.publisher, n.session, n.seq, n.published_at, now, b) for n, b in batch]
        with self.env.begin(write=True) as txn:
            put = txn.put
            for row in rows:
                self.key += 1
                put(self.key.to_bytes(8, "big"), pack([row]), append=True)

    def close(self) -> None:
        self.env.close()


FORMATS: dict[str, Callable[[Path], SqliteRows | SqlitePacked | Segment | Lmdb]] = {
    "sqlite-rows": SqliteRows,
    "sqlite-packed": SqlitePacked,
    "segment": Segment,
    "lmdb": Lmdb,
}


def _quotes(count: int) -> list[tuple[Notification, bytes]]:
    made = []
    for i in range(count):
        n = Notification(
            "feed-1",
            i + 1,
            time.time(),
            {"class": "STOCK", "symbol": "ACME", "close": 100.0 + i / 7, "volume": 1000 + i},
            session=1,
        )
        made.append((n, encode_body(n)))
    return made


def _cpu_per_row(name: str, quotes: list[tuple[Notification, bytes]], batch: int) -> float:
    with tempfile.TemporaryDirectory(prefix="octopis-formats-") as tmp:
        store = FORMATS[name](Path(tmp))
        started = time.process_time()
        for start in range(0, len(quotes), batch):
            store.write(quotes[start : start + batch])
        used = time.process_time() - started
        store.close()
    return used * 1e6 / len(quotes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--count", type=int, default=20000, help="publications each store keeps per run"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of every store; the table gives the median"
    )
    args = parser.parse_args(argv)
    quotes = _quotes(args.count)
    names = list(FORMATS)
    runs: dict[tuple[str, int], list[float]] = {}
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for batch in BATCHES:
            for name in order:
                runs.setdefault((name, batch), []).append(_cpu_per_row(name, quotes, batch))
    print(f"CPU µs per publication, median of {args.rounds} rounds ({args.count} each)")
    print()
    print("| rows per commit | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for batch in BATCHES:
        cells = " | ".join(f"{statistics.median(runs[name, batch]):.2f}" for name in names)
        print(f"| {batch} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
