"""Daily quote series and the block bootstrap that derives synthetic symbols from real ones.

The paper's workloads use 500 stock symbols (§7.1); real inputs hold fewer (100 PADRES
files, 6 embedded series). A synthetic symbol's series is a *block bootstrap* of real
trading days: blocks of :data:`BLOCK_LENGTH` consecutive days, each block from one real
series, drawn uniformly and concatenated. A day carries its close-to-close log return, its
open/high/low relative to its close, and its volume relative to its series' median volume,
so every synthetic day has a real day's shape (high ≥ open, close ≥ low as in the source).

The closes follow the bootstrapped returns with a weak pull towards the starting price
(log-price AR(1), half-life :data:`HALF_LIFE_DAYS` trading days), so that long series
(e.g. a high-rate publisher's 100,000 quotes) stay in a realistic price range instead of
drifting by orders of magnitude. Prices are rounded like the normalized real quotes (cents,
4 decimals below 1); dates are consecutive business days. The same bootstrap *extends* a
real series that is shorter than a publisher's feed, continuing from its last quote.

Everything is deterministic by the ``numpy`` generator passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

BLOCK_LENGTH = 20
"""Trading days per bootstrap block (about one month)."""
HALF_LIFE_DAYS = 250.0
"""Half-life of the pull of a synthetic log price towards its start (about one year)."""
MIN_PRICE = 0.0001


@dataclass(frozen=True)
class Series:
    """One symbol's quotes in date order; ``extended`` quotes at the end are bootstrapped."""

    symbol: str
    synthetic: bool
    day: np.ndarray  # datetime64[D]
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray  # int64
    extended: int = 0

    def __len__(self) -> int:
        return len(self.close)


def split_by_symbol(table: pa.Table) -> list[Series]:
    """The real series of a normalized quote table sorted by symbol and date."""
    symbols = table.column("symbol").to_numpy(zero_copy_only=False)
    if len(symbols) == 0:
        return []
    starts = np.flatnonzero(np.r_[True, symbols[1:] != symbols[:-1]])
    ends = np.r_[starts[1:], len(symbols)]
    day = table.column("date").to_numpy().astype("datetime64[D]")
    arrays = {
        name: table.column(name).to_numpy() for name in ("open", "high", "low", "close", "volume")
    }
    return [
        Series(
            str(symbols[a]),
            False,
            day[a:b],
            *(arrays[name][a:b] for name in ("open", "high", "low", "close", "volume")),
        )
        for a, b in zip(starts, ends, strict=True)
    ]


def round_prices(x: np.ndarray) -> np.ndarray:
    """Cents, 4 decimals below 1, never below :data:`MIN_PRICE`."""
    return np.maximum(np.where(x >= 1, np.round(x, 2), np.round(x, 4)), MIN_PRICE)


class Bootstrap:
    """The pool of real trading days that synthetic and extended series are drawn from."""

    def __init__(self, real: Sequence[Series], block: int = BLOCK_LENGTH) -> None:
        if block < 1:
            raise ValueError(f"block length must be ≥ 1, got {block}")
        usable = [s for s in real if len(s) >= 2]
        if not usable:
            raise ValueError("the block bootstrap needs a real series of two or more quotes")
        self.block = min(block, max(len(s) - 1 for s in usable))
        returns, opens, highs, lows, volumes, starts = [], [], [], [], [], []
        offset = 0
        for s in usable:
            days = len(s) - 1
            returns.append(np.log(s.close[1:] / s.close[:-1]))
            opens.append(s.open[1:] / s.close[1:])
            highs.append(s.high[1:] / s.close[1:])
            lows.append(s.low[1:] / s.close[1:])
            volumes.append(s.volume[1:] / _base_volume(s.volume))
            if days >= self.block:
                starts.append(offset + np.arange(days - self.block + 1))
            offset += days
        self.returns = np.concatenate(returns)
        self.open = np.concatenate(opens)
        self.high = np.concatenate(highs)
        self.low = np.concatenate(lows)
        self.volume = np.concatenate(volumes)
        self.starts = np.concatenate(starts)
        self.first_closes = np.array([s.close[0] for s in usable])
        self.base_volumes = np.array([_base_volume(s.volume) for s in usable])
        self.first_days = np.array([s.day[0] for s in usable])
        self.median_length = int(np.median([len(s) for s in real]))
        self.pull = 1.0 - 0.5 ** (1.0 / HALF_LIFE_DAYS)

    def synthesize(self, symbol: str, length: int, rng: np.random.Generator) -> Series:
        """A synthetic series of ``length`` quotes: start price, base volume and first day
        are those of a real series drawn by ``rng``."""
        source = int(rng.integers(len(self.first_closes)))
        first = np.busday_offset(self.first_days[source], 0, roll="forward")
        return self._walk(
            symbol,
            length,
            rng,
            start_close=float(self.first_closes[source]),
            base_volume=float(self.base_volumes[source]),
            first_day=first,
            synthetic=True,
        )

    def extend(self, series: Series, length: int, rng: np.random.Generator) -> Series:
        """``series`` continued by bootstrapped days up to ``length`` quotes."""
        missing = length - len(series)
        if missing <= 0:
            return series
        tail = self._walk(
            series.symbol,
            missing,
            rng,
            start_close=float(series.close[-1]),
            base_volume=_base_volume(series.volume),
            first_day=np.busday_offset(series.day[-1], 1, roll="forward"),
            synthetic=series.synthetic,
        )
        return Series(
            series.symbol,
            series.synthetic,
            np.concatenate([series.day, tail.day]),
            *(
                np.concatenate([getattr(series, a), getattr(tail, a)])
                for a in ("open", "high", "low", "close", "volume")
            ),
            extended=series.extended + missing,
        )

    def _walk(
        self,
        symbol: str,
        length: int,
        rng: np.random.Generator,
        *,
        start_close: float,
        base_volume: float,
        first_day: np.datetime64,
        synthetic: bool,
    ) -> Series:
        blocks = rng.choice(self.starts, size=math.ceil(length / self.block))
        days = (blocks[:, None] + np.arange(self.block)).ravel()[:length]
        level, keep = 0.0, 1.0 - self.pull
        levels = []
        for r in self.returns[days].tolist():
            level = keep * level + r
            levels.append(level)
        close = start_close * np.exp(np.array(levels))
        open_ = round_prices(close * self.open[days])
        high = round_prices(close * self.high[days])
        low = round_prices(close * self.low[days])
        close = round_prices(close)
        return Series(
            symbol,
            synthetic,
            np.busday_offset(first_day, np.arange(length), roll="forward"),
            open_,
            np.maximum.reduce([high, open_, close]),
            np.minimum.reduce([low, open_, close]),
            close,
            np.round(base_volume * self.volume[days]).astype(np.int64),
        )


def _base_volume(volume: np.ndarray) -> float:
    """A series' typical volume: the median, else the mean, else 1."""
    median = float(np.median(volume))
    if median > 0:
        return median
    mean = float(np.mean(volume))
    return mean if mean > 0 else 1.0
