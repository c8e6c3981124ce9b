"""Replay (DESIGN §11): the rounds' rules over a whole overlay (every broker answers once,
the host hears when all have, a dead or silent part is reported), where a replay reaches,
its frames and its gaps. The retention store itself: tests/test_retention_store.py."""

from __future__ import annotations

from collections import deque
from functools import partial

import pytest
from conditions import stock_notification
from hypothesis import given
from hypothesis import strategies as st
from laws import scots

from octopis.core import make_broker
from octopis.core.codec import WireError, decode_body, decode_peer, encode_body, encode_peer
from octopis.core.durable import claim_of
from octopis.core.messages import Forward, Notification, SubState
from octopis.core.replay import (
    DATA_BATCH,
    Budgets,
    Claimed,
    ClaimRecord,
    ExpireAt,
    QueryStore,
    Replay,
    ReplayData,
    ReplayDeliver,
    ReplayDone,
    ReplayEcho,
    ReplayRounds,
    replay_request,
    sbp_targets,
)
from octopis.topology import Scot, build_preset
from octopis.wire import REPLAY, REPLAY_ECHO, pack
from octopis.wire.client import ReplayDoneNotice

FIG2 = build_preset("fig2")


def _request(budget: float = 3.0) -> Replay:
    return Replay("a:0/1", "a:0", ("[class,eq,'STOCK']",), (("P", 1, 4),), 100.0, budget)


class Overlay:
    """Every broker's rounds on SBP's paths, FIFO links between neighbours, stores that
    answer ``stored`` of each broker's own publications (its name as publisher);
    ``dead`` brokers take nothing."""

    def __init__(self, scot: Scot, dead: frozenset[str] = frozenset(), stored: int = 1) -> None:
        self.scot = scot
        self.dead = dead
        self.cores = {b: make_broker(scot, b, "dnr") for b in scot.brokers}
        self.rounds = {
            b: ReplayRounds(b, partial(self.targets, b)) for b in scot.brokers if b not in dead
        }
        self.stored = stored
        self.queries: dict[str, int] = {}
        self.delivered: list[Notification] = []
        self.done: list[ReplayEcho] = []
        self.wire: deque[tuple[str, str, object]] = deque()

    def targets(
        self, broker: str, src: str | None, state: SubState
    ) -> tuple[list[tuple[str, SubState]], list[tuple[str, SubState]]]:
        core = self.cores[broker]
        hops = sbp_targets(core.primary, list(core.secondary.values()), src, state)
        return [h for h in hops if h[0] not in self.dead], [h for h in hops if h[0] in self.dead]

    def run(self, host: str, request: Replay, requester: str | None = "H") -> None:
        """``requester`` (a client at ``host``; None: nobody) asks ``request``."""
        self.carry_out(host, self.rounds[host].start(request, 0.0, requester))
        while self.wire:
            src, dst, message = self.wire.popleft()
            body = encode_body(message)  # every message crosses the codec both ways
            assert decode_peer(encode_peer(src, message)) == (src, message)
            self.carry_out(dst, self.rounds[dst].receive(src, decode_body(src, body), 0.0))

    def carry_out(self, broker: str, actions: list) -> None:
        for action in actions:
            if type(action) is Forward:
                if action.link not in self.dead:
                    self.wire.append((broker, action.link, action.message))
            elif type(action) is QueryStore:
                self.queries[broker] = self.queries.get(broker, 0) + 1
                found = [stock_notification(broker, q) for q in range(5, 5 + self.stored)]
                self.carry_out(broker, self.rounds[broker].stored(action.request.req_id, found, []))
            elif type(action) is ReplayDeliver:
                self.delivered += action.notifications
            elif type(action) is ReplayDone:
                self.done.append(action.echo)


def test_a_replay_nobody_asked_at_the_host_answers_nobody_there() -> None:
    """Without a requester (a claim that only ends copies of a record, or one forgotten)
    the rounds still ask every store, and hand the host nothing to deliver and no
    summary: no shell asks whether someone is answered."""
    overlay = Overlay(FIG2)
    overlay.run("a:0", _request(), requester=None)
    assert overlay.queries == dict.fromkeys(FIG2.brokers, 1)
    assert overlay.delivered == [] and overlay.done == []


def test_every_broker_answers_once_and_the_host_hears_all() -> None:
    """fig2: the request reaches all 18 brokers once each; each store's answer reaches
    the host (in batches of DATA_BATCH), and one echo says all 18 answered."""
    overlay = Overlay(FIG2, stored=DATA_BATCH + 3)
    overlay.run("a:0", _request())
    assert overlay.queries == dict.fromkeys(FIG2.brokers, 1)
    (echo,) = overlay.done
    assert sorted(echo.answered) == sorted(FIG2.brokers)
    assert echo.silent == echo.unstored == echo.gaps == ()
    assert echo.published == len(overlay.delivered) == 18 * (DATA_BATCH + 3)
    assert {n.publisher for n in overlay.delivered} == set(FIG2.brokers)


def test_a_dead_broker_is_reported_silent_with_the_part_only_it_reaches() -> None:
    """c:0 dead from the start: the request goes the way a subscription from a:0 would,
    so nothing past c:0 on cluster 0's tree (d:0, e:0, f:0) nor the iCOL neighbours of
    c:0 and of those is asked (the subscription does not reach them either): c:0 is
    reported silent, regions a and b answer, each broker once."""
    overlay = Overlay(FIG2, dead=frozenset({"c:0"}))
    overlay.run("a:0", _request())
    (echo,) = overlay.done
    assert sorted(echo.answered) == [f"{r}:{k}" for r in "ab" for k in range(3)]
    assert echo.silent == ("c:0",)
    assert overlay.queries == dict.fromkeys(echo.answered, 1)


def test_a_neighbour_that_dies_mid_round_or_stays_silent_is_reported() -> None:
    """A round waits for its children's echoes: a child that goes down is reported
    at once; one that stays silent, once the round's budget has passed."""
    hops = [("c:0", SubState.PRIMARY), ("b:1", SubState.SECONDARY), ("b:2", SubState.SECONDARY)]
    rounds = ReplayRounds("b:0", lambda src, state: (hops, []))
    actions = rounds.receive("a:0", _request(2.0), 10.0)
    forwarded = [(a.link, a.message.state, a.message.budget) for a in actions if type(a) is Forward]
    assert forwarded == [(n, s, 1.5) for n, s in hops]
    assert rounds.stored("a:0/1", [], []) == []
    assert rounds.receive("b:1", ReplayEcho("a:0/1", seen=True), 10.1) == []
    assert rounds.link_down("c:0") == []
    assert rounds.expire(11.9) == [ExpireAt(12.0)]  # not yet: asked for again
    (echo,) = rounds.expire(12.0)  # nothing waits: no timer asked for
    assert echo.link == "a:0"
    assert echo.message.silent == ("c:0", "b:2") and echo.message.answered == ("b:0",)
    again = rounds.receive("c:0", _request(), 12.1)
    assert again == [Forward("c:0", ReplayEcho("a:0/1", seen=True))]


def test_answers_sent_up_a_link_that_went_down_are_reported_silent_not_answered() -> None:
    """Answers passed toward the host on a link that then goes down may have been dropped
    with it (the parent reports this part silent): the echo sent after, and a late echo
    passed on for a finished request, name those stores silent, never answered, so no
    late echo withdraws a gap whose data was lost."""
    rounds = ReplayRounds("b:0", lambda src, state: ([("c:0", SubState.PRIMARY)], []))
    rounds.receive("a:0", _request(2.0), 10.0)
    rounds.stored("a:0/1", [], [])
    page = ReplayData("a:0/1", (stock_notification("c:1", 1),))
    assert rounds.receive("c:0", page, 10.1) == [Forward("a:0", page)]
    assert rounds.link_down("a:0") == []
    (echo,) = rounds.receive("c:0", ReplayEcho("a:0/1", answered=("c:0", "c:1")), 10.2)
    assert echo.link == "a:0"
    assert echo.message.answered == () and echo.message.silent == ("b:0", "c:0", "c:1")
    late = rounds.receive("d:0", ReplayEcho("a:0/1", answered=("d:0",)), 10.3)
    assert late == [Forward("a:0", ReplayEcho("a:0/1", silent=("d:0",)))]


def test_a_part_still_sending_data_is_waited_for_from_its_last_page() -> None:
    """A large answer comes page by page: a child whose data keeps coming is waited for
    its budget from the last page (not reported silent at the request's deadline, and
    the expiry asks to be called again then), and once it stops, its budget later, it
    is."""
    rounds = ReplayRounds("b:0", lambda src, state: ([("c:0", SubState.PRIMARY)], []))
    assert rounds.receive("a:0", _request(2.0), 10.0)[-2:] == [
        ExpireAt(12.0),
        QueryStore(_request(2.0)),
    ]
    rounds.stored("a:0/1", [], [])
    page = ReplayData("a:0/1", (stock_notification("c:0", 5),))
    assert rounds.receive("c:0", page, 11.5) == [Forward("a:0", page)]
    assert rounds.expire(12.5) == [ExpireAt(13.5)]
    (echo,) = rounds.expire(13.5)
    assert echo.message.silent == ("c:0",)


def test_a_round_sets_its_timer_and_asks_a_store_only_where_there_is_one() -> None:
    """Every round taken asks for :meth:`ReplayRounds.expire` at its deadline (now plus
    its budget); a claim looks for a record, not publications; a broker without a store
    answers at once, unstored, and a claim's echo names it unstored too."""
    rounds = ReplayRounds("b:0", lambda src, state: ([], []))
    actions = rounds.receive("a:0", _request(2.0), 10.0)
    assert actions == [ExpireAt(12.0), QueryStore(_request(2.0))]
    claim = Replay("a:0/2", "a:0", (), (), 0.0, 2.0, claim=claim_of("audit", "d"))
    assert rounds.receive("a:0", claim, 10.0) == [ExpireAt(12.0), ClaimRecord(claim)]
    unstored = ReplayRounds("b:0", lambda src, state: ([], []), has_store=False)
    timer, echo = unstored.receive("a:0", _request(2.0), 10.0)
    assert timer == ExpireAt(12.0) and echo.message.unstored == ("b:0",)
    unstored.receive("a:0", claim, 10.0)
    (echo,) = unstored.stored("a:0/2", [], [])
    assert echo.message.unstored == ("b:0",) and echo.message.answered == ()


def test_rounds_are_bounded() -> None:
    """Past ``limit`` rounds the oldest ends early, its missing echoes reported."""
    rounds = ReplayRounds("b:0", lambda src, state: ([("c:0", SubState.PRIMARY)], []), limit=2)
    for i in range(3):
        rounds.receive("a:0", Replay(f"r{i}", "a:0", ("[x,>,1]",), (), 0.0, 3.0), 0.0)
    assert list(rounds.rounds) == ["r1", "r2"] and rounds.stats["replay.ended_early"] == 1


def test_a_host_names_the_requester_of_its_latest_rounds_and_where_answers_go() -> None:
    """The host remembers who asked for each of its latest ``limit`` requests (late
    answers still find them: the rounds name the requester in what they hand over, the
    shells only hand it), a round that ended early is no longer answered, and a round's
    answers go to the neighbour it came from (the shell asks, DESIGN §11)."""
    rounds = ReplayRounds("a:0", lambda src, state: ([("c:0", SubState.PRIMARY)], []), limit=2)
    for i in range(3):
        rounds.start(Replay(f"r{i}", "a:0", ("[x,>,1]",), (), 0.0, 3.0), 0.0, f"client{i}")
    assert [rounds.requester(f"r{i}") for i in range(3)] == [None, "client1", "client2"]
    assert not rounds.answering("r0") and rounds.answering("r2")
    assert rounds.toward("r2") is None  # the host's own: answered here
    rounds.receive("b:0", Replay("r9", "b:0", ("[x,>,1]",), (), 0.0, 3.0), 0.0)
    assert rounds.toward("r9") == "b:0" and rounds.requester("r9") is None
    n = stock_notification("c:0", 5)
    (deliver,) = rounds.receive("c:0", ReplayData("r2", (n,)), 0.1)
    assert deliver == ReplayDeliver("r2", (n,), "client2")
    assert rounds.stored("r2", [], []) == []  # c:0 has not echoed yet
    (done,) = rounds.receive("c:0", ReplayEcho("r2", answered=("c:0",)), 0.2)
    assert done.requester == "client2" and done.echo.answered == ("a:0", "c:0")


@given(scots(), st.data())
def test_a_replay_reaches_where_the_subscription_reaches_and_names_the_rest(
    scot: Scot, data: st.DataObject
) -> None:
    """Law: whatever brokers are dead, the request is answered once by every broker a
    subscription from the host reaches (the host cluster's tree through live brokers,
    and the live B(x, k) beside each of them), and the dead brokers where that reach
    stops are reported silent, each once."""
    brokers = sorted(scot.brokers)
    host = data.draw(st.sampled_from(brokers))
    dead = frozenset(data.draw(st.sets(st.sampled_from(brokers), max_size=3)) - {host})
    overlay = Overlay(scot, dead)
    overlay.run(host, Replay("r", host, ("[x,>,1]",), (), 0.0, 3.0))
    cluster = scot.brokers[host].cluster
    tree = {b for b, info in scot.brokers.items() if info.cluster == cluster}
    reach, silent, todo = {host}, set(), [host]
    while todo:
        for n in scot.brokers[todo.pop()].neighbours:
            if n.id in tree and n.id not in reach:
                (silent if n.id in dead else reach).add(n.id)
                if n.id not in dead:
                    todo.append(n.id)
    region = {scot.brokers[b].region for b in reach}
    beside = {b for b, info in scot.brokers.items() if info.region in region} - tree
    (echo,) = overlay.done
    assert sorted(echo.answered) == sorted(reach | (beside - dead))
    assert sorted(echo.silent) == sorted(silent | (beside & dead))
    assert overlay.queries == dict.fromkeys(echo.answered, 1)


def test_a_replay_frame_that_breaks_the_format_is_refused() -> None:
    """Each field is checked and named."""
    tail = [None, 0, 0, ""]  # until, answer_max, answer_bytes, claim
    echo_tail = [[], []]  # truncated, claimed
    bad = [
        (pack([REPLAY, "r", "a:0", ["[x,>"], [], 0.0, 3.0, 1, *tail]), "bad content"),
        (pack([REPLAY, "r", "a:0", ["[x,>,1]"], [["P", -1, 2]], 0.0, 3.0, 1, *tail]), "since"),
        (pack([REPLAY, "r", "a:0", ["[x,>,1]"], [], "now", 3.0, 1, *tail]), "after"),
        (pack([REPLAY, "r", "a:0", ["[x,>,1]"], [], 0.0, 3.0, 7, *tail]), "state"),
        (pack([REPLAY, "r", "a:0", ["[x,>,1]"], [], 0.0, 3.0, 1, "x", 0, 0, ""]), "until"),
        (pack([REPLAY, "r", "a:0", ["[x,>,1]"], [], 0.0, 3.0, 1, None, -1, 0, ""]), "answer_max"),
        (pack([REPLAY, "r", "a:0", ["[x,>,1]"], [], 0.0, 3.0, 1, None, 0, 0, 5]), "claim"),
        (pack([REPLAY, "r", "a:0", ["[x,>,1]"], [], 0.0, 3.0, 1]), "8 fields, expected 12"),
        (pack([REPLAY_ECHO, "r", 1, [], [], [], [], 0, *echo_tail]), "REPLAY_ECHO seen"),
        (pack([REPLAY_ECHO, "r", False, [], [], [], [["P", 1, 2]], 0, *echo_tail]), "gaps"),
        (pack([REPLAY_ECHO, "r", False, [], [], [], [], 0, [], [["b:0"]]]), "claimed"),
        (pack([REPLAY_ECHO, "r", False, [], [], [], [], 0, [""], []]), "truncated"),
        (pack([9, "r", [b"\x00"]]), "REPLAY_DATA|not msgpack|kind"),
    ]
    for body, problem in bad:
        with pytest.raises(WireError, match=problem):
            decode_body("a:0", body)
    data = ReplayData("r", (stock_notification("P", 1),))
    assert decode_body("a:0", encode_body(data)) == data
    request = Replay("r", "a:0", ("[x,>,1]",), (("P", 1, 2),), 5.0, 3.0, until=9.0, claim="c/d")
    assert decode_body("a:0", encode_body(request)) == request
    claimed = Claimed("b:0", ("[x,>,1]",), (("P", 1, 2),), 4.0, 6.0)
    echo = ReplayEcho("r", answered=("b:0",), truncated=("b:0",), claimed=(claimed,))
    assert decode_body("a:0", encode_body(echo)) == echo


def test_a_gap_filled_late_is_narrowed_then_withdrawn_and_the_application_told() -> None:
    """A replay left two brokers silent; each answers later (its publications are
    delivered, then its part's echo comes): the subscriber's gap shrinks to the broker
    still silent, then goes, and ``on_gap_filled`` hears each step; ``gaps`` never
    names a broker that has answered."""
    from dataclasses import replace

    from octopis.client import Connection, Subscriber
    from octopis.client.replay import ReplayGap

    told: list[tuple[ReplayGap, ReplayGap | None]] = []
    sub = Subscriber(
        "s",
        Connection(["tcp://127.0.0.1:1"]),
        on_gap_filled=lambda gap, left: told.append((gap, left)),
    )
    gap = ReplayGap("s", "r1", 100.0, silent=("b:0", "c:0"))
    other = ReplayGap("s", "r0", 50.0, trimmed=(("p", 0, 1, 4),))
    record = {
        "id": "r1",
        "gap": gap,
        "late_replayed": 0,
        "repeats": 0,
        "late_parts": [],
    }
    sub.gaps.extend([other, gap])
    sub.replay_log.late.ended("r1", [], gap.silent)
    assert sub.replay_log.late.awaiting
    sub.replay_log.late_answer(record, _done(["b:0"], published=2))
    left = replace(gap, silent=("c:0",))
    assert list(sub.gaps) == [other, left] and told == [(gap, left)]
    sub.replay_log.late_answer(record, _done(["c:0"]))
    assert list(sub.gaps) == [other] and told[-1] == (left, None)
    assert record["gap"] is None and not sub.replay_log.late.awaiting
    sub.replay_log.late_answer(record, _done(["c:0"]))
    assert len(told) == 2  # nothing left to fill: told once per step


def _done(answered: list[str], published: int = 0) -> ReplayDoneNotice:
    """A late part's ``replay_done`` notice: ``answered`` brokers, ``published`` found."""
    return ReplayDoneNotice(
        id="r1",
        answered=answered,
        unstored=[],
        silent=[],
        gaps=[],
        published=published,
        late=True,
        truncated=[],
        claimed=[],
    )


def test_a_claim_and_a_window_of_the_past_wait_the_historic_budget_a_replay_its_own() -> None:
    """One rule for every host, a process's or the simulator's: what budget a request's
    host waits for its answers (``[retention]``'s ``historic_budget`` for a window of the
    past or a durable record's claim, ``replay_budget`` for a fail-over's replay)."""
    budgets = Budgets(replay_budget=2.0, historic_budget=20.0)
    replay = replay_request("a:0/1", "a:0", ["[x,>,1]"], [("P", 0, 3)], 5.0, budgets)
    assert replay == Replay("a:0/1", "a:0", ("[x,>,1]",), (("P", 0, 3),), 5.0, 2.0)
    window = replay_request("a:0/2", "a:0", ["[x,>,1]"], (), 5.0, budgets, historic=True)
    claim = replay_request("a:0/3", "a:0", (), (), 0.0, budgets, claim="c\x00d")
    assert (window.budget, claim.budget, claim.claim) == (20.0, 20.0, "c\x00d")
    assert replay_request("r", "a:0", (), (), 0.0).budget == Budgets().replay_budget == 3.0
