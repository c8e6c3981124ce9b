"""Port reservation of octopis.cluster.launcher: ranges handed out by find_free_base_port
never overlap, within one process or across processes, and come back when their holder
exits. Each test uses its own lock folder and a window of 8 port blocks, and takes every
port as bindable, so the outcome depends on the reservations alone."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from octopis.cluster import launcher
from octopis.cluster.launcher import PORT_BLOCK, ClusterError, find_free_base_port, release_ports

FIRST_BLOCK = -(-launcher._LOWEST_PORT // PORT_BLOCK)
BLOCKS = 8
WINDOW_END = (FIRST_BLOCK + BLOCKS) * PORT_BLOCK  # stands for the ephemeral range's start
ALL_BASES = {(FIRST_BLOCK + i) * PORT_BLOCK for i in range(BLOCKS)}

# Reserves argv[3] ranges of 18 brokers (one block each) in the window, prints their base
# ports and holds them until its stdin closes.
HOLDER = """
import json, sys
from pathlib import Path
from octopis.cluster import launcher
launcher.PORT_LOCK_DIR = Path(sys.argv[1])
launcher._ephemeral_start = lambda: int(sys.argv[2])
launcher._port_free = lambda host, port: True
bases = [launcher.find_free_base_port(18, attempts=1000) for _ in range(int(sys.argv[3]))]
print(json.dumps(bases), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(launcher, "PORT_LOCK_DIR", tmp_path / "ports")
    monkeypatch.setattr(launcher, "_RESERVED", {})
    monkeypatch.setattr(launcher, "_RELEASED", set())
    monkeypatch.setattr(launcher, "_ephemeral_start", lambda: WINDOW_END)
    monkeypatch.setattr(launcher, "_port_free", lambda host, port: True)
    return tmp_path / "ports"


def _ranges(bases: list[int], brokers: int) -> list[range]:
    span = launcher.PORTS_PER_BROKER * brokers
    return [range(base, base + span) for base in bases]


def _disjoint(ranges: list[range]) -> bool:
    ports = [port for r in ranges for port in r]
    return len(ports) == len(set(ports))


@contextlib.contextmanager
def _holder(lock_dir: Path, count: int) -> Iterator[subprocess.Popen]:
    """A separate process holding ``count`` one-block ranges until the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock_dir), str(WINDOW_END), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.stdin.close()
        process.wait(timeout=30)


def _bases(process: subprocess.Popen) -> list[int]:
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=30)
        pytest.fail(f"holder process failed: {process.stderr.read()}")
    return json.loads(line)


def test_reservations_in_one_process_never_overlap(lock_dir: Path) -> None:
    wide = find_free_base_port(40, attempts=1000)  # 160 ports: two blocks
    narrow = [find_free_base_port(18, attempts=1000) for _ in range(BLOCKS - 2)]
    assert _disjoint(_ranges([wide], 40) + _ranges(narrow, 18))
    assert {wide, wide + PORT_BLOCK, *narrow} == ALL_BASES
    with pytest.raises(ClusterError, match="found no 72 consecutive free ports"):
        find_free_base_port(18)


def test_reservations_in_two_processes_never_overlap(lock_dir: Path) -> None:
    half = BLOCKS // 2
    with _holder(lock_dir, half) as first, _holder(lock_dir, half) as second:
        bases = _bases(first) + _bases(second)
        assert len(bases) == BLOCKS
        assert _disjoint(_ranges(bases, 18))
        with pytest.raises(ClusterError):
            find_free_base_port(18)  # the holders still have every block


def test_a_range_is_handed_out_again_after_its_holder_exits(lock_dir: Path) -> None:
    with _holder(lock_dir, BLOCKS) as holder:
        assert set(_bases(holder)) == ALL_BASES
        with pytest.raises(ClusterError):
            find_free_base_port(18)
    assert holder.returncode == 0
    assert {find_free_base_port(18, attempts=1000) for _ in range(BLOCKS)} == ALL_BASES


def test_a_range_with_a_busy_port_is_skipped_and_not_kept(
    lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = min(ALL_BASES) + 5
    monkeypatch.setattr(launcher, "_port_free", lambda host, port: port != busy)
    bases = {find_free_base_port(18, attempts=1000) for _ in range(BLOCKS - 1)}
    assert bases == ALL_BASES - {min(ALL_BASES)}
    monkeypatch.setattr(launcher, "_port_free", lambda host, port: True)
    assert find_free_base_port(18, attempts=1000) == min(ALL_BASES)


def test_a_released_range_goes_to_its_own_process_again_and_to_no_other(
    lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped cluster's blocks (:func:`release_ports`) are handed out again by the
    process that holds them, before any other and only while every port binds; another
    process still cannot lock them; ports this process never reserved change nothing."""
    bases = [find_free_base_port(18, attempts=1000) for _ in range(BLOCKS)]
    release_ports([70000 - 1])  # held by nobody here: nothing to hand out
    with pytest.raises(ClusterError):
        find_free_base_port(18)
    released, busy_one = bases[3], bases[5]
    release_ports(range(released, released + 72))
    release_ports([busy_one + 1])
    monkeypatch.setattr(launcher, "_port_free", lambda host, port: port != busy_one + 7)
    other = subprocess.run(
        [sys.executable, "-c", HOLDER, str(lock_dir), str(WINDOW_END), "1"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode != 0 and "found no 72 consecutive free ports" in other.stderr
    assert find_free_base_port(18) == released
    with pytest.raises(ClusterError):
        find_free_base_port(18)  # the other released range has a busy port
    monkeypatch.setattr(launcher, "_port_free", lambda host, port: True)
    assert find_free_base_port(18) == busy_one
