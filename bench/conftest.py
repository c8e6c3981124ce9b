"""The benchmark suites' setup (run with ``pytest bench --benchmark-only``): benchmarks
run in one process, whatever the default options say (the test suite's ``-n auto``
would run them on parallel workers, where pytest-benchmark turns itself off)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """No pytest-xdist workers for benchmarks: each one measures alone on the machine."""
    config.option.dist = "no"
    config.option.tx = []
