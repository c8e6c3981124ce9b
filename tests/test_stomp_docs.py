"""The guide "Existing clients (STOMP)" runs as written: its shell blocks with bash, its
Python example with this interpreter (stomp.py), its JavaScript example with Node and
@stomp/stompjs from npm (``tests/stomp-js``, installed by ``.ci/setup``), on free ports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs import ROOT, fenced_blocks, on_free_ports, shell, stop_overlay

from octopis.cluster.launcher import find_free_base_port
from octopis.topology import PORTS_PER_BROKER, STOMP_PORTS

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

GUIDE = ROOT / "docs" / "guides" / "stomp.md"
NODE_MODULES = ROOT / "tests" / "stomp-js" / "node_modules"
STOMP_BASE = 61613
"""The STOMP base port the guide's examples use; the test moves it to free ports."""


def _on_free_ports(code: str, base: int, stomp_base: int) -> str:
    if "octopis-topology build" in code:
        code = on_free_ports(code, base)
    for offset in (2, 1, 0):  # b:0's TCP port, a:0's WebSocket port, a:0's TCP port
        code = code.replace(str(STOMP_BASE + offset), str(stomp_base + offset))
    return code


def test_the_stomp_guide_runs_as_written(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None or not (NODE_MODULES / "@stomp" / "stompjs").is_dir():
        pytest.fail("Node and tests/stomp-js/node_modules are needed: run .ci/setup")
    blocks = [b for b in fenced_blocks(GUIDE) if b.language in ("bash", "python", "javascript")]
    assert [b.language for b in blocks] == ["bash", "python", "javascript", "python", "bash"]
    base = find_free_base_port(18 + -(-STOMP_PORTS * 18 // PORTS_PER_BROKER))
    stomp_base = base + PORTS_PER_BROKER * 18
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES)}
    printed: list[list[str]] = []
    try:
        for block in blocks:
            code = _on_free_ports(block.code, base, stomp_base)
            if block.language == "bash":
                done = shell(code, tmp_path, timeout=180)
            else:
                program = [sys.executable, "-c"] if block.language == "python" else [node, "-e"]
                done = subprocess.run(
                    [*program, code],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
            assert done.returncode == 0, f"{code}\n{done.stdout}{done.stderr}"
            if block.language == "python":
                printed.append(done.stdout.split())
            if block.language == "javascript":
                assert done.stdout.split() == ["IBM", "101.5"]
    finally:
        stop_overlay(tmp_path)
    assert printed == [
        ["MSFT", "27.9", "quarterly-report"],  # a selected message with its body
        ["report-0", "report-1"],  # what the durable subscriber missed, back elsewhere
    ]
