"""Suite-wide setup: the hypothesis profile (``HYPOTHESIS_PROFILE``, see ``laws.py``), the
``line_of`` fixture (three broker processes a:0 – b:0 – c:0 in the clear) and
:func:`secure_fig2` (fig2's 18 broker processes with keys on)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import laws  # noqa: F401  (registers and loads the profile)
import networkx as nx
import pytest
from conditions import closing_control

from octopis.cluster.launcher import LocalCluster, find_free_base_port, prepare_topology
from octopis.keys import KEYS_ENV
from octopis.topology import build_scot, complete_factor
from octopis.transport.settings import BrokerSettings


def secure_fig2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: BrokerSettings,
    mode: str = "dnr",
    room: int = 0,
) -> Iterator[LocalCluster]:
    """For a fixture to yield from: fig2 in ``mode`` with keys on and ``settings``, ready
    (on ports with room for ``room`` brokers more: the overlay may grow); the SDK finds
    the keys through $OCTOPIS_KEYS. Stopped when the fixture ends."""
    scot, path = prepare_topology(tmp_path, preset="fig2", room=room)
    cluster = LocalCluster(scot, path, mode, tmp_path, settings)
    cluster.spawn()
    monkeypatch.setenv(KEYS_ENV, str(cluster.keys_dir))
    try:
        asyncio.run(closing_control(cluster, cluster.wait_ready(120)))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def line_of(tmp_path: Path) -> Iterator[Callable[[BrokerSettings], LocalCluster]]:
    """Starts the line a:0 – b:0 – c:0 (SNR, keys off) with the given settings; stops it
    after the test."""
    started: list[LocalCluster] = []

    def start(settings: BrokerSettings) -> LocalCluster:
        line = nx.path_graph(["a", "b", "c"])
        scot = build_scot(line, complete_factor(1), name="line", base_port=find_free_base_port(3))
        path = tmp_path / "line.json"
        path.write_text(json.dumps(scot.to_json()))
        cluster = LocalCluster(scot, path, "snr", tmp_path, settings, secure=False)
        started.append(cluster)
        cluster.spawn()
        return cluster

    yield start
    for cluster in started:
        cluster.stop()
