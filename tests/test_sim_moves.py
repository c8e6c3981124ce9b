"""Subscriber moves in the simulator (DESIGN §9): inside a cluster only the tree path turns,
across clusters a move costs an unsubscribe plus a subscribe, publications during moves
reach everyone exactly once, and the balancers' moves even out the load."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import networkx as nx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from sim_scenarios import exactly_once, scenarios, simulate

from octopis.defaults import LINGER
from octopis.filters.language import Predicate, Subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import LatencyModel, Simulator


def _entries(sim: Simulator, sub_id: str) -> dict[str, tuple]:
    """Per broker: what routing reads of ``sub_id``'s entry (last hop, local, CBV)."""
    return {
        b: (e.last_hop, e.local, e.cbv)
        for b, core in sim.cores.items()
        if (e := core.table.entries.get(sub_id)) is not None
    }


@st.composite
def inside_moves(draw: st.DrawFn) -> tuple:
    """A scenario with a subscriber S0 and another broker of its cluster to move it to."""
    scot, subs, pubs, seed = draw(scenarios())
    assume(len(scot.acyclic) > 1)
    home = draw(st.sampled_from(sorted(scot.brokers)))
    cluster = scot.brokers[home].cluster
    target = draw(
        st.sampled_from(
            sorted(b for b, v in scot.brokers.items() if v.cluster == cluster and b != home)
        )
    )
    subs[0] = (home, subs[0][1])
    return scot, subs, pubs, seed, target, draw(st.sampled_from(["snr", "dnr"]))


@given(inside_moves())
def test_a_move_inside_a_cluster_turns_only_the_tree_path(scenario: tuple) -> None:
    """Moving S0 inside its cluster sends MOVE only along the cluster-tree path from the
    new host to the old, REHOST only from the two hosts to their other neighbours, no SBP
    message; it changes entries on that path only (never a secondary one), and leaves
    every table as a subscription made at the new host would have; later publications
    reach everyone exactly once, with nothing left for the subscriber to drop."""
    scot, subs, pubs, seed, target, mode = scenario
    sent: list[tuple[str, str, str]] = []
    sim = simulate(
        scot,
        mode,
        subs,
        pubs,
        seed,
        on_forward=lambda s, d, m: sent.append((s, d, type(m).__name__)),
    )
    sub_id = next(s for s, owner in sim.subscriber_of.items() if owner == "S0")
    home = subs[0][0]
    before = _entries(sim, sub_id)
    sent.clear()
    assert sim.move("S0", target) == {sub_id: sub_id}
    sim.run()
    path = nx.shortest_path(
        scot.graph.subgraph(
            [b for b, v in scot.brokers.items() if v.cluster == scot.brokers[home].cluster]
        ),
        target,
        home,
    )
    assert [(s, d) for s, d, kind in sent if kind == "Move"] == list(pairwise(path))
    assert {s for s, _, kind in sent if kind == "Rehost"} <= {home, target}
    assert Counter(kind for _, _, kind in sent) == Counter(
        {"Move": len(path) - 1, "Rehost": len(scot.graph[home]) + len(scot.graph[target]) - 2}
    )
    after = _entries(sim, sub_id)
    assert {b for b in after if after[b] != before[b]} == set(path)
    fresh = Simulator(scot, mode, seed=seed, covering="off")
    fresh.subscribe("S0", target, subs[0][1])
    fresh.run()
    fresh_id = next(iter(fresh.subscriber_of))
    assert after == {
        b: ("S0" if local else hop, local, cbv)
        for b, (hop, local, cbv) in _entries(fresh, fresh_id).items()
    }
    for broker, core in sim.cores.items():
        entry = core.table.entries[sub_id]
        if not entry.local:
            assert (entry.host == entry.last_hop) == (entry.last_hop == target), broker
    assert sim.moves == Counter(inside=1, released=1)
    sim.run(sim.now + LINGER)  # past the subscriber's linger
    for broker, publication in pubs:
        sim.publish(f"P{broker}", broker, publication)
    sim.run()
    exactly_once(sim.report())
    assert "absorbed" not in sim.moves


@given(scenarios(), st.sampled_from(["snr", "dnr", "bid"]), st.data())
def test_publications_during_moves_reach_everyone_exactly_once(
    scenario: tuple, mode: str, data: st.DataObject
) -> None:
    """Moves inside and across clusters at random times among the publications: every
    notification reaches every interested subscriber exactly once (across clusters after
    the subscriber drops the overlap), and the moved subscriptions end where they went."""
    scot, subs, pubs, seed = scenario
    sim = Simulator(
        scot,
        mode,
        seed=seed,
        latency=LatencyModel(0.001, 0.004),
        oracle_factory=ReferenceMatcher,
        covering="off",
    )
    for i, (broker, subscription) in enumerate(subs):
        sim.subscribe(f"S{i}", broker, subscription)
    sim.run()
    brokers = sorted(scot.brokers)
    moved = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, len(subs) - 1), st.sampled_from(brokers), st.floats(0.0, 0.05)
            ),
            max_size=4,
        )
    )
    for i, broker in enumerate(brokers * 3):
        sim.at(sim.now + i * 0.002, sim.publish, f"P{broker}", broker, pubs[i % len(pubs)][1])
    for subscriber, broker, at in moved:
        sim.at(sim.now + at, _move_unless_there, sim, f"S{subscriber}", broker)
    sim.run()
    report = sim.report()
    exactly_once(report)
    assert sim.moves["inside"] == sim.moves["released"]
    assert sim.moves["across"] == sim.moves["withdrawn"]
    for sub_id, subscriber in sim.subscriber_of.items():
        hosts = [b for b, c in sim.cores.items() if (e := c.table.entries.get(sub_id)) and e.local]
        assert hosts == [sim._home[subscriber]]
    assert sum(len(c.table) for c in sim.cores.values()) == len(subs) * len(scot.brokers)


def _move_unless_there(sim: Simulator, subscriber: str, broker: str) -> None:
    if sim._home[subscriber] != broker and not sim.moving(subscriber):
        sim.move(subscriber, broker)


@given(scenarios(), st.sampled_from(["snr", "dnr", "bid"]), st.data())
def test_a_move_across_clusters_costs_an_unsubscribe_plus_a_subscribe(
    scenario: tuple, mode: str, data: st.DataObject
) -> None:
    scot, subs, pubs, seed = scenario
    home = subs[0][0]
    others = sorted(
        b
        for b, v in scot.brokers.items()
        if mode == "bid" or v.cluster != scot.brokers[home].cluster
    )
    target = data.draw(st.sampled_from(others))
    assume(target != home)
    kinds: Counter[str] = Counter()
    sim = simulate(
        scot,
        mode,
        subs[:1],
        pubs,
        seed,
        on_forward=lambda s, d, m: kinds.update([type(m).__name__]),
    )
    kinds.clear()
    sim.move("S0", target)
    sim.run()
    alone: Counter[str] = Counter()
    fresh = simulate(
        scot,
        mode,
        [(target, subs[0][1])],
        [],
        seed,
        on_forward=lambda s, d, m: alone.update([type(m).__name__]),
    )
    fresh.unsubscribe(next(iter(fresh.subscriber_of)))
    fresh.run()
    assert kinds == alone
    assert sim.moves == Counter(across=1, withdrawn=1)


def test_the_balancer_evens_out_a_skewed_placement_in_the_simulator() -> None:
    """fig2 with 40 of 48 subscribers on a:0 and e:1, publications from every broker at a
    steady rate: the balancer's rounds (the same decisions as ``octopis balance``) move
    subscribers off the hot brokers, inside their cluster first; the spread of load
    falls, and every notification still reaches every subscriber exactly once."""
    from octopis.balance.policy import BalanceOptions
    from octopis.topology import build_preset

    scot = build_preset("fig2")
    sim = Simulator(scot, "dnr", seed=3, latency=LatencyModel(0.001, 0.004))
    brokers = sorted(scot.brokers)
    for i in range(48):
        broker = ("a:0", "e:1")[i % 2] if i < 40 else brokers[i % len(brokers)]
        sim.subscribe(f"S{i}", broker, Subscription((Predicate("x", "<", 5 + i % 5),)))
    sim.run()
    for step in range(3000):
        broker = brokers[step % len(brokers)]
        sim.at(sim.now + step * 0.01, sim.publish, f"P{broker}", broker, {"x": step % 10})
    options = BalanceOptions(interval=3.0, beta=1.0, cooldown=6.0)
    sim.balance(options, until=sim.now + 24)
    sim.run()
    report = sim.report()
    exactly_once(report)
    timeline = report["balance"]["timeline"]
    decisions = report["balance"]["decisions"]
    print(
        f"cov {timeline[0]['cov']:.2f} -> {timeline[-1]['cov']:.2f}; {len(decisions)} moves "
        f"({sum(d['inside_cluster'] for d in decisions)} inside), moves {report['moves']}"
    )
    assert decisions and timeline[-1]["cov"] < timeline[0]["cov"] / 2
    assert decisions[0]["source"] in ("a:0", "e:1") and decisions[0]["inside_cluster"]
    # adopted inside the cluster, or (covering on: always) subscribed afresh
    moves = report["moves"]
    assert moves.get("inside", 0) + moves.get("across", 0) == len(decisions)


def _ten_a_second(publisher_at: str, count: int) -> tuple[Simulator, float]:
    """Subscriber S on a:0 of fig2 (DNR), and ``count`` publications it takes from P at
    ``publisher_at``, ten a second from the returned start."""
    from octopis.topology import build_preset

    sim = Simulator(build_preset("fig2"), "dnr", seed=1, latency=LatencyModel(0.001, 0.004))
    sim.subscribe("S", "a:0", Subscription((Predicate("x", "<", 5),)))
    sim.run()
    start = sim.now
    for i in range(count):
        sim.at(start + 0.05 + i * 0.1, sim.publish, "P", publisher_at, {"x": 1})
    return sim, start


def test_the_simulated_balancer_samples_as_octopis_balance_does() -> None:
    """One subscriber on a:0 gets 10 deliveries/s for 5 s. The simulator's balancer
    observes as ``octopis balance`` does (DESIGN §9): a sample every ``sample`` second
    between rounds (the round at every ``interval``, planning on a sample of its own);
    each broker's load per second over the brokers' load window (10 s: less while the
    run is younger), read by their own rule; and the subscriber's rate the plans take
    is averaged over every sample, not only the rounds'."""
    from octopis.balance.plans import BrokerLoad, LoadState
    from octopis.balance.policy import BalanceOptions, SubscriberLoads
    from octopis.defaults import LOAD_WINDOW
    from octopis.settings import Load

    assert LOAD_WINDOW == Load().window == 10  # the window a broker process keeps
    sim, start = _ten_a_second("a:0", 50)
    options = BalanceOptions(interval=3.0, sample=1.0, smoothing=4.0, act=False)
    sim.balance(options, until=start + 12)
    sim.run()
    timeline = sim.report()["balance"]["timeline"]
    assert [round(t["t"] - start, 6) for t in timeline] == list(range(1, 13))
    assert [round(t["t"] - start, 6) for t in timeline if "planned" in t] == [3, 6, 9, 12]
    delivered = [min(50, 10 * k) for k in range(13)]  # by each second
    expected = [(delivered[k] - delivered[max(0, k - 10)]) / min(k, 10) for k in range(1, 13)]
    assert [t["loads"]["a:0"] for t in timeline] == pytest.approx(expected)
    probe = LoadState({"a:0": BrokerLoad(0.0, 0.0, 0)}, {"S": 0.0}, {"S": "a:0"})

    def averaged(samples: list[dict]) -> float:
        """S's rate (a:0's load) averaged over ``samples``, as the balancer folds it."""
        loads = SubscriberLoads(options.smoothing)
        for t in samples:
            loads.update(LoadState({}, {"S": t["loads"]["a:0"]}, {"S": "a:0"}), t["t"])
        return loads.applied(probe).loads["S"]

    rounds = sim.balancer.rounds
    assert rounds is not None and rounds.count == 4
    planned = rounds.subscriber_loads.applied(probe).loads["S"]
    assert planned == pytest.approx(averaged(timeline))  # 5.71/s
    assert planned != pytest.approx(averaged([t for t in timeline if "planned" in t]))  # 5.00


def test_the_simulated_brokers_load_windows_follow_a_moving_subscriber() -> None:
    """S, 10 deliveries/s, moves from a:0 to b:0 at 4.5 s and back at 8.5 s (a linger of
    1 s). Each broker's load over its 10 s window keeps what it delivered before S left
    (deliveries since the last sample count where S is attached at a sample); S's own
    rate is listed only where it is, counted from when it came back, as a broker counts
    a new session (DESIGN §9): what it got there before is not taken off."""
    from octopis.balance.policy import BalanceOptions

    sim, start = _ten_a_second("c:0", 150)
    for when, broker in ((4.5, "b:0"), (8.5, "a:0")):
        sim.at(start + when, lambda broker=broker: sim.move("S", broker, linger=1.0))
    sim.balance(BalanceOptions(interval=3.0, act=False), until=start + 12)
    sim.run()
    exactly_once(sim.report())
    timeline = sim.report()["balance"]["timeline"]
    at = {"a:0": [10 * min(k, 4) + 10 * max(0, k - 8) for k in range(13)]}
    at["b:0"] = [10 * min(max(k - 4, 0), 4) for k in range(13)]
    for broker, d in at.items():
        expected = [(d[k] - d[max(0, k - 10)]) / min(k, 10) for k in range(1, 13)]
        assert [t["loads"][broker] for t in timeline] == pytest.approx(expected), broker
    reports = sim.balancer._reports()  # at 12 s: 40 since S came back, over 10 s
    assert reports["a:0"]["busiest_clients"] == {"S": pytest.approx(4.0)}
    assert reports["b:0"]["busiest_clients"] == {}


def test_sdm_moves_hot_subscribers_to_brokers_that_share_their_interest() -> None:
    """fig2 with 24 subscribers of symbol A or B on a:0, one more of A on c:1 and of B on
    f:2: SDM (the balancer's rounds, ``plan="sdm"``) moves the first hot subscriber of
    each symbol to the broker under the mean load that already holds that symbol (across
    clusters: similarity decides, not the cluster), the spread falls, and every
    notification reaches every subscriber exactly once."""
    from octopis.balance.policy import BalanceOptions
    from octopis.topology import build_preset

    scot = build_preset("fig2")
    sim = Simulator(scot, "dnr", seed=5, latency=LatencyModel(0.001, 0.004))
    placed = [(f"S{i}", "a:0", "AB"[i % 2]) for i in range(24)]
    placed += [("anchorA", "c:1", "A"), ("anchorB", "f:2", "B")]
    for name, broker, symbol in placed:
        subscription = Subscription((Predicate("sym", "eq", symbol), Predicate("x", "<", 8)))
        sim.subscribe(name, broker, subscription)
    sim.run()
    brokers = sorted(scot.brokers)
    for step in range(2400):
        broker = brokers[step % len(brokers)]
        publication = {"sym": "AB"[step % 2], "x": step % 10}
        sim.at(sim.now + step * 0.01, sim.publish, f"P{broker}", broker, publication)
    sim.balance(BalanceOptions("sdm", interval=3.0, beta=1.0, cooldown=6.0), until=sim.now + 18)
    sim.run()
    report = sim.report()
    exactly_once(report)
    timeline, decisions = report["balance"]["timeline"], report["balance"]["decisions"]
    symbol = {name: sym for name, _, sym in placed}
    first = {}
    for d in decisions:
        first.setdefault(symbol[d["subscriber"]], d)
    print(f"cov {timeline[0]['cov']:.2f} -> {timeline[-1]['cov']:.2f}; {len(decisions)} moves")
    assert first["A"]["target"] == "c:1" and first["B"]["target"] == "f:2"
    assert "most similar" in first["A"]["reason"]
    assert timeline[-1]["cov"] < timeline[0]["cov"] / 2


def test_a_move_inside_a_cluster_whose_old_host_dies_ends_after_the_sdks_wait() -> None:
    """S moves from c:0 to a:0 (cluster 0: by adoption) and c:0 dies before the move
    reaches it, so no release ever comes: as the SDK does, the move ends
    ``release_wait`` later without it (``moves.release_overdue``), so S may move again,
    and nothing published meanwhile is lost or repeated."""
    from octopis.client_policy.moves import release_wait
    from octopis.failure_schedule import Failure
    from octopis.topology import build_preset

    sim = Simulator(build_preset("fig2"), "snr", seed=2, covering="off")
    sim.subscribe("S", "c:0", Subscription((Predicate("x", "<", 5),)))
    sim.run()
    start = sim.now
    sim.move("S", "a:0")
    sim.fail(Failure(("c:0",), 0.0001, 60.0), start)
    for i in range(100):
        sim.at(start + 0.01 + i * 0.05, sim.publish, "Pb:0", "b:0", {"x": i % 10})
    sim.run(start + release_wait() - 0.5)
    assert sim.moving("S") and "released" not in sim.moves
    sim.run(start + release_wait() + 0.5)
    assert not sim.moving("S") and sim.moves["release_overdue"] == 1
    sim.move("S", "b:0")
    sim.run()
    assert not sim.moving("S")
    report = sim.report()
    assert report["delivered"] == report["expected_deliveries"] == 50
    assert report["lost"] == report["duplicates"] == 0
