"""Benchmarks and the paper's experiments (run with ``pytest bench --benchmark-only``)."""
