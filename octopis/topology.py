"""Structured Cyclic Overlay Topology (SCOT): build, label, validate, (de)serialize.

A SCOT is the Cartesian product G_A □ G_C of an *acyclic factor* G_A (a tree) and a
*connectivity factor* G_C = K_n (paper §3.2). Each copy of G_A is a cluster, indexed by
its G_C vertex 0..n-1; each copy of G_C is a region, labelled by its G_A vertex (§4.1).
Links inside a cluster are aCOLs, links inside a region iCOLs (§4.2). A broker with at
most one primary neighbour is an *edge* broker, one with two or more an *inner* broker
(§4.3).

A broker is named ``"<region>:<cluster>"`` (the paper's B(x, c)); the name is a key only
and is never parsed.

All checks raise :class:`TopologyError` with a message that names the problem.

Reading a topology file needs no graph library: the SCOT is labelled from the factors'
vertex and edge lists (a broker process starts with this, and networkx's import was more
than a third of a broker's start). networkx is imported where a graph is asked for
(:attr:`Scot.acyclic`, :attr:`Scot.graph`, building from factors, analysis, drawing) and
to name what is wrong with a factor that is not a tree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from octopis.topology_factors import (
    TopologyError,
    Tree,
    check_acyclic_factor,
    check_connectivity_factor,
    cluster_count,
    complete_factor,
    error_reason,
    read_factor,
    tree_from_data,
)

if TYPE_CHECKING:
    import networkx as nx

ACOL = "aCOL"
ICOL = "iCOL"
PRIMARY_ROLE = "primary"
SECONDARY_ROLE = "secondary"
INNER = "inner"
EDGE = "edge"

FORMAT = "octopis-topology/1"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_BASE_PORT = 17000
PORTS_PER_BROKER = 4
"""Each broker binds four consecutive ports: peer links, clients, control RPC, metrics."""
PLACEMENTS = ("cluster", "region")
"""How :func:`build_scot` spreads brokers over named hosts: a whole cluster (a copy of the
tree, so iCOLs cross hosts) or a whole region (a copy of K_n, so aCOLs cross hosts) per
host, hosts taken in turn."""
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def broker_id(region: str, cluster: int) -> str:
    """The broker name of B(region, cluster)."""
    return f"{region}:{cluster}"


@dataclass(frozen=True)
class Neighbour:
    """A direct neighbour as its broker knows it (§4.3): name, link kind, role, type and
    cluster index (which the CBV bits name, §4.4)."""

    id: str
    link: str
    role: str
    type: str
    cluster: int
    region: str


@dataclass(frozen=True)
class BrokerInfo:
    """One SCOT node with the labels a broker knows about itself (§4.3)."""

    id: str
    region: str
    cluster: int
    type: str
    endpoint: str
    client_endpoint: str
    control_endpoint: str
    neighbours: tuple[Neighbour, ...]
    metrics_endpoint: str | None = None
    """``http://HOST:PORT/metrics``, Prometheus text (DESIGN §10); None: not served."""
    stomp_endpoint: str | None = None
    """``tcp://HOST:PORT`` of its STOMP listener (DESIGN §13); None: none."""
    stomp_ws_endpoint: str | None = None
    """``ws://HOST:PORT/stomp``, its STOMP-over-WebSocket listener; None: none."""
    host: str | None = None
    """The name of the machine this broker runs on (``octopis up --host NAME`` starts the
    brokers of one host, DESIGN §10); None: the topology names no hosts."""

    @property
    def primary_neighbours(self) -> tuple[str, ...]:
        """Neighbours in the same cluster, reached over aCOLs."""
        return tuple(n.id for n in self.neighbours if n.role == PRIMARY_ROLE)

    @property
    def secondary_neighbours(self) -> tuple[str, ...]:
        """Neighbours in the same region, reached over iCOLs."""
        return tuple(n.id for n in self.neighbours if n.role == SECONDARY_ROLE)


@dataclass
class Scot:
    """A labelled SCOT: its factors, every broker's labels and, when asked for, its
    factor and product graphs (networkx)."""

    name: str
    tree: Tree
    clusters: int
    brokers: dict[str, BrokerInfo] = field(repr=False)

    @cached_property
    def acyclic(self) -> nx.Graph:
        """The acyclic factor G_A."""
        return self.tree.graph()

    @cached_property
    def graph(self) -> nx.Graph:
        """The product G_A □ K_n: broker nodes labelled ``region`` and ``cluster``, links
        labelled ``link`` (aCOL or iCOL)."""
        import networkx as nx

        product = nx.cartesian_product(self.acyclic, nx.complete_graph(self.clusters))
        graph = nx.Graph()
        for region, cluster in product.nodes:
            graph.add_node(broker_id(region, cluster), region=region, cluster=cluster)
        for (x1, c1), (x2, c2) in product.edges:
            link = ACOL if c1 == c2 else ICOL
            graph.add_edge(broker_id(x1, c1), broker_id(x2, c2), link=link)
        return graph

    @property
    def regions(self) -> list[str]:
        """Region labels in the acyclic factor's vertex order."""
        return list(self.tree.vertices)

    def broker(self, region: str, cluster: int) -> BrokerInfo:
        """The broker B(region, cluster)."""
        return self.brokers[broker_id(region, cluster)]

    def summary(self) -> dict[str, int]:
        """Counts of §4.2–4.3: brokers, clusters, regions, link kinds, broker types."""
        import networkx as nx

        kinds = [kind for _, _, kind in self.graph.edges(data="link")]
        types = [b.type for b in self.brokers.values()]
        return {
            "brokers": len(self.brokers),
            "clusters": self.clusters,
            "regions": len(self.tree.vertices),
            "acols": kinds.count(ACOL),
            "icols": kinds.count(ICOL),
            "inner": types.count(INNER),
            "edge": types.count(EDGE),
            "diameter_acyclic": nx.diameter(self.acyclic),
        }

    def failover_order(self, broker_id: str) -> list[str]:
        """Brokers a client of ``broker_id`` should move to, best first (DESIGN §7, §9):
        the rest of its cluster by tree distance (a move inside a cluster touches only
        primary entries on the tree path), then the other clusters, the same region
        first, each again by tree distance. Where brokers are placed on hosts, the
        nearest broker on another host comes second at the latest: a host cut off from
        the network takes all its brokers with it, and a list that stays on it waits
        for the network to heal."""
        import networkx as nx

        home = self.brokers[broker_id]
        distance = nx.single_source_shortest_path_length(self.acyclic, home.region)
        others = [b for b in self.brokers.values() if b.id != broker_id]
        others.sort(key=lambda b: (b.cluster != home.cluster, distance[b.region], b.cluster))
        away = next((i for i, b in enumerate(others) if b.host != home.host), None)
        if away is not None and away > 1:  # a host cut off is left at the second try
            others.insert(1, others.pop(away))
        return [b.id for b in others]

    def endpoints_by_broker(self) -> dict[str, tuple[str, str, str]]:
        """Each broker's peer, client and control endpoints (what its keys must cover)."""
        return {
            b.id: (b.endpoint, b.client_endpoint, b.control_endpoint) for b in self.brokers.values()
        }

    @property
    def hosts(self) -> list[str]:
        """The host names the brokers are placed on, in order of first appearance."""
        return list(dict.fromkeys(b.host for b in self.brokers.values() if b.host))

    def brokers_on(self, host: str) -> list[str]:
        """The brokers placed on ``host``; :class:`TopologyError` if it names none."""
        ids = [b.id for b in self.brokers.values() if b.host == host]
        if not ids:
            known = ", ".join(self.hosts) or "none: the topology names no hosts"
            raise TopologyError(
                f"topology {self.name} places no broker on host {host!r} (hosts: {known})"
            )
        return ids

    def client_endpoints(self, broker_id: str) -> list[str]:
        """The client endpoint of ``broker_id`` followed by those of
        :meth:`failover_order`: the list an SDK connection fails over along."""
        order = [broker_id, *self.failover_order(broker_id)]
        return [self.brokers[b].client_endpoint for b in order]

    def unclustered(self) -> nx.Graph:
        """The same graph with no cluster, region, type or link roles (for BID, §6.1)."""
        import networkx as nx

        plain = nx.Graph()
        plain.add_nodes_from(self.brokers)
        plain.add_edges_from(self.graph.edges)
        return plain

    def to_json(self) -> dict[str, Any]:
        """The topology file contents; :func:`topology_from_json` reads it back."""
        return {
            "format": FORMAT,
            "name": self.name,
            "summary": self.summary(),
            "acyclic": self.tree.to_json(),
            "clusters": self.clusters,
            "brokers": [
                {
                    "id": b.id,
                    "region": b.region,
                    "cluster": b.cluster,
                    "type": b.type,
                    "endpoint": b.endpoint,
                    "client_endpoint": b.client_endpoint,
                    "control_endpoint": b.control_endpoint,
                    **({"metrics_endpoint": b.metrics_endpoint} if b.metrics_endpoint else {}),
                    **({"stomp_endpoint": b.stomp_endpoint} if b.stomp_endpoint else {}),
                    **({"stomp_ws_endpoint": b.stomp_ws_endpoint} if b.stomp_ws_endpoint else {}),
                    **({"host": b.host} if b.host else {}),
                    "neighbours": [
                        {
                            "id": n.id,
                            "link": n.link,
                            "role": n.role,
                            "type": n.type,
                            "cluster": n.cluster,
                            "region": n.region,
                        }
                        for n in b.neighbours
                    ],
                }
                for b in self.brokers.values()
            ],
        }


def build_scot(
    acyclic: nx.Graph,
    connectivity: nx.Graph | int,
    *,
    name: str = "scot",
    host: str = DEFAULT_HOST,
    base_port: int = DEFAULT_BASE_PORT,
    hosts: Mapping[str, str] | None = None,
    place: str = "cluster",
) -> Scot:
    """Build and label the SCOT G_A □ G_C (§3–4), checking all four SCOT properties.

    ``connectivity`` is K_n or the number n. Brokers get endpoints on ``host``, four
    consecutive ports each from ``base_port`` on, clusters first, then regions in the
    acyclic factor's vertex order. With ``hosts`` (host name → address), brokers are
    spread over those machines instead, a cluster or a region per host in turn
    (``place``, one of :data:`PLACEMENTS`), each broker's endpoints on its host's address
    and its ``host`` set to the name; ports stay distinct across hosts.
    """
    check_acyclic_factor(acyclic)
    if isinstance(connectivity, int):
        clusters = cluster_count(connectivity)
    else:
        check_connectivity_factor(connectivity)
        clusters = connectivity.number_of_nodes()
    tree = Tree(tuple(acyclic.nodes), tuple(acyclic.edges))
    scot = _label_scot(tree, clusters, name, host, base_port, hosts, place)
    scot.__dict__["acyclic"] = acyclic  # the caller's graph, not a copy
    return scot


def _label_scot(
    tree: Tree,
    clusters: int,
    name: str,
    host: str = DEFAULT_HOST,
    base_port: int = DEFAULT_BASE_PORT,
    hosts: Mapping[str, str] | None = None,
    place: str = "cluster",
) -> Scot:
    """Label the SCOT of ``tree`` (a tree) □ K_``clusters`` (:func:`build_scot`'s rules):
    B(x, c)'s primary neighbours are B(y, c) for the tree's neighbours y of x (aCOLs),
    its secondary ones B(x, k) for every other cluster k (iCOLs)."""
    names = list(hosts or ())
    for host_name in names:
        if problem := host_name_problem(host_name):
            raise TopologyError(problem)
    if hosts is not None and not names:
        raise TopologyError("hosts: give at least one NAME=ADDRESS")
    if place not in PLACEMENTS:
        raise TopologyError(f"placement {place!r} is not one of {', '.join(PLACEMENTS)}")
    count = len(tree.vertices) * clusters
    last_port = base_port + PORTS_PER_BROKER * count - 1
    if base_port < 1 or last_port > 65535:
        raise TopologyError(
            f"base port {base_port} leaves no room for {count} brokers x "
            f"{PORTS_PER_BROKER} ports (ports {base_port}..{last_port})"
        )
    near = tree.adjacency()
    region_index = {x: i for i, x in enumerate(tree.vertices)}
    region_type = {x: INNER if len(near[x]) >= 2 else EDGE for x in tree.vertices}

    def neighbour(region: str, cluster: int, link: str) -> Neighbour:
        role = PRIMARY_ROLE if link == ACOL else SECONDARY_ROLE
        nid = broker_id(region, cluster)
        return Neighbour(nid, link, role, region_type[region], cluster, region)

    brokers: dict[str, BrokerInfo] = {}
    index = 0
    for cluster in range(clusters):
        for region in tree.vertices:
            bid = broker_id(region, cluster)
            port = base_port + PORTS_PER_BROKER * index
            index += 1
            around = [neighbour(y, cluster, ACOL) for y in near[region]] + [
                neighbour(region, k, ICOL) for k in range(clusters) if k != cluster
            ]
            around.sort(key=lambda n: (n.cluster != cluster, n.cluster, n.region))
            where = None
            address = host
            if names:
                turn = cluster if place == "cluster" else region_index[region]
                where = names[turn % len(names)]
                address = hosts[where]
            brokers[bid] = BrokerInfo(
                id=bid,
                region=region,
                cluster=cluster,
                type=region_type[region],
                endpoint=f"tcp://{address}:{port}",
                client_endpoint=f"tcp://{address}:{port + 1}",
                control_endpoint=f"tcp://{address}:{port + 2}",
                neighbours=tuple(around),
                metrics_endpoint=f"http://{address}:{port + 3}/metrics",
                host=where,
            )
    return Scot(name=name, tree=tree, clusters=clusters, brokers=brokers)


def topology_from_json(data: Any, source: str = "topology") -> Scot:
    """Rebuild a SCOT from a topology file's contents and check every broker entry.

    The factors in the file are the truth; each listed broker must agree with the
    rebuilt one (region, cluster, type, neighbours). Endpoints are taken from the file,
    so a deployment may edit them.
    """
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: not a topology object")
    if data.get("format") != FORMAT:
        raise TopologyError(f"{source}: format is {data.get('format')!r}, expected {FORMAT!r}")
    for key in ("acyclic", "clusters", "brokers"):
        if key not in data:
            raise TopologyError(f"{source}: missing key {key!r}")
    tree = tree_from_data(data["acyclic"], f"{source}: acyclic factor")
    if not tree.is_tree():
        check_acyclic_factor(tree.graph())  # names the cycle or the components
    clusters = cluster_count(data["clusters"])
    scot = _label_scot(tree, clusters, str(data.get("name", "scot")))
    listed = data["brokers"]
    if not isinstance(listed, list):
        raise TopologyError(f"{source}: 'brokers' must be a list")
    seen: dict[str, BrokerInfo] = {}
    for entry in listed:
        broker = _broker_from_json(entry, scot, source)
        if broker.id in seen:
            raise TopologyError(f"{source}: broker {broker.id!r} is listed twice")
        seen[broker.id] = broker
    missing = sorted(set(scot.brokers) - set(seen))
    if missing:
        raise TopologyError(f"{source}: brokers missing from the list: {', '.join(missing[:5])}")
    scot.brokers = {bid: seen[bid] for bid in scot.brokers}
    return scot


def load_topology(path: str | Path) -> Scot:
    """Read a topology JSON file written by ``octopis-topology build``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read topology file {path}: {error_reason(exc)}") from None
    except json.JSONDecodeError as exc:
        raise TopologyError(f"topology file {path} is not valid JSON: {exc}") from None
    return topology_from_json(data, f"topology file {path.name}")


def preset_names() -> list[str]:
    """Names of the factor files shipped in the ``topology/`` folder."""
    return sorted(
        p.name.removesuffix(".toml") for p in _preset_dir().iterdir() if p.name.endswith(".toml")
    )


def preset_path(name: str) -> Path:
    """The factor file of preset ``name``."""
    path = Path(str(_preset_dir().joinpath(f"{name}.toml")))
    if not path.is_file():
        raise TopologyError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return path


def build_from_factor_file(
    path: str | Path,
    clusters: int | None = None,
    *,
    connectivity: nx.Graph | None = None,
    **placement: Any,
) -> Scot:
    """Build a SCOT from a factor file; ``clusters`` overrides the file's default;
    ``placement`` is :func:`build_scot`'s ``host``, ``base_port``, ``hosts``, ``place``."""
    acyclic, table = read_factor(path)
    if connectivity is None:
        n = clusters if clusters is not None else table.get("clusters")
        if n is None:
            raise TopologyError(f"{Path(path).name} names no cluster count; pass --clusters N")
        connectivity = complete_factor(n)
    name = str(table.get("name", Path(path).stem))
    return build_scot(acyclic, connectivity, name=name, **placement)


def build_preset(name: str, **kwargs: Any) -> Scot:
    """Build a preset topology (``fig2``, ``paper75``) with its default cluster count."""
    return build_from_factor_file(preset_path(name), **kwargs)


def _preset_dir():  # importlib Traversable
    return resources.files("octopis.presets")


def _broker_from_json(entry: Any, scot: Scot, source: str) -> BrokerInfo:
    if not isinstance(entry, dict) or "id" not in entry:
        raise TopologyError(f"{source}: broker entry {entry!r:.60} has no 'id'")
    bid = entry["id"]
    expected = scot.brokers.get(bid)
    if expected is None:
        raise TopologyError(f"{source}: broker {bid!r} is not a node of the SCOT")
    for key in ("region", "cluster", "type"):
        if entry.get(key) != getattr(expected, key):
            raise TopologyError(
                f"{source}: broker {bid!r} has {key} {entry.get(key)!r}, "
                f"the factors give {getattr(expected, key)!r}"
            )
    listed = entry.get("neighbours")
    if not isinstance(listed, list):
        raise TopologyError(f"{source}: broker {bid!r} has no neighbour list")
    got = sorted((n.get("id"), n.get("link"), n.get("role")) for n in listed if isinstance(n, dict))
    want = sorted((n.id, n.link, n.role) for n in expected.neighbours)
    if got != want:
        extra = sorted({g[0] for g in got} - {w[0] for w in want})
        lost = sorted({w[0] for w in want} - {g[0] for g in got})
        detail = (
            f"not adjacent: {', '.join(map(str, extra))}"
            if extra
            else (f"missing: {', '.join(lost)}" if lost else "wrong link kind or role")
        )
        raise TopologyError(
            f"{source}: broker {bid!r} neighbours disagree with the SCOT ({detail})"
        )
    endpoints = {}
    for key in ("endpoint", "client_endpoint", "control_endpoint"):
        value = entry.get(key)
        if not isinstance(value, str) or "://" not in value:
            raise TopologyError(f"{source}: broker {bid!r} has no valid {key!r}")
        endpoints[key] = value
    metrics = entry.get("metrics_endpoint")
    if metrics is not None:
        problem = metrics_endpoint_problem(metrics)
        if problem:
            raise TopologyError(f"{source}: broker {bid!r} metrics_endpoint: {problem}")
        endpoints["metrics_endpoint"] = metrics
    for key, scheme, path in (("stomp_endpoint", "tcp", ""), ("stomp_ws_endpoint", "ws", "/stomp")):
        value = entry.get(key)
        if value is not None:
            if problem := _url_problem(value, scheme, path):
                raise TopologyError(f"{source}: broker {bid!r} {key}: {problem}")
            endpoints[key] = value
    host = entry.get("host")
    if host is not None:
        if problem := host_name_problem(host):
            raise TopologyError(f"{source}: broker {bid!r} {problem}")
        endpoints["host"] = host
    return BrokerInfo(
        id=bid,
        region=expected.region,
        cluster=expected.cluster,
        type=expected.type,
        neighbours=expected.neighbours,
        **endpoints,
    )


def metrics_endpoint_problem(endpoint: object) -> str | None:
    """What is wrong with a metrics endpoint (``http://HOST:PORT/metrics``), or None."""
    return _url_problem(endpoint, "http", "/metrics")


def _url_problem(endpoint: object, scheme: str, path: str) -> str | None:
    """What is wrong with ``endpoint`` as ``scheme://HOST:PORT<path>``, or None."""
    expected = f"expected {scheme}://HOST:PORT{path}, not {endpoint!r}"[:120]
    if not isinstance(endpoint, str):
        return expected
    url = urlsplit(endpoint)
    try:
        port = url.port
    except ValueError:
        port = None
    if url.scheme != scheme or not url.hostname or port is None or url.path != path:
        return expected
    return None


STOMP_PORTS = 2
"""A broker's STOMP listeners take two consecutive ports: TCP, then WebSocket."""


def with_stomp(scot: Scot, base_port: int, host: str = DEFAULT_HOST) -> Scot:
    """``scot`` with STOMP endpoints (DESIGN §13) on ``host``: :data:`STOMP_PORTS`
    consecutive ports per broker from ``base_port`` on, in the brokers' order."""
    last = base_port + STOMP_PORTS * len(scot.brokers) - 1
    if base_port < 1 or last > 65535:
        raise TopologyError(f"STOMP base port {base_port} leaves no room (ports up to {last})")
    brokers = {}
    for i, (bid, b) in enumerate(scot.brokers.items()):
        port = base_port + STOMP_PORTS * i
        brokers[bid] = replace(
            b,
            stomp_endpoint=f"tcp://{host}:{port}",
            stomp_ws_endpoint=f"ws://{host}:{port + 1}/stomp",
        )
    scot.brokers = brokers
    return scot


def host_name_problem(name: object) -> str | None:
    """What is wrong with a host name (letters, digits, ``.``, ``_``, ``-``; at most 63,
    not starting with punctuation), or None."""
    if isinstance(name, str) and _HOST_NAME.fullmatch(name):
        return None
    return (
        f"host name {name!r:.70} must be 1-63 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit"
    )


def regions_in_drawing_order(acyclic: nx.Graph) -> list[str]:
    """Regions in a depth-first walk from one end of a longest path, smaller subtrees
    first, so that leaves sit beside their parent and aCOLs stay short."""
    import networkx as nx

    start = nx.periphery(acyclic)[0]
    depth = nx.single_source_shortest_path_length(acyclic, start)
    size = {v: 1 for v in acyclic}
    for v in sorted(acyclic, key=depth.__getitem__, reverse=True):
        parents = [u for u in acyclic[v] if depth[u] < depth[v]]
        if parents:
            size[parents[0]] += size[v]
    order: list[str] = []
    stack = [start]
    while stack:
        v = stack.pop()
        order.append(v)
        children = [u for u in acyclic[v] if depth[u] > depth[v]]
        stack.extend(sorted(children, key=lambda u: (size[u], u), reverse=True))
    return order
