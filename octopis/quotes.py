"""The stock-quote domain of the paper's evaluation (§7: quotes with 10 attributes,
subscriptions of 2% selectivity): reading the PADRES quote files, synthetic quotes, and
stock subscriptions of a chosen selectivity.

The quote files (``<repo>/../shared/data/stockquotes``, one per symbol, CRLF lines) hold
8 attributes per quote; :func:`enrich` adds the paper's two derived ones.
"""

from __future__ import annotations

import math
import os
import random
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from datetime import date, timedelta
from pathlib import Path

from octopis.filters.language import (
    FilterError,
    Predicate,
    Publication,
    Subscription,
    parse_publication,
)
from octopis.matching import Matcher

STOCK_ATTRIBUTES = (
    "class",
    "symbol",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "date",
    "openClose%Diff",
    "highLow%Diff",
)
"""The paper's 10 attributes, in order; the last two are derived by :func:`enrich`."""

QUOTES_ENV = "OCTOPIS_QUOTES"
DEFAULT_QUOTES_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "stockquotes"
"""``<repo>/../shared/data/stockquotes``: where CI clones the shared data beside the repo."""

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def quotes_dir() -> Path:
    """The quote directory: ``$OCTOPIS_QUOTES`` if set, else :data:`DEFAULT_QUOTES_DIR`."""
    configured = os.environ.get(QUOTES_ENV)
    return Path(configured) if configured else DEFAULT_QUOTES_DIR


def read_quote_file(path: str | Path) -> Iterator[Publication]:
    """The quotes of one PADRES quote file, one publication per non-blank line.

    A malformed line raises :class:`FilterError` naming the file and line.
    """
    with open(path, encoding="utf-8", newline="") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield parse_publication(line)
                except FilterError as exc:
                    raise FilterError(f"{path}:{number}: {exc}") from None


def read_quote_dir(directory: str | Path | None = None) -> Iterator[Publication]:
    """The quotes of every file in ``directory`` (default :func:`quotes_dir`), files by name."""
    root = Path(directory) if directory is not None else quotes_dir()
    for path in sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith(".")):
        yield from read_quote_file(path)


def enrich(pub: Publication) -> Publication:
    """A copy of a quote with ``openClose%Diff`` = (close−open)/open and
    ``highLow%Diff`` = (high−low)/low, rounded to 6 decimals (0.0 when the divisor is 0).

    Needs numeric ``open``, ``high``, ``low`` and ``close`` (KeyError if one is missing).
    """
    o, h, lo, c = pub["open"], pub["high"], pub["low"], pub["close"]
    return {
        **pub,
        "openClose%Diff": round((c - o) / o, 6) if o else 0.0,
        "highLow%Diff": round((h - lo) / lo, 6) if lo else 0.0,
    }


def _ticker(i: int) -> str:
    """A distinct four-letter symbol for every i < 26**4."""
    n = (i * 7919 + 4321) % 26**4
    letters = []
    for _ in range(4):
        n, r = divmod(n, 26)
        letters.append(chr(ord("A") + r))
    return "".join(letters)


def _date_text(d: date) -> str:
    return f"{d.day}-{_MONTHS[d.month - 1]}-{d.year % 100:02d}"


def random_quotes(count: int, seed: int, symbols: int = 100) -> list[Publication]:
    """``count`` synthetic quotes with all 10 attributes, deterministic by ``seed``.

    Each of ``symbols`` symbols follows a geometric random walk (own start price, daily
    volatility 1–4%, base volume 50k–20M, lognormal day-to-day volume). Quotes come day
    by day (business days from 2 Jan 1995), every symbol once a day, like a live feed.
    """
    if count < 0 or symbols < 1:
        raise ValueError(f"need count ≥ 0 and symbols ≥ 1, got {count} and {symbols}")
    rng = random.Random(seed)
    names = [_ticker(i) for i in range(symbols)]
    price = [math.exp(rng.uniform(math.log(2.0), math.log(300.0))) for _ in range(symbols)]
    sigma = [rng.uniform(0.01, 0.04) for _ in range(symbols)]
    volume = [math.exp(rng.uniform(math.log(5e4), math.log(2e7))) for _ in range(symbols)]
    quotes: list[Publication] = []
    day = date(1995, 1, 2)
    while len(quotes) < count:
        label = _date_text(day)
        for s in range(min(symbols, count - len(quotes))):
            open_ = max(0.01, round(price[s] * math.exp(rng.gauss(0.0, sigma[s] / 4)), 2))
            close = max(0.01, round(open_ * math.exp(rng.gauss(0.0002, sigma[s])), 2))
            high = round(max(open_, close) * math.exp(abs(rng.gauss(0.0, sigma[s] / 2))), 2)
            low = max(
                0.01, round(min(open_, close) * math.exp(-abs(rng.gauss(0.0, sigma[s] / 2))), 2)
            )
            price[s] = close
            quote: Publication = {
                "class": "STOCK",
                "symbol": names[s],
                "open": open_,
                "high": high,
                "low": low,
                "close": close,
                "volume": int(volume[s] * math.exp(rng.gauss(0.0, 0.5))),
                "date": label,
            }
            quotes.append(enrich(quote))
        day += timedelta(days=3 if day.weekday() == 4 else 1)
    return quotes


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _year(quote: Publication) -> str | None:
    """The ``-YY`` end of a quote's date, if it has a textual date."""
    d = quote.get("date")
    return d[d.rindex("-") :] if isinstance(d, str) and "-" in d else None


class _Sample:
    """Sorted values of one attribute among subsets of the sample's stock quotes."""

    def __init__(self, sample: Sequence[Publication]) -> None:
        self.size = len(sample)
        self.stocks = [q for q in sample if q.get("class") == "STOCK"]
        if not self.stocks:
            raise ValueError("the sample holds no quotes with class 'STOCK'")
        self._groups: dict[tuple[str, object], list[Publication]] = {}
        for q in self.stocks:
            self._groups.setdefault(("symbol", q.get("symbol")), []).append(q)
            self._groups.setdefault(("year", _year(q)), []).append(q)
        moving = sorted(
            (q["openClose%Diff"], q["volume"])
            for q in self.stocks
            if _number(q.get("openClose%Diff")) and _number(q.get("volume"))
        )
        self.moves = [m for m, _ in moving]
        self._volumes = [v for _, v in moving]
        self._cache: dict[tuple[str, object, str], list[float]] = {}

    def values(self, attr: str, group: tuple[str, object] | None = None) -> list[float]:
        """Sorted numeric values of ``attr`` over all stock quotes or one ``group``
        (``("symbol", s)``: quotes of symbol s; ``("year", "-YY")``: quotes of one year)."""
        key = (*(group or ("all", None)), attr)
        if key not in self._cache:
            quotes = self.stocks if group is None else self._groups.get(group, [])
            self._cache[key] = sorted(q[attr] for q in quotes if _number(q.get(attr)))
        return self._cache[key]

    def volumes_moving(self, predicate: Predicate) -> list[float]:
        """Sorted volumes of the quotes whose ``openClose%Diff`` satisfies ``predicate``
        (``>`` or ``<`` a constant)."""
        key = ("move", predicate, "volume")
        if key not in self._cache:
            if predicate.op == ">":
                chosen = self._volumes[bisect_right(self.moves, predicate.value) :]
            else:
                chosen = self._volumes[: bisect_left(self.moves, predicate.value)]
            self._cache[key] = sorted(chosen)
        return self._cache[key]


def _below(xs: list[float], k: int, rng: random.Random) -> tuple[str, float]:
    """``value < c`` or ``value <= c`` holding for the k smallest of sorted ``xs`` (ties aside)."""
    if k < len(xs) and rng.random() < 0.5:
        return "<", xs[k]
    return "<=", xs[k - 1]


def _above(xs: list[float], k: int, rng: random.Random) -> tuple[str, float]:
    """``value > c`` or ``value >= c`` holding for the k largest of sorted ``xs`` (ties aside)."""
    n = len(xs)
    if k < n and rng.random() < 0.5:
        return ">", xs[n - 1 - k]
    return ">=", xs[n - k]


_SHAPES = (("watch", 0.35), ("band", 0.20), ("volatility", 0.15), ("mover", 0.15), ("year", 0.15))
_PRICES = ("open", "high", "low", "close")
_MOVE_LEVELS = (0.5, 0.7, 0.8, 0.9, 0.95)


def stock_subscriptions(
    sample: Sequence[Publication], count: int, seed: int, selectivity: float = 0.02
) -> list[Subscription]:
    """``count`` stock subscriptions whose mean selectivity over ``sample`` is about
    ``selectivity`` (paper §7: 2%), deterministic by ``seed``.

    Every subscription starts with ``[class,eq,'STOCK']`` (PADRES style) and has one of
    five shapes, chosen with these weights:

    * 35% *watch* — one symbol below or above a price:
      ``[symbol,eq,'MSFT'],[close,<,27.5]``; the symbol is drawn in proportion to its
      quotes, so these are the most selective (at most the symbol's share);
    * 20% *band* — a price attribute (open/high/low/close) in a window:
      ``[low,>=,20.1],[low,<=,21.3]``;
    * 15% *volatility* — ``[highLow%Diff,>=,0.061]``;
    * 15% *mover* — a move beyond a quantile and heavy trading:
      ``[openClose%Diff,>,0.012],[volume,>=,2500000]`` (or a fall, with ``<``);
    * 15% *year* — a year and a price: ``[date,str-postfix,'-99'],[close,>,80]``.

    Each subscription aims at its own selectivity, ``selectivity`` × U(0.5, 1.5) scaled by
    one common factor so that the mean over all of them hits the target; the free
    threshold is read off the sorted sample values, so the selectivity over ``sample`` is
    known exactly while building (ties aside). Quotes that lack an attribute count as not
    matching. The quotes should carry the 10 :data:`STOCK_ATTRIBUTES`.
    """
    if count < 0:
        raise ValueError(f"count must be ≥ 0, got {count}")
    if not 0 < selectivity <= 1:
        raise ValueError(f"selectivity must be in (0, 1], got {selectivity}")
    if count == 0:
        return []
    rng = random.Random(seed)
    data = _Sample(sample)
    stock = Predicate("class", "eq", "STOCK")
    names, weights = zip(*_SHAPES, strict=True)
    moves = data.moves

    # Each subscription: its fixed predicates, the attribute whose threshold is free and the
    # sorted values of that attribute among the quotes the fixed predicates accept.
    plans: list[tuple[str, tuple[Predicate, ...], str, list[float]]] = []
    for shape in rng.choices(names, weights, k=count):
        quote = rng.choice(data.stocks)
        fixed: tuple[Predicate, ...] = ()
        attr = "close"
        if shape == "watch" and isinstance(quote.get("symbol"), str):
            fixed = (Predicate("symbol", "eq", quote["symbol"]),)
            xs = data.values(attr, ("symbol", quote["symbol"]))
        elif shape == "mover" and moves:
            level = rng.choice(_MOVE_LEVELS)
            if rng.random() < 0.5:
                fixed = (Predicate("openClose%Diff", ">", moves[int(level * (len(moves) - 1))]),)
            else:
                cut = moves[int((1 - level) * (len(moves) - 1))]
                fixed = (Predicate("openClose%Diff", "<", cut),)
            attr = "volume"
            xs = data.volumes_moving(fixed[0])
        elif shape == "year" and _year(quote):
            fixed = (Predicate("date", "str-postfix", _year(quote)),)
            xs = data.values(attr, ("year", _year(quote)))
        else:
            attr = "highLow%Diff" if shape == "volatility" else rng.choice(_PRICES)
            xs = data.values(attr)
        if (not fixed and shape != "volatility") or not xs:
            shape, fixed, xs = "band", (), data.values(attr)
        if not xs:
            shape, attr, xs = "band", "close", data.values("close")
        if not xs:
            raise ValueError("the sample's stock quotes have no numeric 'close'")
        plans.append((shape, fixed, attr, xs))

    # Targets: min(cap, λ·u·selectivity) with λ chosen so that the mean is the target.
    caps = [len(xs) / data.size for _, _, _, xs in plans]
    spread = [rng.uniform(0.5, 1.5) for _ in plans]

    def mean_at(scale: float) -> float:
        return (
            sum(min(c, scale * u * selectivity) for c, u in zip(caps, spread, strict=True)) / count
        )

    low, high = 0.0, 1.0
    while mean_at(high) < selectivity and high < 1e6:
        high *= 2
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if mean_at(mid) < selectivity else (low, mid)
    subscriptions = []
    for (shape, fixed, attr, xs), cap, u in zip(plans, caps, spread, strict=True):
        k = max(1, min(len(xs), round(min(cap, high * u * selectivity) * data.size)))
        if shape == "band":
            start = rng.randrange(len(xs) - k + 1)
            free = [Predicate(attr, ">=", xs[start]), Predicate(attr, "<=", xs[start + k - 1])]
        else:
            upward = shape in ("volatility", "mover") or rng.random() < 0.5
            op, c = (_above if upward else _below)(xs, k, rng)
            free = [Predicate(attr, op, c)]
        subscriptions.append(Subscription((stock, *fixed, *free)))
    return subscriptions


def measure_selectivity(subs: Sequence[Subscription], sample: Sequence[Publication]) -> list[float]:
    """For each subscription, the fraction of ``sample`` it matches (compiled matcher)."""
    if not sample:
        raise ValueError("cannot measure selectivity over an empty sample")
    matcher = Matcher()
    for i, s in enumerate(subs):
        matcher.add(i, s)
    hits = [0] * len(subs)
    for keys in matcher.match_many(sample):
        for k in keys:
            hits[k] += 1
    return [h / len(sample) for h in hits]
