"""Logs that cannot flood (DESIGN §8): a repeated warning is written at most once per
interval per kind, with the count of what was suppressed since."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """``warning(kind, msg, *args)`` writes at most one line per ``interval`` seconds per
    ``kind``; the next line written says how many of that kind were suppressed. The set of
    kinds is fixed by the code that calls it, so the table stays small."""

    def __init__(self, logger: logging.Logger, interval: float) -> None:
        self._log = logger
        self._interval = interval
        self._next: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, msg: str, *args: object) -> None:
        """Log ``msg % args`` at WARNING unless ``kind`` was logged within the interval."""
        now = time.monotonic()
        if now < self._next.get(kind, 0.0):
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._next[kind] = now + self._interval
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            msg += " (%d more like it suppressed)"
            args = (*args, suppressed)
        self._log.warning(msg, *args)
