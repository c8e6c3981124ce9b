"""The factors of a SCOT (paper §3.2): the acyclic factor G_A, a tree read from a table
or a factor file (TOML or JSON) and checked, and the connectivity factor G_C = K_n with
the index property's labels. Reading a factor needs no graph library; networkx is
imported where a graph is asked for and to name what is wrong with a factor that is not a
tree. Every check raises :class:`TopologyError` naming the problem."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import networkx as nx


class TopologyError(ValueError):
    """A factor or topology is invalid; the message names the problem."""


@dataclass(frozen=True)
class Tree:
    """The acyclic factor as lists: vertex labels in order, edges as pairs."""

    vertices: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]

    def adjacency(self) -> dict[str, list[str]]:
        """Each vertex's neighbours, in edge order."""
        near: dict[str, list[str]] = {v: [] for v in self.vertices}
        for u, v in self.edges:
            near[u].append(v)
            near[v].append(u)
        return near

    def is_tree(self) -> bool:
        """Connected with one edge fewer than vertices: a tree."""
        if len(self.edges) != len(self.vertices) - 1:
            return False
        near, seen = self.adjacency(), {self.vertices[0]}
        stack = [self.vertices[0]]
        while stack:
            for v in near[stack.pop()]:
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return len(seen) == len(self.vertices)

    def to_json(self) -> dict[str, list]:
        """``{"vertices": [...], "edges": [[u, v], ...]}`` (:func:`tree_from_data`)."""
        return {"vertices": list(self.vertices), "edges": [list(e) for e in self.edges]}

    def graph(self) -> nx.Graph:
        """The factor as a networkx graph (vertices, then edges, in order)."""
        import networkx as nx

        graph = nx.Graph()
        graph.add_nodes_from(self.vertices)
        graph.add_edges_from(self.edges)
        return graph


def factor_from_data(data: Any, what: str = "acyclic factor") -> nx.Graph:
    """Read ``{"vertices": [...], "edges": [[u, v], ...]}`` into a graph of string labels
    (checked as :func:`tree_from_data` checks it)."""
    return tree_from_data(data, what).graph()


def tree_from_data(data: Any, what: str = "acyclic factor") -> Tree:
    """Read ``{"vertices": [...], "edges": [[u, v], ...]}`` as string labels and pairs.

    Rejects a missing or empty vertex list, duplicate labels, edges naming unknown
    vertices and repeated edges; it does not check the SCOT properties.
    """
    if not isinstance(data, dict):
        raise TopologyError(f"{what}: expected a table with 'vertices' and 'edges'")
    vertices = data.get("vertices")
    edges = data.get("edges", [])
    if not isinstance(vertices, list):
        raise TopologyError(f"{what}: 'vertices' must be a list of labels")
    if not vertices:
        raise TopologyError(f"{what} is empty: no vertices")
    if not isinstance(edges, list):
        raise TopologyError(f"{what}: 'edges' must be a list of [u, v] pairs")
    labels: dict[str, None] = {}
    for label in vertices:
        if isinstance(label, bool) or not isinstance(label, (str, int)) or str(label) == "":
            raise TopologyError(f"{what}: vertex label {label!r} is not a non-empty string")
        if str(label) in labels:
            raise TopologyError(f"{what} has duplicate vertex label {str(label)!r}")
        labels[str(label)] = None
    pairs: dict[frozenset[str], tuple[str, str]] = {}
    for edge in edges:
        if not isinstance(edge, list) or len(edge) != 2:
            raise TopologyError(f"{what}: edge {edge!r} is not a [u, v] pair")
        u, v = (str(x) for x in edge)
        for end in (u, v):
            if end not in labels:
                raise TopologyError(f"{what}: edge {u}-{v} names unknown vertex {end!r}")
        if u == v:
            raise TopologyError(f"{what} has a cycle: {u}-{u} (self-loop)")
        if frozenset((u, v)) in pairs:
            raise TopologyError(f"{what} has a cycle: {u}-{v}-{u} (edge listed twice)")
        pairs[frozenset((u, v))] = (u, v)
    return Tree(tuple(labels), tuple(pairs.values()))


def read_factor(path: str | Path) -> tuple[nx.Graph, dict[str, Any]]:
    """Read a factor file (TOML or JSON) and return the graph and the file's table.

    The table may carry ``name`` and a default ``clusters`` count besides the graph.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read factor file {path}: {error_reason(exc)}") from None
    data = _parse_table(text, path)
    return factor_from_data(data, f"acyclic factor {path.name}"), data


def check_acyclic_factor(graph: nx.Graph) -> None:
    """Acyclic property (§3.2): G_A is a non-empty tree (connected, no cycle)."""
    import networkx as nx

    if graph.number_of_nodes() == 0:
        raise TopologyError("acyclic factor is empty: no vertices")
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = [u for u, _ in cycle] + [cycle[0][0]]
        raise TopologyError(f"acyclic factor has a cycle: {'-'.join(path)}")
    if not nx.is_connected(graph):
        parts = sorted(sorted(c) for c in nx.connected_components(graph))
        shown = " and ".join("{" + ", ".join(p) + "}" for p in parts[:3])
        raise TopologyError(f"acyclic factor is disconnected: {len(parts)} components, {shown}")


def complete_factor(clusters: int) -> nx.Graph:
    """The connectivity factor K_n with the index property's labels 0..n-1."""
    import networkx as nx

    return nx.complete_graph(cluster_count(clusters))


def cluster_count(clusters: object) -> int:
    if isinstance(clusters, bool) or not isinstance(clusters, int) or clusters < 1:
        raise TopologyError(f"number of clusters must be a positive integer, got {clusters!r}")
    return clusters


def check_connectivity_factor(graph: nx.Graph) -> None:
    """Connectivity and index properties (§3.2): G_C is complete, labelled 0..n-1."""
    n = graph.number_of_nodes()
    if n == 0:
        raise TopologyError("connectivity factor is empty: no vertices")
    labels = sorted(str(v) for v in graph.nodes)
    if labels != sorted(str(i) for i in range(n)):
        raise TopologyError(
            f"connectivity factor breaks the index property: labels must be 0..{n - 1}, "
            f"got {', '.join(labels)}"
        )
    for u in graph.nodes:
        for v in graph.nodes:
            if str(u) < str(v) and not graph.has_edge(u, v):
                raise TopologyError(f"connectivity factor is not complete: missing edge {u}-{v}")


def _parse_table(text: str, path: Path) -> Any:
    """A factor file's table: TOML or JSON, by its suffix, else whichever parses."""
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise TopologyError(f"factor file {path.name} is not valid JSON: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if path.suffix.lower() == ".toml":
            raise TopologyError(f"factor file {path.name} is not valid TOML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise TopologyError(f"factor file {path.name} is neither TOML nor JSON") from None


def error_reason(exc: BaseException) -> str:
    """Why reading a file failed, in a few words."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
