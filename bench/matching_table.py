"""The matcher tables of ``bench/RESULTS.md``. At scale, side by side with a baseline
checkout, in one run (:mod:`bench.matching_scale`)::

    python -m bench.matching_table --sizes 100000 1000000 --baseline ../base --churn-size 100000

and from a ``bench/bench_matching.py`` run::

    pytest bench/bench_matching.py --benchmark-only --benchmark-json=matcher.json
    python -m bench.matching_table matcher.json

One row per shape and size: compiled publications/s for each call, the reference's, the
ratio of each compiled call to it, the mean selectivity and the compiled index's memory;
then, if the run has them, one row per shape of ``test_build``: the time to add a
subscription, to build the index of all of them, its memory in all and per subscription.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.matching_scale import run, shape_names

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


def main(argv: list[str]) -> None:
    """A pytest-benchmark JSON file's table, or (with options) the run at scale."""
    if len(argv) == 1 and argv[0].endswith(".json"):
        print(table(json.loads(Path(argv[0]).read_text())))
        return
    parser = argparse.ArgumentParser(prog="python -m bench.matching_table")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[100_000, 1_000_000],
        help="subscriptions in a table, one row per size (default 100,000 and 1,000,000)",
    )
    parser.add_argument("--shapes", nargs="+", default=None, help="default: every shape")
    parser.add_argument("--baseline", type=Path, help="a checkout with its matcher built")
    parser.add_argument("--churn-size", type=int, default=100_000, help="0: no churn runs")
    parser.add_argument(
        "--churn-publications", type=int, default=256, help="publications per churn pass"
    )
    parser.add_argument("--repeat", type=int, default=5, help="passes; the best counts")
    parser.add_argument(
        "--publications",
        type=int,
        nargs="+",
        default=[1024, 256],
        help="publications per pass, one per size (smallest size first)",
    )
    parser.add_argument("--out", type=Path, help="also write the report here, shape by shape")
    args = parser.parse_args(argv)
    shapes = args.shapes or shape_names()
    unknown = sorted(set(shapes) - set(shape_names()))
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {shape_names()}")
    if any(size < 1 for size in args.sizes) or args.repeat < 1 or args.churn_size < 0:
        parser.error("sizes and --repeat must be positive, --churn-size at least 0")
    sizes = sorted(set(args.sizes) | ({args.churn_size} if args.churn_size else set()))
    padded = args.publications + args.publications[-1:] * len(sizes)
    per = dict(zip(sizes, padded[: len(sizes)], strict=True))
    report = run(
        args.sizes,
        shapes,
        args.baseline,
        per,
        args.repeat,
        args.churn_size or None,
        args.churn_publications,
        lambda line: print(line, file=sys.stderr, flush=True),
        args.out,
    )
    print(report)


if __name__ == "__main__":
    main(sys.argv[1:])
