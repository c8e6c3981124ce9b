"""docs/durable.md's examples (DESIGN §11): its commands and program, as written, do what the
page says against an overlay ``octopis up`` started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from octopis.cluster.launcher import prepare_topology

PAGE = Path(__file__).resolve().parents[1] / "docs" / "durable.md"


def _blocks(page: Path, language: str) -> list[list[str]]:
    """The lines of each fenced ``language`` block of ``page``, in order (blank lines
    dropped in shell blocks, a line ending in a backslash joined to the next)."""
    blocks, current = [], None
    for line in page.read_text().splitlines():
        if line.strip() == f"```{language}":
            current = []
        elif line.strip() == "```" and current is not None:
            blocks.append(current)
            current = None
        elif current is not None and current and current[-1].endswith("\\"):
            current[-1] = current[-1][:-1] + line.strip()  # a command continued
        elif current is not None and (line.strip() or language == "python"):
            current.append(line)
    return blocks


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_the_pages_examples_do_what_the_page_says(tmp_path: Path) -> None:
    """docs/durable.md's commands and program, as written, against an overlay `octopis up`
    started in the directory they run in (fig2 on free ports, keys on)."""
    scot, _ = prepare_topology(tmp_path / "build", preset="fig2")
    (tmp_path / "t.json").write_text(json.dumps(scot.to_json()))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("OCTOPIS_KEYS", None)

    def sh(command: str) -> list[dict]:
        done = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, (command, done.stderr)
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    historic, durable = _blocks(PAGE, "sh")
    (program,) = _blocks(PAGE, "python")
    sh("octopis up t.json")
    try:
        published = sh(historic[0])
        assert [p["published"] for p in published] == [1, 2]
        head, *lines = sh(historic[1])
        assert head["history"]["silent"] == [] and head["history"]["error"] is None
        assert [(n["publication"]["symbol"], n.get("replayed")) for n in lines] == [("MSFT", True)]
        first = sh(durable[0])
        assert len(first) == 1 and "subscribed" in first[0]  # nothing owed to a new one
        status = subprocess.run(
            ["octopis", "status"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        rows = {row.split()[0]: row.split() for row in status.stdout.splitlines()[1:]}
        assert rows["a:0"][8] == "2" and rows["c:0"][11] == "1/1", status.stdout  # kept; away
        assert rows["f:2"][8] == "0" and rows["f:2"][11] == "0/0", status.stdout
        sh(durable[1])
        head, *lines = sh(durable[2])
        assert head["history"]["error"] is None and head["history"]["silent"] == []
        assert [(n["publication"]["symbol"], n.get("replayed")) for n in lines] == [("ORCL", True)]
        ended = sh(durable[3])
        assert ended[0]["ended"] == "audit"
        head, *lines = sh(durable[2])  # ended: a fresh durable, owed nothing
        assert lines == [] and head["history"]["published"] == 0
        done = subprocess.run(
            [sys.executable, "-c", "\n".join(program)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["missed 81.0 True", "past [80.5, 81.0] True"]
    finally:
        sh("octopis down")
