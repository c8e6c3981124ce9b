"""The matcher at scale, side by side with a baseline build, in one run:

    python -m bench.matching_table --sizes 100000 1000000 --baseline ../base-checkout

For every shape (:mod:`octopis.shapes`, and ``stock`` where the quote data is) and size:
the time to add the subscriptions (each with one of :data:`GROUPS` groups) and to build
their index, the index's memory per subscription (``Matcher.stats()``) and the growth of
the process's resident memory over add and build, per subscription; then ``match()`` and
``match_groups`` publications/s. Then, at ``--churn-size``, how each shape's ``match()``
rate changes when subscriptions come and go between matches: before every publication,
``k`` live subscriptions are removed and ``k`` new ones added, the publications/s counting
the adds, removes and the rebuilds they cause.

Side by side: ``--baseline DIR`` is a checkout whose ``octopis/_match*.so`` is built; its
``Matcher`` is loaded beside this tree's into the same process and given the same
workloads, and every measurement alternates the two, pass by pass. Rates are CPU time
(``time.process_time``): the best of ``--repeat`` passes over ``--publications``
publications (the machine is shared; the best pass is the one least disturbed).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import platform
import random
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from octopis.filters.language import Publication, Subscription
from octopis.matching import Matcher
from octopis.quotes import enrich, quotes_dir, read_quote_dir, stock_subscriptions
from octopis.shapes import SHAPES

GROUPS = 16
"""Groups of ``match_groups``: about the neighbours and local clients of a broker."""
CHURN = (0, 1, 10, 100)
"""Subscriptions removed and added between two matches in the churn runs."""

MatcherType = Callable[[], Matcher]


@dataclass
class Point:
    """One matcher's figures on one shape and size."""

    add_us: float
    rebuild_s: float
    index_bytes: float
    rss_bytes: float
    selectivity: float
    rates: dict[str, float] = field(default_factory=dict)
    """Best publications/s per call (``match``, ``match_groups``, ``churn k``)."""


def load_baseline(tree: Path) -> MatcherType:
    """The ``Matcher`` of the compiled ``octopis/_match`` in checkout ``tree``."""
    found = sorted((tree / "octopis").glob("_match*.so"))
    if not found:
        raise SystemExit(f"no compiled octopis/_match*.so in {tree}: build it there first")
    spec = importlib.util.spec_from_file_location("octopis_baseline._match", found[0])
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {found[0]}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Matcher


def commit(tree: Path) -> str:
    """``git describe``-like name of ``tree``'s HEAD (``-dirty`` with local changes), or the
    directory's name if it is no git checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(tree), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return tree.resolve().name
    return out.stdout.strip()


def workload(shape: str, size: int, seed: int) -> tuple[list[Subscription], list[Publication]]:
    """A shape's subscriptions and publications (through msgpack, as a broker gets them)."""
    if shape == "stock":
        quotes = [enrich(q) for q in read_quote_dir()]
        rng = random.Random(7)
        sample = rng.sample(quotes, 20_000)
        pubs: list[Publication] = rng.sample(quotes, 4096)
        subs = stock_subscriptions(sample, size, seed=seed)
    else:
        subs, pubs = SHAPES[shape](size, seed)
    return subs, msgpack.unpackb(msgpack.packb(pubs))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build(kind: MatcherType, subs: Sequence[Subscription]) -> tuple[Matcher, Point]:
    """A matcher holding ``subs`` (key i, group i % GROUPS), its index built, and the
    costs of getting there."""
    gc.collect()
    rss = _rss()
    matcher = kind()
    started = time.process_time()
    for key, subscription in enumerate(subs):
        matcher.add(key, subscription, key % GROUPS)
    added = time.process_time()
    matcher.rebuild()
    built = time.process_time()
    return matcher, Point(
        add_us=(added - started) / len(subs) * 1e6,
        rebuild_s=built - added,
        index_bytes=matcher.stats()["memory"] / len(subs),
        rss_bytes=(_rss() - rss) / len(subs),
        selectivity=0.0,
    )


def _pass(call: Callable[[Publication], object], pubs: Sequence[Publication]) -> float:
    gc.disable()
    try:
        started = time.process_time()
        for pub in pubs:
            call(pub)
        return time.process_time() - started
    finally:
        gc.enable()


def _churn_pass(
    matcher: Matcher,
    pubs: Sequence[Publication],
    spare: Sequence[Subscription],
    per_match: int,
    rng: random.Random,
    live: list[int],
    next_key: list[int],
) -> float:
    """Before each publication, ``per_match`` random live keys out and as many new ones
    in (from ``spare``); the CPU time of it all."""
    plan = []
    for _ in pubs:
        gone = []
        for _ in range(per_match):
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            gone.append(live.pop())
        new = list(range(next_key[0], next_key[0] + per_match))
        next_key[0] += per_match
        live.extend(new)
        plan.append((gone, new))
    gc.disable()
    try:
        started = time.process_time()
        for pub, (gone, new) in zip(pubs, plan, strict=True):
            for key in gone:
                matcher.remove(key)
            for key in new:
                matcher.add(key, spare[key % len(spare)], key % GROUPS)
            matcher.match(pub)
        return time.process_time() - started
    finally:
        gc.enable()


def measure(
    kinds: dict[str, MatcherType],
    shape: str,
    size: int,
    publications: int,
    repeat: int,
    churn: int,
) -> dict[str, Point]:
    """Every figure of ``shape`` at ``size`` for each matcher of ``kinds``, alternating;
    the churn runs over the first ``churn`` publications (none if 0)."""
    subs, pubs = workload(shape, size, seed=size)
    pubs = pubs[:publications]
    points: dict[str, Point] = {}
    matchers: dict[str, Matcher] = {}
    for name, kind in kinds.items():
        matchers[name], points[name] = build(kind, subs)
        hits = sum(len(keys) for keys in matchers[name].match_many(pubs))
        points[name].selectivity = hits / (len(pubs) * size)
    for call in ("match", "match_groups"):
        best = dict.fromkeys(kinds, float("inf"))
        for _ in range(repeat):
            for name, matcher in matchers.items():
                best[name] = min(best[name], _pass(getattr(matcher, call), pubs))
        for name in kinds:
            points[name].rates[call] = len(pubs) / best[name]
    if churn:
        spare, _ = workload(shape, size, seed=size + 1)
        state = {name: (random.Random(1), list(range(size)), [10 * size]) for name in kinds}
        for per_match in CHURN:
            best = dict.fromkeys(kinds, float("inf"))
            for _ in range(repeat):
                for name, matcher in matchers.items():
                    rng, live, next_key = state[name]
                    elapsed = _churn_pass(
                        matcher, pubs[:churn], spare, per_match, rng, live, next_key
                    )
                    best[name] = min(best[name], elapsed)
            for name in kinds:
                points[name].rates[f"churn {per_match}"] = len(pubs[:churn]) / best[name]
    return points


def _pair(points: dict[str, Point], figure: Callable[[Point], float], form: str) -> str:
    """``base → branch`` (with their ratio for rates), or the branch's figure alone."""
    mine = figure(points["branch"])
    if "baseline" not in points:
        return format(mine, form)
    base = figure(points["baseline"])
    ratio = f" ({mine / base:.2f}×)" if base else ""
    return f"{format(base, form)} → {format(mine, form)}{ratio}"


def rows(results: dict[tuple[str, int], dict[str, Point]]) -> list[str]:
    """The scale table: one row per shape and size."""
    lines = [
        "| shape | subscriptions | match() /s | match_groups /s | add µs | rebuild s "
        "| index B/sub | RSS B/sub | selectivity |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (shape, size), points in sorted(results.items()):
        cells = [
            shape,
            f"{size:,}",
            _pair(points, lambda p: p.rates["match"], ",.0f"),
            _pair(points, lambda p: p.rates["match_groups"], ",.0f"),
            _pair(points, lambda p: p.add_us, ".2f"),
            _pair(points, lambda p: p.rebuild_s, ".2f"),
            _pair(points, lambda p: p.index_bytes, ",.0f"),
            _pair(points, lambda p: p.rss_bytes, ",.0f"),
            f"{points['branch'].selectivity:.2%}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def churn_rows(results: dict[tuple[str, int], dict[str, Point]]) -> list[str]:
    """The churn table: per shape, match() publications/s at each churn."""
    heads = " | ".join(f"{k} out + {k} in" for k in CHURN)
    lines = [
        f"| shape | subscriptions | {heads} |",
        "|---|---:|" + "---:|" * len(CHURN),
    ]
    for (shape, size), points in sorted(results.items()):
        if "churn 0" not in points["branch"].rates:
            continue
        cells = [shape, f"{size:,}"]
        cells += [_pair(points, lambda p, k=k: p.rates[f"churn {k}"], ",.0f") for k in CHURN]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def run(
    sizes: Sequence[int],
    shapes: Sequence[str],
    baseline: Path | None,
    publications: dict[int, int],
    repeat: int,
    churn_size: int | None,
    churn_publications: int,
    log: Callable[[str], None],
    out: Path | None = None,
) -> str:
    """The whole report, as markdown (written to ``out`` too, after every shape).
    ``--baseline``: baseline first; without it, this tree alone."""
    kinds: dict[str, MatcherType] = {}
    if baseline is not None:
        kinds["baseline"] = load_baseline(baseline)
    kinds["branch"] = Matcher
    here = Path(__file__).resolve().parent.parent
    started = time.monotonic()
    load = os.getloadavg()[0]
    results: dict[tuple[str, int], dict[str, Point]] = {}
    names = f"Commit {commit(here)}" + (
        f" against {commit(baseline)} (`{baseline}`)" if baseline else ""
    )

    def report() -> str:
        head = [
            names + f", Python {platform.python_version()}; {time.monotonic() - started:.0f} s, "
            f"load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end. "
            "Cells with two figures are baseline → this tree (ratio).",
            "",
        ]
        churn_table = churn_rows(results)
        if len(churn_table) == 2:  # no churn runs
            churn_table = []
        return "\n".join(head + rows(results) + ["", *churn_table]) + "\n"

    for size in sorted(set(sizes) | ({churn_size} if churn_size else set())):
        for shape in shapes:
            log(f"{shape} at {size:,}")
            results[shape, size] = measure(
                kinds,
                shape,
                size,
                publications.get(size, 256),
                repeat,
                churn_publications if size == churn_size else 0,
            )
            if out is not None:
                out.write_text(report())
    return report()


def shape_names() -> list[str]:
    """Every shape: ``stock`` first where the quote data is, then the synthetic ones."""
    return (["stock"] if quotes_dir().is_dir() else []) + sorted(SHAPES)
