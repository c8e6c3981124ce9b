"""`octopis down` returns only once every broker process has exited and its ports bind
again, so `octopis up` on the same ports right after starts cleanly, every time; a
broker that ignores SIGTERM is killed after `--timeout` and named; `octopis up` on ports
another process holds names the port, its broker and the holder, and starts nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import psutil
import pytest
from conditions import run_octopis

from octopis.cluster.launcher import held_ports, prepare_topology
from octopis.topology import load_topology

pytestmark = pytest.mark.processes
CYCLES = 10


def _running(pids: list[int]) -> list[int]:
    """Those of ``pids`` whose process has not exited (a zombie has: it holds nothing)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def _pids(cwd: Path) -> dict[str, int]:
    return json.loads((cwd / ".octopis" / "cluster.json").read_text())["pids"]


@pytest.mark.timeout(900)
def test_down_then_up_on_the_same_ports_ten_times_in_a_row(tmp_path: Path) -> None:
    """fig2 (18 brokers, CurveZMQ on), the same topology file and ports each time:
    after each `down` no broker process is running and every port binds; each `up`
    finds every broker ready."""
    _, path = prepare_topology(tmp_path, preset="fig2")
    scot = load_topology(path)
    clean = 0
    for cycle in range(CYCLES):
        up = run_octopis(["up", str(path)], 180, tmp_path)
        assert up.returncode == 0, f"cycle {cycle}: {up.stdout}{up.stderr}"
        assert "18 brokers of fig2 up" in up.stdout
        pids = list(_pids(tmp_path).values())
        down = run_octopis(["down"], 180, tmp_path)
        assert down.returncode == 0, f"cycle {cycle}: {down.stdout}{down.stderr}"
        assert "stopped 18 brokers: every process has exited" in down.stdout
        assert down.stderr == "", down.stderr  # none had to be killed, no port left held
        assert _running(pids) == [], f"cycle {cycle}: still running after down"
        assert held_ports(scot, list(scot.brokers)) == [], f"cycle {cycle}"
        clean += 1
    assert clean == CYCLES
    print(f"{clean} of {CYCLES} down/up cycles clean")


@pytest.mark.timeout(300)
def test_down_kills_and_names_a_broker_that_does_not_stop(tmp_path: Path) -> None:
    """A stopped (SIGSTOP) broker cannot act on SIGTERM: `down --timeout 1` kills it
    after a second, says so, and still returns only once it is gone. Before that, with
    every broker running: a second `up` on the run directory is refused (status 2),
    `status` has a row for each of the 18 brokers, ready and its memory (MB) reported, and
    `balance plan` on the idle overlay plans no move."""
    _, path = prepare_topology(tmp_path, preset="fig2")
    up = run_octopis(["up", str(path)], 180, tmp_path)
    assert up.returncode == 0, up.stderr
    assert "18 brokers of fig2 up" in up.stdout
    pids = _pids(tmp_path)
    assert len(pids) == 18
    again = run_octopis(["up", str(path)], 60, tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr
    status = run_octopis(["status"], 60, tmp_path)
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()[1:]]
    assert sorted(row[0] for row in rows) == sorted(pids)
    assert all(row[2] == "yes" and float(row[6]) > 1 for row in rows), status.stdout
    plan = run_octopis(["balance", "plan"], 60, tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "plan ldm: 0 moves" in plan.stdout and len(plan.stdout.splitlines()) == 21
    os.kill(pids["c:1"], signal.SIGSTOP)
    down = run_octopis(["down", "--timeout", "1"], 180, tmp_path)
    assert down.returncode == 0, down.stderr
    killed = [line.split(" did not exit within 1 s of SIGTERM: killed")[0].split(", ")
              for line in down.stderr.splitlines() if "of SIGTERM: killed" in line]  # fmt: skip
    assert any("c:1" in names for names in killed), down.stderr  # others may be slow too
    assert "stopped 18 brokers" in down.stdout
    assert _running(list(pids.values())) == []


@pytest.mark.timeout(120)
def test_up_on_a_held_port_names_the_port_and_its_holder(tmp_path: Path) -> None:
    """A port of broker d:2 held by this test process: `up` exits with status 2, names
    the port, the broker and its role, and this process's pid, and starts no broker."""
    _, path = prepare_topology(tmp_path, preset="fig2")
    scot = load_topology(path)
    port = int(scot.brokers["d:2"].client_endpoint.rsplit(":", 1)[1])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        up = run_octopis(["up", str(path)], 60, tmp_path)
    assert up.returncode == 2, up.stdout + up.stderr
    assert f"127.0.0.1:{port} (d:2 client) held by pid {os.getpid()}" in up.stderr, up.stderr
    assert not (tmp_path / ".octopis" / "cluster.json").exists()
    assert not (tmp_path / ".octopis" / "logs").exists()  # no broker started
