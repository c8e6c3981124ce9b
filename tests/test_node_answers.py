"""What a retention store answers to a replay (``octopis.core.answer``, DESIGN §11), the
same rules in the simulator's stores and the broker process's SQLite store: a replay's
``until`` and bounds cut both answers alike (the simulator used to ignore both), both
report what they trimmed as the same gaps (the simulator reported none), both read a
window by their own time of storing, and the node's answer selection cuts at its bounds
and reads no further than it needs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_scenarios import fig2_settled

from octopis.core import (
    Notification,
)
from octopis.core.answer import CLOCK_SLACK, AnswerSelection, Kept, RetentionBound
from octopis.core.codec import encode_body
from octopis.core.replay import Replay
from octopis.defaults import PAGE_ROWS
from octopis.settings import Retention
from octopis.sim.stores import RetentionStores
from octopis.topology import build_preset
from octopis.transport.retention import RetentionStore, StoreAnswer

FIG2 = build_preset("fig2")


def _retained(count: int) -> list[Notification]:
    return [
        Notification(f"P{i % 3}", i // 3 + 1, 100.0 + i, {"x": i % 7, "sym": "A"})
        for i in range(count)
    ]


@pytest.mark.parametrize(
    "window",
    [
        {},
        {"until": 130.0},
        {"answer_max": 5},
        {"since": (("P1", 0, 4), ("P2", 0, 9))},
        {"until": 150.0, "answer_max": 7, "since": (("P0", 0, 3),)},
    ],
)
def test_the_simulator_answers_a_replay_as_the_process_store_does(
    tmp_path: Path, window: dict
) -> None:
    """The same retained publications and the same request, answered by the process's
    SQLite store and by the simulator's memory store: the same publications, the same
    cut (``until``, ``since`` per publisher and session, ``answer_max``)."""
    notes = _retained(60)
    store = RetentionStore(
        tmp_path / "r.sqlite", Retention(max_bytes=1 << 20), lambda body: _decode(body)
    )
    for n in notes:
        store.add(n, encode_body(n), n.published_at)
    store.commit(200.0)
    request = Replay("r", "c:0", ("[x,<,4]",), window.get("since", ()), 110.0, 1.0,
                     until=window.get("until", float("inf")),
                     answer_max=window.get("answer_max", 0))  # fmt: skip
    answer = StoreAnswer(store, request, 0, 0)
    found = []
    while not answer.done:
        found += answer.page(7)
    sim = fig2_settled("snr")
    for n in notes:  # stored when published, as the process's store was told
        sim.retention.keep("c:0", n, n.published_at)
    simulated, gaps, truncated = sim.retention.answer("c:0", request)
    assert [n.key for n in found] == [n.key for n in simulated]
    assert answer.gaps == gaps == []
    assert answer.truncated == truncated == ("answer_max" in window)
    assert found, "the request matches something"
    store.close()


@pytest.mark.parametrize(
    ("case", "expected_gaps"),
    [
        ({"trim": 20}, [("P0", 0, 1, 7), ("P1", 0, 1, 7), ("P2", 0, 1, 6)]),
        ({"trim": 20, "since": (("P1", 0, 3), ("P2", 0, 6))}, [("P0", 0, 1, 7), ("P1", 0, 4, 7)]),
        ({"trim": 20, "after": 118.5}, [("P1", 0, 1, 7)]),
        ({"answer_max": 5}, []),
        (
            {"trim": 20, "answer_max": 4, "until": 150.0},
            [("P0", 0, 1, 7), ("P1", 0, 1, 7), ("P2", 0, 1, 6)],
        ),
    ],
)
def test_both_stores_report_what_they_trimmed_and_cut_at_their_bounds(
    tmp_path: Path, case: dict, expected_gaps: list
) -> None:
    """60 publications of one encoded size, of which the oldest ``trim`` are dropped (the
    SQLite store past ``max_bytes``, the simulator's past its count); each store answers
    with the brokers' bounds (``[retention] answer_max``): the same publications, the
    same gaps (what was dropped that the request asks for) and the same cut."""
    notes = _retained(60)
    size = len(encode_body(notes[0]))
    assert {len(encode_body(n)) for n in notes} == {size}
    kept = len(notes) - case.get("trim", 0)
    retention = Retention(max_bytes=kept * size, answer_max=case.get("answer_max", 100_000))
    store = RetentionStore(tmp_path / "r.sqlite", retention, _decode)
    stores = RetentionStores(Counter(), kept, retention.answer_max, retention.answer_bytes)
    for n in notes:
        store.add(n, encode_body(n), n.published_at)
        store.commit(n.published_at)
        stores.keep("c:0", n, n.published_at)
    assert store.rows == len(stores.kept["c:0"]) == kept
    request = Replay("r", "c:0", ("[x,<,4]",), case.get("since", ()), case.get("after", 0.0), 1.0,
                     until=case.get("until", float("inf")))  # fmt: skip
    answer = StoreAnswer(store, request, retention.answer_max, retention.answer_bytes)
    found = []
    while not answer.done:
        found += answer.page(7)
    simulated, gaps, truncated = stores.answer("c:0", request)
    assert found, "the request matches something kept"
    assert [n.key for n in found] == [n.key for n in simulated]
    assert answer.gaps == gaps == expected_gaps
    assert answer.truncated == truncated == ("answer_max" in case)
    assert len(found) == case.get("answer_max", len(found))
    store.close()


def test_the_retention_bound_drops_the_aged_then_the_oldest_and_reads_no_further() -> None:
    """What a store drops (its own bounds, DESIGN §11), once for both stores: every row
    stored wholly before ``max_age``, then the oldest while the store holds more than
    ``max_total``; the rows after the first it keeps are not read."""
    rows = [(1, 10, 100.0), (2, 10, 200.0), (3, 10, 300.0), (4, 10, 400.0)]
    aged = RetentionBound(25, max_age=150.0)
    assert aged.over(40, 100.0, 390.0) and not aged.over(20, 300.0, 390.0)
    assert aged.over(20, 200.0, 390.0)  # within max_total, its oldest past max_age
    rest = iter(rows)
    assert aged.cut(rest, 40, 390.0) == [1, 2]
    assert next(rest) == rows[3]  # row 3 ended the reading: row 4 was never read
    assert RetentionBound(15).cut(rows, 40, 390.0) == [1, 2, 3]  # no age bound
    assert RetentionBound(40, max_age=1000.0).cut(rows, 40, 390.0) == []


def test_both_stores_read_a_replay_window_by_their_own_time_of_storing(tmp_path: Path) -> None:
    """A store reads by its time of storing, a request asks by the publisher's clock:
    rows stored more than :data:`CLOCK_SLACK` before ``after`` answer nothing, and the
    first stored that long past ``until`` ends the reading, in both stores. A publisher
    whose clock runs 100 s ahead of its broker (past the slack) is missed by both."""
    ahead = [n._replace(published_at=n.published_at + 100.0) for n in _retained(60)]
    request = Replay("r", "c:0", ("[x,<,9]",), (), 205.0, 1.0)
    selection = AnswerSelection(request)
    assert selection.start_at == 205.0 - CLOCK_SLACK
    taken = [
        n
        for n in ahead
        if selection.take(n.publisher, 0, n.seq, n.published_at, n.published_at - 100.0, 0,
                          lambda n=n: n) is not None
    ]  # fmt: skip
    stored_late_enough = [n for n in ahead if n.published_at - 100.0 >= 205.0 - CLOCK_SLACK]
    assert taken == stored_late_enough
    assert len(taken) < sum(n.published_at >= 205.0 for n in ahead)  # the clock's miss
    stores = RetentionStores(Counter())
    for n in ahead:
        stores.keep("c:0", n, n.published_at - 100.0)  # stored by the broker's clock
    simulated, _, _ = stores.answer("c:0", request)
    store = RetentionStore(tmp_path / "r.sqlite", Retention(max_bytes=1 << 20), _decode)
    for n in ahead:
        store.add(n, encode_body(n), n.published_at - 100.0)
    store.commit(300.0)
    assert simulated == taken
    assert [n.key for n in store.answer(request)[0]] == [n.key for n in taken]
    store.close()
    late = AnswerSelection(Replay("r", "c:0", ("[x,<,9]",), (), 0.0, 1.0, until=100.0))
    assert late.take("P0", 0, 1, 50.0, 100.0 + CLOCK_SLACK, 0, lambda: ahead[0]) is not None
    assert not late.ended
    assert late.take("P0", 0, 2, 50.0, 101.0 + CLOCK_SLACK, 0, lambda: ahead[0]) is None
    assert late.ended  # stored past the window: the store reads no further


def _decode(body: bytes) -> Notification:
    from octopis.core.codec import decode_body

    return decode_body("c:0", body)


def test_answer_selection_cuts_at_bytes() -> None:
    request = Replay("r", "c:0", ("[x,<,9]",), (), 0.0, 1.0, answer_bytes=25)
    selection = AnswerSelection(request)
    notes = _retained(5)
    taken = [
        selection.take(n.publisher, 0, n.seq, n.published_at, n.published_at, 10, lambda n=n: n)
        for n in notes
    ]
    assert taken[:2] == notes[:2] and taken[2] is None and selection.truncated


def test_answer_selection_chooses_rows_until_it_ends_and_reads_no_further() -> None:
    """:meth:`AnswerSelection.choose`, the loop both stores read with: what it takes of
    the rows in order, past the cut nothing more, and no row after the one that ended it
    is read (a store stops reading)."""
    notes = _retained(8)
    read: list[int] = []

    def rows() -> Iterator[Kept]:
        for n in notes:
            read.append(n.seq)
            yield n.publisher, 0, n.seq, n.published_at, n.published_at, 10, lambda n=n: n

    cut = AnswerSelection(Replay("r", "c:0", ("[x,<,9]",), (), 0.0, 1.0, answer_max=3))
    assert cut.choose(rows()) == notes[:3] and cut.truncated
    assert read == [n.seq for n in notes[:4]]  # the fourth ended it
    read.clear()
    whole = AnswerSelection(Replay("r", "c:0", ("[x,<,9]",), (("P0", 0, 2),), 0.0, 1.0))
    assert whole.choose(rows()) == [n for n in notes if n.publisher != "P0" or n.seq > 2]
    assert not whole.ended and len(read) == len(notes)


@pytest.mark.parametrize(("kept", "expected_pages"), [(3 * PAGE_ROWS + 40, 4), (2 * PAGE_ROWS, 2)])
def test_both_stores_answer_a_large_request_in_the_same_pages(
    tmp_path: Path, kept: int, expected_pages: int
) -> None:
    """A request larger than a page: the process's store and the simulator's both read
    :data:`~octopis.defaults.PAGE_ROWS` kept rows a page from where the window starts,
    and hand the node the same pages (each sent on at once,
    :meth:`~octopis.core.replay.ReplayRounds.part`), the last with the answer's end (no
    empty page after a store that ends on a page's end)."""
    notes = _retained(kept)
    store = RetentionStore(tmp_path / "r.sqlite", Retention(max_bytes=1 << 24), _decode)
    stores = RetentionStores(Counter())
    for n in notes:
        store.add(n, encode_body(n), n.published_at)
        stores.keep("c:0", n, n.published_at)
    store.commit(2000.0)
    request = Replay("r", "c:0", ("[x,<,4]",), (), 0.0, 1.0)
    answer = StoreAnswer(store, request, 0, 0)
    pages = []
    while not answer.done:
        pages.append([n.key for n in answer.page(PAGE_ROWS)])
    simulated, gaps, truncated = stores.pages("c:0", request)
    assert [[n.key for n in page] for page in simulated] == pages
    assert len(pages) == expected_pages and all(pages), "full pages, the last with the end"
    assert answer.gaps == gaps == [] and not answer.truncated and not truncated
    store.close()
