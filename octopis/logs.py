"""Logs that cannot flood (DESIGN §8): a repeated warning is written at most once per
interval per kind, with the count of what was suppressed since; a library logger (the
control RPC's) gets the same through :class:`FloodFilter`."""

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
        self._write(logging.WARNING, kind, msg, args)

    def exception(self, kind: str, msg: str, *args: object) -> None:
        """Log ``msg % args`` at ERROR with the exception being handled, unless ``kind``
        was logged within the interval."""
        self._write(logging.ERROR, kind, msg, args, exc_info=True)

    def _write(
        self, level: int, kind: str, msg: str, args: tuple[object, ...], exc_info: bool = False
    ) -> None:
        now = time.monotonic()
        if now < self._next.get(kind, 0.0):
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._next[kind] = now + self._interval
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            msg += " (%d more like it suppressed)"
            args = (*args, suppressed)
        self._log.log(level, msg, *args, exc_info=exc_info)


class FloodFilter(logging.Filter):
    """For a logger whose messages we do not write ourselves (aiozmq's, which logs every
    undecodable control message with its bytes): at most one record per ``interval``,
    its message cut to ``max_chars``, the next one saying how many were suppressed."""

    def __init__(self, interval: float, max_chars: int = 300) -> None:
        super().__init__()
        self._interval = interval
        self._max_chars = max_chars
        self._next = 0.0
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Let ``record`` through (shortened) unless one was let through lately."""
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            return False
        self._next = now + self._interval
        message = record.getMessage()
        if len(message) > self._max_chars:
            message = f"{message[: self._max_chars]}… ({len(message)} characters)"
        if self._suppressed:
            message += f" ({self._suppressed} more like it suppressed)"
            self._suppressed = 0
        record.msg, record.args, record.exc_info, record.exc_text = message, None, None, None
        return True
