"""``octopis-topology``: build, show and draw SCOT topologies (paper §3–4)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import networkx as nx

from octopis.cli import run_cli
from octopis.cluster.deploy import BROKER_UNIT, systemd_units, target_name
from octopis.core import MODES
from octopis.keys import DEFAULT_CLIENT, make_keys
from octopis.topology import (
    ACOL,
    DEFAULT_BASE_PORT,
    DEFAULT_HOST,
    INNER,
    PLACEMENTS,
    PORTS_PER_BROKER,
    STOMP_PORTS,
    Scot,
    TopologyError,
    build_from_factor_file,
    load_topology,
    preset_names,
    preset_path,
    regions_in_drawing_order,
    with_stomp,
)
from octopis.topology_change import (
    add_cluster,
    add_region,
    changed_brokers,
    remove_cluster,
    remove_region,
)
from octopis.topology_factors import factor_from_data, read_factor


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``octopis-topology``."""
    parser = argparse.ArgumentParser(
        prog="octopis-topology",
        description="Build, inspect and draw Structured Cyclic Overlay Topologies (SCOT = "
        "acyclic factor G_A x complete factor K_n). Exit status 2 on bad input.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = sub.add_parser(
        "build",
        help="build a SCOT and write it as JSON",
        description="Build the SCOT of an acyclic factor (a preset or a TOML/JSON factor file "
        "listing 'vertices' and 'edges') and K_n, label clusters, regions, broker types and "
        "link kinds, and write the topology JSON. Nothing is written on error.",
    )
    source = build.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", choices=preset_names(), help="a shipped factor file")
    source.add_argument(
        "--acyclic",
        metavar="FILE",
        type=Path,
        help="acyclic factor file (TOML or JSON: vertices, edges)",
    )
    shape = build.add_mutually_exclusive_group()
    shape.add_argument(
        "--clusters",
        type=int,
        metavar="N",
        help="clusters n of K_n (default: the factor file's 'clusters')",
    )
    shape.add_argument(
        "--connectivity",
        metavar="FILE",
        type=Path,
        help="connectivity factor file; must be complete and labelled 0..n-1",
    )
    where = build.add_mutually_exclusive_group()
    where.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address in every broker endpoint, all brokers on one machine "
        f"(default {DEFAULT_HOST})",
    )
    where.add_argument(
        "--hosts",
        type=_host_pair,
        action="append",
        metavar="NAME=ADDRESS",
        help="spread the brokers over machines: one NAME=ADDRESS per host (repeatable, or "
        "comma-separated); each broker's endpoints use its host's address and the topology "
        "names its host for `octopis up --host NAME`",
    )
    build.add_argument(
        "--place",
        choices=PLACEMENTS,
        default="cluster",
        help="with --hosts: a whole cluster per host (iCOLs cross hosts; default) or a whole "
        "region per host (aCOLs cross hosts), hosts taken in turn",
    )
    build.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        metavar="P",
        help=f"first port; each broker takes {PORTS_PER_BROKER}, distinct across hosts "
        f"(default {DEFAULT_BASE_PORT})",
    )
    build.add_argument(
        "--stomp-base-port",
        type=int,
        metavar="P",
        help=f"also give every broker STOMP endpoints (TCP and WebSocket, {STOMP_PORTS} ports "
        "each from P on), which `octopis up --stomp` listens on; default: none",
    )
    build.add_argument(
        "--stomp-host",
        default=DEFAULT_HOST,
        metavar="ADDRESS",
        help=f"address the STOMP endpoints bind (default {DEFAULT_HOST}: this machine only)",
    )
    build.add_argument(
        "-o", "--output", required=True, type=Path, metavar="FILE", help="topology JSON to write"
    )
    build.set_defaults(func=cmd_build)

    show = sub.add_parser(
        "show",
        help="print the summary and per-cluster/per-region tables",
        description="Print a topology file's summary and tables.",
    )
    show.add_argument("file", type=Path, metavar="FILE", help="topology JSON")
    show.add_argument(
        "--endpoints",
        action="store_true",
        help="also list each broker's peer, client, control and metrics endpoints",
    )
    show.set_defaults(func=cmd_show)

    draw = sub.add_parser(
        "draw",
        help="draw a topology (PNG or SVG)",
        description="Draw clusters as rows and regions as columns; aCOLs solid, iCOLs "
        "dashed arcs; inner brokers as squares, edge brokers as circles.",
    )
    draw.add_argument("file", type=Path, metavar="FILE", help="topology JSON")
    draw.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="PICTURE",
        help="output picture, .png or .svg",
    )
    draw.set_defaults(func=cmd_draw)

    keys = sub.add_parser(
        "keys",
        help="make the CurveZMQ key pairs of a deployment",
        description="Write a key pair per broker of a topology file, client key pairs, the "
        "admin key pair and endpoints.json (each broker endpoint and its public key) into "
        "DIR (secrets mode 0600; pairs already there are kept). Give each broker host its "
        "brokers/<id>.key_secret, every public *.key, clients/*.key, admin/admin.key and "
        "endpoints.json, and run `octopis-broker --keys DIR`; give each client host its "
        "clients/<name>.key_secret and endpoints.json (SDK: keys=DIR or $OCTOPIS_KEYS); "
        "keep admin/admin.key_secret where you run `octopis status`.",
    )
    keys.add_argument("file", type=Path, metavar="FILE", help="topology JSON")
    keys.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="DIR",
        help="directory the keys go into (made if missing; pairs already there are kept)",
    )
    keys.add_argument(
        "--client",
        action="append",
        metavar="NAME",
        help="a client key pair to make (repeatable; default: one named 'client')",
    )
    keys.set_defaults(func=cmd_keys)

    user = sub.add_parser(
        "stomp-user",
        help="add a STOMP login to a deployment's keys directory",
        description="Add (or replace) a login that brokers run with --keys DIR and --stomp "
        "accept on CONNECT: DIR/stomp-credentials.json keeps a salted scrypt hash of the "
        "passcode (mode 0600), never the passcode. The passcode is read from standard input "
        "(one line; at least 8 characters). Brokers read the file when they start.",
    )
    user.add_argument("keys", type=Path, metavar="DIR", help="the keys directory")
    user.add_argument("name", metavar="LOGIN", help="the login to add or replace")
    user.set_defaults(func=cmd_stomp_user)

    systemd = sub.add_parser(
        "systemd",
        help="write the systemd units that run one host's brokers",
        description="For a topology that names hosts (`build --hosts`), write into DIR the "
        f"template unit {BROKER_UNIT} (one broker per instance, the command line `octopis "
        "up` runs, restarted when it fails) and octopis-<host>.target, which wants every "
        "broker placed on HOST. Copy both to /etc/systemd/system on that host, then "
        "`systemctl daemon-reload && systemctl enable --now octopis-<host>.target`. Paths "
        "are as they will be on that host.",
    )
    systemd.add_argument("file", type=Path, metavar="FILE", help="topology JSON")
    systemd.add_argument("--host", required=True, metavar="NAME", help="the host's name")
    systemd.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="DIR",
        help="directory the units go into",
    )
    systemd.add_argument(
        "--topology-path",
        type=Path,
        metavar="PATH",
        help="where the topology file is on the host (default: FILE's absolute path)",
    )
    security = systemd.add_mutually_exclusive_group(required=True)
    security.add_argument(
        "--keys", type=Path, metavar="PATH", help="the keys directory on the host"
    )
    security.add_argument(
        "--insecure", action="store_true", help="run the brokers without CurveZMQ"
    )
    systemd.add_argument("--mode", default="dnr", choices=MODES, help="routing (default dnr)")
    systemd.add_argument("--config", type=Path, metavar="PATH", help="settings TOML on the host")
    systemd.add_argument(
        "--python",
        default=sys.executable,
        metavar="PATH",
        help="the interpreter with OctopiS installed on the host (default: the one running "
        "this command)",
    )
    systemd.add_argument("--user", metavar="NAME", help="run the brokers as this user")
    systemd.set_defaults(func=cmd_systemd)
    _add_change_commands(sub)
    return parser


def _add_change_commands(sub: argparse._SubParsersAction) -> None:
    """``add-cluster``, ``remove-cluster``, ``add-region``, ``remove-region``."""
    kept = (
        " Every broker of FILE keeps its id, endpoints and host; a new broker runs beside "
        "its nearest old one (same address and host) on ports after the highest in use. "
        "Otherwise the result is the SCOT of the new shape built afresh (labels, broker "
        "types, neighbours). Nothing is written on error; `octopis scale` applies the "
        "change to a running overlay."
    )
    commands = {
        "add-cluster": (
            "add cluster n (a copy of the tree, one broker per region)",
            "Write FILE's SCOT with one more cluster, labelled n.",
        ),
        "remove-cluster": (
            "remove the last cluster",
            "Write FILE's SCOT without cluster INDEX, which must be the last (n-1): the "
            "index property (paper §3.2) labels clusters 0..n-1.",
        ),
        "add-region": (
            "add a region as a leaf of the tree (one broker per cluster)",
            "Write FILE's SCOT with region NAME attached to region X of the tree.",
        ),
        "remove-region": (
            "remove a leaf region (one broker per cluster)",
            "Write FILE's SCOT without region NAME, which must be a leaf of the tree.",
        ),
    }
    for command, (summary, description) in commands.items():
        p = sub.add_parser(command, help=summary, description=description + kept)
        p.add_argument("file", type=Path, metavar="FILE", help="topology JSON")
        if command == "remove-cluster":
            p.add_argument("index", type=int, metavar="INDEX", help="the cluster (n-1)")
        if command in ("add-region", "remove-region"):
            p.add_argument("name", metavar="NAME", help="the region's label")
        if command == "add-region":
            p.add_argument(
                "--attach-to", required=True, metavar="X", help="the region it hangs from"
            )
        p.add_argument(
            "-o", "--output", required=True, type=Path, metavar="OUT", help="topology JSON to write"
        )
        p.set_defaults(func=cmd_change, change=command)


def cmd_build(args: argparse.Namespace) -> None:
    """Build and write a topology; the output appears only when complete."""
    connectivity = None
    if args.connectivity is not None:
        _, table = read_factor(args.connectivity)
        connectivity = factor_from_data(table, f"connectivity factor {args.connectivity.name}")
        connectivity = nx.relabel_nodes(connectivity, _index_label)
    factor = preset_path(args.preset) if args.preset else args.acyclic
    hosts = None
    if args.hosts:
        hosts = {}
        for name, address in (pair for group in args.hosts for pair in group):
            if name in hosts:
                raise TopologyError(f"--hosts names host {name!r} twice")
            hosts[name] = address
    scot = build_from_factor_file(
        factor,
        args.clusters,
        connectivity=connectivity,
        host=args.host,
        base_port=args.base_port,
        hosts=hosts,
        place=args.place,
    )
    if args.stomp_base_port is not None:
        scot = with_stomp(scot, args.stomp_base_port, args.stomp_host)
    write_atomically(args.output, json.dumps(scot.to_json(), indent=1) + "\n")
    s = scot.summary()
    print(
        f"{args.output}: {scot.name}: {s['brokers']} brokers, {s['clusters']} clusters, "
        f"{s['regions']} regions, {s['acols']} aCOLs, {s['icols']} iCOLs"
        + (f" on {len(scot.hosts)} hosts" if scot.hosts else "")
    )


def cmd_change(args: argparse.Namespace) -> None:
    """Write the next topology version; print what changed."""
    old = load_topology(args.file)
    if args.change == "add-cluster":
        new = add_cluster(old)
    elif args.change == "remove-cluster":
        new = remove_cluster(old, args.index)
    elif args.change == "add-region":
        new = add_region(old, args.name, args.attach_to)
    else:
        new = remove_region(old, args.name)
    write_atomically(args.output, json.dumps(new.to_json(), indent=1) + "\n")
    added, removed, relinked = changed_brokers(old, new)
    s = new.summary()
    print(
        f"{args.output}: {new.name}: {s['brokers']} brokers, {s['clusters']} clusters, "
        f"{s['regions']} regions; added {', '.join(added) or 'none'}; removed "
        f"{', '.join(removed) or 'none'}; {len(relinked)} brokers have new or fewer links"
    )


def cmd_show(args: argparse.Namespace) -> None:
    """Print a topology's summary and tables (and each broker's endpoints)."""
    scot = load_topology(args.file)
    print(format_topology(scot))
    if args.endpoints:
        print()
        print(format_endpoints(scot))


def cmd_draw(args: argparse.Namespace) -> None:
    """Render a topology picture."""
    if args.output.suffix.lower() not in (".png", ".svg"):
        raise TopologyError(f"picture must be .png or .svg, got {args.output.name!r}")
    draw_topology(load_topology(args.file), args.output)
    print(f"{args.output}: drawn")


def cmd_keys(args: argparse.Namespace) -> None:
    """Write the key pairs of a topology's deployment."""
    scot = load_topology(args.file)
    clients = args.client or [DEFAULT_CLIENT]
    make_keys(args.output, scot.endpoints_by_broker(), clients)
    print(
        f"{args.output}: key pairs of {len(scot.brokers)} brokers, {len(clients)} client(s) "
        "and the admin"
    )


def cmd_stomp_user(args: argparse.Namespace) -> None:
    """Add a STOMP login to a keys directory."""
    from octopis.gateway.credentials import add_user

    passcode = sys.stdin.readline().rstrip("\r\n")
    path = add_user(args.keys, args.name, passcode)
    print(f"{path}: login {args.name!r} added")


def cmd_systemd(args: argparse.Namespace) -> None:
    """Write the systemd units of one host's brokers."""
    scot = load_topology(args.file)
    units = systemd_units(
        scot,
        args.host,
        args.topology_path or args.file.resolve(),
        mode=args.mode,
        keys=args.keys,
        config=args.config,
        python=args.python,
        user=args.user,
    )
    for name, text in units.items():
        write_atomically(args.output / name, text)
    print(
        f"{args.output}: {', '.join(units)} for the {len(scot.brokers_on(args.host))} brokers "
        f"on host {args.host}; on that host: cp {args.output}/* /etc/systemd/system/ && "
        f"systemctl daemon-reload && systemctl enable --now {target_name(args.host)}"
    )


def format_topology(scot: Scot) -> str:
    """A readable summary, a per-cluster table and a per-region table."""
    s = scot.summary()
    lines = [
        f"{scot.name}: {s['brokers']} brokers, {s['clusters']} clusters, {s['regions']} regions",
        f"links: {s['acols']} aCOLs + {s['icols']} iCOLs = {s['acols'] + s['icols']}; "
        f"brokers: {s['inner']} inner, {s['edge']} edge; diam(G_A) = {s['diameter_acyclic']}",
        "",
        f"{'cluster':<8}{'brokers':>8}{'aCOLs':>7}{'inner':>7}{'edge':>6}",
    ]
    for c in range(scot.clusters):
        members = [b for b in scot.brokers.values() if b.cluster == c]
        inner = sum(b.type == INNER for b in members)
        acols = sum(len(b.primary_neighbours) for b in members) // 2
        lines.append(f"{c:<8}{len(members):>8}{acols:>7}{inner:>7}{len(members) - inner:>6}")
    width = max(6, *(len(r) for r in scot.regions)) + 2
    lines += ["", f"{'region':<{width}}{'type':<7}{'brokers':>8}{'iCOLs':>7}  primary neighbours"]
    for region in scot.regions:
        b0 = scot.broker(region, 0)
        nbrs = ", ".join(scot.brokers[n].region for n in b0.primary_neighbours) or "-"
        icols = scot.clusters * (scot.clusters - 1) // 2
        lines.append(f"{region:<{width}}{b0.type:<7}{scot.clusters:>8}{icols:>7}  {nbrs}")
    return "\n".join(lines)


def format_endpoints(scot: Scot) -> str:
    """One line per broker: its id, its host (when the topology names hosts) and its peer,
    client, control and metrics endpoints, and its STOMP ones when it has them."""
    width = max(len(b) for b in scot.brokers) + 2
    host_width = max((len(h) for h in scot.hosts), default=-2) + 2
    stomp = any(b.stomp_endpoint or b.stomp_ws_endpoint for b in scot.brokers.values())
    kinds = "peer / client / control / metrics" + (" / stomp / stomp-ws" if stomp else "")
    lines = [f"{'broker':<{width}}{'host':<{host_width}}{kinds}"]
    for b in scot.brokers.values():
        ends = (b.endpoint, b.client_endpoint, b.control_endpoint, b.metrics_endpoint or "-")
        if stomp:
            ends += (b.stomp_endpoint or "-", b.stomp_ws_endpoint or "-")
        lines.append(f"{b.id:<{width}}{b.host or '':<{host_width}}{'  '.join(ends)}")
    return "\n".join(lines)


def draw_topology(scot: Scot, output: Path) -> None:
    """Draw ``scot`` into ``output``: rows are clusters, columns regions (§4.1).

    aCOLs are solid arcs above their row, iCOLs dashed arcs beside their column, so
    neither kind crosses into the other's band. Needs matplotlib (the ``experiments``
    extra); without it, a :class:`TopologyError` says how to install it.
    """
    try:
        import matplotlib
    except ImportError:
        raise TopologyError(
            "drawing needs matplotlib: pip install 'octopis[experiments]'"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    order = regions_in_drawing_order(scot.acyclic)
    column = {r: i for i, r in enumerate(order)}
    pos = {b.id: (float(column[b.region]), -1.2 * b.cluster) for b in scot.brokers.values()}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(order) + 2), 1.5 * scot.clusters + 1.8))
    for u, v, kind in scot.graph.edges(data="link"):
        (x1, y1), (x2, y2) = sorted((pos[u], pos[v]))
        length = max(abs(x2 - x1), abs(y2 - y1))
        if kind == ACOL:
            bend = 0.0 if length <= 1 else -2 * min(0.45, 0.12 * length) / length
            style = {"color": "#1f4e79", "lw": 1.6, "zorder": 1}
        else:
            bend = 0.0 if length <= 1.3 else 2 * min(0.3, 0.08 * length) / length
            style = {"color": "#c55a11", "lw": 0.8, "ls": "--", "alpha": 0.8, "zorder": 0}
        arc = f"arc3,rad={bend}"  # ends at the centres, under the markers: nothing to clip
        ax.add_patch(
            FancyArrowPatch(
                (x1, y1),
                (x2, y2),
                arrowstyle="-",
                connectionstyle=arc,
                shrinkA=0,
                shrinkB=0,
                **style,
            )
        )
    for kind, shape, colour in ((INNER, "s", "#2e75b6"), ("edge", "o", "#a9d18e")):
        nodes = [b.id for b in scot.brokers.values() if b.type == kind]
        nx.draw_networkx_nodes(
            scot.graph,
            pos,
            nodelist=nodes,
            node_shape=shape,
            ax=ax,
            node_color=colour,
            node_size=380,
            edgecolors="black",
            label=f"{kind} broker",
        ).set_zorder(2)
    nx.draw_networkx_labels(
        scot.graph, pos, labels={b.id: b.region for b in scot.brokers.values()}, font_size=7, ax=ax
    )
    ax.plot([], [], color="#1f4e79", lw=1.6, label="aCOL (intra-cluster)")
    ax.plot([], [], color="#c55a11", ls="--", lw=0.8, label="iCOL (inter-cluster)")
    ax.set_yticks(
        [-1.2 * c for c in range(scot.clusters)], [f"cluster {c}" for c in range(scot.clusters)]
    )
    ax.set_xticks(range(len(order)), order)
    ax.set_xlabel("region")
    ax.set_xlim(-0.7, len(order) - 0.3)
    ax.set_ylim(-1.2 * (scot.clusters - 1) - 0.6, 0.8)
    ax.tick_params(left=False, bottom=False, labelleft=True, labelbottom=True)
    for spine in ax.spines.values():
        spine.set_visible(False)
    s = scot.summary()
    ax.set_title(
        f"SCOT {scot.name}: {s['brokers']} brokers, {s['clusters']} clusters, "
        f"{s['acols']} aCOLs, {s['icols']} iCOLs"
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=130)
    plt.close(fig)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, so a failure leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _host_pair(text: str) -> list[tuple[str, str]]:
    """``NAME=ADDRESS[,NAME=ADDRESS...]`` as pairs (argparse type of ``--hosts``)."""
    pairs = []
    for item in text.split(","):
        name, sep, address = item.strip().partition("=")
        if not sep or not name or not address:
            raise argparse.ArgumentTypeError(f"expected NAME=ADDRESS, got {item.strip()!r}")
        pairs.append((name, address))
    return pairs


def _index_label(label: str) -> int | str:
    return int(label) if label.isdigit() else label


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``octopis-topology``."""
    from octopis.gateway.credentials import CredentialsError

    return run_cli(build_parser(), argv, errors=(TopologyError, CredentialsError))


if __name__ == "__main__":
    sys.exit(main())
