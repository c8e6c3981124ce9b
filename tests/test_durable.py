"""Durable, historic and hybrid subscriptions (DESIGN §11): the records' rules, the store's
paged answers, and the whole of it on broker processes with a durable subscriber killed
for 30 s and a store's broker killed during a historic answer."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conditions import accounting, closing_control, until
from conftest import secure_fig2

from octopis.client import Publisher, Subscriber
from octopis.client.deliveries import Received
from octopis.client.durable_acks import DurableAcks
from octopis.client.replay import parse_time
from octopis.client.streams import EndOfHistory
from octopis.client_policy import resume_from
from octopis.cluster.launcher import LocalCluster, prepare_topology
from octopis.core.codec import encode_body
from octopis.core.durable import SAVE_EVERY, DurableError, Durables, Withdraw, claim_of
from octopis.core.messages import Notification
from octopis.core.replay import Claimed, Replay, ReplayDone, ReplayRounds
from octopis.defaults import CLIENT_LIVENESS, LOOKBACK
from octopis.failure_schedule import Failure
from octopis.filters.composite import parse_composite
from octopis.filters.language import Publication, parse_subscription
from octopis.quotes import quotes_dir, read_quote_file
from octopis.settings import BrokerSettings, Clients, Retention
from octopis.sim.durable_clients import DurableSimulator
from octopis.topology import build_preset
from octopis.transport.replaying import _decode_kept
from octopis.transport.retention import RetentionStore, StoreAnswer

# -- the records' rules ------------------------------------------------------------------


def test_a_record_waits_while_its_client_is_away_and_is_handed_over_once() -> None:
    durables = Durables("c:0", keep=60.0, limit=10)
    durables.attach("audit", "d", "k1/audit", "s1", ("[x,>,1]",), 100.0)
    assert durables.claim("audit", "d", "k1/audit", 100.0) is None  # just made: nothing owed
    durables.ack("audit", "d", [("P", 1, 7), ("P", 1, 5), ("Q", 2, 3)], 101.0)
    assert durables.detached("s1", heard=110.0)
    record = durables.claim("audit", "d", key=None, now=130.0)
    assert record is not None and durables.records == {}
    claimed = record.claimed("c:0", 130.0)
    assert claimed.since == (("P", 1, 7), ("Q", 2, 3))  # the highest taken, per publisher
    assert claimed.after == max(100.0, 110.0 - LOOKBACK)  # exact: no clock skew
    assert durables.claim("audit", "d", key=None, now=131.0) is None  # once
    assert durables.stats["durable.claimed"] == 1
    # its new host's record takes over what the claimed one still owed
    durables.attach("audit", "d", "k2/audit", "s2", ("[x,>,1]",), 140.0)
    assert durables.ack("audit", "d", list(claimed.since), 141.0, after=claimed.after)
    assert durables.records[("audit", "d")].after == claimed.after
    assert not durables.ack("audit", "other", [], 141.0)


def test_a_composite_subscription_cannot_be_durable() -> None:
    """Refused by name before anything is made (its joins are not replayed); a plain
    one is taken, up to ``[durable] max``."""
    durables = Durables("c:0", keep=60.0, limit=1)
    joined = parse_composite("{[a,eq,'x']} || {[b,eq,'y']}")
    with pytest.raises(DurableError, match="a composite subscription cannot be durable"):
        durables.room("audit", "d", joined)
    durables.room("audit", "d", parse_subscription("[x,>,1]"))
    assert durables.records == {} and durables.stats["durable.refused"] == 0


def test_the_records_counts_and_listing_are_the_nodes() -> None:
    """What an operator sees of the records (``octopis status``, the metrics): how many
    are kept and how many clients are away, each record attached or since when away."""
    durables = Durables("c:0", keep=60.0, limit=10)
    durables.attach("audit", "d", "k1/audit", "s1", ("[x,>,1]",), 100.0)
    durables.attach("audit", "e", "k1/audit", "s2", ("[x,>,1]",), 100.0)
    durables.ack("audit", "d", [("P", 1, 7)], 101.0)
    assert durables.detached("s1", heard=110.0)
    counts = durables.counts()
    assert (counts["durable.kept"], counts["durable.away"], counts["durable.made"]) == (2, 1, 2)
    assert durables.listed(1) == [
        {"client": "audit", "name": "d", "attached": False, "away_since": 110.0,
         "publishers": 1, "owed_since": 100.0}
    ]  # fmt: skip
    assert [r["attached"] for r in durables.listed(5)] == [False, True]


def test_a_client_back_at_the_same_broker_is_owed_from_when_it_left() -> None:
    """Its record stayed here: the claim hands it back from when the client was last
    heard (less ``LOOKBACK``), not from the claim's time; a client away longer than
    ``LOOKBACK`` lost what unknown publishers published in between (nemesis seed 2)."""
    durables = Durables("b:0", keep=3600.0, limit=10)
    durables.attach("audit", "d", "k1/audit", "s1", ("[x,>,1]",), 100.0)
    assert durables.claim("audit", "d", "k1/audit", 100.0) is None
    assert durables.detached("s1", heard=101.0)
    durables.attach("audit", "d", "k2/audit", "s2", ("[x,>,1]",), 145.0)
    record = durables.claim("audit", "d", "k2/audit", 145.0)
    assert record is not None
    assert record.claimed("b:0", 145.0).after == max(100.0, 101.0 - LOOKBACK) == 100.0
    kept = durables.records[("audit", "d")]
    assert kept.away is None and kept.key == "k2/audit"  # attached again, not abandoned
    assert durables.expire(145.0 + 7200.0) == []


def test_a_claim_is_answered_by_the_node_once_for_the_shell_and_the_simulator() -> None:
    """:meth:`Durables.answer_claim` decides what a broker does with a claim: the record
    kept here goes in the echo, written at once; a subscription of it still held here by
    another connection is withdrawn; a claim that finds nothing changes nothing."""
    durables = Durables("b:0", keep=60.0, limit=10)
    rounds = ReplayRounds("b:0", lambda src, state: ([], []))
    durables.attach("audit", "d", "k1/audit", "s1", ("[x,>,1]",), 100.0)
    durables.ack("audit", "d", [("P", 1, 7)], 101.0)
    claim = Replay("a:0/1", "a:0", (), (), 0.0, 3.0, claim=claim_of("audit", "d"))
    rounds.receive("a:0", claim, 0.0)
    answer = durables.answer_claim(rounds, claim, 130.0)  # not the host: passing
    assert answer.withdraw == Withdraw("k1/audit", "audit", "s1") and answer.save
    (echo,) = answer.actions
    assert [c.since for c in echo.message.claimed] == [(("P", 1, 7),)]
    assert durables.records == {}
    again = Replay("a:0/2", "a:0", (), (), 0.0, 3.0, claim=claim_of("audit", "d"))
    rounds.receive("a:0", again, 0.0)
    answer = durables.answer_claim(rounds, again, 131.0)
    assert answer.withdraw is None and not answer.save
    (echo,) = answer.actions
    assert echo.message.claimed == () and echo.message.answered == ("b:0",)
    # At the host the rounds name who asked: a record its own attachment has just made
    # is not handed over (the node reads the requester; the shells pass none).
    host, host_rounds = (
        Durables("a:0", keep=60.0, limit=10),
        ReplayRounds("a:0", lambda *_: ([], [])),
    )
    host.attach("audit", "d", "k2/audit", "s2", ("[x,>,1]",), 140.0)
    mine = Replay("a:0/3", "a:0", (), (), 0.0, 3.0, claim=claim_of("audit", "d"))
    host_rounds.start(mine, 0.0, "k2/audit")
    answer = host.answer_claim(host_rounds, mine, 141.0)
    assert answer.withdraw is None and not answer.save and ("audit", "d") in host.records


def test_the_records_written_are_those_changed_since_the_last_write() -> None:
    """:meth:`Durables.written`, what both shells write (the process's store, the
    simulator's copy a restart reads back): every record changed since the last write,
    one gone as None, once; a record its own client claimed back here is written
    attached again (else a restart would read it away since its client last left)."""
    durables = Durables("b:0", keep=60.0, limit=10)
    durables.attach("audit", "d", "k1/audit", "s1", ("[x,>,1]",), 100.0)
    durables.attach("desk", "d", "k2/desk", "s2", ("[x,>,1]",), 100.0)
    assert list(durables.written()) == [("audit", "d"), ("desk", "d")]
    assert durables.written() == {}
    durables.ack("audit", "d", [("P", 1, 7)], 101.0)
    durables.end("s2")
    audit = durables.records[("audit", "d")]
    assert durables.written() == {("audit", "d"): audit, ("desk", "d"): None}
    durables.detached("s1", 102.0)
    durables.attach("audit", "d", "k3/audit", "s3", (), 110.0)  # back here: still away
    assert durables.written() == {("audit", "d"): audit} and audit.away == 102.0
    owed = durables.claim("audit", "d", "k3/audit", 111.0)
    assert owed is not None and owed.away == 102.0  # owed from when it left
    assert durables.written() == {("audit", "d"): audit} and audit.away is None


class _Stream:
    """A durable stream that keeps what it is offered."""

    def __init__(self, durable: str | None) -> None:
        self.durable = durable
        self.got: list[tuple[str, int, int]] = []

    def offer(self, received: Received, size: int) -> None:
        self.got.append((received.publisher, received.session, received.seq))


def test_a_claimed_record_keeps_out_late_copies_of_what_was_taken_before() -> None:
    """A process that claimed its durable record drops a live delivery the record says
    an earlier process took: a copy held for a link that was down, released after the
    subscription was made anew (nemesis seed 265); others, and other streams, pass."""
    acks = DurableAcks("audit", lambda message: None)
    copy = Claimed("b:0", ("[x,>,1]",), (("P", 1, 2), ("Q", 1, 5)), 10.0, 11.0)
    answer = acks.claim_answered("d", [copy], silent=(), error=None)
    assert (answer.gap, answer.resumed, answer.after) == (None, copy, 10.0)
    durable, plain = _Stream("d"), _Stream(None)

    def received(publisher: str, seq: int) -> Received:
        return Received("audit", publisher, seq, 0.0, 0.0, {"x": 1}, session=1)

    for publisher, seq in (("P", 2), ("P", 3), ("Q", 4), ("R", 1)):
        acks.offer(durable, received(publisher, seq), 10)
        acks.offer(plain, received(publisher, seq), 10)
    assert durable.got == [("P", 1, 3), ("R", 1, 1)] and acks.covered == 2
    assert len(plain.got) == 4


def test_a_record_made_at_a_failover_owes_from_the_replays_start() -> None:
    """A durable subscriber fails over to c:1 at 40 s and replays from 30 s (when it
    subscribed): its acknowledgements to c:1 carry that start, so that c:1's record owes
    it even if the process ends before the replay is answered (its old host's copy may
    be silent to the next claim; nemesis seed 134). An earlier start stays: a claimed
    record's, or an earlier fail-over's."""
    sent: list[dict] = []
    acks = DurableAcks("audit", sent.append)
    durables = Durables("c:1", keep=60.0, limit=10)

    async def fail_over() -> None:
        acks.claim_answered("e", [Claimed("b:0", (), (("P", 1, 2),), 5.0, 6.0)], (), None)
        for progress in acks.progress(["d", "e"]):
            progress.failed_over(30.0)
        acks.progress(["d"])[0].failed_over(34.0)  # a second fail-over, before the answer
        durables.attach("audit", "d", "k2/audit", "s2", ("[x,>,1]",), 40.0)
        acks.ack_all(["d", "e"])
        await asyncio.sleep(0)

    asyncio.run(fail_over())
    assert {m["durable"]: m["after"] for m in sent} == {"d": 30.0, "e": 5.0}
    message = next(m for m in sent if m["durable"] == "d")
    assert durables.ack("audit", "d", message["since"], 40.0, message["after"])
    assert durables.detached("s2", heard=40.5)
    record = durables.claim("audit", "d", key=None, now=42.0)
    assert record is not None and record.claimed("c:1", 42.0).after == 30.0


def test_a_claim_resumes_from_the_freshest_copy_and_the_earliest_start() -> None:
    """Copies of one record: the freshest copy's filters, from the earliest start (a copy
    made at a fail-over began then; nemesis seed 85), and of each publisher the highest
    acknowledgement of any copy (the fail-over's host died before it wrote the whole
    record acknowledged again there; nemesis seed 35232)."""
    kept = Claimed("e:1", ("[x,<,6]",), (("P", 0, 1), ("Q", 0, 7)), 0.0, 32.0)
    moved = Claimed("c:1", ("[x,<,6]",), (("P", 0, 3),), 33.8, 33.9)
    best, since, after = resume_from([kept, moved])
    assert (best, sorted(since), after) == (moved, [("P", 0, 3), ("Q", 0, 7)], 0.0)
    assert resume_from([moved]) == (moved, [("P", 0, 3)], 33.8)


def test_an_abandoned_record_is_withdrawn_after_keep_and_counted() -> None:
    durables = Durables("c:0", keep=60.0, limit=1)
    durables.attach("a", "d", "k/a", "s1", ("[x,>,1]",), 0.0)
    with pytest.raises(DurableError, match=r"durable\.max"):
        durables.attach("b", "d", "k/b", "s2", ("[x,>,1]",), 0.0)
    durables.detached("s1", heard=10.0)
    assert durables.expire(69.0) == [] and len(durables.records) == 1
    assert [r.client for r in durables.expire(71.0)] == ["a"]
    assert durables.records == {} and durables.stats["durable.abandoned"] == 1


def test_the_simulators_brokers_abandon_a_record_past_keep_as_the_process_does() -> None:
    """A simulated broker runs the process's expiry (``maintain``, every ``SAVE_EVERY``):
    a record whose client has been away past ``keep`` is abandoned, counted and written,
    and the client coming back after that finds no record to claim."""
    sim = DurableSimulator(build_preset("fig2"), "snr", seed=3, covering="off", durable_keep=5.0)
    sim.durable_subscribe("D", "c:0", parse_subscription("[x,<,5]"))
    sim.run()
    sim.durable_leave("D")
    left = sim.now
    sim.run()  # the expiry timer keeps no run going
    assert sim.now < left + 5.0 and len(sim.durable_records["c:0"].records) == 1
    sim.run(left + 5.0 + SAVE_EVERY)  # a run past keep
    records = sim.durable_records["c:0"]
    assert records.records == {} and records.stats["durable.abandoned"] == 1
    assert sim._written["c:0"] == {}
    sim.durable_return("D", "c:0")
    sim.run()
    assert sim.durable_clients["D"].counts["claims"] == 2
    assert sim.durable_clients["D"].counts["claimed"] == 0  # nothing left to claim


def test_a_durable_client_back_at_a_dead_broker_tries_its_list_as_a_connection_does() -> None:
    """A durable client comes back as a new process at c:0, dead since it left: it
    learns so only by c:0's silence, :data:`CLIENT_LIVENESS` after its hello
    (``client_policy.failover.connect_tries``, as a fail-over goes), and starts at the
    next broker of c:0's list; the simulator once chose the first live broker at once,
    reading which were dead."""
    scot = build_preset("fig2")
    sim = DurableSimulator(scot, "snr", seed=3, covering="off")
    sim.durable_subscribe("D", "c:0", parse_subscription("[x,<,5]"))
    sim.run()
    sim.durable_leave("D")
    sim.fail(Failure(("c:0",), 0.0, 30.0), sim.now)
    sim.run(sim.now + 1.0)
    back = sim.now
    sim.durable_return("D", "c:0")
    client = sim.durable_clients["D"]
    assert client.host is None and client.run == 1  # no answer yet
    sim.run(back + CLIENT_LIVENESS)
    assert client.host == scot.failover_order("c:0")[0] and client.run == 2
    assert client.away[-1][1] == back + CLIENT_LIVENESS
    assert sim.failure_counts["failover.no_live_broker"] == 0


def test_ending_a_durable_forgets_it_and_a_move_is_not_an_end() -> None:
    durables = Durables("c:0", keep=60.0, limit=10)
    durables.attach("a", "d", "k/a", "s1", ("[x,>,1]",), 0.0)
    durables.attach("a", "e", "k/a", "s2", ("[x,>,1]",), 0.0)
    assert durables.end("s1") == ("a", "d") and durables.end("nope") is None
    durables.moved("s2")
    assert durables.records == {}
    assert durables.stats["durable.ended"] == 1
    durables.attach("a", "d", "k/a", "s3", ("[x,>,1]",), 0.0)
    durables.attach("a", "e", "k/a", "s4", ("[x,>,1]",), 0.0)
    assert durables.unsubscribed("s3", moved=False) == claim_of("a", "d")  # claim copies
    assert durables.unsubscribed("s4", moved=True) is None and durables.records == {}
    assert durables.unsubscribed("s5", moved=False) is None  # not durable
    assert durables.stats["durable.ended"] == 2


# -- the store's answers -----------------------------------------------------------------


def _store(tmp_path: Path) -> RetentionStore:
    return RetentionStore(tmp_path / "r.sqlite", Retention(max_bytes=2**30), _decode_kept)


def _fill(store: RetentionStore, publications: list[Publication], start: float) -> None:
    for seq, publication in enumerate(publications, 1):
        n = Notification("P", seq, start + seq, publication, session=1)
        store.add(n, encode_body(n), start + seq)
    store.commit(start + len(publications))


def _quotes(symbols: tuple[str, ...], count: int) -> list[Publication]:
    """``count`` real quotes, the symbols' files interleaved."""
    files = [read_quote_file(quotes_dir() / s) for s in symbols]
    mixed = (q for group in itertools.zip_longest(*files) for q in group if q is not None)
    return list(itertools.islice(mixed, count))


def test_a_store_answers_a_window_page_by_page_exactly_as_the_reference_matcher(
    tmp_path: Path,
) -> None:
    quotes = _quotes(("MSFT", "INTC", "ORCL"), 600)
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


# -- on broker processes -----------------------------------------------------------------

DURABLE_SUBSCRIBER = textwrap.dedent(
    """
    import asyncio, json, sys
    from octopis.client import Subscriber

    async def main():
        sub = await Subscriber.connect(sys.argv[1].split(","), "auditor")
        stream = await sub.subscribe(sys.argv[2], durable="audit")
        history = stream.history
        print(json.dumps({"ready": history is not None and history.complete}), flush=True)
        async for n in stream:
            print(json.dumps([n.seq, n.replayed]), flush=True)

    asyncio.run(main())
    """
)
KILLED_FOR = 30.0
"""Seconds the durable subscriber stays dead (the acceptance's figure)."""


@pytest.fixture
def overlay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """fig2 in DNR with keys on. What a durable, historic or hybrid subscription gets does
    not depend on the routing mode beyond the routing laws, which the simulator checks on
    the brokers' own node in SNR and DNR (tests/test_failures.py
    ``test_a_durable_subscriber_fails_over_twice_along_the_list_it_began_with``,
    ``test_subscribers_that_fail_over_get_what_was_published_while_they_were_away``;
    tests/test_nemesis.py ``test_the_seeds_pass``: durable and historic subscribers in
    every mode); the processes show the stores' SQLite files, the killed client process
    and the killed store's broker, once."""
    yield from secure_fig2(
        tmp_path, monkeypatch, BrokerSettings(clients=Clients(timeout=2.0)), "dnr"
    )


class DurableProcess:
    """The durable subscriber as an OS process of its own, its output read as it comes."""

    def __init__(self, endpoints: list[str], text: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", DURABLE_SUBSCRIBER, ",".join(endpoints), text],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.got: list[tuple[int, bool]] = []
        self.ready = False

    async def read(self) -> None:
        assert self.process.stdout is not None
        while line := await asyncio.to_thread(self.process.stdout.readline):
            item = json.loads(line)
            if isinstance(item, dict):
                assert item["ready"], "the durable subscription's claim was incomplete"
                self.ready = True
            else:
                self.got.append((item[0], item[1]))

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_historic_hybrid_and_durable_subscriptions_get_exactly_their_publications(
    overlay: LocalCluster,
) -> None:
    """fig2 with keys; a:0 hosts the publisher of real quotes (cluster 0).
    - a durable subscriber (its own process) at c:0 is killed with ``kill -9`` 4 s into
      publishing and started again 30 s later at f:2 (another cluster);
    - a historic subscription at e:1 asks for a closed window of the past while
      publishing goes on; a hybrid one at b:1 starts from before the first publication,
      also while publishing goes on;
    - at the end a:0 (the only store with anything) is stopped and killed while a
      historic answer is under way: the answer names it; after its restart, asked again,
      the answer is complete.
    Each is compared with the reference matcher over what was published: expected,
    delivered, duplicated and lost, and the order per publisher."""
    cluster = overlay
    scot = cluster.scot
    quotes = _quotes(("MSFT", "INTC", "ORCL", "CSCO", "DELL", "YHOO"), 1200)
    durable_text = "[class,eq,'STOCK'],[symbol,eq,'MSFT']"
    historic_text = "[class,eq,'STOCK'],[close,>,25]"
    hybrid_text = "[class,eq,'STOCK'],[volume,>,20000000]"
    published: dict[int, Publication] = {}
    hybrid_got: Counter[int] = Counter()
    report: dict[str, dict] = {}

    def matching(text: str, seqs: list[int]) -> list[int]:
        reference = parse_subscription(text)
        return [s for s in seqs if reference.matches(published[s])]

    async def scenario() -> None:
        durable = DurableProcess(scot.client_endpoints("c:0"), durable_text)
        reader = asyncio.create_task(durable.read())
        await until(lambda: durable.ready, "durable subscriber ready", 30)
        pub = await Publisher.connect(scot.client_endpoints("a:0"), "quotes")
        start = time.time()
        for q in quotes[:200]:  # the closed window of the past
            published[await pub.publish(q)] = q
        window_end = time.time()

        async def publish_on() -> None:
            for q in quotes[200:]:
                published[await pub.publish(q)] = q
                await asyncio.sleep(0.035)

        publishing = asyncio.create_task(publish_on())
        await asyncio.sleep(1.0)
        historic = await Subscriber.connect(scot.client_endpoints("e:1"), "historian")
        stream = await historic.subscribe(historic_text, since=start, until=window_end)
        got = [n.seq async for n in stream]
        expected = matching(historic_text, list(range(1, 201)))
        report["historic"] = accounting("historian", len(expected), Counter(got))
        assert got == expected and stream.history is not None and stream.history.complete
        with pytest.raises(EndOfHistory):
            await stream.get(1)

        hybrid = await Subscriber.connect(scot.client_endpoints("b:1"), "hybrid")
        live = await hybrid.subscribe(hybrid_text, since=start)
        assert live.history is not None and live.history.complete, live.history

        async def read_hybrid() -> None:
            last = 0
            async for n in live:
                assert n.seq > last, f"hybrid out of publisher order: {n.seq} after {last}"
                last = n.seq
                hybrid_got[n.seq] += 1

        hybrid_reader = asyncio.create_task(read_hybrid())
        await asyncio.sleep(2.0)
        durable.kill()
        await reader
        first_run = list(durable.got)
        await asyncio.sleep(KILLED_FOR)
        again = DurableProcess(scot.client_endpoints("f:2"), durable_text)
        reader = asyncio.create_task(again.read())
        await until(lambda: again.ready, "durable subscriber back", 60)
        await publishing
        await pub.close()
        seqs = sorted(published)
        durable_expected = matching(durable_text, seqs)
        await until(
            lambda: {s for s, _ in first_run + again.got} >= set(durable_expected),
            "everything the durable subscriber missed",
            30,
        )
        hybrid_expected = matching(hybrid_text, seqs)
        await until(lambda: set(hybrid_got) >= set(hybrid_expected), "hybrid deliveries", 30)
        await asyncio.sleep(0.5)  # a repeat would arrive meanwhile
        again.kill()
        await reader
        hybrid_reader.cancel()
        second = [s for s, _ in again.got]
        assert second == sorted(second), "the durable's return is out of publisher order"
        assert any(replayed for _, replayed in again.got)
        durable_got = Counter(s for s, _ in first_run + again.got)
        report["durable"] = accounting("auditor", len(durable_expected), durable_got)
        report["hybrid"] = accounting("hybrid", len(hybrid_expected), hybrid_got)
        assert set(durable_got) == set(durable_expected) and first_run
        assert set(hybrid_got) == set(hybrid_expected)
        await hybrid.close()

        # a store's broker killed during a historic answer, then asked again
        cluster.pause("a:0", True)
        asking = asyncio.create_task(
            historic.subscribe(historic_text, since=start, until=time.time())
        )
        await asyncio.sleep(0.5)
        cluster.kill("a:0")
        cut = await asking
        partial = [n.seq async for n in cut]
        assert cut.history is not None and not cut.history.complete
        assert cut.history.silent == ("a:0",) and partial == []
        cluster.spawn_one("a:0")
        await cluster.wait_ready(60)
        whole = await historic.subscribe(historic_text, since=start, until=time.time())
        got = [n.seq async for n in whole]
        expected = matching(historic_text, seqs)
        report["historic after restart"] = accounting("historian", len(expected), Counter(got))
        assert got == expected and whole.history is not None and whole.history.complete
        await historic.close()

    asyncio.run(closing_control(cluster, scenario()))
    print(json.dumps(report))
    for name, counts in report.items():
        assert counts["lost"] == counts["duplicates"] == 0, (name, counts)
        assert counts["delivered"] == counts["expected"] > 0, (name, counts)


@pytest.fixture
def snr_fig2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    yield from secure_fig2(tmp_path, monkeypatch, BrokerSettings(clients=Clients(timeout=2.0)))


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_claim_a_broker_keeping_a_fresher_copy_did_not_answer_is_a_reported_gap(
    snr_fig2: LocalCluster,
) -> None:
    """A durable subscriber at c:0 fails over (along its list) when c:0 is killed and takes
    publications there; it leaves (its record waits there), c:0 restarts with the copy
    it wrote when the subscription was made, and the fail-over's host is stopped
    (SIGSTOP) when the subscriber comes back at c:0: the claim finds only c:0's stale
    copy, and the SDK reports the gap (that host silent) instead of replaying as if that
    copy were the record (nemesis seed 34673). Counted: nothing lost, and what comes
    again comes in the second run only, as the gap says it may."""
    cluster = snr_fig2
    scot = cluster.scot
    got: list[Counter[int]] = [Counter(), Counter()]
    text = "[class,eq,'STOCK']"

    async def holder() -> str | None:
        for broker in (b for b in scot.brokers if b != "c:0"):
            stats = await cluster.call(broker, "stats")
            if any(d["client"] == "s" and d["publishers"] for d in stats["durables"]):
                return broker
        return None

    async def scenario() -> tuple[list[int], str, list]:
        first = await Subscriber.connect(
            scot.client_endpoints("c:0"), "s", on_notification=lambda n: got[0].update([n.seq])
        )
        await first.subscribe(text, durable="d")
        cluster.kill("c:0")
        await until(lambda: bool(first.connection.outages), "fail-over", 30)
        pub = await Publisher.connect(scot.client_endpoints("c:1"), "p")  # c:0 reaches it
        published: list[int] = []

        async def delivered() -> bool:
            published.append(await pub.publish({"class": "STOCK", "price": 1.0}))
            await asyncio.sleep(0.05)
            return bool(got[0])

        await until(delivered, "a delivery at the fail-over's host", 20)
        await until(lambda: set(got[0]) >= set(published), "the fail-over's replay", 20)
        await until(holder, "the acknowledgement at the fail-over's host", 20)
        silent = await holder()
        assert silent is not None
        await first.close()
        cluster.spawn_one("c:0")
        await cluster.wait_ready(60)
        cluster.pause(silent, True)
        try:
            again = await Subscriber.connect(
                scot.client_endpoints("c:0"), "s", on_notification=lambda n: got[1].update([n.seq])
            )
            await again.subscribe(text, durable="d")
            await until(lambda: set(got[1]) >= set(published), "the replay", 30)
            gaps = list(again.gaps)
            await again.close()
        finally:
            cluster.pause(silent, False)
        await pub.close()
        return published, silent, gaps

    published, silent, gaps = asyncio.run(closing_control(cluster, scenario()))
    counts = accounting("s", len(published), got[0] + got[1])
    print(counts, gaps)
    assert any(silent in g.silent and "fresher copy" in (g.error or "") for g in gaps), gaps
    assert counts["lost"] == 0 and counts["duplicates"] == len(published)
    assert set(got[0]) == set(got[1]) == set(published) and max(got[0].values()) == 1


# -- the page's examples -----------------------------------------------------------------

PAGE = Path(__file__).resolve().parents[1] / "docs" / "durable.md"


def _blocks(page: Path, language: str) -> list[list[str]]:
    """The lines of each fenced ``language`` block of ``page``, in order (blank lines
    dropped in shell blocks, a line ending in a backslash joined to the next)."""
    blocks, current = [], None
    for line in page.read_text().splitlines():
        if line.strip() == f"```{language}":
            current = []
        elif line.strip() == "```" and current is not None:
            blocks.append(current)
            current = None
        elif current is not None and current and current[-1].endswith("\\"):
            current[-1] = current[-1][:-1] + line.strip()  # a command continued
        elif current is not None and (line.strip() or language == "python"):
            current.append(line)
    return blocks


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_the_pages_examples_do_what_the_page_says(tmp_path: Path) -> None:
    """docs/durable.md's commands and program, as written, against an overlay `octopis up`
    started in the directory they run in (fig2 on free ports, keys on)."""
    scot, _ = prepare_topology(tmp_path / "build", preset="fig2")
    (tmp_path / "t.json").write_text(json.dumps(scot.to_json()))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("OCTOPIS_KEYS", None)

    def sh(command: str) -> list[dict]:
        done = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, (command, done.stderr)
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    historic, durable = _blocks(PAGE, "sh")
    (program,) = _blocks(PAGE, "python")
    sh("octopis up t.json")
    try:
        published = sh(historic[0])
        assert [p["published"] for p in published] == [1, 2]
        head, *lines = sh(historic[1])
        assert head["history"]["silent"] == [] and head["history"]["error"] is None
        assert [(n["publication"]["symbol"], n.get("replayed")) for n in lines] == [("MSFT", True)]
        first = sh(durable[0])
        assert len(first) == 1 and "subscribed" in first[0]  # nothing owed to a new one
        status = subprocess.run(
            ["octopis", "status"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        rows = {row.split()[0]: row.split() for row in status.stdout.splitlines()[1:]}
        assert rows["a:0"][8] == "2" and rows["c:0"][11] == "1/1", status.stdout  # kept; away
        assert rows["f:2"][8] == "0" and rows["f:2"][11] == "0/0", status.stdout
        sh(durable[1])
        head, *lines = sh(durable[2])
        assert head["history"]["error"] is None and head["history"]["silent"] == []
        assert [(n["publication"]["symbol"], n.get("replayed")) for n in lines] == [("ORCL", True)]
        ended = sh(durable[3])
        assert ended[0]["ended"] == "audit"
        head, *lines = sh(durable[2])  # ended: a fresh durable, owed nothing
        assert lines == [] and head["history"]["published"] == 0
        done = subprocess.run(
            [sys.executable, "-c", "\n".join(program)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["missed 81.0 True", "past [80.5, 81.0] True"]
    finally:
        sh("octopis down")


def test_the_hosts_answers_name_who_asked_and_whether_a_claim() -> None:
    """A shell routes a replay's answers by what the rounds' actions carry, the requester
    and whether it asked a claim (a durable client's process reads a claim's answer
    otherwise than its replay's), and keeps no table of its requests of its own."""
    durables = Durables("a:0", keep=60.0, limit=10)
    rounds = ReplayRounds("a:0", lambda *_: ([], []))
    claim = Replay("a:0/1", "a:0", (), (), 0.0, 3.0, claim=claim_of("audit", "d"))
    rounds.start(claim, 0.0, "k1/audit")
    replay = Replay("a:0/2", "a:0", ("[x,>,1]",), (), 0.0, 3.0)
    rounds.start(replay, 0.0, "k1/audit")
    (done,) = rounds.stored("a:0/2", [], [])
    assert (done.requester, done.claim) == ("k1/audit", False)
    (*_, claimed) = durables.answer_claim(rounds, claim, 1.0).actions
    assert type(claimed) is ReplayDone and (claimed.requester, claimed.claim) == ("k1/audit", True)
    assert rounds.requester("a:0/1") == "k1/audit"
