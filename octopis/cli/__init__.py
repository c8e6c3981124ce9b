"""Command-line entry points. Each command reports bad input as one line on stderr
(``<prog>: error: <problem>``) and exits with status 2."""

from __future__ import annotations

import argparse
import logging
import sys

EXIT_BAD_INPUT = 2


def run_cli(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    errors: tuple[type[BaseException], ...],
    failures: tuple[type[BaseException], ...] = (),
) -> int:
    """Parse ``argv`` and run the chosen command.

    ``errors`` (bad input) exit with status 2, ``failures`` (the run itself failed, e.g. a
    broker died) with status 1; both print one line on stderr.
    """
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        status = args.func(args)
    except errors as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except failures as exc:
        print(f"{parser.prog}: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)
