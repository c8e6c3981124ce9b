"""The nemesis's long run (DESIGN §7): many seeds on the brokers' own nodes, in parallel.

    python -m bench.nemesis [--seeds 100000] [--first 0] [--workers 2] [--preset fig2 ...]
                            [--out bench/results/nemesis.json]

Each seed is drawn, run and checked by :mod:`octopis.nemesis.scenarios` (``octopis nemesis``
runs one). The table counts the runs, those that passed, the faults injected by kind, and
the deliveries: expected, delivered, duplicated, lost (counted with a reason or reported
to the subscriber as a gap), refused (their publishers were told: a full disk) and silent
(lost with neither: the figure that must be 0), in all and by kind of subscriber (live,
failed over, historic, durable; for composite subscribers the counts are of matches),
with the failing seeds to replay one by one; and what the retention stores confirmed,
refused and lost naming why.
The table so far is written beside ``--out`` (``nemesis.partial.json``) as each chunk of
seeds comes in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from octopis.nemesis.scenarios import PRESETS, sweep

REPO = Path(__file__).resolve().parents[1]
CHUNK = 100


def _chunk(args: tuple[int, int, tuple[str, ...]]) -> dict[str, Any]:
    first, count, presets = args
    return sweep(range(first, first + count), presets=presets)


def run(
    first: int,
    seeds: int,
    workers: int,
    presets: tuple[str, ...],
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Sweep ``seeds`` seeds from ``first`` on ``workers`` processes; the summed table
    (``progress`` is given the table so far as each chunk comes in)."""
    chunks = [
        (s, min(CHUNK, first + seeds - s), presets) for s in range(first, first + seeds, CHUNK)
    ]
    table: dict[str, Any] = {
        "runs": 0, "passed": 0, "failing": [], "faults": {}, "kinds": {}, "stores": {}
    }  # fmt: skip
    started = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        for part in pool.map(_chunk, chunks):
            for key, value in part.items():
                if key == "failing":
                    table["failing"] += value
                elif key in ("faults", "stores"):
                    _add(table[key], value)
                elif key == "kinds":
                    for kind, counts in value.items():
                        _add(table["kinds"].setdefault(kind, {}), counts)
                else:
                    table[key] = table.get(key, 0) + value
            if progress is not None:
                progress({**table, "seconds": round(time.perf_counter() - started, 1)})
    table["seconds"] = round(time.perf_counter() - started, 1)
    table["first"], table["presets"] = first, list(presets)
    table["commit"] = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return table


def _add(into: dict[str, int], counts: dict[str, int]) -> None:
    for key, n in counts.items():
        into[key] = into.get(key, 0) + n


def markdown(table: dict[str, Any]) -> str:
    """The RESULTS table of one long run."""
    faults = ", ".join(f"{kind} {n:,}" for kind, n in table["faults"].items())
    rows = [
        "| seeds | passed | faults injected | expected | delivered | duplicated "
        "| lost (accounted) | refused | silent | seconds |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {table['runs']:,} | {table['passed']:,} | {faults} | {table['expected']:,} | "
        f"{table['delivered']:,} | {table['duplicated']:,} | {table['lost']:,} | "
        f"{table.get('refused', 0):,} | {table['silent']:,} | {table['seconds']:,} |",
        "",
        "| subscribers | expected | delivered | duplicated | lost (accounted) | refused | silent "
        "| gaps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, c in table["kinds"].items():
        rows.append(
            f"| {kind} | {c['expected']:,} | {c['delivered']:,} | {c['duplicated']:,} | "
            f"{c['lost']:,} | {c.get('refused', 0):,} | {c['silent']:,} | {c.get('gaps', 0):,} |"
        )
    stores = table.get("stores", {})
    rows += [
        "",
        "| publications | confirmed | refused (publisher told) | lost by a store (named) |",
        "|---|---:|---:|---:|",
        f"| in all | {stores.get('confirmed', 0):,} | {stores.get('refused', 0):,} | "
        f"{stores.get('store_lost', 0):,} |",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds", type=int, default=100_000, help="how many seeds to run (default 100,000)"
    )
    parser.add_argument(
        "--first", type=int, default=0, help="the first seed; the run takes consecutive ones"
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="processes running seeds side by side"
    )
    parser.add_argument(
        "--preset",
        action="append",
        choices=PRESETS,
        help="topology of the runs; repeat it to let each seed draw among them (default fig2)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench/results/nemesis.json",
        help="where the table goes as JSON (the partial table is written beside it)",
    )
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(".partial.json")
    table = run(
        args.first,
        args.seeds,
        args.workers,
        tuple(args.preset or ("fig2",)),
        lambda so_far: partial.write_text(json.dumps(so_far, indent=1)),
    )
    args.out.write_text(json.dumps(table, indent=1))
    print(markdown(table))
    if table["failing"]:
        print(f"failing seeds: {' '.join(map(str, table['failing'][:100]))}")
    return 1 if table["failing"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
