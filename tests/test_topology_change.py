"""Topology versions (``octopis.topology_change``, issue 18): a SCOT grown or shrunk by a
cluster or a region differs from the old one only by the brokers added or removed and
their links, and is otherwise the SCOT of the new shape built afresh; the refusals name
their reason; ``octopis-topology`` writes the new version only when it is valid."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from laws import sized
from test_topology import trees

from octopis.cli.topology import main as topology_main
from octopis.topology import Scot, TopologyError, build_preset, build_scot, topology_from_json
from octopis.topology_change import (
    add_cluster,
    add_region,
    changed_brokers,
    changed_links,
    refuge_turns,
    refuges,
    remove_cluster,
    remove_region,
)


@st.composite
def changes(draw: st.DrawFn) -> tuple[Scot, list[tuple[str, str]]]:
    """A SCOT (a random tree × 1–5 clusters, on two hosts or one) and up to four changes,
    each valid for the shape it meets."""
    tree = draw(trees(10))
    clusters = draw(st.integers(1, 5))
    hosts = {"h0": "10.0.0.1", "h1": "10.0.0.2"} if draw(st.booleans()) else None
    scot = build_scot(tree, clusters, name="t", hosts=hosts, base_port=20000)
    steps: list[tuple[str, str]] = []
    shape = scot
    for i in range(draw(st.integers(1, 4))):
        kinds = ["add-cluster", "add-region"]
        if shape.clusters > 1:
            kinds.append("remove-cluster")
        leaves = [x for x in shape.acyclic if shape.acyclic.degree(x) <= 1]
        if shape.acyclic.number_of_nodes() > 1:
            kinds.append("remove-region")
        kind = draw(st.sampled_from(kinds))
        if kind == "add-region":
            arg = f"{draw(st.sampled_from(shape.regions))}>n{i}"
        elif kind == "remove-region":
            arg = draw(st.sampled_from(leaves))
        else:
            arg = ""
        steps.append((kind, arg))
        shape = apply(shape, kind, arg)
    return scot, steps


def apply(scot: Scot, kind: str, arg: str) -> Scot:
    if kind == "add-cluster":
        return add_cluster(scot)
    if kind == "remove-cluster":
        return remove_cluster(scot, scot.clusters - 1)
    if kind == "add-region":
        attach_to, name = arg.split(">")
        return add_region(scot, name, attach_to)
    return remove_region(scot, arg)


def labels(scot: Scot) -> dict[str, tuple]:
    """Each broker's labels and neighbour list: what a fresh build decides."""
    return {b.id: (b.region, b.cluster, b.type, b.neighbours) for b in scot.brokers.values()}


@settings(max_examples=sized(20, 80), deadline=None)
@given(changes())
def test_a_change_touches_only_the_brokers_it_adds_or_removes(
    case: tuple[Scot, list[tuple[str, str]]],
) -> None:
    scot, steps = case
    for kind, arg in steps:
        new = apply(scot, kind, arg)
        fresh = build_scot(new.acyclic, new.clusters, name=new.name)
        assert labels(new) == labels(fresh)  # the new shape, built afresh
        added, removed, relinked = changed_brokers(scot, new)
        assert bool(added) == kind.startswith("add") and bool(removed) == (not added)
        per_unit = scot.clusters if "region" in kind else len(scot.regions)
        assert len(added or removed) == per_unit
        for bid in set(scot.brokers) & set(new.brokers):
            old, now = scot.brokers[bid], new.brokers[bid]
            assert (old.endpoint, old.client_endpoint, old.control_endpoint) == (
                now.endpoint,
                now.client_endpoint,
                now.control_endpoint,
            )
            assert (old.metrics_endpoint, old.host) == (now.metrics_endpoint, now.host)
        changed = set(added) | set(removed)
        for u, v in nx.symmetric_difference(
            _on(scot.graph, new.graph), _on(new.graph, scot.graph)
        ).edges:
            assert u in changed or v in changed
        assert all(set(new.graph[b]) & changed or set(scot.graph[b]) & changed for b in relinked)
        lost = changed_links(scot, new)
        assert sorted(lost) == sorted([*removed, *relinked])
        assert all(lost[b] == set(scot.graph[b]) for b in removed)
        assert all(b in changed or gone <= changed for b, gone in lost.items())
        endpoints = [
            e
            for b in new.brokers.values()
            for e in (b.endpoint, b.client_endpoint, b.control_endpoint, b.metrics_endpoint)
        ]
        assert len(endpoints) == len(set(endpoints))
        assert labels(topology_from_json(json.loads(json.dumps(new.to_json())))) == labels(new)
        scot = new


@settings(max_examples=sized(20, 80), deadline=None)
@given(changes())
def test_a_leaving_brokers_subscribers_go_to_its_refuges_in_turn(
    case: tuple[Scot, list[tuple[str, str]]],
) -> None:
    """Where a removed broker's subscribers go (``octopis scale`` and the simulator's
    shrink both ask :func:`refuge_turns`): a cluster leaves, its region's brokers of the
    other clusters; a region leaves, its tree neighbour's broker of the same cluster;
    taken in turn, so the subscribers of one broker spread over all of them."""
    scot, steps = case
    for kind, arg in steps:
        new = apply(scot, kind, arg)
        found = refuges(scot, new)
        assert sorted(found) == sorted(changed_brokers(scot, new)[1])
        refuge = refuge_turns(scot, new)
        for broker, places in found.items():
            leaving = scot.brokers[broker]
            for b in places:
                assert b in new.brokers
                if kind == "remove-cluster":
                    assert new.brokers[b].region == leaving.region
                    assert new.brokers[b].cluster != leaving.cluster
                else:
                    assert new.brokers[b].cluster == leaving.cluster
                    assert scot.acyclic.has_edge(new.brokers[b].region, leaving.region)
            assert len(places) == (new.clusters if kind == "remove-cluster" else 1)
            assert [refuge(broker) for _ in range(2 * len(places))] == places * 2
        scot = new


def _on(graph: nx.Graph, other: nx.Graph) -> nx.Graph:
    """``graph`` over the union of both graphs' nodes (for a symmetric difference)."""
    union = nx.Graph()
    union.add_nodes_from([*graph.nodes, *other.nodes])
    union.add_edges_from(graph.edges)
    return union


def test_new_brokers_run_beside_their_nearest_old_one() -> None:
    """fig2 on three hosts, a cluster per host: cluster 3 runs on cluster 2's host, region
    g (attached to b) on each cluster's host, all on ports after the highest in use."""
    scot = build_preset("fig2", hosts={"h0": "10.0.0.1", "h1": "10.0.0.2", "h2": "10.0.0.3"})
    top = max(int(b.metrics_endpoint.split(":")[-1].split("/")[0]) for b in scot.brokers.values())
    grown = add_cluster(scot)
    assert grown.broker("a", 3).host == "h2" and grown.broker("a", 3).endpoint.startswith(
        "tcp://10.0.0.3:"
    )
    assert int(grown.broker("a", 3).endpoint.rsplit(":", 1)[1]) == top + 1
    wider = add_region(scot, "g", "b")
    assert [wider.broker("g", c).host for c in range(3)] == ["h0", "h1", "h2"]
    assert wider.broker("b", 0).type == "inner" and wider.broker("g", 0).type == "edge"
    assert remove_region(wider, "g").to_json() == scot.to_json()
    assert remove_cluster(grown, 3).to_json() == scot.to_json()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: remove_cluster(s, 1), r"only the last, 2, can leave"),
        (lambda s: remove_cluster(s, 7), r"there is no cluster 7"),
        (lambda s: remove_cluster(build_scot(s.acyclic, 1), 0), "has one cluster"),
        (lambda s: remove_region(s, "b"), r"region 'b' is not a leaf \(it links"),
        (lambda s: remove_region(s, "zz"), "has no region 'zz'"),
        (lambda s: add_region(s, "a", "b"), "has a region 'a' already"),
        (lambda s: add_region(s, "g", "zz"), "no region 'zz' to attach 'g' to"),
        (lambda s: add_region(s, "g:1", "b"), "without ':'"),
    ],
)
def test_an_invalid_change_is_refused_with_its_reason(change: object, message: str) -> None:
    scot = build_preset("fig2")
    with pytest.raises(TopologyError, match=message):
        change(scot)  # type: ignore[operator]


def test_octopis_topology_writes_the_next_version_or_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    base = tmp_path / "fig2.json"
    assert topology_main(["build", "--preset", "fig2", "-o", str(base)]) == 0
    grown = tmp_path / "grown.json"
    assert topology_main(["add-cluster", str(base), "-o", str(grown)]) == 0
    out = capsys.readouterr().out
    assert "24 brokers, 4 clusters" in out and "added a:3, b:3" in out
    assert "18 brokers have new or fewer links" in out
    wider = tmp_path / "wider.json"
    assert topology_main(["add-region", str(grown), "g", "--attach-to", "f", "-o", str(wider)]) == 0
    assert json.loads(wider.read_text())["summary"]["regions"] == 7
    back = tmp_path / "back.json"
    assert topology_main(["remove-region", str(wider), "g", "-o", str(back)]) == 0
    assert topology_main(["remove-cluster", str(back), "3", "-o", str(back)]) == 0
    assert json.loads(back.read_text()) == json.loads(base.read_text())
    refused = tmp_path / "refused.json"
    assert topology_main(["remove-cluster", str(base), "0", "-o", str(refused)]) == 2
    assert "only the last, 2, can leave" in capsys.readouterr().err
    assert not refused.exists()
