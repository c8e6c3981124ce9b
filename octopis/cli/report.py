"""Rendering run reports (``octopis sim`` and ``octopis run`` share the keys)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from octopis.cli.topology import write_atomically


def print_report(report: dict[str, Any]) -> str:
    """The report as an aligned two-column table; nested figures are flattened."""
    rows = list(_flatten(report, ""))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _flatten(report: dict[str, Any], prefix: str) -> Iterable[tuple[str, str]]:
    for key, value in report.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", _fmt(value)


def write_deliveries(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """One JSON object per line, written atomically."""
    write_atomically(path, "".join(json.dumps(r) + "\n" for r in records))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.6g}"
    return str(value)
