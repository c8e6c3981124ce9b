"""The client session rules (``octopis.core.sessions``, DESIGN §7-§9), and the simulator
taking them from the same table the broker process does: the limit per client, the
withdrawal of a client that is gone, the orphans of a move under way."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octopis.core import make_broker
from octopis.core.durable import Durables
from octopis.core.sessions import (
    ClientTable,
    Liveness,
    SessionRefused,
    adopt,
    advertise,
    interests,
    moves_by_adoption,
    order_move,
)
from octopis.defaults import CLIENT_LIVENESS
from octopis.filters.composite import parse_composite
from octopis.filters.language import Predicate, Subscription
from octopis.sim import Simulator
from octopis.topology import build_preset

FIG2 = build_preset("fig2")


def _made(made: list[str], sub_id: str) -> Callable[[], tuple[str, list]]:
    """A shell's ``make``: records that it ran and makes ``sub_id`` (no actions)."""

    def make() -> tuple[str, list]:
        made.append(sub_id)
        return sub_id, []

    return make


def test_one_subscription_past_the_limit_is_refused_by_name_and_changes_nothing() -> None:
    """:meth:`ClientTable.subscribe`, which both shells call: within the limit the
    subscription is made and held; past it nothing is made (the core is not asked)."""
    table, made = ClientTable(limit=2), []
    for sub_id in ("s1", "s2"):
        assert table.subscribe("k", "alice", _made(made, sub_id)) == (sub_id, [])
    with pytest.raises(SessionRefused, match=r"alice already holds 2 subscriptions \(limits"):
        table.subscribe("k", "alice", _made(made, "s3"))
    assert table.subscriptions("k") == {"s1", "s2"} and made == ["s1", "s2"]
    assert table.counters["subscriptions_refused.limit"] == 1
    table.subscribe("other", "bob", _made(made, "s4"))  # the limit is per client
    assert table.subscriptions("other") == {"s4"}


def test_only_a_held_subscription_may_be_withdrawn_by_its_client() -> None:
    """:meth:`ClientTable.unsubscribe`: another client's is refused by name and nothing is
    withdrawn; its own is forgotten, then withdrawn (uncounted: the client asked)."""
    table, withdrawn = ClientTable(limit=2), []

    def withdraw(key: str, sub_id: str) -> list:
        withdrawn.append((key, sub_id, set(table.subscriptions(key))))
        return [sub_id]

    table.subscribe("k", "alice", _made([], "s1"))
    with pytest.raises(SessionRefused, match="mallory holds no subscription s1"):
        table.unsubscribe("m", "mallory", "s1", withdraw)
    assert table.subscriptions("k") == {"s1"} and withdrawn == []
    assert table.unsubscribe("k", "alice", "s1", withdraw) == ["s1"]
    assert withdrawn == [("k", "s1", set())] and table.subscriptions("k") == set()
    with pytest.raises(SessionRefused, match="alice holds no subscription s1"):
        table.unsubscribe("k", "alice", "s1", withdraw)  # not twice
    assert table.counters["subscriptions_withdrawn"] == 0


def test_a_subscription_withdrawn_for_its_client_is_counted_once() -> None:
    """:meth:`ClientTable.withdraw` (a durable record claimed where its client came back;
    the process's ``ClientConnections.withdraw`` and the simulator's durable clients):
    a held one is forgotten, withdrawn and counted; one no longer held changes nothing."""
    table = ClientTable(limit=2)
    table.subscribe("k", "alice", _made([], "s1"))
    assert table.withdraw("k", "s1", lambda key, sub_id: [(key, sub_id)]) == [("k", "s1")]
    assert table.withdraw("k", "s1", lambda key, sub_id: [(key, sub_id)]) is None
    assert table.subscriptions("k") == set()
    assert table.counters["subscriptions_withdrawn"] == 1


def test_both_shells_order_a_move_by_the_nodes_rule() -> None:
    """:func:`order_move` says how clients move and marks their subscriptions: by
    adoption (marked moving) only where :func:`moves_by_adoption` says so."""
    for mode, covering, adopts in (("snr", "off", True), ("snr", "active", False)):
        core = make_broker(FIG2, "c:0", mode, covering=covering)
        table = ClientTable(limit=2)
        table.subscribe("k", "alice", _made([], "s1"))
        assert order_move(core, table, ["k"], 0.0, inside=True) == (adopts, {"k": ["s1"]})
        assert set(table.moving) == ({"s1"} if adopts else set())
    core = make_broker(FIG2, "c:0", "snr", covering="off")
    assert order_move(core, table, ["k"], 0.0, inside=False) == (False, {"k": ["s1"]})


def test_a_client_silent_past_the_timeout_is_gone() -> None:
    liveness: Liveness[bytes] = Liveness(timeout=5.0)
    for key, seen in ((b"a", 10.0), (b"b", 7.0), (b"c", 5.0)):
        liveness.heard(key, seen)
    assert liveness.silent(10.0, caught_up=True) == []  # c exactly at it
    assert liveness.silent(10.5, caught_up=True) == [b"c"]
    assert liveness.silent(12.5, caught_up=True) == [b"b", b"c"]


def test_silence_is_judged_with_requests_read_and_the_brokers_stall_excused() -> None:
    """A request still unread may be a heartbeat: nobody is silent then. A tick late by
    more than a tick moves every client's last hearing on by its lateness; one heard
    again is alive."""
    liveness: Liveness[bytes] = Liveness(timeout=4.0)  # a tick every second
    liveness.heard(b"a", 0.0)
    liveness.heard(b"b", 4.0)
    assert liveness.ticked(20.0, caught_up=False) == []  # 19 s late: a stall
    assert liveness.last_seen == {b"a": 19.0, b"b": 23.0}
    assert liveness.ticked(21.5, caught_up=True) == []  # half a tick late: no stall
    assert liveness.silent(23.5, caught_up=True) == [b"a"]
    liveness.heard(b"a", 23.5)
    assert liveness.silent(27.5, caught_up=True) == [b"b"]
    assert liveness.forget(b"b") == 23.0 and liveness.silent(30.0, caught_up=True) == [b"a"]


def test_a_gone_client_loses_its_subscriptions_but_not_those_on_their_way_elsewhere() -> None:
    """A subscription its client was told to move inside the cluster is an orphan: kept
    until the move arrives (released quietly) or its deadline passes (withdrawn then)."""
    table = ClientTable(limit=10, move_timeout=5.0)
    for sub_id in ("s1", "s2", "s3"):
        table.attach("k", sub_id)
    assert table.order_move(["k", "idle"], now=0.0, inside=True) == {"k": ["s1", "s2", "s3"]}
    assert (
        table.moving
        == dict.fromkeys(["s1", "s2", "s3"], table.deadline(0.0))
        == {
            "s1": 5.0,
            "s2": 5.0,
            "s3": 5.0,
        }
    )
    table.detach("k", "s3")
    table.moving.pop("s3")  # its client withdrew it instead of moving it
    table.attach("k", "s4")
    assert table.gone("k") == ["s4"]
    assert set(table.orphans) == {"s1", "s2"} and table.subscriptions("k") == set()
    assert table.released("k", "s1") is False  # arrived: nobody to tell, nothing to withdraw
    assert table.expire(now=4.0) == []
    assert table.expire(now=6.0) == [("k", "s2")]
    assert table.counters["subscriptions_withdrawn"] == 2 and not table.moving


def test_an_expired_move_order_leaves_the_client_subscribed_here() -> None:
    table = ClientTable(limit=10, move_timeout=1.0)
    table.attach("k", "s1")
    table.order_move(["k"], now=0.0, inside=True)
    assert table.expire(now=2.0) == [] and table.counters["moves.expired"] == 1
    assert table.gone("k") == ["s1"]  # no longer moving: withdrawn when it goes
    table.attach("j", "s2")
    table.order_move(["j"], now=0.0, inside=False)  # across: it subscribes afresh
    assert not table.moving and table.released("j", "s2") is True


@given(
    woke=st.floats(0.0, 50.0),
    ordered=st.floats(0.0, 100.0),
    move_timeout=st.floats(0.1, 40.0),
    timeout=st.floats(0.4, 20.0),
)
def test_a_move_order_expires_at_the_tick_the_simulator_waits_for(
    woke: float, ordered: float, move_timeout: float, timeout: float
) -> None:
    """A broker process expires move orders at its client ticks (``ClientTable.expire``
    on each :class:`Liveness` tick); the simulator, which runs no timer while none is
    due, looks once, at :meth:`Liveness.tick_after` the order's deadline. Stepped tick
    by tick as the process does, the order is found late at exactly that tick."""
    liveness, table = Liveness(timeout), ClientTable(limit=10, move_timeout=move_timeout)
    liveness.start(woke)
    table.attach("k", "s1")
    table.order_move(["k"], now=ordered, inside=True)
    deadline = table.moving["s1"]
    looks = 0
    while True:
        looks += 1
        tick = woke + looks * liveness.tick
        table.expire(now=tick)
        if not table.moving:
            break
    assert tick == pytest.approx(liveness.tick_after(deadline), abs=1e-9)
    assert liveness.tick_after(deadline) > deadline


def _subscribed_sim(limit: int) -> Simulator:
    sim = Simulator(FIG2, "snr", seed=1, covering="off")
    sim.nodes["c:0"].sessions.limit = limit
    return sim


def test_the_simulator_refuses_and_withdraws_as_a_broker_does() -> None:
    """The simulator's brokers hold their clients in the same table: past the limit the
    same refusal; a client cut off and dropped loses exactly its subscriptions there."""
    sim = _subscribed_sim(limit=2)
    subscription = Subscription((Predicate("x", "<", 5),))
    kept = [sim.subscribe("S", "c:0", subscription) for _ in range(2)]
    with pytest.raises(SessionRefused, match="S already holds 2 subscriptions"):
        sim.subscribe("S", "c:0", subscription)
    other = sim.subscribe("T", "c:0", subscription)
    sim.run()
    assert set(kept) | {other} <= set(sim.cores["c:0"].table.entries)
    sim._client_gone("c:0", "S", sim.now)
    sim.run()
    assert not set(kept) & set(sim.cores["c:0"].table.entries)
    assert other in sim.cores["c:0"].table.entries
    assert sim.nodes["c:0"].sessions.counters["subscriptions_withdrawn"] == 2


def test_the_node_withdraws_what_a_gone_client_held_for_both_shells() -> None:
    """:meth:`BrokerNode.client_gone`, which both shells call: every subscription of the
    client (but the one on its way elsewhere), its advertisements, and its durable
    record left waiting; another client keeps what it holds."""
    sim = Simulator(FIG2, "snr", seed=1, covering="off", advertisements=True)
    node, core = sim.nodes["c:0"], sim.cores["c:0"]
    subscription = Subscription((Predicate("x", "<", 5),))
    held = [sim.subscribe("S", "c:0", subscription) for _ in range(3)]
    other = sim.subscribe("T", "c:0", subscription)
    adv_id = sim.advertise("S", "c:0", subscription)
    durables = Durables("c:0", keep=60.0, limit=10)
    durables.attach("S", "d", "S", held[0], (subscription.to_text(),), now=1.0)
    node.sessions.order_move(["S"], now=0.0, inside=True)
    node.sessions.moving.pop(held[0])
    node.sessions.moving.pop(held[1])  # only held[2] is on its way elsewhere
    sim.run()
    assert all(adv_id in c.advertising.entries for c in sim.cores.values())
    withdrawn, actions, save = node.client_gone("S", 5.0, durables)
    assert withdrawn == sorted(held[:2]) and set(node.sessions.orphans) == {held[2]}
    assert durables.records[("S", "d")].away == 5.0 and durables.records[("S", "d")].key is None
    assert save  # its record waits: written now, by both shells
    assert core.advertisements_of("S") == [] and actions
    sim._dispatch("c:0", actions)
    sim.run()
    assert all(adv_id not in c.advertising.entries for c in sim.cores.values())
    assert not set(withdrawn) & set(core.table.entries)
    assert {held[2], other} <= set(core.table.entries)
    assert node.sessions.subscriptions("T") == {other}


def test_the_node_says_when_a_going_or_a_release_writes_the_durable_records() -> None:
    """Both shells write the records at once when the node's answer says ``save``
    (:meth:`BrokerNode.client_gone`, :meth:`BrokerNode.released`): a durable record left
    waiting or gone with a move; nothing changed, nothing to write (the process once
    wrote at every drop and release, the simulator at neither)."""
    sim = Simulator(FIG2, "snr", seed=1, covering="off")
    node, subscription = sim.nodes["c:0"], Subscription((Predicate("x", "<", 5),))
    held = {c: sim.subscribe(c, "c:0", subscription) for c in ("S", "T", "U", "V")}
    durables = Durables("c:0", keep=60.0, limit=10)
    for client in ("S", "U"):
        durables.attach(client, "d", client, held[client], (subscription.to_text(),), 1.0)
    assert node.client_gone("T", 2.0, durables).save is False
    assert node.client_gone("S", 2.0, durables).save is True
    assert node.released("V", held["V"], durables) == (True, False)  # (tell, save)
    assert node.released("U", held["U"], durables) == (True, True)
    assert set(durables.records) == {("S", "d")}


def test_the_simulator_moves_by_the_session_rules_of_a_broker() -> None:
    """A move inside the cluster: the old host's node is ordered to move the client's
    subscriptions and lets each go when the move reaches it (``ClientTable.order_move``,
    ``BrokerNode.released``); the new host takes them within the client's limit. A client
    dropped at the old host meanwhile leaves orphans there, released quietly."""
    sim = Simulator(FIG2, "snr", seed=1, covering="off")
    subscription = Subscription((Predicate("x", "<", 5),))
    held = {sim.subscribe("S", "c:0", subscription) for _ in range(2)}
    sim.run()
    old, new = sim.nodes["c:0"].sessions, sim.nodes["a:0"].sessions
    sim.move("S", "a:0")
    assert set(old.moving) == held and new.subscriptions("S") == held
    sim._client_gone("c:0", "S", sim.now)  # gone before the moves reached c:0
    assert set(old.orphans) == held and old.subscriptions("S") == set()
    sim.run()
    assert old.counters["moves.ordered"] == 2 and old.counters["moves.released"] == 2
    assert not old.orphans and not old.moving and old.counters["subscriptions_withdrawn"] == 0
    assert held <= set(sim.cores["a:0"].table.entries) and sim.moves["released"] == 2
    sim.publish("P", "b:1", {"x": 1})
    sim.run()
    report = sim.report()
    assert report["expected_deliveries"] == report["delivered"] == 1
    assert report["duplicates"] == report["lost"] == 0


@pytest.mark.parametrize(
    ("mode", "covering", "inside", "adopts"),
    [
        ("snr", "off", True, True),
        ("dnr", "off", True, True),
        ("snr", "off", False, False),  # another cluster: subscribed afresh
        ("snr", "active", True, False),  # covering: subscribed afresh
        ("bid", "off", True, False),
    ],
)
def test_how_a_client_moves_is_the_nodes_rule_for_both_shells(
    mode: str, covering: str, inside: bool, adopts: bool
) -> None:
    """By adoption inside the cluster where the core adopts, else afresh (the process's
    ``move_client`` and the simulator's ``move`` both ask :func:`moves_by_adoption`);
    BID refuses an adoption and an advertisement by name."""
    core = make_broker(FIG2, "c:0", mode, covering=covering)
    assert moves_by_adoption(core, inside) is adopts
    if mode != "bid":
        return
    subscription = Subscription((Predicate("x", "<", 5),))
    table = ClientTable(limit=2)
    with pytest.raises(SessionRefused, match="c:0 routes by BID: move by subscribing afresh"):
        adopt(core, table, "k", "alice", "s1")
    with pytest.raises(SessionRefused, match="c:0 routes by BID: no advertisements"):
        advertise(core, "k", subscription)
    assert table.subscriptions("k") == set()


def test_an_advertisement_is_one_atomic_filter() -> None:
    """A composite filter is refused as an advertisement, by name, and nothing spreads."""
    core = make_broker(FIG2, "c:0", "snr", covering="off", advertisements=True)
    joined = parse_composite("{[a,eq,'x']} || {[b,eq,'y']}")
    with pytest.raises(SessionRefused, match="an advertisement is one atomic filter"):
        advertise(core, "k", joined)
    assert core.advertisements_of("k") == []
    adv_id, actions = advertise(core, "k", Subscription((Predicate("x", "<", 5),)))
    assert core.advertisements_of("k") == [adv_id] and actions


def test_an_adoption_is_held_for_its_client_within_its_limit() -> None:
    """The new host takes a moving subscription over for its client (held in its table),
    and refuses one past the client's limit, changing nothing."""
    sim = Simulator(FIG2, "snr", seed=1, covering="off")
    sub_id = sim.subscribe("S", "c:0", Subscription((Predicate("x", "<", 5),)))
    sim.run()
    table = ClientTable(limit=1)
    assert adopt(sim.cores["a:0"], table, "k", "alice", sub_id)
    assert table.subscriptions("k") == {sub_id}
    with pytest.raises(SessionRefused, match="alice already holds 1 subscriptions"):
        adopt(sim.cores["a:0"], table, "k", "alice", "other")
    assert table.subscriptions("k") == {sub_id}


def test_a_clients_interests_are_those_of_the_subscriptions_it_holds_here() -> None:
    """:func:`interests` (a broker's ``clients`` RPC and the simulator's balancer read it
    for the SDM plan): the union over the client's own subscriptions that the routing
    table stores; another client's, and one it no longer holds, do not count."""
    sim = Simulator(FIG2, "snr", seed=1, covering="off")
    node, core = sim.nodes["c:0"], sim.cores["c:0"]
    ibm = Subscription((Predicate("symbol", "eq", "IBM"), Predicate("x", "<", 5)))
    sun = Subscription((Predicate("symbol", "eq", "SUN"),))
    kept = sim.subscribe("S", "c:0", ibm)
    dropped = sim.subscribe("S", "c:0", sun)
    sim.subscribe("T", "c:0", Subscription((Predicate("symbol", "eq", "HP"),)))
    sim.run()
    assert interests(core, node.sessions, "S") == {"symbol='IBM'", "symbol='SUN'"}
    sim.unsubscribe(dropped)
    sim.run()
    assert interests(core, node.sessions, "S") == ibm.interests() == {"symbol='IBM'"}
    assert interests(core, node.sessions, "nobody") == frozenset()
    assert kept in core.table.entries
    balancer_view = sim.balancer._interests({"S", "T"})
    assert balancer_view == {"S": {"symbol='IBM'"}, "T": {"symbol='HP'"}}


def test_a_move_names_what_the_client_holds_at_its_host_not_what_it_held_elsewhere() -> None:
    """The simulator's move names the subscriptions its host's client table holds for
    the subscriber (:func:`order_move`, as a broker process orders one): after a
    fail-over, the ones its old host has not dropped yet are not its host's to move."""
    sim = Simulator(FIG2, "snr", seed=1, covering="off")
    subscription = Subscription((Predicate("x", "<", 5),))
    stale = {sim.subscribe("S", "c:0", subscription) for _ in range(2)}
    sim.run()
    sim.fail_client("S", at=sim.now)
    sim.run(until=sim.now + CLIENT_LIVENESS + 1.0)  # failed over, not yet dropped at c:0
    host = sim.clients.home["S"]
    held = sim.nodes[host].sessions.subscriptions("S")
    assert host != "c:0" and len(held) == 2 and not held & stale
    assert stale <= sim.nodes["c:0"].sessions.subscriptions("S")
    target = next(b for b in FIG2.brokers if b not in (host, "c:0"))
    assert set(sim.move("S", target)) == held
