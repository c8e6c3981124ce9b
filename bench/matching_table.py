"""The matcher table of ``bench/RESULTS.md`` from a ``bench/bench_matching.py`` run:

    pytest bench/bench_matching.py --benchmark-only --benchmark-json=matcher.json
    python -m bench.matching_table matcher.json

One row per shape and size: compiled publications/s for each call, the reference's, the
ratio of each compiled call to it, the mean selectivity and the compiled index's memory;
then, if the run has them, one row per shape of ``test_build``: the time to add a
subscription, to build the index of all of them, its memory in all and per subscription.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CALLS = ("match_groups", "match_groups_full", "match")


def table(report: dict) -> str:
    """Markdown rows for every (shape, size) of a pytest-benchmark JSON ``report``."""
    rows: dict[tuple[str, int], dict[str, dict]] = {}
    builds: dict[str, dict] = {}
    for bench in report["benchmarks"]:
        info = bench["extra_info"]
        if info["call"] == "build":
            builds[info["shape"]] = info
        else:
            rows.setdefault((info["shape"], info["subscriptions"]), {})[info["call"]] = info
    lines = [
        "| shape | subscriptions | match_groups | match_groups, no early stop | match "
        "| reference | ratios to the reference | selectivity | index memory |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for (shape, size), calls in sorted(rows.items()):
        reference = calls.get("reference", {}).get("pubs_per_s")
        rates = [calls.get(call, {}).get("pubs_per_s") for call in CALLS]
        match = calls.get("match", {})
        cells = [shape, f"{size:,}"]
        cells += [f"{rate:,.0f}" if rate else "–" for rate in rates]
        cells.append(f"{reference:,.1f}" if reference else "–")
        cells.append(
            " / ".join(f"{rate / reference:,.0f}×" if rate and reference else "–" for rate in rates)
        )
        cells.append(f"{match['mean_selectivity']:.2%}" if match else "–")
        cells.append(f"{match['index_bytes'] / 2**20:.1f} MiB" if match else "–")
        lines.append("| " + " | ".join(cells) + " |")
    if builds:
        lines += [
            "",
            "| shape | subscriptions | add | rebuild | index memory | per subscription |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for shape, info in sorted(builds.items()):
            lines.append(
                f"| {shape} | {info['subscriptions']:,} | {info['add_us']:.1f} µs "
                f"| {info['rebuild_s']:.2f} s | {info['index_bytes'] / 2**20:.1f} MiB "
                f"| {info['bytes_per_subscription']} B |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
