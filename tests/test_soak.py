"""The flake finder (tests/soak.py): it reads pytest's JUnit reports and tabulates every
test that failed in any run, with the runs it failed in."""

from __future__ import annotations

from pathlib import Path

from soak import RunResult, read_junit, table

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests.test_a" name="test_also_ok" time="0.1"/>
<testcase classname="tests.test_b" name="test_flaky" time="2.0">
  <failure message="AssertionError: deliveries: not within 30 s&#10;more">trace</failure>
</testcase>
<testcase classname="tests.test_b" name="test_broken_fixture" time="0.0">
  <error message="fixture 'x' not found">trace</error>
</testcase>
<testcase classname="tests.test_c" name="test_skipped" time="0.0">
  <skipped message="no chromium"/>
</testcase>
</testsuite></testsuites>
"""


def test_a_report_is_counted_and_failures_keep_their_first_line(tmp_path: Path) -> None:
    path = tmp_path / "run.xml"
    path.write_text(REPORT)
    passed, failed, skipped, failures = read_junit(path)
    assert (passed, failed, skipped) == (2, 2, 1)
    assert failures == {
        "tests.test_b::test_flaky": "AssertionError: deliveries: not within 30 s",
        "tests.test_b::test_broken_fixture": "fixture 'x' not found",
    }


def test_the_table_lists_each_failing_test_with_its_runs_most_frequent_first() -> None:
    runs = [
        RunResult(1, 400.0, 1, 599, 2, 0, {"t::flaky": "timeout", "t::once": "boom | bang"}),
        RunResult(2, 410.0, 0, 601, 0, 0, {}),
        RunResult(3, 405.0, 1, 600, 1, 0, {"t::flaky": "timeout again"}),
    ]
    text = table(runs, ["-m", "processes"])
    assert "3 runs of `python -m pytest -n auto -m processes`" in text
    assert "| 2 | 0 | 601 | 0 | 0 | 410 |" in text
    assert "Tests that failed in any run: 2." in text
    rows = [line for line in text.splitlines() if line.startswith("| `t::")]
    assert rows == ["| `t::flaky` | 1, 3 | timeout |", "| `t::once` | 1 | boom / bang |"]


def test_a_clean_soak_says_so() -> None:
    text = table([RunResult(1, 300.0, 0, 601, 0, 0, {})], [])
    assert "Tests that failed in any run: 0." in text
    assert "| test | failed in runs |" not in text
