"""Durable subscriptions' records (DESIGN §11), sans-IO: a record waits while its client is
away and is handed over once, a claim is answered by the node alike for the shell and the
simulator, what a record owes after a fail-over or a move, and what is written, withdrawn
and counted. The store's paged answers: tests/test_durable_store.py; the whole on broker
processes: tests/test_durable_processes.py; docs/durable.md's examples:
tests/test_durable_page.py."""

from __future__ import annotations

import asyncio
import copy

import pytest

from octopis.client.deliveries import Received
from octopis.client.durable_acks import DurableAcks
from octopis.client_policy import resume_from
from octopis.core.durable import SAVE_EVERY, DurableError, Durables, Withdraw, claim_of
from octopis.core.replay import Claimed, Replay, ReplayDone, ReplayRounds
from octopis.defaults import CLIENT_LIVENESS, LOOKBACK
from octopis.failure_schedule import Failure
from octopis.filters.composite import parse_composite
from octopis.filters.language import parse_subscription
from octopis.sim.durable_clients import DurableSimulator
from octopis.topology import build_preset
from octopis.wire.client import AckRequest


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
    sent: list[AckRequest] = []
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
    assert {m.durable: m.after for m in sent} == {"d": 30.0, "e": 5.0}
    message = next(m for m in sent if m.durable == "d")
    assert durables.ack("audit", "d", message.since, 40.0, message.after)
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


def test_a_simulated_broker_writes_a_record_a_move_took_away_at_once() -> None:
    """A durable client moved inside its cluster: its old host lets the subscription go
    and, as the node's answer says (``Release.save``), writes its records at once, as the
    process does; dying then, it comes back without the record (the simulator once
    wrote nothing on a release, and a restart read the record back)."""
    sim = DurableSimulator(build_preset("fig2"), "snr", seed=3, covering="off")
    sim.durable_subscribe("D", "c:0", parse_subscription("[x,<,5]"))
    sim.run()
    assert set(sim.durable_records["c:0"].records) == {("D", "d")}
    sim.move("D", "a:0")
    sim.run()
    assert sim.moves["released"] == 1 and sim.durable_records["c:0"].records == {}
    sim.fail(Failure(("c:0",), sim.now + 0.1, sim.now + 1.0))
    sim.run()
    assert sim.durable_records["c:0"].records == {}


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


@pytest.mark.parametrize(("pause", "fails_over"), [(4.0, True), (1.0, False)])
def test_a_durable_client_fails_over_from_a_broker_paused_past_its_liveness(
    pause: float, fails_over: bool
) -> None:
    """c:0, a durable client's host, is paused (SIGSTOP) while publications flow from
    a:0: past the SDK's liveness the client hears it no more and fails over as from a
    dead host (its subscription made again, durable, at the next broker of its list, its
    record acknowledged there, what it missed replayed), while c:0 keeps its own copy of
    the record, and, at its resume, drops the silent client; a shorter pause is waited
    out. Either way the client holds to its contract (``check_durables``): each
    publication its filter matches, once, nothing lost silently."""
    from octopis.nemesis.checks import check_durables

    scot = build_preset("fig2")
    sim = DurableSimulator(scot, "snr", seed=7, covering="off")
    sim.durable_subscribe("D", "c:0", parse_subscription("[x,<,5]"))
    sim.run()
    start = sim.now
    sim.fail(Failure(("c:0",), 1.0, 1.0 + pause, stall=True), start)
    for i in range(200):
        sim.at(start + i * 0.05, sim.publish, "Pa:0", "a:0", {"x": i % 10})
    sim.run()
    client = sim.durable_clients["D"]
    problems, counts = check_durables(sim)
    assert problems == [] and counts["silent"] == counts["duplicated"] == 0, counts
    assert counts["delivered"] == counts["expected"] == 100
    if fails_over:
        assert client.counts["failed_over"] == 1
        assert client.host == scot.failover_order("c:0")[0]
    else:
        assert client.counts["failed_over"] == 0 and client.host == "c:0"


def test_a_simulated_broker_whose_disk_is_full_writes_its_durable_records_later() -> None:
    """As the process's shell does (``Replaying.save_durables``): while c:0's disk is full
    the durable records a client's acknowledgements changed are not written (counted
    ``durable.writes_refused``, kept as changed, tried again every ``SAVE_EVERY``); once
    it has room they are, and a restart reads them back."""
    sim = DurableSimulator(build_preset("fig2"), "snr", seed=3, covering="off")
    sim.durable_subscribe("D", "c:0", parse_subscription("[x,<,5]"))
    sim.run()
    written = dict(sim._written["c:0"])
    start = sim.now
    sim.retention.fill("c:0")
    for i in range(20):
        sim.at(start + i * 0.1, sim.publish, "Pa:0", "a:0", {"x": i % 10})
    sim.run(start + 5.0)
    assert sim.durable_records["c:0"].stats["durable.writes_refused"] > 0
    assert sim._written["c:0"] == written and sim.durable_records["c:0"].dirty
    sim.retention.free("c:0")
    sim.run(start + 5.0 + 2 * SAVE_EVERY)
    assert not sim.durable_records["c:0"].dirty
    ((ident, record),) = sim._written["c:0"].items()
    assert ident == ("D", "d") and record.since  # what it acknowledged, written
    assert sim.durable_clients["D"].received and len(sim.durable_clients["D"].received) == 10


def test_a_power_failure_rolls_a_simulated_brokers_durable_records_back_as_sqlite_does() -> None:
    """c:0, D's host, loses power with ``sync = "normal"`` and the last 1.5 s unsynced: as
    the process's SQLite file rolls back every write of that tail, the records the
    restart reads back are those written before it, not the last written; what D took
    at c:0 since then counts as unwritten (a repeat of it is allowed). With ``full``
    the last write stands."""
    unwritten = {}
    for sync in ("normal", "full"):
        sim = DurableSimulator(build_preset("fig2"), "snr", seed=3, covering="off")
        sim.durable_subscribe("D", "c:0", parse_subscription("[x,<,5]"))
        sim.run()
        start = sim.now
        for i in range(40):
            sim.at(start + i * 0.1, sim.publish, "Pa:0", "a:0", {"x": i % 10})
        sim.fail(Failure(("c:0",), 4.0, 5.0), start)
        sim.at(start + 4.0, sim.power_loss, "c:0", sync, 1.5)
        sim.run(start + 3.99)
        last = copy.deepcopy(sim._written["c:0"])
        before = [s for at, s in sim._writes["c:0"] if at <= start + 2.5][-1]
        sim.run(start + 4.5)
        restored = {ident: r.since for ident, r in sim.durable_records["c:0"].records.items()}
        kept = before if sync == "normal" else last
        assert restored == {ident: r.since for ident, r in kept.items()}
        assert before[("D", "d")].since != last[("D", "d")].since  # acknowledged since
        unwritten[sync] = sim.durable_clients["D"].unwritten
    assert unwritten["full"] < unwritten["normal"]  # the tail's acknowledgements too
