"""``octopis``: the simulator, the broker cluster runner and the shell clients."""

from __future__ import annotations

import argparse
import sys

from octopis.cli import LOG_FORMATS, run_cli
from octopis.cli.errors import USER_ERRORS


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``octopis`` with every subcommand registered."""
    from octopis.cli import balance, cluster, scale, sim

    parser = argparse.ArgumentParser(
        prog="octopis",
        description="OctopiS content-based publish/subscribe on a SCOT: simulate routing "
        "(sim), run a workload on broker processes (run), start and stop brokers (up, down), "
        "grow or shrink them while they run (scale), "
        "publish and subscribe from a shell (pub, sub). Exit status 2 on bad input.",
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
    sim.register(commands)
    cluster.register(commands)
    balance.register(commands)
    scale.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``octopis``."""
    from octopis.balance.observe import BalanceError
    from octopis.cluster.launcher import ClusterError

    return run_cli(build_parser(), argv, errors=USER_ERRORS, failures=(ClusterError, BalanceError))


if __name__ == "__main__":
    sys.exit(main())
