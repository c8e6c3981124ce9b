"""A broker's CPU as one server (issue 20): the time a notification takes a broker,
measured on the broker processes (``python -m bench.calibrate``), so that simulated
delays queue where the processes' would.

A notification a broker takes in (from a client or a neighbour) keeps its one event loop
busy for ``per_message + per_entry × table size + per_copy × copies + per_delivery ×
deliveries`` seconds; every message waits for the loop in arrival order (the simulator's
engine). Subscriptions and control traffic wait but are not charged (they are rare
against notifications in the paper's workloads). Idle work (heartbeats, timers) is
measured but not charged either: it takes a broker ``idle`` of each second, which the
report states.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FIELDS = ("per_message", "per_entry", "per_copy", "per_delivery")


@dataclass(frozen=True)
class ServiceModel:
    """Seconds of a broker's CPU per notification taken in, per routing-table entry it
    is matched against, per copy forwarded and per delivery to a local client."""

    per_message: float
    per_entry: float = 0.0
    per_copy: float = 0.0
    per_delivery: float = 0.0
    idle: float = 0.0
    """Share of each second a broker spends with no notification (not charged)."""
    source: dict[str, Any] = field(default_factory=dict, compare=False)
    """How the figures were measured (commit, topology, sizes, fit residual)."""

    def __post_init__(self) -> None:
        for name in (*FIELDS, "idle"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"service model: {name} must be a number ≥ 0, not {value!r}")

    def notification(self, table_size: int, copies: int, deliveries: int) -> float:
        """Seconds one notification keeps a broker busy."""
        return (
            self.per_message
            + self.per_entry * table_size
            + self.per_copy * copies
            + self.per_delivery * deliveries
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, path: str | Path) -> ServiceModel:
        """A model written by ``bench.calibrate``; ValueError naming the problem."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"service model {path}: {exc}") from None
        if not isinstance(data, dict) or "per_message" not in data:
            raise ValueError(f"service model {path}: not a JSON object with per_message")
        unknown = sorted(set(data) - {*FIELDS, "idle", "source"})
        if unknown:
            raise ValueError(f"service model {path}: unknown field(s) {', '.join(unknown)}")
        return cls(**data)
