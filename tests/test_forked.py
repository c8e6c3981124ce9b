"""Brokers forked from a zygote (octopis.cluster.forked, octopis.cli.zygote): separate
processes in sessions of their own that behave as executed ones do, as the launcher
sees them (status, log, kill -9, pause, stop), and that do not outlive their launcher."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from octopis.cluster.forked import ForkedBroker, Zygote, fork_broker
from octopis.cluster.launcher import LocalCluster, broker_command, prepare_topology

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]


@pytest.mark.parametrize("forked", [False, True], ids=["exec", "fork"])
def test_a_broker_with_bad_input_exits_2_and_says_why_in_its_log(
    tmp_path: Path, forked: bool
) -> None:
    scot, path = prepare_topology(tmp_path, preset="fig2")
    cluster = LocalCluster(scot, path, "snr", tmp_path, secure=False, forked=forked)
    cluster.run_dir.joinpath("logs").mkdir()
    cluster.run_dir.joinpath("broker.toml").write_text("[links]\nheartbeat = -1\n")
    process = cluster.spawn_one("a:0")
    assert process.wait(30) == 2
    assert cluster.dead() == {"a:0": 2}
    log = (tmp_path / "logs" / "a_0.log").read_text()
    assert "heartbeat" in log and log.count("\n") == 1
    assert isinstance(process, ForkedBroker) is forked


def test_forked_brokers_serve_die_pause_and_stop_as_executed_ones(tmp_path: Path) -> None:
    scot, path = prepare_topology(tmp_path, preset="fig2")
    cluster = LocalCluster(scot, path, "dnr", tmp_path, secure=False, forked=True)
    cluster.spawn()
    try:
        asyncio.run(cluster.wait_ready(60))
        pids = {b: p.pid for b, p in cluster.processes.items()}
        assert len(set(pids.values())) == len(scot.brokers)
        for pid in pids.values():
            assert os.getsid(pid) == pid  # a session of its own, as start_new_session
            assert psutil.Process(pid).parent().parent().pid == os.getpid()  # the zygote's
        for broker_id in ("a:0", "f:2"):
            log = tmp_path / "logs" / f"{broker_id.replace(':', '_')}.log"
            assert broker_id in log.read_text()
        cluster.pause("b:0", True)
        paused = psutil.Process(pids["b:0"])
        deadline = time.monotonic() + 10
        while paused.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)  # the signal is delivered, not yet taken
        assert paused.status() == psutil.STATUS_STOPPED
        cluster.pause("b:0", False)
        cluster.kill("c:1")
        assert cluster.processes["c:1"].returncode == -signal.SIGKILL
        assert cluster.dead() == {}  # killed on purpose
        cluster.spawn_one("c:1")
        asyncio.run(cluster.wait_ready(60, ["c:1"]))
        assert cluster.processes["c:1"].pid != pids["c:1"]
    finally:
        cluster.stop()
    assert {p.returncode for p in cluster.processes.values()} == {0}
    zygote = next(iter(cluster.processes.values()))._zygote  # type: ignore[attr-defined]
    seen = {p.pid for p in cluster.processes.values()}
    assert not seen & set(zygote.ended)  # a status read is not kept twice
    for pid in cluster.processes.values():
        assert not psutil.pid_exists(pid.pid) or psutil.Process(pid.pid).status() == "zombie"


def test_the_zygote_stops_its_brokers_when_its_launcher_dies(tmp_path: Path) -> None:
    _, path = prepare_topology(tmp_path, preset="fig2")
    launcher = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from octopis.cluster.forked import fork_broker
        from octopis.cluster.launcher import broker_command
        command = broker_command(Path({str(path)!r}), "a:0", "snr")
        print(fork_broker(command, Path({str(tmp_path / "a.log")!r})).pid, flush=True)
        time.sleep(60)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", launcher], stdout=subprocess.PIPE, cwd=Path.cwd()
    )
    assert process.stdout is not None
    pid = int(process.stdout.readline())
    broker = psutil.Process(pid)
    log = tmp_path / "a.log"
    deadline = time.monotonic() + 30
    while "a:0" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)  # until it serves (and handles SIGTERM)
    process.kill()
    process.wait()
    broker.wait(30)  # not this process's child: its status is the zygote's to read
    assert "a:0 stopped" in log.read_text()  # SIGTERM: a clean stop


def test_a_zygote_refuses_what_is_not_this_interpreters_broker(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a broker command line"):
        fork_broker(["python3", "-m", "octopis.cli.broker"], tmp_path / "x.log")
    zygote = Zygote()
    command = broker_command(tmp_path / "missing.json", "a:0")
    pid = zygote.fork(command[3:], tmp_path / "x.log")
    broker = ForkedBroker(pid, command, zygote)
    assert broker.wait(30) == 2
    assert "missing.json" in (tmp_path / "x.log").read_text()


def test_the_zygote_answers_a_malformed_request_and_goes_on(tmp_path: Path) -> None:
    zygote = subprocess.Popen(
        [sys.executable, "-m", "octopis.cli.zygote"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    command = broker_command(tmp_path / "missing.json", "a:0")
    request = {"argv": command[3:], "log": str(tmp_path / "x.log"), "env": {}, "cwd": "/"}
    zygote.stdin.write('{"argv": []}\nnot json\n' + json.dumps(request) + "\n")
    zygote.stdin.flush()
    lines = [zygote.stdout.readline().split() for _ in range(4)]
    assert [line[0] for line in lines] == ["error", "error", "pid", "exit"]
    assert lines[1][1:3] == ["malformed", "request:"]
    assert lines[3][1:] == [lines[2][1], "2"]  # the child it forked, with its status
    zygote.stdin.close()
    assert zygote.wait(30) == 0
    assert "missing.json" in (tmp_path / "x.log").read_text()
