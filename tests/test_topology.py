"""SCOT builder: counting formulas and labelling rules as properties, presets, CLI errors."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopis.cli.topology import main as topology_main
from octopis.topology import (
    ACOL,
    EDGE,
    ICOL,
    INNER,
    PRIMARY_ROLE,
    SECONDARY_ROLE,
    TopologyError,
    build_preset,
    build_scot,
    load_topology,
    topology_from_json,
)


@st.composite
def trees(draw: st.DrawFn, max_vertices: int = 25) -> nx.Graph:
    """Random labelled trees: vertex i > 0 attaches to a random earlier vertex."""
    n = draw(st.integers(1, max_vertices))
    graph = nx.Graph()
    graph.add_nodes_from(f"v{i}" for i in range(n))
    for i in range(1, n):
        graph.add_edge(f"v{i}", f"v{draw(st.integers(0, i - 1))}")
    return graph


@settings(max_examples=60, deadline=None)
@given(tree=trees(), n=st.integers(2, 8))
def test_counting_formulas(tree: nx.Graph, n: int) -> None:
    scot = build_scot(tree, n)
    v = tree.number_of_nodes()
    s = scot.summary()
    assert s["brokers"] == v * n
    assert s["acols"] == n * (v - 1)
    assert s["icols"] == v * n * (n - 1) // 2
    assert s["clusters"] == n and s["regions"] == v
    assert s["inner"] + s["edge"] == v * n
    assert s["diameter_acyclic"] == nx.diameter(tree)
    assert scot.graph.number_of_edges() == s["acols"] + s["icols"]


@settings(max_examples=60, deadline=None)
@given(tree=trees(), n=st.integers(2, 8))
def test_neighbour_and_type_rules(tree: nx.Graph, n: int) -> None:
    scot = build_scot(tree, n)
    for b in scot.brokers.values():
        primary = {scot.brokers[p].region for p in b.primary_neighbours}
        assert all(scot.brokers[p].cluster == b.cluster for p in b.primary_neighbours)
        assert primary == set(tree[b.region])
        secondary = b.secondary_neighbours
        assert sorted(scot.brokers[s].cluster for s in secondary) == [
            c for c in range(n) if c != b.cluster
        ]
        assert all(scot.brokers[s].region == b.region for s in secondary)
        assert b.type == (EDGE if len(b.primary_neighbours) <= 1 else INNER)
        for nb in b.neighbours:
            assert (nb.link, nb.role) in ((ACOL, PRIMARY_ROLE), (ICOL, SECONDARY_ROLE))
            assert nb.type == scot.brokers[nb.id].type
    for region in tree.nodes:
        assert len({scot.broker(region, c).type for c in range(n)}) == 1


@settings(max_examples=25, deadline=None)
@given(tree=trees(12), n=st.integers(1, 5))
def test_json_round_trip(tree: nx.Graph, n: int) -> None:
    scot = build_scot(tree, n)
    again = topology_from_json(json.loads(json.dumps(scot.to_json())))
    assert again.brokers == scot.brokers
    assert again.summary() == scot.summary()


def test_unclustered_view_has_same_graph_and_no_roles() -> None:
    scot = build_preset("fig2")
    plain = scot.unclustered()
    assert set(plain.nodes) == set(scot.brokers)
    assert {frozenset(e) for e in plain.edges} == {frozenset(e) for e in scot.graph.edges}
    assert all(not data for _, data in plain.nodes(data=True))
    assert all(not data for _, _, data in plain.edges(data=True))


def test_fig2_matches_section_4_5() -> None:
    scot = build_preset("fig2")
    b0 = scot.broker("b", 0)
    assert set(b0.primary_neighbours) == {"a:0", "c:0"}
    assert set(b0.secondary_neighbours) == {"b:1", "b:2"}
    assert {r for r in "abcdef" if scot.broker(r, 0).type == EDGE} == {"a", "d", "f"}


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        (
            "fig2",
            {
                "brokers": 18,
                "clusters": 3,
                "regions": 6,
                "acols": 15,
                "icols": 18,
                "inner": 9,
                "edge": 9,
                "diameter_acyclic": 4,
            },
        ),
        (
            "paper75",
            {
                "brokers": 75,
                "clusters": 5,
                "regions": 15,
                "acols": 70,
                "icols": 150,
                "inner": 25,
                "edge": 50,
                "diameter_acyclic": 6,
            },
        ),
    ],
)
def test_build_show_draw_presets(
    tmp_path: Path, capsys: pytest.CaptureFixture, preset: str, expected: dict
) -> None:
    out = tmp_path / "t.json"
    assert topology_main(["build", "--preset", preset, "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["summary"] == expected
    assert all(isinstance(v, int) for v in data["summary"].values())
    broker = data["brokers"][0]
    assert {"id", "region", "cluster", "type", "endpoint", "neighbours"} <= broker.keys()
    assert {"id", "link", "role"} <= broker["neighbours"][0].keys()
    assert len({b["endpoint"] for b in data["brokers"]}) == expected["brokers"]

    assert topology_main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"{expected['brokers']} brokers" in shown
    assert f"{expected['acols']} aCOLs + {expected['icols']} iCOLs" in shown
    for c in range(expected["clusters"]):
        assert re.search(rf"^{c}\s+{expected['regions']}\s", shown, re.M)
    assert "/metrics" not in shown
    assert topology_main(["show", "--endpoints", str(out)]) == 0
    listed = re.findall(r"^(\S+)\s+tcp://\S+\s+tcp://\S+\s+tcp://\S+\s+(http://\S+/metrics)$",
                        capsys.readouterr().out, re.M)  # fmt: skip
    assert [b for b, _ in listed] == [b["id"] for b in data["brokers"]]
    assert [m for _, m in listed] == [b["metrics_endpoint"] for b in data["brokers"]]

    png, svg = tmp_path / "t.png", tmp_path / "t.svg"
    assert topology_main(["draw", str(out), "-o", str(png)]) == 0
    assert topology_main(["draw", str(out), "-o", str(svg)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.read_bytes()[:2000]


def test_options_host_port_clusters(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert (
        topology_main(
            [
                "build",
                "--preset",
                "fig2",
                "--clusters",
                "4",
                "--host",
                "10.0.0.7",
                "--base-port",
                "20000",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    scot = load_topology(out)
    assert scot.summary()["brokers"] == 24
    ports = sorted(int(b.endpoint.rsplit(":", 1)[1]) for b in scot.brokers.values())
    assert ports[0] == 20000 and all(
        b.endpoint.startswith("tcp://10.0.0.7:") for b in scot.brokers.values()
    )
    first = min(scot.brokers.values(), key=lambda b: b.endpoint)
    assert first.metrics_endpoint == "http://10.0.0.7:20003/metrics"


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:9000", "http://127.0.0.1/metrics", "http://h:9/x", 9000]
)
def test_a_bad_metrics_endpoint_is_named(tmp_path: Path, endpoint: object) -> None:
    """A metrics endpoint must read http://HOST:PORT/metrics; one without is allowed (the
    broker then serves no metrics)."""
    data = build_preset("fig2").to_json()
    del data["brokers"][1]["metrics_endpoint"]
    assert topology_from_json(data).brokers[data["brokers"][1]["id"]].metrics_endpoint is None
    data["brokers"][0]["metrics_endpoint"] = endpoint
    with pytest.raises(TopologyError, match=r"broker 'a:0' metrics_endpoint: expected http://"):
        topology_from_json(data)


@pytest.mark.parametrize("place", ["cluster", "region"])
def test_hosts_get_whole_clusters_or_regions_in_turn(tmp_path: Path, place: str) -> None:
    """``build --hosts``: each broker's endpoints use its host's address, a whole cluster
    (or region) per host in turn, ports distinct across hosts, and the placement survives
    the file."""
    out = tmp_path / "t.json"
    hosts = ["--hosts", "n0=192.0.2.10,n1=192.0.2.11", "--hosts", "n2=192.0.2.12"]
    assert (
        topology_main(["build", "--preset", "fig2", *hosts, "--place", place, "-o", str(out)]) == 0
    )
    scot = load_topology(out)
    assert scot.hosts == ["n0", "n1", "n2"]
    regions = scot.regions
    for b in scot.brokers.values():
        turn = b.cluster if place == "cluster" else regions.index(b.region)
        assert b.host == f"n{turn % 3}"
        address = f"192.0.2.1{turn % 3}"
        ends = (b.endpoint, b.client_endpoint, b.control_endpoint, b.metrics_endpoint)
        assert all(f"//{address}:" in e for e in ends), ends
    assert len({b.endpoint for b in scot.brokers.values()}) == 18
    assert sorted(scot.brokers_on("n1")) == sorted(
        b.id for b in scot.brokers.values() if b.host == "n1"
    )
    with pytest.raises(TopologyError, match=r"places no broker on host 'n9' \(hosts: n0, n1, n2\)"):
        scot.brokers_on("n9")
    with pytest.raises(TopologyError, match="names no hosts"):
        build_preset("fig2").brokers_on("n0")


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ("a=1.2.3.4,a=1.2.3.5", "--hosts names host 'a' twice"),
        ("a b=1.2.3.4", "host name 'a b' must be 1-63 letters"),
        ("a", "expected NAME=ADDRESS, got 'a'"),
    ],
)
def test_bad_hosts_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture, hosts: str, message: str
) -> None:
    out = tmp_path / "t.json"
    with pytest.raises(SystemExit) if "NAME=" in message else contextlib.nullcontext():
        assert topology_main(["build", "--preset", "fig2", "--hosts", hosts, "-o", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    data = build_preset("fig2").to_json()
    data["brokers"][0]["host"] = "-bad"
    with pytest.raises(TopologyError, match="broker 'a:0' host name '-bad' must be"):
        topology_from_json(data)


BAD_FACTORS = [
    (
        "cycle.toml",
        'vertices = ["a", "b", "c"]\nedges = [["a","b"],["b","c"],["c","a"]]\n',
        r"acyclic factor has a cycle: (a-b-c-a|b-c-a-b|c-a-b-c|a-c-b-a)",
    ),
    (
        "split.toml",
        'vertices = ["a", "b", "c", "d"]\nedges = [["a","b"],["c","d"]]\n',
        r"acyclic factor is disconnected: 2 components, \{a, b\} and \{c, d\}",
    ),
    (
        "dup.json",
        '{"vertices": ["a", "b", "a"], "edges": [["a", "b"]]}',
        r"duplicate vertex label 'a'",
    ),
    ("empty.toml", "vertices = []\nedges = []\n", r"is empty: no vertices"),
    ("broken.toml", "vertices = [\n", r"is not valid TOML"),
    ("unknown.toml", 'vertices = ["a"]\nedges = [["a", "z"]]\n', r"names unknown vertex 'z'"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD_FACTORS)
def test_bad_acyclic_factor(
    tmp_path: Path, capsys: pytest.CaptureFixture, name: str, text: str, message: str
) -> None:
    factor = tmp_path / name
    factor.write_text(text)
    out = tmp_path / "t.json"
    status = topology_main(["build", "--acyclic", str(factor), "--clusters", "3", "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [factor]


def test_connectivity_factor_not_complete(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    conn = tmp_path / "k3minus.toml"
    conn.write_text("vertices = [0, 1, 2]\nedges = [[0, 1], [1, 2]]\n")
    out = tmp_path / "t.json"
    status = topology_main(
        ["build", "--preset", "fig2", "--connectivity", str(conn), "-o", str(out)]
    )
    assert status == 2
    assert "connectivity factor is not complete: missing edge 0-2" in capsys.readouterr().err
    assert not out.exists()


def test_connectivity_factor_index_property(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    conn = tmp_path / "k2.toml"
    conn.write_text('vertices = ["x", "y"]\nedges = [["x", "y"]]\n')
    status = topology_main(
        ["build", "--preset", "fig2", "--connectivity", str(conn), "-o", str(tmp_path / "t.json")]
    )
    assert status == 2
    assert "breaks the index property" in capsys.readouterr().err


def test_unreadable_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "t.json"
    assert (
        topology_main(
            ["build", "--acyclic", str(tmp_path / "nope.toml"), "--clusters", "2", "-o", str(out)]
        )
        == 2
    )
    assert "cannot read factor file" in capsys.readouterr().err
    assert (
        topology_main(["build", "--acyclic", str(tmp_path), "--clusters", "2", "-o", str(out)]) == 2
    )
    assert "cannot read factor file" in capsys.readouterr().err
    assert not out.exists()
    assert topology_main(["show", str(tmp_path / "missing.json")]) == 2
    assert "cannot read topology file" in capsys.readouterr().err


def test_tampered_topology_file_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = build_preset("fig2").to_json()
    data["brokers"][0]["neighbours"].append({"id": "f:2", "link": ACOL, "role": PRIMARY_ROLE})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert topology_main(["show", str(bad)]) == 2
    assert "neighbours disagree with the SCOT (not adjacent: f:2)" in capsys.readouterr().err
    with pytest.raises(TopologyError, match="not valid JSON"):
        (tmp_path / "x.json").write_text("{")
        load_topology(tmp_path / "x.json")


def test_bad_clusters_and_ports(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    out = str(tmp_path / "t.json")
    assert topology_main(["build", "--preset", "fig2", "--clusters", "0", "-o", out]) == 2
    assert "number of clusters must be a positive integer" in capsys.readouterr().err
    assert topology_main(["build", "--preset", "paper75", "--base-port", "65400", "-o", out]) == 2
    assert "leaves no room for 75 brokers" in capsys.readouterr().err


@pytest.mark.processes
def test_console_script_is_installed(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("octopis-topology")
    out = tmp_path / "t.json"
    done = subprocess.run(
        [str(exe), "build", "--preset", "paper75", "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["summary"]["brokers"] == 75
    bad = subprocess.run(
        [str(exe), "show", str(tmp_path / "none.json")], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and bad.stderr.startswith("octopis-topology: error: ")


def test_draw_without_matplotlib_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    topology = tmp_path / "t.json"
    assert topology_main(["build", "--preset", "fig2", "-o", str(topology)]) == 0
    out = tmp_path / "t.png"
    assert topology_main(["draw", str(topology), "-o", str(out)]) == 2
    assert "pip install 'octopis[experiments]'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("place", ["cluster", "region"])
def test_a_failover_list_reaches_another_host_at_its_second_try(place: str) -> None:
    """Placed on hosts, every broker's fail-over list names a broker of another host at
    most second (a host cut off from the network takes its brokers with it); the rest
    keeps the order of the unplaced topology: its cluster first, by tree distance."""
    hosts = {"n0": "127.0.0.10", "n1": "127.0.0.11", "n2": "127.0.0.12"}
    placed = build_preset("fig2", hosts=hosts, place=place)
    plain = build_preset("fig2")
    moved = 0
    for broker in placed.brokers:
        order = placed.failover_order(broker)
        home = placed.brokers[broker].host
        assert any(placed.brokers[b].host != home for b in order[:2]), (broker, order[:2])
        before = plain.failover_order(broker)
        assert sorted(order) == sorted(before)
        assert [b for b in order if b != order[1]] == [b for b in before if b != order[1]]
        moved += order != before
    assert moved > 0 if place == "cluster" else moved == 0
