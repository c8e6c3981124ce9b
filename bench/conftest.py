"""Shared fixtures for the benchmark suites (run with ``pytest bench --benchmark-only``)."""
