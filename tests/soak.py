"""Run the whole suite K times and tabulate each test's failures: the flake finder.

    python tests/soak.py --runs 5 --out bench/results/soak.md
    python tests/soak.py --runs 3 -- -m "not spark"      # pytest options after --

Each run is ``python -m pytest -n auto`` (as CI runs it; plus the options given after
``--``) with a JUnit XML report of its own; the table lists every test that failed or
errored in any run with the runs it failed in, then one line per run (passed, failed,
skipped, wall time).
The exit code is 0 only when every run passed with no failure and no error, so a CI job
or a helper can run it unattended. The XML reports stay in ``--keep`` (default a
temporary folder) for a closer look at a failure.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class RunResult:
    """One run of the suite: its counts, its wall time and the tests that failed."""

    number: int
    seconds: float
    exit_code: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    """Test id → the first line of its failure or error message."""


def read_junit(path: Path) -> tuple[int, int, int, dict[str, str]]:
    """Passed, failed (failures and errors), skipped and the failed tests' first lines,
    from a pytest JUnit XML report."""
    passed = failed = skipped = 0
    failures: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failures[name] = message[0][:160] if message else ""
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failures


def run_once(number: int, keep: Path, workers: str, extra: list[str]) -> RunResult:
    """Run the suite once with ``-n workers`` and read its report."""
    report = keep / f"run-{number}.xml"
    command = [sys.executable, "-m", "pytest", "-n", workers, "-q", f"--junitxml={report}"]
    started = time.monotonic()
    done = subprocess.run([*command, *extra], cwd=REPO, check=False)
    result = RunResult(number, time.monotonic() - started, done.returncode)
    if report.is_file():
        result.passed, result.failed, result.skipped, result.failures = read_junit(report)
    elif done.returncode != 0:
        result.failures["(the run itself)"] = f"pytest exited {done.returncode} with no report"
        result.failed = 1
    return result


def table(results: list[RunResult], extra: list[str], workers: str = "auto") -> str:
    """The soak report in Markdown."""
    failed_in: dict[str, list[int]] = defaultdict(list)
    first: dict[str, str] = {}
    for result in results:
        for name, message in result.failures.items():
            failed_in[name].append(result.number)
            first.setdefault(name, message)
    lines = [
        "# Soak: the whole suite, run after run",
        "",
        f"{len(results)} runs of `{' '.join(['python -m pytest -n', workers, *extra])}`; "
        f"{platform.python_implementation()} {platform.python_version()} on "
        f"{platform.machine()}, {_cores()} cores; hypothesis profile "
        f"{os.environ.get('HYPOTHESIS_PROFILE', 'dev')}.",
        "",
        "| run | exit | passed | failed | skipped | wall s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.number} | {r.exit_code} | {r.passed} | {r.failed} | {r.skipped} | {r.seconds:.0f} |"
        for r in results
    ]
    lines += ["", f"Tests that failed in any run: {len(failed_in)}.", ""]
    if failed_in:
        lines += ["| test | failed in runs | first message |", "|---|---|---|"]
        for name in sorted(failed_in, key=lambda n: (-len(failed_in[n]), n)):
            runs = ", ".join(map(str, failed_in[name]))
            lines.append(f"| `{name}` | {runs} | {first[name].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the test suite K times with parallel workers and tabulate each "
        "test's failures (exit 0 only if every run passed).",
        epilog="Options after -- go to pytest as they are.",
    )
    parser.add_argument("--runs", type=int, default=5, help="how many runs (default 5)")
    parser.add_argument(
        "--workers", default="auto", help="pytest-xdist workers (default auto, as CI)"
    )
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    parser.add_argument("--keep", type=Path, help="keep each run's JUnit XML here")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop after a failed run")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    keep = args.keep or Path(tempfile.mkdtemp(prefix="octopis-soak-"))
    keep.mkdir(parents=True, exist_ok=True)
    results: list[RunResult] = []
    for number in range(1, args.runs + 1):
        result = run_once(number, keep, args.workers, extra)
        results.append(result)
        print(
            f"soak run {number}/{args.runs}: {result.passed} passed, {result.failed} failed, "
            f"{result.skipped} skipped in {result.seconds:.0f} s",
            flush=True,
        )
        report = table(results, extra, args.workers)
        if args.out:  # after every run: a soak cut short keeps what it found
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(report)
        if args.stop_on_failure and (result.failed or result.exit_code):
            break
    print(table(results, extra, args.workers))
    return 0 if all(r.exit_code == 0 and not r.failed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
