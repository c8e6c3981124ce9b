"""Medians with bootstrap intervals, and the verdict on a paper's ratio (issue 20).

An experiment repeats every point several times, modes interleaved; a figure is the
median of its runs, with a 95% percentile-bootstrap interval (runs resampled with
replacement). A claimed change (e.g. −47% notification delay against BID) is judged
from the interval of our change, never from one run:

- **not reproduced**: the interval lies wholly within ±half the claim (whatever its sign,
  the change is too small to be the claim), or wholly on the other side of zero;
- **reproduced**: the interval lies wholly on the claim's side of zero (and reaches half
  its size);
- **inconclusive**: otherwise (the interval holds zero and changes of the claim's size).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence

RESAMPLES = 2000
LEVEL = 0.95


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(values) if values else math.nan


def _interval(samples: list[float]) -> tuple[float, float]:
    finite = sorted(s for s in samples if not math.isnan(s))
    if not finite:
        return math.nan, math.nan
    tail = (1 - LEVEL) / 2
    low = finite[int(tail * (len(finite) - 1))]
    high = finite[math.ceil((1 - tail) * (len(finite) - 1))]
    return low, high


def median_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """``(median, low, high)``: the median of ``values`` and its 95% bootstrap interval
    (the median itself for a single value)."""
    values = list(values)
    if len(values) < 2:
        m = median(values)
        return m, m, m
    rng = random.Random(seed)
    samples = [median(rng.choices(values, k=len(values))) for _ in range(RESAMPLES)]
    return (median(values), *_interval(samples))


def change_interval(
    groups: Mapping[tuple, Sequence[float]],
    pairs: Sequence[tuple[tuple, tuple]],
    seed: int = 0,
) -> tuple[float, float, float]:
    """The mean over ``pairs`` ``(ours, base)`` of the relative change of the median of
    ``groups[ours]`` from that of ``groups[base]`` (−0.25 = 25% lower), and its 95%
    bootstrap interval (each group's runs resampled on their own)."""

    def mean_change(pick: Callable[[Sequence[float]], Sequence[float]]) -> float:
        changes = []
        for ours, base in pairs:
            b = median(pick(groups[base]))
            changes.append((median(pick(groups[ours])) - b) / b if b else math.nan)
        return sum(changes) / len(changes) if changes else math.nan

    estimate = mean_change(lambda values: values)
    if all(len(groups[key]) < 2 for pair in pairs for key in pair):
        return estimate, estimate, estimate
    rng = random.Random(seed)
    samples = [
        mean_change(lambda values: rng.choices(values, k=len(values))) for _ in range(RESAMPLES)
    ]
    return (estimate, *_interval(samples))


def verdict(claim: float, low: float, high: float, runs: int) -> str:
    """``reproduced``, ``not reproduced`` or ``inconclusive`` (module docstring); a
    single run per group is always inconclusive; no claim or no figure: ``–``."""
    if math.isnan(claim) or math.isnan(low) or math.isnan(high):
        return "–"
    if runs < 2:
        return "inconclusive"
    sign = 1 if claim > 0 else -1
    if -abs(claim) / 2 < low and high < abs(claim) / 2:
        return "not reproduced"
    if sign * low < 0 and sign * high < 0:
        return "not reproduced"
    if sign * low > 0 and sign * high > 0:
        return "reproduced"
    return "inconclusive"
