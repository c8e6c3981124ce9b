"""Command-line entry points. Each command reports bad input as one line on stderr
(``<prog>: error: <problem>``) and exits with status 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

EXIT_BAD_INPUT = 2

Errors = tuple[type[BaseException], ...] | Callable[[], tuple[type[BaseException], ...]]
"""Exception classes, or a function that names them when one is raised."""

LOG_FORMATS = ("text", "json")
"""``--log-format`` choices: a line of text, or one JSON object per line for machines."""


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, broker, logger, message,
    and the exception's traceback if there is one."""

    converter = time.gmtime

    def __init__(self, broker: str) -> None:
        super().__init__()
        self.broker = broker

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "broker": self.broker,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class StderrHandler(logging.StreamHandler):
    """Writes each record to ``sys.stderr`` as it is when the record comes, not as it was
    when the handler was made (a program that swaps stderr, pytest's capture among them,
    must not leave the handler writing to a closed stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


def configure_logging(level: str, log_format: str = "text", broker: str = "-") -> None:
    """Route every log record to stderr in ``log_format``, each naming ``broker`` (the
    broker process it comes from, ``-`` elsewhere) and the logger (the component)."""
    handler = StderrHandler()
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter(broker))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {broker} %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def run_cli(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    errors: Errors,
    failures: Errors = (),
) -> int:
    """Parse ``argv`` and run the chosen command.

    ``errors`` (bad input) exit with status 2, ``failures`` (the run itself failed, e.g. a
    broker died) with status 1; both print one line on stderr.
    """
    args = parser.parse_args(argv)
    configure_logging(
        getattr(args, "log_level", "WARNING"),
        getattr(args, "log_format", "text"),
        getattr(args, "id", None) or "-",
    )
    try:
        status = args.func(args)
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, errors() if callable(errors) else errors):
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if isinstance(exc, failures() if callable(failures) else failures):
            print(f"{parser.prog}: failed: {exc}", file=sys.stderr)
            return 1
        raise
    return int(status or 0)
