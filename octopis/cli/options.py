"""The options every ``octopis`` command that acts on a running overlay shares, with one
meaning everywhere: ``--run-dir DIR`` (the run directory ``octopis up`` wrote, default
``.octopis``), or ``--topology FILE`` with ``--keys DIR`` or ``--insecure``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from octopis.cli.errors import UsageError
from octopis.overlay import DEFAULT_RUN_DIR

if TYPE_CHECKING:
    from octopis.cluster.launcher import LocalCluster
    from octopis.overlay import KeysChoice, Overlay

RUN_DIR_HELP = (
    "the run directory `octopis up` wrote: the overlay's topology, keys and processes "
    f"(default {DEFAULT_RUN_DIR})"
)


def add_overlay_options(parser: argparse.ArgumentParser, *, keys_needed: bool = True) -> None:
    """``--run-dir`` or ``--topology``, and ``--keys`` or ``--insecure``: which running
    overlay the command acts on and how it is reached (``keys_needed`` False: the command
    reads what needs no keys, and says so)."""
    group = parser.add_argument_group(
        "the overlay",
        "the one `octopis up` started in a run directory, or any running overlay (on this "
        "host or several) by its topology file and keys",
    )
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--run-dir", type=Path, default=DEFAULT_RUN_DIR, metavar="DIR", help=RUN_DIR_HELP
    )
    where.add_argument(
        "--topology", type=Path, metavar="FILE", help="the overlay's topology file instead"
    )
    unused = "" if keys_needed else " (not needed here: metrics are read without keys)"
    keys = group.add_mutually_exclusive_group()
    keys.add_argument(
        "--keys",
        type=Path,
        metavar="DIR",
        help="with --topology: the overlay's keys directory (`octopis-topology keys`; "
        f"default $OCTOPIS_KEYS, else none){unused}",
    )
    keys.add_argument(
        "--insecure",
        action="store_true",
        help="with --topology: reach the overlay in the clear (its brokers run --insecure)"
        + unused,
    )


def keys_of(args: argparse.Namespace) -> KeysChoice:
    """The keys ``--keys`` or ``--insecure`` choose (:data:`octopis.overlay.KeysChoice`);
    :class:`UsageError` without ``--topology``."""
    if args.topology is None and (args.keys is not None or args.insecure):
        raise UsageError(
            "--keys and --insecure go with --topology: a run directory records how its "
            "overlay is reached"
        )
    return False if args.insecure else args.keys


def overlay_of(args: argparse.Namespace) -> Overlay:
    """The overlay the command's options name."""
    from octopis.overlay import Overlay

    keys = keys_of(args)
    if args.topology is not None:
        return Overlay.find(topology=args.topology, keys=keys)
    return Overlay.find(run_dir=args.run_dir, keys=keys)


def cluster_of(
    args: argparse.Namespace, recorded: str | None = None
) -> tuple[LocalCluster, dict[str, int]]:
    """The overlay the command's options name, as a :class:`LocalCluster` to talk to its
    brokers, and the pids its run directory recorded (none with ``--topology``).
    ``recorded`` says why the command needs what ``octopis up`` recorded (mode, settings,
    processes): then ``--topology`` is refused with it."""
    from octopis.cluster.launcher import LocalCluster

    if args.topology is None:
        keys_of(args)
        return LocalCluster.from_state(args.run_dir)
    if recorded is not None:
        raise UsageError(f"{recorded}: name the overlay by --run-dir DIR, on the host that runs it")
    overlay = overlay_of(args)
    cluster = LocalCluster(
        overlay.scot,
        overlay.topology,
        "",
        Path("."),
        secure=overlay.keys is not None,
        keys=overlay.keys,
    )
    return cluster, {}
