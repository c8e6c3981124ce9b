"""The broker node's failure decisions (``octopis.core.node``, DESIGN §7), and the
simulator and the broker process taking them from it.

Unit checks of :class:`BrokerNode` (the order of work when a link heals, the hold of
local publications while resyncing, when a share is owed and paid, BID's lost table),
then the simulator running the same decisions: a publication made at a restarted broker
while it resyncs is held and delivered exactly once (the simulator used to refuse it),
a restarted BID broker counts what its lost table cannot reach (the processes never
did), and a second fail-over goes on along the list of the first (the simulator used to
recompute it). What the stores answer to a replay: tests/test_node_answers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_scenarios import fig2_settled

from octopis.client_policy import LastSeen, replay_after
from octopis.client_policy.failover import failover_order
from octopis.core import (
    Forward,
    Hold,
    NoCongestion,
    Notification,
    Subscribe,
    SubState,
    Unsubscribe,
    make_broker,
)
from octopis.core.custody import PublishReceipt
from octopis.core.neighbours import TRANSITIONS, Event, Neighbours, Phase, stall
from octopis.core.node import BrokerNode, HandedShare, NotKept, NotServing, Refused, read_sbp
from octopis.core.replay import Replay, ReplayData
from octopis.defaults import CLOCK_SKEW, LOOKBACK, PUBLISHERS_KNOWN
from octopis.failure_schedule import Failure
from octopis.filters.language import Predicate, Subscription
from octopis.topology import build_preset

FIG2 = build_preset("fig2")
NO_CONGESTION = NoCongestion()


def _node(broker: str = "c:0", mode: str = "snr", **kw: object) -> BrokerNode:
    return BrokerNode(make_broker(FIG2, broker, mode, covering="off"), 100, **kw)


def _settled(node: BrokerNode, *, down: tuple[str, ...] = ()) -> BrokerNode:
    """``node`` has met every neighbour (synced, serving); those in ``down`` are
    declared down since."""
    for n in FIG2.brokers[node.core.id].neighbours:
        node.neighbours.built(n.id, 7, 0.0)
    for n in down:
        node.neighbours.silent(n, 1.0)
    return node


def _sub(core_id: str, n: int) -> Subscribe:
    return Subscribe(
        f"{core_id}#{n}",
        core_id,
        Subscription((Predicate("x", "<", n),)),
        SubState.PRIMARY,
        None,
        0.0,
    )


def test_a_healed_link_hands_held_subscriptions_then_refresh_then_copies_then_shares() -> None:
    """The process's order, now the only one: what SBP could not send first, then (with
    covering) what went over the link before, then the held copies, then owed shares."""
    node = BrokerNode(make_broker(FIG2, "c:0", "snr", covering="active"), 100, serving=True)
    _settled(node)
    peer = next(n.id for n in FIG2.brokers["c:0"].neighbours)
    sub_id, actions = node.core.subscribe("S", Subscription((Predicate("x", "<", 3),)), 0.0)
    sent = [a for a in actions if type(a) is Forward and a.link == peer]
    assert sent, "the subscription goes over the link first"
    node.link_down(peer, [_sub("b:0", 5)])
    copy = Notification("P", 1, 0.0, {"x": 1})
    node.recovery.hold_copy(peer, copy)
    node.recovery.owed_shares.add(peer)
    steps = node.link_back(peer)
    kinds = [
        "held"
        if type(a) is Forward and getattr(a.message, "sub_id", "") == "b:0#5"
        else "copy"
        if type(a) is Forward and a.message is copy
        else "share-end"
        if type(a) is HandedShare
        else "refresh"
        if type(a) is Forward and getattr(a.message, "sub_id", "") == sub_id
        else "share"
        for a in steps
    ]
    assert kinds[0] == "held"
    assert kinds.index("refresh") < kinds.index("copy") < kinds.index("share-end")
    assert kinds[-1] == "share-end" and steps[-1].link == peer


def test_local_publications_wait_for_serving_up_to_the_hold() -> None:
    """Not serving: a publication is held (no action), in order, up to the hold, and its
    receipt waits for the hold's copy; past it the publisher is refused with a message
    that says why (its receipt keeps nothing); serving hands them back."""
    node = _node(publication_hold=2)
    notes = [Notification("P", i, 0.0, {"x": 1}) for i in (1, 2, 3)]
    answered: list[int] = []
    r1, r2, r3 = (PublishReceipt(lambda i=i: answered.append(i)) for i in (1, 2, 3))
    assert node.publish(notes[0], r1, NO_CONGESTION) is None
    assert node.publish(notes[1], r2, NO_CONGESTION) is None
    with pytest.raises(NotServing, match="resyncing after its start and already holds 2"):
        node.publish(notes[2], r3, NO_CONGESTION)
    assert node.counters["publications_refused.hold_full"] == 1
    assert r1.waits and r2.waits and not r3.waits and answered == []
    node.start(0.0, down_after=1.0)
    assert node.serve_if_ready(0.5, NO_CONGESTION) is None  # no neighbour heard: wait for T
    steps = node.serve_if_ready(1.0, NO_CONGESTION)
    assert steps is not None and node.held == []
    assert next(steps)[1] is r1  # the first held, published: its actions carry r1
    assert r1.waits and answered == []  # its hold copy is held once the shell routed it
    assert next(steps)[1] is r2 and answered == [1]
    assert next(steps) == ([], None) and answered == [1, 2]  # then the shares: none owed
    assert node.publish(notes[2], r3, NO_CONGESTION) is not None  # routed now
    assert not r3.waits


def test_a_publication_its_store_refuses_is_refused_before_routing_and_counted() -> None:
    """The store's refusal, handed to the publish step, refuses the publication before the
    node takes it (neither held nor routed, its receipt keeps nothing), counted once by
    the node for both shells; without one it is taken."""
    node = _node()
    note = Notification("P", 1, 0.0, {"x": 1})
    receipt = PublishReceipt(lambda: None)
    with pytest.raises(NotKept, match="the disk refused"):
        node.publish(note, receipt, NO_CONGESTION, "the disk refused a commit")
    assert node.counters["publications_refused.not_kept"] == 1
    assert node.held == [] and not receipt.waits
    assert node.publish(note, receipt, NO_CONGESTION) is None  # taken: held (not serving)
    assert node.held == [(note, receipt)] and issubclass(NotKept, Refused)


def test_copies_given_back_are_routed_again_then_their_receipts_count_them_held() -> None:
    """What a link gave back goes again one step per copy, routed with the link down
    and carrying its receipt; the copy taken back counts as held once the shell asks for
    the next step (after it carried out the rerouted copies, which the receipt keeps)."""
    node = _settled(_node(), down=("b:0",))
    note = Notification("P", 1, 0.0, {"x": 1})
    answered: list[int] = []
    receipt = PublishReceipt(lambda: answered.append(1))
    receipt.keep()  # the copy the link kept
    copies = node.link_down("b:0", [(note, receipt)], read=lambda c: c[0])
    view = node.neighbours.view(NO_CONGESTION)
    steps = node.route_again("b:0", copies, view, lambda c: c[0], lambda c: c[1])
    assert next(steps)[1] is receipt and answered == []
    assert next(steps, None) is None and answered == [1]
    assert node.core.stats["custody.rerouted"] == 1


def test_a_share_is_owed_until_serving_and_whole_then_paid_once() -> None:
    """A neighbour met while this node resyncs is owed its share (SYNCED says not
    complete); paid when this node serves, to a neighbour that is up, once."""
    node = _node()
    node.core.expect_shares({n.id for n in FIG2.brokers["c:0"].neighbours})
    peer = "b:0"
    _, handed = node.neighbour_met(peer, 7, restarted=False)
    assert handed == HandedShare(peer, 0, complete=False, wants_share=True)
    assert peer in node.recovery.owed_shares
    assert node.pay_owed_shares() == []  # not serving
    for n in FIG2.brokers["c:0"].neighbours:  # the peer wants ours; the others do not
        node.synced(n.id, HandedShare("c:0", 0, wants_share=n.id == peer))
    _settled(node, down=(peer,))
    ((paid, _),) = node.serve_if_ready(0.0, NO_CONGESTION)  # the peer is not up: still owed
    assert not [a for a in paid if type(a) is HandedShare and a.link == peer]
    node.neighbours.heard(peer, 2.0)
    paid = node.pay_owed_shares()
    assert [a for a in paid if type(a) is HandedShare] == [HandedShare(peer, 0, True, False)]
    assert node.pay_owed_shares() == []


def test_a_share_paid_late_is_said_again_when_its_link_heals() -> None:
    """A share paid late over a link that failed before it was taken: its entries wait
    for the heal, the word that it was handed (a link frame) is lost; the heal says it
    again behind them, so the neighbour does not go on missing it."""
    node = _node()
    node.core.expect_shares({n.id for n in FIG2.brokers["c:0"].neighbours})
    peer = "b:0"
    node.neighbour_met(peer, 7, restarted=False)
    for n in FIG2.brokers["c:0"].neighbours:
        node.synced(n.id, HandedShare("c:0", 0, wants_share=n.id == peer))
    _settled(node)
    ((paid, _),) = node.serve_if_ready(0.0, NO_CONGESTION)
    entries = [a.message for a in paid if type(a) is Forward and a.link == peer]
    assert [a for a in paid if type(a) is HandedShare] == [HandedShare(peer, len(entries))]
    node.neighbours.silent(peer, 1.0)
    node.link_down(peer, entries)  # the link failed: the entries wait, SYNCED lost
    healed = node.link_back(peer)
    assert [a.message for a in healed if type(a) is Forward] == entries
    assert healed[-1] == HandedShare(peer, 0, True, False)
    node.neighbour_met(peer, 8, restarted=True)  # a new process gets a share of its own
    assert HandedShare(peer, 0, True, False) not in node.link_back(peer)


def test_a_share_heard_is_taken_then_a_neighbour_now_serving_gets_what_was_held() -> None:
    """A SYNCED from a neighbour that already said it serves: its share counts, is taken
    (our table is whole for it), and then the copy held for it is handed, in one step; a
    SYNCED before its handshake named us changes nothing."""
    node = _node()
    node.core.expect_shares({n.id for n in FIG2.brokers["c:0"].neighbours})
    peer = "b:0"
    note = Notification("P", 1, 0.0, {"x": 1})
    assert node.share_heard(peer, HandedShare("c:0", 0)) == []  # not met yet
    node.neighbours.met(peer, 7)
    node.neighbours.handshake(peer, 0, 0)  # names us (incarnation 0 here)
    node.neighbours.heard(peer, 1.0)
    node.neighbours.said(peer, True)
    node.hold(Hold(peer, note))
    actions = node.share_heard(peer, HandedShare("c:0", 0))
    assert peer not in node.core.missing_shares
    assert actions[-1:] == [Forward(peer, note)] and node.neighbours[peer].serving


def test_a_bid_broker_learns_its_table_was_lost_from_a_neighbour_that_knew_it() -> None:
    """BID has no resync: a neighbour that knew a predecessor says so in its SYNCED, and
    the restarted broker counts each local publication its empty table cannot route."""
    neighbour = _node("b:0", "bid")
    _, handed = neighbour.neighbour_met("c:0", 9, restarted=True)
    assert handed.predecessor and neighbour.counters["restarts_without_resync"] == 1
    node = _node("c:0", "bid")
    node.serving = True
    node.synced("b:0", handed)
    node.publish(Notification("P", 1, 0.0, {"x": 1}), None, NO_CONGESTION)
    assert node.core.stats["undeliverable.table_lost"] == 1
    fresh = _node("c:0", "bid")
    fresh.synced("b:0", HandedShare("c:0", 0))
    assert not fresh.core.table_lost


def test_a_bid_broker_whose_shell_knew_a_predecessor_counts_its_lost_table_alone() -> None:
    """A restarted BID broker cut off from every neighbour meets none to tell it: the
    shell (its data directory's mark, the simulator's surviving store) says it had a
    predecessor, and each local publication is counted, not lost silently."""
    core = _node("c:0", "bid").core
    node = BrokerNode(core, 16, predecessor=True)
    node.serving = True
    node.publish(Notification("P", 1, 0.0, {"x": 1}), None, NO_CONGESTION)
    assert node.core.stats["undeliverable.table_lost"] == 1
    clustered = _node("c:0", "snr").core
    BrokerNode(clustered, 16, predecessor=True)  # resync refills it: nothing is lost
    assert not hasattr(clustered, "table_lost")


def test_a_bid_broker_drops_the_routes_through_a_restarted_neighbour() -> None:
    """c:0 routes e:1's subscription through c:1 and a:0's through b:0; c:1 restarts.
    Its new process lacks the entry (BID has no resync) and may take it again from a late
    copy of the flood that came by way of c:0 (c:0 → c:2 → c:1): a notification for it
    would then go round c:0 → c:1 → c:2 → c:0 for ever (nemesis seeds 37021, 54854 and
    61031 never ended). The entry loses its route instead: a late copy does not make it
    again, and a notification for it is counted undeliverable, not sent on."""
    node = _node("c:0", "bid")
    core = node.core
    late = Subscribe("e:1#1", "e:1", Subscription((Predicate("x", "<", 5),)), SubState.PRIMARY,
                     None, 0.0)  # fmt: skip
    core.receive("c:1", late, NO_CONGESTION)
    core.receive("b:0", _sub("a:0", 5), NO_CONGESTION)
    node.neighbour_met("c:1", 9, restarted=True)
    assert core.stats["routes_lost"] == 1 and core.table.entries["a:0#5"].last_hop == "b:0"
    assert core.receive("c:2", late, NO_CONGESTION) == []
    assert core.stats["sbp_duplicates"] == 1
    listed = (("e:1", "e:1#1"), ("a:0", "a:0#5"))
    onward = core.receive("d:0", Notification("P", 1, 0.0, {"x": 1}, destinations=listed),
                          NO_CONGESTION)  # fmt: skip
    assert [(a.link, a.message.destinations) for a in onward] == [("b:0", listed[1:])]
    published = core.publish(Notification("P", 2, 0.0, {"x": 1}), NO_CONGESTION)
    assert [(a.link, a.message.destinations) for a in published] == [("b:0", listed[1:])]
    assert core.stats["undeliverable.route_lost"] == 2
    core.receive("c:2", Unsubscribe("e:1#1", SubState.PRIMARY), NO_CONGESTION)
    assert "e:1#1" not in core.table


def test_a_broker_process_finds_the_mark_of_one_that_died(tmp_path: Path) -> None:
    """The mark a broker process leaves in its data directory while it runs: found by
    the next process if this one died, gone if it stopped cleanly; nothing known
    without a data directory."""
    from octopis.transport.process_mark import clear_running, mark_running

    assert not mark_running(tmp_path / "data", "a:0")  # the first process
    assert mark_running(tmp_path / "data", "a:0")  # its predecessor died with the mark
    assert not mark_running(tmp_path / "data", "b:0")  # marks are per broker
    clear_running(tmp_path / "data", "a:0")
    assert not mark_running(tmp_path / "data", "a:0")  # stopped cleanly before
    assert not mark_running(None, "a:0")


def test_what_a_link_gives_back_is_held_dropped_or_routed_again_in_order() -> None:
    """What never reached a neighbour: subscriptions and replay requests wait for it, in
    order, behind what waited before; replay answers are dropped and counted (the round
    reports that part silent), so is the word that a share was handed; the copies come
    back, in order, to be routed again."""
    node = _node()
    request = Replay("r1", "c:0", ("[x,<,3]",), (), 0.0, 1.0)
    first, second = Notification("P", 1, 0.0, {"x": 1}), Notification("P", 2, 0.0, {"x": 1})
    node.link_down("b:0", [_sub("c:0", 0)])
    given_back = [first, _sub("c:0", 1), ReplayData("r1", ()), HandedShare("b:0", 3), second]
    assert node.link_down("b:0", [*given_back, request]) == [first, second]
    assert node.recovery.subscriptions["b:0"] == [_sub("c:0", 0), _sub("c:0", 1), request]
    assert node.counters["replay_answers_dropped"] == 1
    assert read_sbp(request) == ("replay r1", True)
    assert read_sbp(_sub("c:0", 1)) == ("c:0#1", True)


def test_the_session_table_covers_every_phase_and_event() -> None:
    """One transition per (phase, event): the table is total, a new incarnation or a
    handshake restarts the session from anywhere, a share counts only after a handshake
    that named us."""
    assert set(TRANSITIONS) == {(p, e) for p in Phase for e in Event}
    assert {TRANSITIONS[(p, Event.MET)] for p in Phase} == {Phase.HANDSHAKING}
    assert TRANSITIONS[(Phase.HANDSHAKING, Event.SHARE)] is Phase.HANDSHAKING
    assert TRANSITIONS[(Phase.SYNCING, Event.SHARE)] is Phase.SYNCED


def test_a_neighbour_serves_once_its_share_and_its_word_are_in_whichever_comes_first() -> None:
    """A heartbeat saying *serving* can overtake the share (heartbeats go ahead of data):
    the neighbour serves — copies released, its predecessor's entries withdrawn — only
    once its share is in too, so the withdrawal never precedes what replaces it."""
    for word_first in (True, False):
        table = Neighbours(["n"])
        assert table.heard("n", 0.0) and table["n"].describe() == "new"
        assert table.met("n", 5) is False and table["n"].describe() == "handshaking"
        assert not table.share("n").for_us  # before the handshake: for our predecessor
        table.hello("n", names_us=True)
        if word_first:
            assert not table.said("n", True) and not table.routable("n")
            assert table.share("n") == (True, True)
        else:
            assert table.share("n") == (True, False) and table["n"].describe() == "starting"
            assert table.said("n", True)
        assert table.routable("n") and table["n"].describe() == "serving"
        assert not table.said("n", True)  # no news: said once


def test_a_silent_neighbour_resumes_its_session_and_must_speak_again() -> None:
    """Down keeps the session (a cut link that heals goes on where it was) but forgets
    its word: it serves again on its next heartbeat; a new incarnation is a restart."""
    table = Neighbours(["n"])
    table.built("n", 5, 0.0)
    table.silent("n", 3.0)
    assert table["n"].describe() == "down" and not table.routable("n")
    assert table.ready(waited=False)  # declared down: it does not hold back serving
    assert table.heard("n", 4.0) and table["n"].phase is Phase.SYNCED
    assert not table.ready(waited=True)  # up, word not said again yet
    assert table.said("n", True) and table.ready(waited=False)
    assert table.met("n", 5) is None and table.met("n", 6) is True
    assert table["n"].restarts == 1 and not table.reachable("n")


def test_time_not_running_is_nobodys_silence() -> None:
    """A tick late by more than a tick credits the lateness to every neighbour."""
    assert stall(now=10.15, woke=10.0, tick=0.1) == 0.0  # late by half a tick: on time
    assert stall(now=10.5, woke=10.0, tick=0.1) == pytest.approx(0.4)
    table = Neighbours(["n", "m"], now=1.0)
    table.stalled(0.4)
    assert table["n"].last_heard == table["m"].last_heard == pytest.approx(1.4)


def test_ready_waits_for_every_live_neighbour_or_the_liveness_timeout() -> None:
    table = Neighbours(["up", "never"])
    table.built("up", 1, 0.0)
    assert not table.ready(waited=False)  # "never" not heard: wait for T
    assert table.ready(waited=True)
    table.met("up", 2)  # it restarted: its share and its word again
    table.hello("up", True)
    assert not table.ready(waited=True)


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_the_simulator_holds_publications_at_a_resyncing_broker(mode: str) -> None:
    """c:0 restarts and, while its neighbours' shares are on their way, its publisher
    publishes: held, then routed once c:0 serves: every subscriber on a live broker gets
    it exactly once (before, the simulator refused it and the process held it)."""
    sim = fig2_settled(mode)
    start = sim.now
    sim.fail(Failure(("c:0",), 0.5, 1.0), start)
    sim.at(start + 1.0, sim.publish, "P", "c:0", {"x": 1})
    sim.at(start + 2.0, sim.publish, "P", "c:0", {"x": 2})
    sim.run()
    report = sim.report()
    assert report["failures"]["publications_held"] >= 1
    assert "publications_refused" not in report["failures"]
    alive = report["failures"]["host_alive"]
    assert alive["expected_deliveries"] > 0
    assert alive["lost"] == alive["duplicates"] == alive["unexpected"] == 0, alive
    assert alive["delivered"] == alive["expected_deliveries"]


def test_what_a_resyncing_node_routes_is_counted_by_the_node() -> None:
    """Messages routed from neighbours before a node serves are counted by the node,
    for the process and the simulator alike (the process counted them itself)."""
    resyncing, serving = _node(), _node(serving=True)
    resyncing.routed(3)
    resyncing.routed()
    serving.routed(5)
    assert resyncing.counts()["routed_while_resyncing"] == 4
    assert "routed_while_resyncing" not in serving.counts()


@pytest.mark.parametrize("alone", [False, True])
def test_the_simulator_counts_a_restarted_bid_brokers_lost_table(alone: bool) -> None:
    """c:0 restarts under BID, met by its neighbours or (``alone``) while they are all
    dead: either way its publication is counted undeliverable (nemesis seed 1611 lost it
    silently when c:0 met nobody)."""
    sim = fig2_settled("bid")
    start = sim.now
    sim.fail(Failure(("c:0",), 0.5, 1.0), start)
    if alone:
        for neighbour in FIG2.brokers["c:0"].neighbours:  # dead before c:0 is back
            sim.fail(Failure((neighbour.id,), 0.8, 5.0), start)
    sim.at(start + 3.0, sim.publish, "P", "c:0", {"x": 1})
    sim.run()
    assert sim.report()["failures"]["undeliverable.table_lost"] == 1


def test_a_second_fail_over_goes_on_along_the_first_list() -> None:
    """One fail-over order for the SDK and the simulator: the list a connection was
    given (its broker, then the topology's order), rotated from where it is now."""
    first = "c:0"
    endpoints = [first, *FIG2.failover_order(first)]
    assert failover_order(endpoints, first) == [*FIG2.failover_order(first), first]
    second = failover_order(endpoints, first)[0]
    again = failover_order(endpoints, second)
    assert again[0] == endpoints[2] and again[-1] == second
    assert again != [*FIG2.failover_order(second), second]  # what the simulator did


def test_replay_after_and_last_seen() -> None:
    assert replay_after(None, 100.0) == 100.0  # never subscribed before: from now
    assert replay_after(50.0, 100.0) == 100.0 - LOOKBACK
    assert replay_after(90.0, 100.0) == 90.0 - CLOCK_SKEW  # a publisher's clock behind
    seen = LastSeen()
    seen.saw_all([("p", 0, 3), ("p", 0, 2), ("q", 1, 5)])
    assert seen.since() == [("p", 0, 3), ("q", 1, 5)]
    for i in range(PUBLISHERS_KNOWN + 1):
        seen.saw(f"x{i}", 0, 1)
    assert ("p", 0) not in seen and len(seen) == PUBLISHERS_KNOWN


@pytest.mark.processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("alone", [False, True])
def test_a_restarted_bid_broker_process_counts_its_lost_table(tmp_path: Path, alone: bool) -> None:
    """The same decision on processes as in the simulator above: the line a:0 – b:0 –
    c:0 under BID, a subscriber at c:0; a:0 is killed (-9) and started again, and a
    publication of its new publisher cannot reach c:0's subscription, which its empty
    table lacks (BID has no resync). b:0 tells a:0 it knew its predecessor, or
    (``alone``: b:0 killed first) the mark a:0's predecessor left in the data directory
    does; either way a:0 counts ``undeliverable.table_lost`` instead of losing it
    silently. a:0 is killed once b:0 knows it took the subscription: one it had not
    acknowledged b:0 would hand its new process (DESIGN §7, custody)."""
    import asyncio
    import json

    import networkx as nx
    from conditions import closing_control, until

    from octopis.client import Publisher, Subscriber
    from octopis.cluster.launcher import LocalCluster, find_free_base_port
    from octopis.settings import BrokerSettings
    from octopis.topology import build_scot, complete_factor

    line = nx.path_graph(["a", "b", "c"])
    scot = build_scot(line, complete_factor(1), name="line", base_port=find_free_base_port(3))
    path = tmp_path / "line.json"
    path.write_text(json.dumps(scot.to_json()))
    cluster = LocalCluster(scot, path, "bid", tmp_path, BrokerSettings(), secure=False, forked=True)
    cluster.spawn()

    async def scenario() -> tuple[int, int]:
        await cluster.wait_ready(60)
        sub = await Subscriber.connect(scot.brokers["c:0"].client_endpoint, "s")
        stream = await sub.subscribe("[class,eq,'Q']")

        async def taken() -> bool:
            # a:0 first: b:0's SUBSCRIBE is pending from its send until a:0's acknowledgement,
            # so b:0 seen without it afterwards means acknowledged (read the other way round,
            # b:0 may not have sent it yet, and a:0 take it before acknowledging)
            if (await cluster.call("a:0", "stats"))["routing_table_size"] != 1:
                return False
            return not (await cluster.call("b:0", "stats"))["custody"]["a:0"]["pending"]

        await until(taken, "a:0 took the subscription and b:0 heard so", 30)
        if alone:
            cluster.kill("b:0")
        cluster.kill("a:0")
        cluster.spawn_one("a:0")
        await cluster.wait_ready(60, ["a:0"], state="serving")
        pub = await Publisher.connect(scot.brokers["a:0"].client_endpoint, "p")
        await pub.publish({"class": "Q", "n": 1})
        stats = await cluster.call("a:0", "stats")
        got = 0
        try:
            await stream.get(timeout=2)
            got = 1
        except TimeoutError:
            pass
        for client in (pub, sub):
            await client.close()
        return stats["core"].get("undeliverable.table_lost", 0), got

    try:
        lost, got = asyncio.run(closing_control(cluster, scenario()))
    finally:
        cluster.stop()
    assert (lost, got) == (1, 0)


def test_a_hello_is_for_us_only_if_it_names_this_incarnation() -> None:
    """``Neighbours.handshake``, which both shells call with a HELLO's facts: a HELLO
    naming no incarnation of ours yet (0), or an earlier one, leaves the session
    handshaking (its frames are not for us); one naming this incarnation starts it."""
    table = Neighbours(["n"])
    table.heard("n", 0.0)
    assert table.met("n", 5) is False
    for names in (0, 6):  # none yet; an earlier process of ours
        table.handshake("n", names, 7)
        assert table["n"].describe() == "handshaking" and not table.reachable("n")
    table.handshake("n", 7, 7)
    assert table["n"].describe() == "syncing" and table.reachable("n")
    assert table.share("n") == (True, False) and not table.routable("n")  # no word yet
    assert table.said("n", True) and table.routable("n")
