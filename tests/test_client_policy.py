"""The client policy's seam (DESIGN §11): a replay's answer joins the live deliveries
held while it came, each publication once, in publisher order; and a replay asks, of
each publisher, from a publication nothing earlier can still overtake. And when a
connection's fail-over tries end, and what it sends again (DESIGN §7)."""

from __future__ import annotations

import itertools
import random

import pytest

from octopis.client_policy import (
    NO_ANSWER,
    SEAM_FILLED,
    ClaimAnswer,
    DurableProgress,
    FromPoints,
    LateAnswers,
    RecentDeliveries,
    ReplayGaps,
    Seam,
    SubscriberReplays,
    claim_gap,
    each_once,
    join_at_seam,
    still_silent,
)
from octopis.client_policy.failover import Unanswered, connect_tries, failover_tries
from octopis.client_policy.moves import Linger, Resubscribe, WithdrawOld, move_across
from octopis.core.replay import Claimed
from octopis.defaults import LINGER, PUBLISHERS_KNOWN


def test_the_seam_delivers_each_publication_once_in_publisher_order() -> None:
    delivered = {("p", 1, 1)}  # before the fail-over
    live = [("q", 2, 1), ("p", 1, 3)]  # held while the answer came

    def first_time(item: tuple[str, int, int]) -> bool:
        if item in delivered:
            return False
        delivered.add(item)
        return True

    replayed = [("p", 1, 2), ("p", 1, 1), ("q", 1, 7), ("p", 1, 2), ("p", 1, 3)]
    delivered.update(live)  # the live ones went through the connection's record
    joined, repeats = join_at_seam(live, replayed, lambda item: item, first_time)
    assert joined == [("p", 1, 2), ("p", 1, 3), ("q", 1, 7), ("q", 2, 1)]
    assert repeats == 3  # p#1 seen before, p#2 twice in the answer, p#3 held live
    assert len(joined) == len(set(joined))


def test_a_seam_with_nothing_replayed_keeps_the_live_deliveries_in_order() -> None:
    joined, repeats = join_at_seam([("b", 0, 2), ("a", 0, 9)], [], lambda i: i, lambda _: True)
    assert (joined, repeats) == ([("a", 0, 9), ("b", 0, 2)], 0)


def test_a_replay_asks_from_a_publication_taken_before_anything_earlier_could_overtake() -> None:
    """Seed 45344's history: seq 2 taken 0.63 s before the broker went silent, seq 1
    still on a detour (it came after seq 2): the replay asks for that publisher by time,
    so seq 1 comes with it. One taken ``settle`` before the silence is a from-point."""
    points = FromPoints(settle=4.0)
    points.saw("Pb:0", 0, 2, 1.57)
    assert points.since(2.2) == []
    points.saw("q", 1, 5, 3.0)
    assert points.since(7.0) == [("Pb:0", 0, 2), ("q", 1, 5)]
    assert points.since(6.5) == [("Pb:0", 0, 2)]


def test_from_points_are_never_too_late_and_stay_close() -> None:
    """Against every take remembered: the from-point was taken by ``silent - settle``
    (nothing earlier still in flight), and is no lower than the last taken a span before
    that (a span's points lose no more)."""
    rng = random.Random(7)
    for _ in range(300):
        settle = rng.choice((0.5, 2.0, 4.0))
        points, takes, now = FromPoints(settle=settle), [], 0.0
        for _ in range(rng.randint(1, 60)):
            now += rng.expovariate(3.0)
            seq = rng.randint(1, 40)  # out of order, repeated
            points.saw("p", 0, seq, now)
            takes.append((now, seq))
        silent = now + rng.uniform(0, 3 * settle)
        since = dict(((p, s), q) for p, s, q in points.since(silent))
        cutoff = silent - settle
        usable = [seq for at, seq in takes if at <= cutoff]
        if ("p", 0) in since:
            assert since[("p", 0)] <= max(usable)
        close = [seq for at, seq in takes if at <= cutoff - points.span]
        if close:
            assert since[("p", 0)] >= max(close)


def test_from_points_outlive_the_takes_that_follow_the_silence() -> None:
    """The process test's failure: takes went on for 6 s after the broker fell silent (a
    move's other connection, the broker left behind), and the replay was asked then. The
    from-point is still one taken ``settle`` before the silence, not none (a replay by
    time, 30 s back, re-sent what the record of recent deliveries had forgotten), and it
    stays so for a replay asked up to ``reach`` after the silence."""
    points = FromPoints(settle=4.0, reach=30.0)
    now, seq = 0.0, 0
    while now < 106.0:
        seq += 1
        points.saw("p", 1, seq, now)
        now += 0.25
    silent = 100.0
    point = dict(((p, s), q) for p, s, q in points.since(silent))[("p", 1)]
    assert 4 * (silent - 4.0 - points.span) <= point <= 4 * (silent - 4.0) + 1
    late = FromPoints(settle=4.0, reach=30.0)
    for step in range(4 * 130):
        late.saw("p", 1, step + 1, step / 4)
    assert [q for _, _, q in late.since(100.0)] and late.since(100.0)[0][2] <= 4 * 96 + 1


def test_from_points_forget_the_least_recently_heard_past_their_bound() -> None:
    points = FromPoints(settle=1.0, known=3)
    for i, name in enumerate("abcd"):
        points.saw(name, 0, 1, float(i))
    assert ("a", 0) not in points and len(points) == 3
    assert [p for p, _, _ in points.since(10.0)] == ["b", "c", "d"]
    assert FromPoints().known == PUBLISHERS_KNOWN
    with pytest.raises(ValueError, match="settle time"):
        FromPoints(settle=-1.0)
    with pytest.raises(ValueError, match="reach"):
        FromPoints(reach=0.0)


def test_the_record_of_recent_deliveries_joins_a_seam_and_drops_live_repeats() -> None:
    """One rule for the SDK and the simulator's clients: a live delivery is taken once;
    a replay's answer joins what was held, each once, in publisher order."""
    record = RecentDeliveries(horizon=30.0)
    assert record.took(("c", "p", 1, 1), 0.0) and not record.took(("c", "p", 1, 1), 1.0)
    joined, repeats = record.join("c", [("q", 1, 1)], [("p", 1, 2), ("p", 1, 1)], lambda i: i, 2.0)
    assert (joined, repeats) == ([("p", 1, 2), ("q", 1, 1)], 1)
    assert not record.took(("c", "p", 1, 2), 3.0)  # recorded by the join


def test_a_late_part_narrows_a_replays_gap_and_a_claim_names_its_own() -> None:
    """A broker a late echo names answered leaves the gap, even if it names it silent
    too; a claim leaves a gap when a broker stayed silent or it failed finding nothing."""
    outstanding = {"b:0", "c:0"}
    still_silent(outstanding, ("b:0",), ("b:0", "d:0"))
    assert outstanding == {"c:0", "d:0"}
    assert claim_gap(True, ()) is None and claim_gap(False, ()) is None
    assert claim_gap(True, (), "claim failed: timeout") is None  # the record came anyway
    assert claim_gap(False, (), "claim failed: timeout") == "claim failed: timeout"
    assert "fresher copy" in (claim_gap(True, ("c:0",)) or "")


def test_only_a_late_part_of_the_same_request_narrows_its_gap() -> None:
    """Each replay request keeps its own silent brokers: a late part of one does not
    narrow another's, a request with nothing missing is forgotten, and a request answered
    again under the same id starts afresh."""
    gaps = ReplayGaps()
    gaps.left("r1", ("b:0", "c:0"))
    gaps.left("r2", ("b:0",))
    gaps.left("r3", ())
    assert gaps == {"r1": {"b:0", "c:0"}, "r2": {"b:0"}}
    gaps.answered("r1", ("b:0",), ())
    assert gaps == {"r1": {"c:0"}, "r2": {"b:0"}} and gaps.silent() == {"b:0", "c:0"}
    gaps.answered("r2", ("b:0",), ("d:0",))
    assert gaps == {"r1": {"c:0"}, "r2": {"d:0"}}
    gaps.answered("r2", ("d:0",), ())
    assert "r2" not in gaps and gaps.silent() == {"c:0"}
    gaps.left("r1", ("e:0",))
    assert gaps == {"r1": {"e:0"}}


def test_a_durable_progress_drops_what_its_claimed_record_covers() -> None:
    """What a claimed record says was taken is taken, a late copy of it is covered, and a
    fail-over owes from the earlier of the record's start and the replay's."""
    progress = DurableProgress()
    assert not progress.covers("P", 1, 1)
    progress.claimed([("P", 1, 5)], after=10.0)
    assert progress.covers("P", 1, 5) and not progress.covers("P", 1, 6)
    assert progress.taken.since() == [("P", 1, 5)]
    progress.failed_over(20.0)
    assert progress.owed_after == 10.0


def test_a_claims_answer_says_the_gap_and_the_replay_from_the_record() -> None:
    """A claim that found copies resumes from the freshest, of each publisher after the
    highest acknowledged, of others from the earliest start; one that found none asks
    for nothing, and is a gap only if brokers stayed silent or it failed."""
    kept = Claimed("e:1", ("[x,<,6]",), (("P", 0, 1), ("Q", 0, 7)), 2.0, 32.0)
    moved = Claimed("c:1", ("[x,<,6]",), (("P", 0, 3),), 33.8, 33.9)
    progress = DurableProgress()
    answer = progress.claim_answered([kept, moved], silent=("d:0",))
    assert answer.resumed is moved and answer.after == 2.0
    assert sorted(answer.since) == [("P", 0, 3), ("Q", 0, 7)]
    assert answer.gap is not None and "fresher copy" in answer.gap
    assert progress.covers("Q", 0, 7) and progress.owed_after == 2.0
    new = DurableProgress()
    assert new.claim_answered([], silent=()) == ClaimAnswer(None)
    failed = new.claim_answered([], silent=(), error="claim failed: timeout")
    assert failed.gap == "claim failed: timeout" and failed.resumed is None
    assert new.record is None and new.whole() is None


def test_a_subscribers_replays_note_each_delivery_and_ask_from_it_after_a_failover() -> None:
    """A delivery moves the from-points and, while a replay waits for late answers, is
    kept from them; a fail-over's replay asks from the points, by time from the first
    subscription less the skew, and each durable record owes from that start."""
    replaying = SubscriberReplays(late=LateAnswers())
    replaying.subscribed(50.0)
    replaying.subscribed(55.0)  # the first time counts
    replaying.late.ended("r1", [], ["b:0"])
    replaying.delivered("P", 0, 4, 10.0)
    assert not replaying.late.fresh("r1")(("P", 0, 4))
    one, other = DurableProgress(), DurableProgress()
    other.claimed([], after=3.0)
    since, after = replaying.failed_over(60.0, [one, other])
    assert since == [("P", 0, 4)] and after == 49.0
    assert (one.owed_after, other.owed_after) == (49.0, 3.0)
    replaying.late.answered("r1", ["b:0"], [])
    assert not replaying.late.awaiting


def test_a_seam_holds_live_deliveries_up_to_its_limit_and_waits_for_its_request() -> None:
    seam: Seam[str, str, str] = Seam(limit=2)
    assert seam.hold("a") and seam.hold("b") and not seam.overflowed
    assert not seam.hold("c") and seam.overflowed and seam.live == ["a", "b"]
    seam.part("r2", ["x"])  # before the request is named: kept by id
    assert not seam.end("r1", "claim done") and seam.answer == []
    assert seam.named("r1") and seam.next_request() == "claim done"
    assert seam.replay is None and not seam.named("r2")
    seam.part("r2", ["y"])
    assert seam.answer == ["x", "y"] and seam.progress == 2
    assert seam.end("r2", "done") and seam.summary == "done"
    unheld: Seam[str, str, str] = Seam(hold_live=False)
    assert not unheld.hold("a") and not unheld.overflowed


def test_a_seam_tells_why_its_request_falls_short() -> None:
    """One rule for the SDK and the simulator's subscribers: the shell's own error; no
    end is no answer; an answer cut at its bounds, or a seam that overflowed, falls
    short as a whole; a full answer through a seam that held every live delivery does
    not (what its end says of silent, unstored and trimmed parts is a gap apart)."""
    seam: Seam[str, str, str] = Seam(limit=1, replay="r")
    assert seam.shortfall() == NO_ANSWER and seam.shortfall("refused") == "refused"
    seam.end("r", "done")
    assert seam.hold("a") and seam.shortfall() is None
    assert seam.shortfall(truncated=["b:1"]) == "stores cut their answer at its bounds: b:1"
    assert not seam.hold("b") and seam.shortfall() == SEAM_FILLED
    assert seam.shortfall("refused") == "refused"


def test_the_failover_tries_end_only_once_every_broker_of_the_list_is_gone() -> None:
    """The SDK goes round its list endlessly (it cannot know a broker will not restart);
    told which are gone for good (the simulator), the tries end instead of the None of
    a round after which none of the client's own list may answer, whatever brokers off
    that list do."""
    endless = failover_tries(["a", "b", "c"], "a")
    assert [next(endless) for _ in range(8)] == ["b", "c", "a", None, "b", "c", "a", None]
    gone = {"a", "b"}
    asked: set[str] = set()

    def gone_for_good(broker: str) -> bool:
        asked.add(broker)
        return broker in gone

    tries = failover_tries(["a", "b", "c"], "b", gone_for_good)
    assert [next(tries) for _ in range(4)] == ["c", "a", "b", None]  # c may come back
    gone.add("c")
    assert list(tries) == ["c", "a", "b"]
    assert asked == {"a", "b", "c"}  # its list only: "d", alive or not, is never asked


def test_a_move_across_subscribes_anew_lingers_then_withdraws() -> None:
    """Make before break (DESIGN §9): the new subscriptions first, the old ones kept
    ``linger`` seconds (the one default, ``defaults.LINGER``, unless given), then
    withdrawn; nothing waits for a sign that the new ones have spread."""
    assert move_across(["s1", "s2"]) == [
        Resubscribe(("s1", "s2")),
        Linger(LINGER),
        WithdrawOld(("s1", "s2")),
    ]
    assert move_across(iter(["s1"]), 0.5) == [
        Resubscribe(("s1",)),
        Linger(0.5),
        WithdrawOld(("s1",)),
    ]


def test_a_new_connection_tries_its_list_from_the_first() -> None:
    """A client connecting anew (a durable subscriber back as a new process) tries its
    list from its first broker, then goes round it as a fail-over does, the tries ending
    once every broker of it is gone for good."""
    assert list(itertools.islice(connect_tries(["a", "b"]), 5)) == ["a", "b", None, "a", "b"]
    assert list(connect_tries(["a", "b"], lambda broker: True)) == ["a", "b"]


def test_a_fail_over_sends_again_what_is_unanswered_in_the_order_first_sent() -> None:
    """What a connection sends again at the broker it fails over to: what its
    publications need there first (a publisher's advertisements), then each request not
    answered (confirmed, refused or given up), in the order first sent; one sent again
    keeps its place and its first form (a publication, its sequence number and stamp)."""
    waiting: Unanswered[int, str] = Unanswered()
    for seq in (1, 2, 3, 4):
        waiting.sent(seq, f"p{seq}")
    assert waiting.answered(2) == "p2"  # confirmed
    assert waiting.answered(2) is None  # answered once
    waiting.sent(1, "p1 again")  # sent again at a fail-over: keeps its place and form
    waiting.sent(5, "p5")
    assert waiting.resend(["advertise"]) == ["advertise", "p1", "p3", "p4", "p5"]
    assert (len(waiting), 3 in waiting, 2 in waiting, waiting.get(4)) == (4, True, False, "p4")
    for seq in (1, 3, 4, 5):
        waiting.answered(seq)
    assert waiting.resend(["advertise"]) == ["advertise"] and not waiting.waiting()


def test_a_historic_answer_holds_each_publication_once_in_publisher_order() -> None:
    """Two stores may both keep a publication its publisher sent again after a
    fail-over: the historic answer its subscriber takes holds it once, the first copy,
    in publisher order."""
    answer = [("q", 1, 2, "a"), ("p", 1, 5, "a"), ("q", 1, 2, "b"), ("p", 1, 1, "b")]
    assert each_once(answer, lambda item: item[:3]) == [
        ("p", 1, 1, "b"),
        ("p", 1, 5, "a"),
        ("q", 1, 2, "a"),
    ]


def test_a_silent_broker_is_noticed_three_unanswered_heartbeats_and_the_liveness_later() -> None:
    """The SDK's heartbeat watch (``client_policy.silence``), as its connections tick it
    and as the simulator's clients run it: a broker that answers nothing from ``t`` on
    is judged silent at the first tick ``liveness`` after the first heartbeat it left
    unanswered (one sent as it was last heard counts as answered), more than
    ``liveness`` and at most ``liveness`` plus one interval after ``t``,
    wherever the connection's ticks fall. Input heard, or waiting unread, starts it
    again; so does a stall of the client's own process, which ticks late rather than
    often: three heartbeats must go unanswered, however long they take."""
    from octopis.client_policy.silence import (
        SilenceWatch,
        heartbeat_interval,
        phase_of,
        silence_noticed,
    )
    from octopis.defaults import CLIENT_LIVENESS

    interval = heartbeat_interval()
    assert interval == CLIENT_LIVENESS / 3 and heartbeat_interval(1.0, 1.5) == 0.25
    rng = random.Random(4)
    for _ in range(200):
        t = rng.uniform(0, 100)
        phase = phase_of(f"c{rng.random()}", 7, interval)
        assert 0 <= phase < interval
        noticed = silence_noticed(t, phase, interval)
        assert CLIENT_LIVENESS < noticed - t <= CLIENT_LIVENESS + interval + 1e-9
        assert (noticed - phase) / interval == pytest.approx(round((noticed - phase) / interval))
    assert silence_noticed(1.0, 0.0, 0.5) == pytest.approx(3.0)  # heard at that tick
    assert silence_noticed(1.01, 0.0, 0.5) == pytest.approx(3.0)
    watch = SilenceWatch(1.5)
    assert [watch.tick(t, heard=0.0) for t in (0.5, 1.0, 1.5)] == [False] * 3
    assert not watch.tick(2.0, heard=1.8)  # heard after the first unanswered: again
    assert [watch.tick(t, heard=1.8) for t in (2.5, 3.0)] == [False, False]
    assert not watch.tick(3.5, heard=1.8, answered=True)  # waiting unread: it answered
    assert [watch.tick(t, heard=1.8) for t in (4.0, 4.5)] == [False, False]
    assert watch.tick(5.0, heard=1.8) and watch.first_unanswered is None  # 3.5's beat
    stalled = SilenceWatch(1.5)
    assert [stalled.tick(t, heard=0.0) for t in (0.5, 10.0, 20.0)] == [False] * 3
    assert stalled.tick(20.5, heard=0.0)  # the third unanswered, long past the liveness
