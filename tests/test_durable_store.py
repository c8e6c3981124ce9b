"""A retention store's answers to historic queries (DESIGN §11): a window answered page by
page exactly as the reference matcher, cut at the answer's bounds; and the times a query
names, read in every documented form."""

from __future__ import annotations

from pathlib import Path

import pytest
from conditions import mixed_quotes

from octopis.client.replay import parse_time
from octopis.core.codec import encode_body
from octopis.core.messages import Notification
from octopis.core.replay import Replay
from octopis.filters.language import Publication, parse_subscription
from octopis.settings import Retention
from octopis.transport.replaying import _decode_kept
from octopis.transport.retention import RetentionStore, StoreAnswer


def _store(tmp_path: Path) -> RetentionStore:
    return RetentionStore(tmp_path / "r.sqlite", Retention(max_bytes=2**30), _decode_kept)


def _fill(store: RetentionStore, publications: list[Publication], start: float) -> None:
    for seq, publication in enumerate(publications, 1):
        n = Notification("P", seq, start + seq, publication, session=1)
        store.add(n, encode_body(n), start + seq)
    store.commit(start + len(publications))


def test_a_store_answers_a_window_page_by_page_exactly_as_the_reference_matcher(
    tmp_path: Path,
) -> None:
    quotes = mixed_quotes(("MSFT", "INTC", "ORCL"), 600)
    store = _store(tmp_path)
    _fill(store, quotes, 1000.0)
    text = "[class,eq,'STOCK'],[close,>,25]"
    reference = parse_subscription(text)
    request = Replay("r", "a:0", (text,), (), 1100.5, 30.0, until=1450.5)
    expected = [s for s, q in enumerate(quotes, 1) if 1100.5 <= 1000 + s < 1450.5]
    expected = [s for s in expected if reference.matches(quotes[s - 1])]
    answer = StoreAnswer(store, request, 0, 0)
    pages = []
    while not answer.done:
        pages.append([n.seq for n in answer.page(7)])
    assert len(pages) > 10 and [s for page in pages for s in page] == expected
    assert not answer.truncated and answer.gaps == []
    cut = StoreAnswer(store, Replay("r", "a:0", (text,), (), 0.0, 30.0, answer_max=5), 0, 0)
    every = [s for s in range(1, 601) if reference.matches(quotes[s - 1])]
    assert [n.seq for n in cut.page(1000)] == every[:5]
    assert cut.done and cut.truncated
    body = len(encode_body(Notification("P", 1, 1001.0, quotes[0], session=1)))
    small = StoreAnswer(store, Replay("r", "a:0", ("[class,eq,'STOCK']",), (), 0.0, 30.0), 0, body)
    assert len(small.page(1000)) <= 1 and small.truncated


def test_times_are_read_in_every_documented_form() -> None:
    now = 1_800_000_000.0
    assert parse_time("all") == 0.0 and parse_time("now", now) == now
    assert parse_time("10m", now) == now - 600 and parse_time("1.5h", now) == now - 5400
    assert parse_time("2026-11-27T10:00Z") == parse_time("2026-11-27T10:00:00+00:00")
    assert parse_time(12.5) == 12.5
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time("yesterday")
