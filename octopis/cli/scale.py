"""``octopis scale``: grow or shrink an overlay `octopis up` started, while it runs
(DESIGN §9; :mod:`octopis.cluster.scale`)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any

from octopis.cli.errors import UsageError
from octopis.cli.options import add_overlay_options, cluster_of

if TYPE_CHECKING:
    from octopis.cluster.launcher import LocalCluster
    from octopis.topology import Scot


def configure(command: str, scale: argparse.ArgumentParser) -> None:
    """Give ``scale`` its description, its four changes and their arguments."""
    scale.description = (
        "Change an overlay `octopis up` started to a new topology version "
        "while it runs: leaving brokers' subscribers move first (make-before-break), the "
        "remaining brokers whose neighbours change are told their new links (each only "
        "its own), new brokers start and are filled by resync, leaving ones stop. The new "
        "version is written to the run directory and recorded, so `status`, `down` and a "
        "later `scale` use it. Clusters are labelled 0..n-1, so only the last can leave; "
        "a region joins and leaves as a leaf of the tree. A publisher must not be attached "
        "to a leaving broker (the change is refused, naming it)."
    )
    changes = scale.add_subparsers(dest="change", required=True, metavar="CHANGE")
    add_c = changes.add_parser("add-cluster", help="one more copy of the tree (cluster n)")
    remove_c = changes.add_parser("remove-cluster", help="remove the last cluster")
    remove_c.add_argument("index", type=int, help="the last cluster's index, n-1")
    add_r = changes.add_parser("add-region", help="one more region, a leaf of the tree")
    add_r.add_argument("name", help="the new region's label")
    add_r.add_argument("--attach-to", required=True, metavar="REGION", help="its tree neighbour")
    remove_r = changes.add_parser("remove-region", help="remove a leaf region")
    remove_r.add_argument("name", help="the region's label")
    for parser in (add_c, remove_c, add_r, remove_r):
        add_overlay_options(parser)
        parser.add_argument(
            "--timeout",
            type=float,
            default=120.0,
            metavar="SECONDS",
            help="give up a step (moves, relinks, readiness) after this long (default 120)",
        )
        parser.add_argument("--json", action="store_true", help="print what it did as JSON")
        parser.set_defaults(func=cmd_scale)


def new_version(scot: Scot, args: argparse.Namespace) -> Scot:
    """The topology version ``args.change`` makes of ``scot`` (TopologyError if invalid)."""
    from octopis.topology_change import add_cluster, add_region, remove_cluster, remove_region

    if args.change == "add-cluster":
        return add_cluster(scot)
    if args.change == "remove-cluster":
        return remove_cluster(scot, args.index)
    if args.change == "add-region":
        return add_region(scot, args.name, args.attach_to)
    return remove_region(scot, args.name)


async def _change(cluster: LocalCluster, new: Scot, pids: dict[str, int], timeout: float) -> Any:
    from octopis.cluster.scale import change_overlay

    try:
        return await change_overlay(cluster, new, pids, timeout)
    finally:
        await cluster.close_control()


def cmd_scale(args: argparse.Namespace) -> int:
    """``octopis scale CHANGE``."""
    cluster, pids = cluster_of(
        args, recorded="scale starts and stops brokers with the settings `octopis up` recorded"
    )
    if cluster.host is not None:
        raise UsageError(
            "this overlay runs on several hosts (`octopis up --host`): scale changes an "
            "overlay whose brokers all run here"
        )
    new = new_version(cluster.scot, args)
    try:
        done = asyncio.run(_change(cluster, new, pids, args.timeout))
    finally:
        cluster.write_state(pids)
    if args.json:
        print(json.dumps(done, indent=1))
        return 0
    moves = done["moves"]
    print(
        f"{new.name}: {new.clusters} clusters x {len(new.regions)} regions; added "
        f"{', '.join(done['added']) or 'none'}; removed {', '.join(done['removed']) or 'none'}; "
        f"{len(done['relinked'])} brokers relinked; "
        + (
            f"{moves['inside']} subscribers moved inside, {moves['across']} across; "
            if moves
            else ""
        )
        + f"ready in {done['seconds']:.1f} s; topology {done['topology']}"
    )
    return 0
