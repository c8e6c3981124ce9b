"""Workload directory format: round trip, determinism, and rejection of bad directories."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import networkx as nx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from octopis.topology import build_preset, build_scot, complete_factor
from octopis.workload import (
    PUBLICATION_SCHEMA,
    SUBSCRIPTION_SCHEMA,
    HighRatePublisher,
    WorkloadError,
    follower_brokers,
    generate_workload,
    read_workload,
    write_workload,
)

FIG2 = build_preset("fig2")


def _small(seed: int = 1):
    return generate_workload(FIG2, subscribers=40, publishers=4, notifications=5, seed=seed)


def test_round_trip_with_pyarrow_alone(tmp_path: Path) -> None:
    workload = _small()
    write_workload(tmp_path / "w", workload)
    subs = pq.read_table(tmp_path / "w" / "subscriptions.parquet")
    pubs = pq.read_table(tmp_path / "w" / "publications.parquet")
    assert subs.schema.equals(SUBSCRIPTION_SCHEMA)
    assert pubs.schema.equals(PUBLICATION_SCHEMA)
    assert subs.num_rows == 40 and pubs.num_rows == 20
    again = read_workload(tmp_path / "w")
    assert again.subscriptions == workload.subscriptions
    assert again.publications == workload.publications
    meta = json.loads((tmp_path / "w" / "meta.json").read_text())
    assert meta["format"] == "octopis-workload/1"
    assert meta["topology"] == {"name": "fig2", "brokers": 18}


def test_generation_is_deterministic_and_timed() -> None:
    a, b, c = _small(7), _small(7), _small(8)
    assert a.subscriptions == b.subscriptions and a.publications == b.publications
    assert a.publications != c.publications
    per_publisher: dict[str, list[float]] = {}
    for p in a.publications:
        per_publisher.setdefault(p.publisher, []).append(p.time)
    for times in per_publisher.values():
        assert times[0] < 5.0
        assert all(abs((t2 - t1) - 1.0) < 1e-9 for t1, t2 in itertools.pairwise(times))
    assert len(a.publications[0].publication) == 10


def test_unknown_broker_is_rejected() -> None:
    paper75 = build_preset("paper75")
    workload = generate_workload(paper75, subscribers=30, publishers=2, notifications=2, seed=1)
    with pytest.raises(WorkloadError, match=r"broker\(s\) the topology fig2 lacks: "):
        workload.check_topology(FIG2)


def _write_rows(path: Path, subs: list[dict], pubs: list[dict]) -> None:
    path.mkdir()
    (path / "meta.json").write_text('{"format": "octopis-workload/1"}')
    pq.write_table(
        pa.Table.from_pylist(subs, schema=SUBSCRIPTION_SCHEMA), path / "subscriptions.parquet"
    )
    pq.write_table(
        pa.Table.from_pylist(pubs, schema=PUBLICATION_SCHEMA), path / "publications.parquet"
    )


GOOD_SUB = {"subscriber": "S1", "broker": "a:0", "filter": "[x,>,1]", "time": 0.0}
GOOD_PUB = {"publisher": "P1", "broker": "b:1", "seq": 1, "time": 0.5, "publication": "[x,2]"}


@pytest.mark.parametrize(
    ("subs", "pubs", "message"),
    [
        ([{**GOOD_SUB, "filter": "[x,>>,1]"}], [GOOD_PUB], r"subscriptions.parquet row 0: "),
        (
            [GOOD_SUB],
            [GOOD_PUB, {**GOOD_PUB, "seq": 2, "publication": "[x,1],[x,2]"}],
            r"publications.parquet row 1: ",
        ),
        (
            [GOOD_SUB, {**GOOD_SUB, "broker": "b:0"}],
            [GOOD_PUB],
            r"subscriber S1 is placed on two brokers: a:0 and b:0",
        ),
        ([GOOD_SUB], [GOOD_PUB, GOOD_PUB], r"publication P1/1 appears twice"),
        ([{**GOOD_SUB, "time": -1.0}], [GOOD_PUB], r"not a finite time ≥ 0"),
    ],
)
def test_bad_rows_are_rejected(tmp_path: Path, subs: list, pubs: list, message: str) -> None:
    _write_rows(tmp_path / "w", subs, pubs)
    with pytest.raises(WorkloadError, match=message):
        read_workload(tmp_path / "w")


def test_bad_directories_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist"):
        read_workload(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadError, match=r"cannot read meta\.json"):
        read_workload(tmp_path / "empty")
    _write_rows(tmp_path / "w", [GOOD_SUB], [GOOD_PUB])
    (tmp_path / "w" / "publications.parquet").write_text("not parquet")
    with pytest.raises(WorkloadError, match="not readable Parquet"):
        read_workload(tmp_path / "w")
    pq.write_table(pa.table({"publisher": ["P"]}), tmp_path / "w" / "publications.parquet")
    with pytest.raises(WorkloadError, match="lacks column"):
        read_workload(tmp_path / "w")


def test_write_refuses_to_replace_other_directories(tmp_path: Path) -> None:
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep")
    with pytest.raises(WorkloadError, match="not a workload directory"):
        write_workload(tmp_path / "precious", _small())
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep"


def test_hrp_followers_spread_over_the_other_clusters_in_turn() -> None:
    pick = random.Random(3).choice
    brokers = follower_brokers(FIG2, "b:1", 7, burst=True, pick=pick)
    assert [FIG2.brokers[b].cluster for b in brokers] == [0, 2, 0, 2, 0, 2, 0]
    anywhere = follower_brokers(FIG2, "b:1", 200, burst=False, pick=pick)
    assert {FIG2.brokers[b].cluster for b in anywhere} == {0, 1, 2}


def test_mixed_regime_puts_a_share_of_the_followers_in_the_hrps_cluster() -> None:
    pick = random.Random(5).choice
    brokers = follower_brokers(FIG2, "b:1", 10, burst=True, pick=pick, inside=0.4)
    clusters = [FIG2.brokers[b].cluster for b in brokers]
    assert clusters[:4] == [1] * 4 and "b:1" not in brokers[:4]
    assert clusters[4:] == [0, 2, 0, 2, 0, 2]
    with pytest.raises(WorkloadError, match="inside share"):
        HighRatePublisher(10, inside=0.5, burst_placement=False).audience(100)
    with pytest.raises(WorkloadError, match="inside share"):
        HighRatePublisher(10, inside=1.5).audience(100)


def test_hrp_followers_of_a_single_cluster_stay_in_it() -> None:
    one = build_scot(nx.path_graph(["a", "b", "c"]), complete_factor(1), name="line")
    brokers = follower_brokers(one, "b:0", 4, burst=True, pick=random.Random(1).choice)
    assert len(brokers) == 4 and set(brokers) <= set(one.brokers)
