"""The retention store (DESIGN §11) and when it commits: what it answers after a given
point, a body kept unchanged, its bounds and the gaps it reports, paged answers, a store of
a row per publication packed when opened, the commit policy (an awaited publish at once, a
pipelined one within the delay), a full disk refusing by name and keeping what was
committed, and what was committed surviving a ``kill -9``."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from conditions import closing_control, stock_notification, until

from octopis.cluster.launcher import LocalCluster
from octopis.core.answer import (
    COMMIT_DELAY,
    COMMIT_ROWS,
    PIPELINE_DELAY,
    CommitRefusals,
    CommitWaits,
    RetentionBound,
    commit_delay,
    commit_refused,
)
from octopis.core.codec import encode_body
from octopis.core.custody import PublishReceipt
from octopis.core.replay import (
    Replay,
)
from octopis.defaults import PAGE_ROWS, REFUSE_FOR
from octopis.settings import BrokerSettings, Retention
from octopis.sim.stores import RetentionStores
from octopis.topology import build_preset
from octopis.transport.replaying import PAGE_ROOM, PAGE_WAIT, Replaying, _decode_kept
from octopis.transport.retention import RetentionStore, StoreAnswer
from octopis.wire.client import Notice, ReplayDoneNotice, ReplayedNotice

FIG2 = build_preset("fig2")


def test_a_store_commits_at_once_when_awaited_or_full_else_within_the_delay() -> None:
    """When a store commits (the node's rule; the shell keeps the timer): an awaited
    publication once the input ran dry, :data:`COMMIT_ROWS` kept whatever the input, an
    awaited one on a busy input within ``COMMIT_DELAY``, pipelined ones within the longer
    ``PIPELINE_DELAY``."""
    assert commit_delay(1, idle=True, awaited=True) == 0
    assert commit_delay(1, idle=True, awaited=False) == PIPELINE_DELAY  # pipelined
    assert commit_delay(1, idle=False, awaited=True) == COMMIT_DELAY  # the input is busy
    assert commit_delay(COMMIT_ROWS, idle=False, awaited=False) == 0
    assert commit_delay(COMMIT_ROWS - 1, idle=False, awaited=False) == PIPELINE_DELAY
    assert 0 < COMMIT_DELAY < PIPELINE_DELAY


def _store(path: Path, max_bytes: int = 1 << 20, max_age: float = 3600.0) -> RetentionStore:
    retention = Retention(max_bytes=max_bytes, max_age=max_age)
    return RetentionStore(path / "b.sqlite", retention, _decode_kept)


def test_the_store_answers_what_matches_after_the_given_point(tmp_path: Path) -> None:
    """Published from time 100 on: of (P, 1) after seq 4, of other publishers all; only
    what matches the filters; each once (P's 6 was sent twice); in publisher order."""
    store = _store(tmp_path)
    for seq in (1, 2, 3, 4, 5, 6, 6, 7, 8):
        n = stock_notification("P", seq, 100.0 + seq, price=seq)
        store.add(n, encode_body(n), 1000.0)
    for seq, at in ((1, 99.0), (2, 101.0)):
        n = stock_notification("Q", seq, at)
        store.add(n, encode_body(n), 1000.0)
    assert store.commit(1000.0) == 11 and store.rows == 11
    request = Replay("r", "a:0", ("[class,eq,'STOCK'],[price,<,7]",), (("P", 1, 4),), 100.0, 3.0)
    found, gaps = store.answer(request)
    assert [(n.publisher, n.seq) for n in found] == [("P", 5), ("P", 6), ("Q", 2)]
    assert gaps == []


def test_the_store_keeps_a_publication_body_unchanged(tmp_path: Path) -> None:
    """A replayed publication has its opaque body, byte for byte."""
    store = _store(tmp_path)
    body = bytes(range(256)) * 4
    n = stock_notification("P", 1, 100.0)._replace(body=body)
    store.add(n, encode_body(n), 1000.0)
    second = stock_notification("P", 2, 101.0)
    store.add(second, encode_body(second), 1000.0)
    store.commit(1000.0)
    found, _ = store.answer(Replay("r", "a:0", ("[class,eq,'STOCK']",), (), 0.0, 3.0))
    assert [(x.seq, x.body) for x in found] == [(1, body), (2, b"")]


def test_the_store_trims_to_its_bounds_and_reports_what_it_dropped(tmp_path: Path) -> None:
    """Past max_bytes the oldest go first; a request reaching behind them gets a gap."""
    one = len(encode_body(stock_notification("P", 1)))
    store = _store(tmp_path, max_bytes=5 * one)
    for seq in range(1, 9):
        n = stock_notification("P", seq)
        store.add(n, encode_body(n), 1000.0 + seq)
        store.commit(1000.0 + seq)
    assert store.rows == 5 and store.bytes <= 5 * one
    assert store.stats["retention.trimmed"] == 3
    request = Replay("r", "a:0", ("[class,eq,'STOCK']",), (("P", 1, 1),), 0.0, 3.0)
    found, gaps = store.answer(request)
    assert [n.seq for n in found] == [4, 5, 6, 7, 8] and gaps == [("P", 1, 2, 3)]
    aged = _store(tmp_path / "aged", max_age=10.0)
    n = stock_notification("P", 1)
    aged.add(n, encode_body(n), 1000.0)
    aged.commit(1000.0)
    assert aged.commit(1011.0) == 0 and aged.rows == 0


def test_an_answer_read_in_small_pages_is_the_answer_read_at_once(tmp_path: Path) -> None:
    """Pages end inside a commit's packed publications and go on from there: three at a
    time, the answer is every publication once, in order, as one read gives it."""
    store = _store(tmp_path)
    for seq in range(1, 21):
        n = stock_notification("P", seq, 100.0 + seq)
        store.add(n, encode_body(n), 1000.0 + seq // 7)
        if seq % 7 == 0:
            store.commit(1000.0 + seq // 7)
    store.commit(1003.0)
    request = Replay("r", "a:0", ("[class,eq,'STOCK']",), (), 0.0, 3.0)
    answer, paged = StoreAnswer(store, request, 0, 0), []
    while not answer.done:
        paged += answer.page(3)
    assert [n.seq for n in paged] == [n.seq for n in store.answer(request)[0]]
    assert [n.seq for n in paged] == list(range(1, 21))


def test_a_store_kept_a_row_per_publication_is_packed_when_opened(tmp_path: Path) -> None:
    """A store written before publications were packed per commit: opened, it holds and
    answers every one of them, and its table of rows is gone."""
    path = tmp_path / "b.sqlite"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE kept (publisher TEXT NOT NULL, session INTEGER NOT NULL, seq INTEGER "
        "NOT NULL, published_at REAL NOT NULL, stored_at REAL NOT NULL, body BLOB NOT NULL)"
    )
    rows = []
    for seq in range(1, 301):
        n = stock_notification("P", seq, 100.0 + seq)
        rows.append(("P", 1, seq, n.published_at, 1000.0 + seq, encode_body(n)))
    db.executemany("INSERT INTO kept VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    db.close()
    store = _store(tmp_path)
    assert store.rows == 300 and store.bytes == sum(len(r[5]) for r in rows)
    found, _ = store.answer(Replay("r", "a:0", ("[class,eq,'STOCK']",), (), 0.0, 3.0))
    assert [n.seq for n in found] == list(range(1, 301))
    assert not store.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'kept'").fetchone()


def _replaying(
    data: Path,
    notify: Callable[[str, Notice], bool],
    queued: Callable[[str | None], int] = lambda link: 0,
) -> Replaying:
    """Broker a:0's retention and replay (the process's shell) with the default
    settings, its store in ``data``, alone (no neighbour to ask)."""
    settings = BrokerSettings()
    return Replaying(
        "a:0",
        settings.retention,
        settings.durable,
        1.0,
        data,
        lambda neighbour, message: None,
        lambda src, state: ([], []),
        notify,
        queued,
    )


def test_an_awaited_publish_is_committed_at_once_a_pipelined_one_within_the_delay(
    tmp_path: Path,
) -> None:
    """At the end of an idle pass the store commits at once if a publisher waits for its
    only unanswered publication; publications from a connection with others unanswered
    wait for the commit timer (``PIPELINE_DELAY``) and are committed together; an awaited
    one kept on a busy input brings that timer forward to ``COMMIT_DELAY``; each confirm
    follows its commit."""
    answered: list[int] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        replaying = _replaying(tmp_path, lambda key, message: True)
        started = loop.time()  # the pipeline's timer is set after this, PIPELINE_DELAY ahead
        for seq, alone in ((1, True), (2, False), (3, False)):
            receipt = PublishReceipt(partial(answered.append, seq), alone=alone)
            n = stock_notification("P", seq)
            replaying.kept(n, encode_body(n), receipt)
            replaying.pass_ended(True)
            if seq == 1:
                assert answered == [1]  # committed at once
        timer = replaying._commit_timer
        assert timer is not None and timer.when() >= started + PIPELINE_DELAY
        assert answered == [1] and replaying.store.pending == 2
        n = stock_notification("P", 4)
        replaying.kept(n, encode_body(n), PublishReceipt(partial(answered.append, 4)))
        replaying.pass_ended(False)  # awaited, the input busy: within COMMIT_DELAY
        timer = replaying._commit_timer
        assert timer is not None and timer.when() <= loop.time() + COMMIT_DELAY
        await until(lambda: len(answered) == 4, "the delayed commit", 10)
        assert answered == [1, 2, 3, 4] and not replaying.store.pending
        assert replaying.store.stats["retention.commits"] == 2
        replaying.store.close()

    asyncio.run(scenario())


def test_the_process_answers_a_large_replay_page_by_page_to_the_requester_named(
    tmp_path: Path,
) -> None:
    """The process's shell answers a request larger than :data:`PAGE_ROWS`: the first
    page at once, the rest while the link toward the requester has room (none while it
    is full), each publication once and in order, to the client the rounds name, then
    ``replay_done``; the rounds' timer is set (:class:`ExpireAt`) and fires harmlessly."""
    told: list[tuple[str, Notice]] = []
    room = {"queued": PAGE_ROOM + 1}  # full until the first page has gone

    def notify(key: str, message: Notice) -> bool:
        told.append((key, message))
        return True

    async def scenario() -> None:
        replaying = _replaying(tmp_path, notify, lambda link: room["queued"])
        count = 2 * PAGE_ROWS + 7
        for seq in range(1, count + 1):
            n = stock_notification("P", seq, time.time())
            replaying.kept(n, encode_body(n), None)
        req_id = replaying.start("k1", ["[class,eq,'STOCK']"], [], 0.0, historic=True)
        await asyncio.sleep(10 * PAGE_WAIT)  # the task looks at the full link meanwhile
        seqs = [_decode_kept(b).seq for _, m in told for b in m.bodies]
        assert seqs == list(range(1, PAGE_ROWS + 1))  # the first page, nothing more
        room["queued"] = 0
        await until(lambda: type(told[-1][1]) is ReplayDoneNotice, "the last page", 10)
        replayed = [m for key, m in told if key == "k1" and type(m) is ReplayedNotice]
        seqs = [_decode_kept(b).seq for m in replayed for b in m.bodies]
        assert seqs == list(range(1, count + 1))
        assert {m.id for _, m in told} == {req_id} and {k for k, _ in told} == {"k1"}
        assert told[-1][1].published == count and told[-1][1].answered == ["a:0"]
        replaying.expire()  # the round is over: nothing more is told
        assert type(told[-1][1]) is ReplayDoneNotice and len(told) == len(replayed) + 1
        replaying.close()

    asyncio.run(scenario())


def test_a_full_disk_refuses_what_its_commit_held_and_new_publications_for_a_while() -> None:
    """The simulator's store with a full disk: the publication routed in the pass is
    refused, by its receipt's answer at the commit (:class:`CommitWaits`, the process's),
    with the node's words (:func:`commit_refused`: it may have been delivered), and new
    ones are refused before routing for ``REFUSE_FOR`` seconds (:class:`CommitRefusals`),
    as the process's store refuses them."""
    counts: Counter[str] = Counter()
    stores = RetentionStores(counts)
    n = stock_notification("P", 1)
    stores.fill("c:0")
    waits = CommitWaits()
    waits.kept(stores.receipt("c:0", n.key))  # the store's copy
    refusal = stores.keep("c:0", n, 10.0)
    why = "c:0's retention store cannot store it: its disk is full"
    assert refusal == why and not stores.refused  # told with the commit's answer
    waits.committed(refusal)
    assert stores.refused == {n.key: commit_refused(why)} and not stores.confirmed
    assert "it may have been delivered" in commit_refused(why)
    stores.free("c:0")
    process_store = CommitRefusals("c:0's retention store")
    process_store.refused(10.0)
    assert stores.refusal("c:0", 10.0 + REFUSE_FOR / 2) == process_store.refusal(
        10.0 + REFUSE_FOR / 2
    )
    assert stores.refusal("c:0", 10.0 + REFUSE_FOR) is None
    assert counts["retention.refused"] == 1  # a refusal before routing: the node's count
    stores.fill("c:0")
    stores.keep("c:0", stock_notification("P", 2), 20.0)
    stores.free("c:0")
    assert stores.refusal("c:0", 20.0 + REFUSE_FOR / 2) is not None
    stores.restarted("c:0")  # a new process refuses nothing until a commit of its own fails
    assert stores.refusal("c:0", 20.0 + REFUSE_FOR / 2) is None


def test_what_was_committed_survives_a_kill_9(tmp_path: Path) -> None:
    """A process commits publications, then is killed with SIGKILL: reopened, the store
    holds every one of them."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from octopis.core.messages import Notification
        from octopis.core.codec import encode_body
        from octopis.transport.replaying import _decode_kept
        from octopis.settings import Retention
        from octopis.transport.retention import RetentionStore
        store = RetentionStore(
            Path({str(tmp_path / "b.sqlite")!r}), Retention(max_bytes=1 << 30), _decode_kept
        )
        for seq in range(1, 1001):
            n = Notification("P", seq, 5.0, {{"class": "STOCK", "price": 1.0}}, session=1)
            store.add(n, encode_body(n), 10.0)
            if seq % 100 == 0:
                store.commit(10.0)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert done.returncode == -signal.SIGKILL
    store = _store(tmp_path)
    found, _ = store.answer(Replay("r", "a:0", ("[class,eq,'STOCK']",), (), 0.0, 3.0))
    assert [n.seq for n in found] == list(range(1, 1001))


def test_a_full_disk_refuses_new_publications_and_keeps_what_was_committed(
    tmp_path: Path,
) -> None:
    """The store's file may not grow (SQLite's page limit stands in for a full disk; the
    process test fills a real tmpfs): the commit that does not fit raises an error that
    names the file, nothing of it is written, everything committed before is answered as
    before, new publications are refused for a second, then tried again."""
    from octopis.defaults import REFUSE_FOR
    from octopis.transport.retention import RetentionError

    store = _store(tmp_path)
    for seq in range(1, 4):
        n = stock_notification("P", seq)
        store.add(n, encode_body(n), 1000.0)
    store.commit(1000.0)
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")
    for seq in range(4, 200):
        n = stock_notification("P", seq, price=float(seq) * 1e6)
        store.add(n, encode_body(n) + bytes(4000), 1001.0)
    with pytest.raises(RetentionError, match=r"b\.sqlite cannot store 196 publications: .*full"):
        store.commit(1001.0)
    assert store.refusal(1001.5) is not None and "publish again later" in store.refusal(1001.5)
    assert store.refusal(1001.0 + REFUSE_FOR) is None
    assert store.stats["retention.refused"] == 196 and store.rows == 3
    found, gaps = store.answer(Replay("r", "a:0", ("[class,eq,'STOCK']",), (), 0.0, 3.0))
    assert [n.seq for n in found] == [1, 2, 3] and gaps == []
    store.db.execute("PRAGMA max_page_count = 1000000")
    n = stock_notification("P", 200)
    store.add(n, encode_body(n), 1003.0)
    assert store.commit(1003.0) == 1 and store.refusals.refused_at is None


def test_a_full_disk_refusing_durable_records_is_counted_and_written_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Durable records share the store's file: when the disk refuses their write (the
    page limit stands in for a full disk), the shell logs and counts it
    (``durable.writes_refused``), raises nothing (its ``maintain`` task, which writes
    them every second, would have ended and stopped the broker), keeps them as changed,
    and writes them once the disk has room; a restart then reads them back. A trim the
    disk refuses is counted (``retention.trims_refused``) and leaves what was kept."""
    replaying = _replaying(tmp_path, lambda key, message: True)
    store = replaying.store
    assert store is not None
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")
    for i in range(60):
        filters = (f"[class,eq,'STOCK'],[symbol,eq,'{'S' * 200}{i}']",)
        replaying.durables.attach(f"c{i}", "d", f"k{i}", f"s{i}", filters, 1000.0)
    replaying.save_durables()  # refused: logged and counted, nothing raised
    assert replaying.stats["durable.writes_refused"] == 60
    assert store.durables() == [] and len(replaying.durables.dirty) == 60
    store.db.execute("PRAGMA max_page_count = 1000000")
    replaying.save_durables()
    assert len(store.durables()) == 60 and not replaying.durables.dirty
    replaying.close()
    again = _replaying(tmp_path, lambda key, message: True)
    assert len(again.durables.records) == 60
    kept = again.store
    assert kept is not None

    def refused(now: float) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    kept.bound = RetentionBound(0)  # a trim due at every commit
    monkeypatch.setattr(kept, "trim", refused)
    n = stock_notification("P", 1)
    kept.add(n, encode_body(n), 1000.0)
    assert kept.commit(1000.0) == 1 and kept.rows == 1  # kept; the trim waits
    assert again.stats["retention.trims_refused"] == 1
    again.close()


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_broker_whose_disk_fills_refuses_by_name_and_loses_nothing_confirmed(
    line_of: Callable[[BrokerSettings], LocalCluster], tmp_path: Path
) -> None:
    """The line a:0 – b:0 – c:0 with its data directory on a 1 MB tmpfs (a ballast file
    takes a third of it): a publisher at a:0 publishes large quotes until a publish is
    answered with a named refusal (the retention store cannot store). A subscriber at
    c:0 gets every confirmed one exactly once; a:0 keeps serving: a durable subscription
    made at a:0 on the full disk is made (its record's write refused, counted, written
    later), and once the ballast is deleted a:0 accepts publications again and they
    arrive; a historic subscription at a:0 answers every confirmed publication, none
    twice."""
    data = tmp_path / "data"
    data.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(data)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    (data / "ballast").write_bytes(bytes(340_000))
    try:
        cluster = line_of(BrokerSettings())
        scot = cluster.scot
        a, c = (scot.brokers[b].client_endpoint for b in ("a:0", "c:0"))
        outcome = asyncio.run(closing_control(cluster, _fill_the_disk(cluster, a, c, data)))
    finally:
        cluster.stop()
        subprocess.run(["umount", "-l", str(data)], check=False)
    confirmed, refusal, got, far, history, refused_writes = outcome
    print(f"{len(confirmed)} confirmed before the refusal: {refusal}")
    assert refused_writes >= 1  # a durable subscribe on the full disk: served, written later
    assert len(confirmed) > 50
    assert "a:0.retention.sqlite" in refusal and "full" in refusal
    assert {seq for seq, n in got.items() if n > 1} == set()
    assert set(confirmed) <= set(got)
    assert far == 1
    assert sorted(history) == sorted(set(history)) and set(confirmed) <= set(history)


async def _fill_the_disk(
    cluster: LocalCluster, a: str, c: str, data: Path
) -> tuple[list[int], str, Counter[int], int, list[int], int]:
    from octopis.client import BrokerError, Publisher, Subscriber

    await cluster.wait_ready(60)
    sub = await Subscriber.connect(c, "watcher")
    stream = await sub.subscribe("[class,eq,'Q']")
    far = await sub.subscribe("[class,eq,'FAR']")
    deadline = time.monotonic() + 30
    while (await cluster.call("a:0", "stats"))["routing_table_size"] < 2:
        assert time.monotonic() < deadline, "the subscriptions did not reach a:0 in 30 s"
        await asyncio.sleep(0.1)
    pub = await Publisher.connect(a, "filler")
    padding = "x" * 900
    confirmed: list[int] = []
    refusal = ""
    for i in range(1, 5000):
        try:
            await pub.publish({"class": "Q", "i": i, "pad": padding})
        except BrokerError as exc:
            refusal = str(exc)
            break
        confirmed.append(i)
    keeper = await Subscriber.connect(a, "keeper")  # its durable record cannot be written
    kept = await keeper.subscribe("[class,eq,'FAR']", durable="far")
    refused_writes = (await cluster.call("a:0", "stats"))["retention"]["durable.writes_refused"]
    (data / "ballast").unlink()
    other = await Publisher.connect(a, "other")
    for _ in range(50):  # refused for a second after the disk refused, then tried again
        try:
            await other.publish({"class": "FAR", "n": 1})
            break
        except BrokerError:
            await asyncio.sleep(0.2)
    far_got = [(await far.get(timeout=10)).seq]
    assert (await kept.get(timeout=10)).seq == far_got[0]
    got: Counter[int] = Counter()
    while True:
        try:
            got[(await stream.get(timeout=3)).seq] += 1
        except TimeoutError:
            break
    historian = await Subscriber.connect(a, "historian")
    past = await historian.subscribe("[class,eq,'Q']", since="all", until=time.time())
    history = [n.seq async for n in past]
    for client in (historian, other, pub, sub, keeper):
        await client.close()
    return confirmed, refusal, got, len(far_got), history, refused_writes
