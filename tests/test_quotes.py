"""The stock-quote domain: quote files, enrichment, synthetic quotes, stock subscriptions."""

from __future__ import annotations

import random
import re
import statistics
from pathlib import Path

import pytest

from octopis.filters.language import FilterError, Subscription
from octopis.matching import ReferenceMatcher
from octopis.quotes import (
    DEFAULT_QUOTES_DIR,
    STOCK_ATTRIBUTES,
    enrich,
    measure_selectivity,
    quotes_dir,
    random_quotes,
    read_quote_dir,
    read_quote_file,
    stock_subscriptions,
)

REPO = Path(__file__).resolve().parents[1]
EVERY_QUOTE = pytest.mark.xdist_group("quotes")
"""The tests that read every quote file share one worker, so that the files are parsed once."""


@pytest.fixture(scope="module")
def every_quote() -> list[dict]:
    """Every quote of the quote directory, parsed (files by name)."""
    return list(read_quote_dir())


def test_attributes_in_paper_order() -> None:
    assert STOCK_ATTRIBUTES == (
        "class", "symbol", "open", "high", "low", "close", "volume", "date",
        "openClose%Diff", "highLow%Diff",
    )  # fmt: skip


def test_quotes_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    expected = REPO.parent / "shared" / "data" / "stockquotes"
    assert expected == DEFAULT_QUOTES_DIR
    monkeypatch.delenv("OCTOPIS_QUOTES", raising=False)
    assert quotes_dir() == DEFAULT_QUOTES_DIR
    monkeypatch.setenv("OCTOPIS_QUOTES", str(tmp_path))
    assert quotes_dir() == tmp_path


@EVERY_QUOTE
def test_every_quote_parses(every_quote: list[dict]) -> None:
    """All quote files stream through the parser: 100 symbols, 245,190 quotes.

    The data README's 245,090 counts line terminators (``wc -l``); each file's last line
    has none.
    """
    directory = quotes_dir()
    files = sorted(p for p in directory.iterdir() if p.is_file())
    assert len(files) == 100
    terminators = sum(p.read_bytes().count(b"\r\n") for p in files)
    assert terminators == 245_090
    assert len(every_quote) == 245_190
    assert len({quote["symbol"] for quote in every_quote}) == 100


def test_quote_file_contents() -> None:
    quotes = list(read_quote_file(quotes_dir() / "MSFT"))
    assert quotes[0] == {
        "class": "STOCK",
        "symbol": "MSFT",
        "open": 27.0,
        "high": 27.17,
        "low": 26.94,
        "close": 27.07,
        "volume": 94646096,
        "date": "21-Dec-04",
    }
    assert quotes[-1]["date"] == "13-Mar-86"
    for q in quotes:
        assert list(q) == list(STOCK_ATTRIBUTES[:8])
        assert isinstance(q["volume"], int)
        assert all(isinstance(q[a], float) for a in ("open", "high", "low", "close"))


def test_bad_quote_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "BAD"
    path.write_bytes(b"[class,'STOCK'],[close,1.5]\r\n\r\n[class,'STOCK'],[close,x]\r\n")
    with pytest.raises(FilterError, match=r"BAD:3: position 24: invalid value 'x'"):
        list(read_quote_file(path))


def test_enrich() -> None:
    quote = {"class": "STOCK", "open": 63.30, "high": 64.25, "low": 62.05, "close": 64.18}
    enriched = enrich(quote)
    assert enriched["openClose%Diff"] == 0.013902
    assert enriched["highLow%Diff"] == 0.035455
    assert list(enriched)[-2:] == ["openClose%Diff", "highLow%Diff"]
    assert "openClose%Diff" not in quote
    zero = enrich({"open": 0, "high": 1.0, "low": 0, "close": 2.0})
    assert zero["openClose%Diff"] == 0.0 and zero["highLow%Diff"] == 0.0
    with pytest.raises(KeyError):
        enrich({"open": 1.0})


def test_random_quotes() -> None:
    quotes = random_quotes(1000, seed=3, symbols=7)
    assert len(quotes) == 1000
    assert quotes == random_quotes(1000, seed=3, symbols=7)
    assert quotes != random_quotes(1000, seed=4, symbols=7)
    assert len({q["symbol"] for q in quotes}) == 7
    assert quotes[0]["date"] == "2-Jan-95" and quotes[7]["date"] == "3-Jan-95"
    for q in quotes:
        assert tuple(q) == STOCK_ATTRIBUTES
        assert q["class"] == "STOCK"
        assert re.fullmatch(r"[A-Z]{4}", q["symbol"])
        assert re.fullmatch(r"\d{1,2}-[A-Z][a-z]{2}-\d\d", q["date"])
        assert q["high"] >= max(q["open"], q["close"]) >= min(q["open"], q["close"]) >= q["low"]
        assert q["low"] > 0 and isinstance(q["volume"], int) and q["volume"] > 0
        assert q == enrich(q)
    assert random_quotes(0, seed=1) == []
    assert len(random_quotes(5, seed=1, symbols=1)) == 5
    with pytest.raises(ValueError):
        random_quotes(5, seed=1, symbols=0)


@pytest.fixture(scope="module")
def real_sample(every_quote: list[dict]) -> list[dict]:
    rng = random.Random(11)
    quotes = [enrich(q) for q in every_quote]
    return rng.sample(quotes, 8000)


@EVERY_QUOTE
def test_stock_subscriptions_hit_the_selectivity(real_sample: list[dict]) -> None:
    subs = stock_subscriptions(real_sample[:4000], 1500, seed=2)
    assert len(subs) == 1500
    assert subs == stock_subscriptions(real_sample[:4000], 1500, seed=2)
    assert subs != stock_subscriptions(real_sample[:4000], 1500, seed=3)
    on_sample = statistics.mean(measure_selectivity(subs, real_sample[:4000]))
    assert 0.016 <= on_sample <= 0.024
    assert abs(on_sample - 0.02) < 0.002
    on_other = statistics.mean(measure_selectivity(subs, real_sample[4000:]))
    assert 0.016 <= on_other <= 0.024
    lower = statistics.mean(
        measure_selectivity(stock_subscriptions(real_sample[:4000], 500, seed=2, selectivity=0.005),
                            real_sample[:4000])
    )  # fmt: skip
    assert 0.004 <= lower <= 0.006


@EVERY_QUOTE
def test_stock_subscription_shapes(real_sample: list[dict]) -> None:
    subs = stock_subscriptions(real_sample[:2000], 1000, seed=9)
    shapes = {"watch": 0, "band": 0, "volatility": 0, "mover": 0, "year": 0}
    for s in subs:
        first, *rest = s.predicates
        assert first.to_text() == "[class,eq,'STOCK']"
        attrs = [p.attr for p in rest]
        if attrs[0] == "symbol":
            shapes["watch"] += 1
            assert attrs == ["symbol", "close"] and rest[1].op in ("<", "<=", ">", ">=")
        elif attrs[0] == "openClose%Diff":
            shapes["mover"] += 1
            assert attrs == ["openClose%Diff", "volume"] and rest[1].op in (">", ">=")
        elif attrs[0] == "date":
            shapes["year"] += 1
            assert rest[0].op == "str-postfix" and re.fullmatch(r"-\d\d", rest[0].value)
        elif attrs == ["highLow%Diff"]:
            shapes["volatility"] += 1
        else:
            shapes["band"] += 1
            assert attrs[0] in ("open", "high", "low", "close") and attrs[0] == attrs[1]
            assert [p.op for p in rest] == [">=", "<="] and rest[0].value <= rest[1].value
    assert 300 <= shapes.pop("watch") <= 400
    assert all(100 <= n <= 220 for n in shapes.values())


def test_measure_selectivity_matches_the_reference() -> None:
    quotes = random_quotes(500, seed=1, symbols=5)
    subs = stock_subscriptions(quotes, 60, seed=1)
    reference = ReferenceMatcher()
    for i, s in enumerate(subs):
        reference.add(i, s)
    hits = [0] * len(subs)
    for q in quotes:
        for k in reference.match(q):
            hits[k] += 1
    assert measure_selectivity(subs, quotes) == [h / 500 for h in hits]
    assert abs(statistics.mean(hits) / 500 - 0.02) < 0.004


def test_stock_subscriptions_edge_cases() -> None:
    quotes = random_quotes(50, seed=3, symbols=1)
    assert stock_subscriptions(quotes, 0, seed=1) == []
    subs = stock_subscriptions(quotes, 30, seed=1)
    assert len(subs) == 30 and all(isinstance(s, Subscription) for s in subs)
    assert all(s > 0 for s in measure_selectivity(subs, quotes))
    one = stock_subscriptions(quotes[:1], 5, seed=1)
    assert measure_selectivity(one, quotes[:1]) == [1.0] * 5
    with pytest.raises(ValueError, match="no quotes with class 'STOCK'"):
        stock_subscriptions([{"class": "BOND", "close": 1.0}], 5, seed=1)
    with pytest.raises(ValueError, match="selectivity"):
        stock_subscriptions(quotes, 5, seed=1, selectivity=0)
    with pytest.raises(ValueError, match="count"):
        stock_subscriptions(quotes, -1, seed=1)
    with pytest.raises(ValueError, match="empty sample"):
        measure_selectivity(subs, [])
