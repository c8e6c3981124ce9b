"""``octopis sim``: report keys, deliveries file, and bad input (exit status 2); the
CLI's log handler."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from pathlib import Path

import pytest

from octopis.cli import configure_logging
from octopis.cli.main import main
from octopis.topology import build_preset
from octopis.workload import generate_workload, write_workload

REPORT_KEYS = {
    "mode",
    "brokers",
    "subscriptions",
    "subscriptions_made",
    "notifications",
    "sbp_messages",
    "sbp_duplicates",
    "avg_subscription_tree_length",
    "notification_messages",
    "matching_operations",
    "expected_deliveries",
    "delivered",
    "duplicates",
    "lost",
}


@pytest.fixture
def fig2_file(tmp_path: Path) -> Path:
    path = tmp_path / "fig2.json"
    path.write_text(json.dumps(build_preset("fig2").to_json()))
    return path


@pytest.mark.parametrize("mode", ["snr", "dnr", "bid"])
def test_generated_workload_json_report(
    fig2_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture, mode: str
) -> None:
    deliveries = tmp_path / "d.jsonl"
    assert (
        main(
            [
                "sim",
                "--topology",
                str(fig2_file),
                "--mode",
                mode,
                "--subscribers",
                "60",
                "--publishers",
                "5",
                "--notifications",
                "4",
                "--seed",
                "3",
                "--covering",
                "off",
                "--json",
                "--deliveries",
                str(deliveries),
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report.keys() >= REPORT_KEYS
    assert report["mode"] == mode and report["brokers"] == 18
    assert report["subscriptions"] == 60 and report["notifications"] == 20
    assert report["sbp_messages"] == 60 * (17 if mode != "bid" else 2 * 33 - 17)  # paper SBP
    assert report["expected_deliveries"] > 0
    assert report["delivered"] == report["expected_deliveries"]
    assert report["duplicates"] == report["lost"] == 0
    assert report["run_time"] >= report["wall_time"] > 0 and report["peak_memory"] > 2**20
    lines = [json.loads(line) for line in deliveries.read_text().splitlines()]
    assert len(lines) == report["delivered"]
    assert set(lines[0]) == {"subscriber", "publisher", "seq"}
    # the default, covering active: the same deliveries, fewer SBP messages (BID floods)
    args = ["sim", "--topology", str(fig2_file), "--mode", mode, "--subscribers", "60"]
    args += ["--publishers", "5", "--notifications", "4", "--seed", "3", "--json"]
    assert main(args) == 0
    covered = json.loads(capsys.readouterr().out)
    assert covered["delivered"] == covered["expected_deliveries"] == report["delivered"]
    assert covered["duplicates"] == covered["lost"] == 0
    if mode == "bid":
        assert "covering" not in covered and covered["sbp_messages"] == report["sbp_messages"]
    else:
        assert (covered["covering"], report["covering"]) == ("active", "off")
        assert covered["sbp_messages"] < report["sbp_messages"]


def test_workload_directory_and_table_output(
    fig2_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    write_workload(
        tmp_path / "w",
        generate_workload(
            build_preset("fig2"), subscribers=20, publishers=2, notifications=3, seed=1
        ),
    )
    args = ["sim", "--preset", "fig2", "--mode", "snr", "--workload", str(tmp_path / "w")]
    assert main(args) == 0
    out = capsys.readouterr().out
    verdict = re.match(
        r"OK  fig2, SNR, 18 brokers: (\d+) of (\d+) delivered exactly once, 0 lost", out
    )
    assert verdict and verdict[1] == verdict[2] != "0", out
    assert re.search(r"^notification +[\d.]+ ms", out, re.M) and "sbp_messages" not in out
    assert re.search(r"^run: [\d.]+ s, [\d.]+ s of them simulating [\d.]+ s; "
                     r"peak memory [\d,]+ MiB$", out, re.M), out  # fmt: skip
    per = re.search(r"\(SBP, covering: ([\d.]+) per subscription against N-1 = 17\)", out)
    assert per and 0 < float(per[1]) <= 17, out  # the default covering, and what it sent
    assert main([*args, "--covering", "off"]) == 0
    assert re.search(r"^messages: [\d,]+ notification, 340 subscription \(SBP\), ",
                     capsys.readouterr().out, re.M)  # fmt: skip
    assert main([*args, "--details"]) == 0
    detailed = capsys.readouterr().out
    assert detailed.startswith(verdict[0]) and re.search(r"^sbp_messages +\d+$", detailed, re.M)


def test_bad_inputs_exit_2_and_run_nothing(
    fig2_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    paper = generate_workload(
        build_preset("paper75"), subscribers=10, publishers=1, notifications=1, seed=0
    )
    write_workload(tmp_path / "w75", paper)
    deliveries = tmp_path / "d.jsonl"
    assert (
        main(
            [
                "sim",
                "--topology",
                str(fig2_file),
                "--mode",
                "snr",
                "--workload",
                str(tmp_path / "w75"),
                "--deliveries",
                str(deliveries),
            ]
        )
        == 2
    )
    assert "the topology fig2 lacks" in capsys.readouterr().err
    assert not deliveries.exists()

    empty = tmp_path / "empty.json"
    empty.write_text(
        json.dumps(
            {
                "format": "octopis-topology/1",
                "acyclic": {"vertices": [], "edges": []},
                "clusters": 3,
                "brokers": [],
            }
        )
    )
    assert (
        main(
            [
                "sim",
                "--topology",
                str(empty),
                "--mode",
                "snr",
                "--subscribers",
                "1",
                "--publishers",
                "1",
                "--notifications",
                "1",
            ]
        )
        == 2
    )
    assert "is empty: no vertices" in capsys.readouterr().err

    assert main(["sim", "--preset", "fig2", "--mode", "snr", "--subscribers", "5"]) == 2
    assert "needs --subscribers, --publishers and --notifications" in capsys.readouterr().err


def test_log_lines_follow_the_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's log handler writes to ``sys.stderr`` as it is at each record: a stream
    swapped in later gets the line, and one closed since is not written to."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        first, second = io.StringIO(), io.StringIO()
        monkeypatch.setattr(sys, "stderr", first)
        configure_logging("WARNING", broker="b1")
        logging.getLogger("octopis.test").warning("one")
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        logging.getLogger("octopis.test").warning("two")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert second.getvalue().endswith("WARNING b1 octopis.test: two\n")
