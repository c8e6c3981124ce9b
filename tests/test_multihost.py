"""Brokers on several hosts (DESIGN §10): fig2 spread over three network namespaces, each
with its own address on a bridge, started host by host with ``octopis up --host``, and
workloads run across them exactly once from a fourth namespace (a client host).

Everything lives in namespaces the ``namespaces`` fixture makes
(:mod:`octopis.cluster.netns`): the machine's own network is never touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conditions import assert_one_sbp_each

from octopis.cluster.netns import HOSTS, Namespaces
from octopis.topology import load_topology

pytestmark = [pytest.mark.processes, pytest.mark.xdist_group("multihost")]
"""One worker runs the module, so the overlay (module scope) is brought up on the
namespaces once: between other modules' tests pytest would tear it down and up again."""

OCTOPIS = [sys.executable, "-m", "octopis.cli.main"]


@pytest.fixture(scope="module")
def overlay(namespaces: Namespaces, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """fig2, a cluster per host, up with CurveZMQ keys made for the deployment; yields the
    directory holding ``t.json``, ``keys/`` and each host's run directory ``run-<host>``."""
    root = tmp_path_factory.mktemp("multihost")
    hosts = ",".join(f"{h}={namespaces.address(h)}" for h in HOSTS)
    topology = str(root / "t.json")
    for argv in (
        ["build", "--preset", "fig2", "--hosts", hosts, "-o", topology],
        ["keys", topology, "-o", str(root / "keys")],
    ):
        subprocess.run(
            [sys.executable, "-m", "octopis.cli.topology", *argv], check=True, timeout=60
        )
    ups = {
        h: subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                namespaces.hosts[h],
                *OCTOPIS,
                "up",
                topology,
                "--host",
                h,
                "--keys",
                str(root / "keys"),
                "--run-dir",
                str(root / f"run-{h}"),
                "--timeout",
                "120",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for h in HOSTS
    }
    try:
        outputs = {h: p.communicate(timeout=180)[0] for h, p in ups.items()}
        for h, p in ups.items():
            assert p.returncode == 0, f"octopis up --host {h} failed:\n{outputs[h]}"
        yield root
    finally:
        for h, p in ups.items():
            if p.poll() is None:
                p.kill()
            if (root / f"run-{h}" / "cluster.json").exists():
                namespaces.run(
                    namespaces.hosts[h], [*OCTOPIS, "down", "--run-dir", str(root / f"run-{h}")]
                )


def _net_namespace(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def test_each_host_runs_its_brokers_in_its_namespace(namespaces: Namespaces, overlay: Path) -> None:
    scot = load_topology(overlay / "t.json")
    for h in HOSTS:
        state = json.loads((overlay / f"run-{h}" / "cluster.json").read_text())
        assert sorted(state["pids"]) == sorted(scot.brokers_on(h))
        home = os.stat(f"/run/netns/{namespaces.hosts[h]}").st_ino
        assert {_net_namespace(pid) for pid in state["pids"].values()} == {home}
    # every link is up, iCOLs included: they cross from one namespace to another
    status = namespaces.run(
        namespaces.hosts["h0"], [*OCTOPIS, "status", "--run-dir", str(overlay / "run-h0"), "--json"]
    )
    assert status.returncode == 0, status.stderr
    stats = json.loads(status.stdout)
    assert sorted(stats) == sorted(scot.brokers)
    crossing = 0
    for broker, s in stats.items():
        assert s["links_up"] == s["neighbours"], (broker, s["links"])
        here = scot.brokers[broker].host
        crossing += sum(scot.brokers[n].host != here for n in s["links"])
    assert crossing == 2 * scot.summary()["icols"]


@pytest.mark.parametrize("run", [1, 2])
def test_a_workload_across_hosts_is_delivered_exactly_once(
    namespaces: Namespaces, overlay: Path, run: int
) -> None:
    """Two runs one after the other on the same overlay: each report counts its own run
    only (SBP = N−1 messages per subscription every time)."""
    report_path = overlay / f"client-run-{run}"
    result = namespaces.run(
        namespaces.client,
        [
            *OCTOPIS,
            "run",
            "--attach",
            "--topology",
            str(overlay / "t.json"),
            "--keys",
            str(overlay / "keys"),
            "--subscribers",
            "90",
            "--publishers",
            "6",
            "--notifications",
            "20",
            "--rate",
            "300",
            "--seed",
            str(run),
            "--run-dir",
            str(report_path),
            "--json",
            "--no-progress",
        ],
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    scot = load_topology(overlay / "t.json")
    print(
        f"run {run}: expected {report['expected_deliveries']}, delivered "
        f"{report['delivered']}, duplicates {report['duplicates']}, lost {report['lost']}"
    )
    assert report["mode"] == "dnr"
    assert report["expected_deliveries"] > 150
    assert report["delivered"] == report["expected_deliveries"]
    assert report["duplicates"] == report["lost"] == report["unexpected"] == 0
    assert report["subscriptions"] == 90
    assert_one_sbp_each(report, len(scot.brokers) - 1)
