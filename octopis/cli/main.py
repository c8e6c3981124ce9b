# PYTHON_ARGCOMPLETE_OK
"""``octopis``: the simulator, the broker cluster runner and the shell clients.

Only the chosen command's module is imported and only its parser gets its arguments
(each command imports what it uses when it runs), so ``octopis status --help`` starts
without the simulator, the SDK or the graph library."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from collections.abc import Collection

from octopis import __version__
from octopis.cli import LOG_FORMATS, run_cli
from octopis.cli.errors import failures, user_errors

COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("sim", "simulate SBP and notification routing (snr, dnr, bid) in memory"),
    "nemesis": ("nemesis", "run seeded faults on the brokers' nodes in the simulator, checked"),
    "run": ("cluster", "run a workload on one broker process per SCOT node and report"),
    "up": ("cluster", "start one broker process per node and return when all are connected"),
    "down": ("cluster", "stop the brokers of a running overlay"),
    "status": ("cluster", "show the brokers of a running overlay: links, tables, counters"),
    "restart": ("cluster", "start one broker of an `octopis up` overlay again"),
    "monitor": ("cluster", "serve a live web page of a running overlay"),
    "sub": ("shell", "subscribe at a broker and print notifications"),
    "pub": ("shell", "publish notifications at a broker"),
    "balance": (
        "balance",
        "load-balancing plans for a running overlay, and a balancer that carries them out",
    ),
    "scale": ("scale", "add or remove a cluster or a region of a running overlay"),
}
"""Each command → the module of ``octopis.cli`` that configures and runs it, and its
one-line summary."""

EPILOG = (
    "Commands that act on a running overlay find it by --run-dir DIR (the run directory "
    "`octopis up` wrote, default .octopis) or by --topology FILE with --keys DIR. "
    'Shell completion (bash, zsh): eval "$(register-python-argcomplete octopis)", e.g. '
    "in ~/.bashrc."
)


def build_parser(configured: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``octopis``: every subcommand with its arguments, or those of
    ``configured`` with theirs and the others by name and summary only."""
    parser = argparse.ArgumentParser(
        prog="octopis",
        description="OctopiS content-based publish/subscribe on a SCOT: simulate routing "
        "(sim), run a workload on broker processes (run), start and stop brokers (up, down), "
        "grow or shrink them while they run (scale), "
        "publish and subscribe from a shell (pub, sub). Exit status 2 on bad input.",
        epilog=EPILOG,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__}",
        help="print the version and exit",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging verbosity (default WARNING)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line; the brokers `up` and `run` start "
        "log the same way (default text)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary)
        if configured is None or name in configured:
            importlib.import_module(f"octopis.cli.{module}").configure(name, sub)
    return parser


def chosen_command(argv: list[str]) -> str | None:
    """The command ``argv`` names (the first word that is not a global option or its
    value), if it names one."""
    with_value = {"--log-level", "--log-format"}
    words = iter(argv)
    for word in words:
        if word in with_value:
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``octopis``."""
    if "_ARGCOMPLETE" in os.environ:
        _complete()
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_only(chosen_command(argv)))
    return run_cli(parser, argv, errors=user_errors, failures=failures)


def _complete() -> None:
    """Answer the shell's completion request (argcomplete) with the parser of the command
    being typed; argcomplete exits."""
    import argcomplete

    line = os.environ.get("COMP_LINE", "")[: int(os.environ.get("COMP_POINT") or 0)]
    start = int(os.environ["_ARGCOMPLETE"] or 1)  # 1: octopis ..., 3: python -m module ...
    try:
        configured: list[str] | None = _only(chosen_command(shlex.split(line)[start:]))
    except ValueError:  # an open quote: complete with every command's parser
        configured = None
    argcomplete.autocomplete(build_parser(configured))


def _only(command: str | None) -> list[str]:
    return [] if command is None else [command]


if __name__ == "__main__":
    sys.exit(main())
