"""Whether a broker's previous process ended without stopping (DESIGN §7): a mark in its
data directory, made as a process starts and removed as it stops cleanly. A process that
finds it had a predecessor that died (``kill -9``, a crash, the machine); a BID broker then
knows its table lost what was subscribed before, even cut off from every neighbour."""

from __future__ import annotations

from pathlib import Path


def _mark(data_dir: Path, broker_id: str) -> Path:
    return data_dir / f"{broker_id.replace(':', '_')}.running"


def mark_running(data_dir: Path | None, broker_id: str) -> bool:
    """Mark ``broker_id``'s process as running in ``data_dir``; whether a mark was there
    already (an earlier process died). Without a data directory nothing is known: False."""
    if data_dir is None:
        return False
    mark = _mark(data_dir, broker_id)
    died = mark.exists()
    data_dir.mkdir(parents=True, exist_ok=True)
    mark.touch()
    return died


def clear_running(data_dir: Path | None, broker_id: str) -> None:
    """``broker_id``'s process stops cleanly: the next one starts as a first."""
    if data_dir is not None:
        _mark(data_dir, broker_id).unlink(missing_ok=True)
