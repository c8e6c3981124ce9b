"""Routing laws as properties over random SCOTs, subscriptions, publications and latencies."""

from __future__ import annotations

import json
from collections import Counter
from itertools import pairwise
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from laws import scots, sized

from octopis.core import Notification, Subscribe
from octopis.defaults import LINGER
from octopis.filters.language import Predicate, Subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import InjectedCongestion, LatencyModel, Simulator, TimedLinks
from octopis.sim.events import EventQueue
from octopis.sim.service import ServiceModel
from octopis.topology import Scot, build_scot

predicates = st.one_of(
    st.builds(
        Predicate,
        st.just("x"),
        st.sampled_from(["<", ">", "=", "<>", "<=", ">="]),
        st.integers(0, 9),
    ),
    st.builds(
        Predicate, st.just("sym"), st.sampled_from(["eq", "neq"]), st.sampled_from(["A", "B", "C"])
    ),
)
subscriptions = st.builds(
    lambda ps: Subscription(tuple(ps)), st.lists(predicates, min_size=1, max_size=2)
)
publications = st.fixed_dictionaries(
    {"x": st.integers(0, 9), "sym": st.sampled_from(["A", "B", "C"])}
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Scot, list, list, int]:
    scot = draw(scots())
    brokers = st.sampled_from(sorted(scot.brokers))
    subs = draw(st.lists(st.tuples(brokers, subscriptions), min_size=1, max_size=8))
    pubs = draw(st.lists(st.tuples(brokers, publications), min_size=1, max_size=8))
    return scot, subs, pubs, draw(st.integers(0, 2**16))


JITTERY = LatencyModel(0.001, 0.004)
"""The laws' latencies: jitter large against the base, so paths race."""


def _simulate(
    scot: Scot,
    mode: str,
    subs: list,
    pubs: list,
    seed: int,
    latency: LatencyModel = JITTERY,
    **kwargs,
) -> Simulator:
    """The paper's SBP (covering off, unless ``kwargs`` say otherwise): these laws count
    its messages and entries."""
    kwargs.setdefault("covering", "off")
    sim = Simulator(
        scot, mode, seed=seed, latency=latency, oracle_factory=ReferenceMatcher, **kwargs
    )
    for i, (broker, subscription) in enumerate(subs):
        sim.subscribe(f"S{i}", broker, subscription)
    sim.run()
    for broker, publication in pubs:
        sim.publish(f"P{broker}", broker, publication)
    sim.run()
    fired = {key for core in sim.cores.values() for key, n in core.stats.items() if n}
    assert not {key for key in fired if key.split(".")[0] in FAILURE_MACHINERY}
    return sim


FAILURE_MACHINERY = ("tunnel", "dedup", "custody", "undeliverable", "dnr_detour")
"""Stats that only failures may move: without one, tunnels and dedup never fire."""


def _exactly_once(report: dict) -> None:
    assert "failures" not in report
    assert report["duplicates"] == 0
    assert report["lost"] == 0
    assert report["unexpected"] == 0
    assert report["delivered"] == report["expected_deliveries"]


@given(scenarios())
def test_snr_laws(scenario: tuple) -> None:
    scot, subs, pubs, seed = scenario
    sim = _simulate(scot, "snr", subs, pubs, seed)
    n = len(scot.brokers)
    report = sim.report()
    assert report["subscriptions_made"] == len(subs)
    assert report["sbp_messages"] == len(subs) * (n - 1)
    assert report["sbp_duplicates"] == 0
    diameter = nx.diameter(scot.acyclic)
    for sub_id in sim.subscription_depth:
        holders = [
            core.table.entries[sub_id] for core in sim.cores.values() if sub_id in core.table
        ]
        assert len(holders) == n
        assert max(e.hops for e in holders) <= diameter + 1
        assert sum(e.local for e in holders) == 1
    assert report["max_subscription_tree_length"] <= diameter + 1
    _exactly_once(report)


@given(scenarios())
def test_bid_laws(scenario: tuple) -> None:
    scot, subs, pubs, seed = scenario
    sim = _simulate(scot, "bid", subs, pubs, seed)
    n, e = len(scot.brokers), scot.graph.number_of_edges()
    report = sim.report()
    assert report["sbp_messages"] == len(subs) * (2 * e - (n - 1))
    assert report["sbp_duplicates"] == len(subs) * (2 * e - (n - 1) - (n - 1))
    assert all(len(core.table) == len(subs) for core in sim.cores.values())
    _exactly_once(report)


@given(scenarios(), st.sampled_from(["snr", "dnr", "bid"]), st.data())
def test_unsubscribe_removes_everywhere_and_stops_deliveries(
    scenario: tuple, mode: str, data: st.DataObject
) -> None:
    scot, subs, pubs, seed = scenario
    sim = _simulate(scot, mode, subs, pubs, seed)
    gone = data.draw(st.sets(st.sampled_from(sorted(sim.subscription_depth)), min_size=1))
    for sub_id in gone:
        sim.unsubscribe(sub_id)
    sim.run()
    for core in sim.cores.values():
        assert not gone & set(core.table.entries)
    before = Counter(sim.ledger.received)
    for broker, publication in pubs:
        sim.publish(f"P{broker}", broker, publication)
    sim.run()
    _exactly_once(sim.report())
    later = sim.ledger.received - before
    holders = {sim.subscriber_of[sid] for sid in sim.subscription_depth if sid not in gone}
    assert {subscriber for subscriber, _, _ in later} <= holders


@given(scenarios(), st.floats(0.0, 1.0))
def test_dnr_laws_under_any_congestion(scenario: tuple, fraction: float) -> None:
    scot, subs, pubs, seed = scenario
    links = InjectedCongestion.random_icols(scot, fraction, seed)
    on_overloaded: Counter[tuple[str, tuple[str, int]]] = Counter()

    def watch(src: str, dst: str, message: object) -> None:
        if isinstance(message, Notification) and (src, dst) in links.overloaded_links:
            on_overloaded[(src, message.key)] += 1

    sim = _simulate(scot, "dnr", subs, pubs, seed, links=links, on_forward=watch)
    _exactly_once(sim.report())
    assert all(count <= 1 for count in on_overloaded.values())


@given(scenarios(), st.floats(20.0, 2000.0), st.integers(1, 5))
def test_dnr_laws_under_dynamic_congestion(scenario: tuple, capacity: float, q: int) -> None:
    """Real output queues (links of ``capacity`` messages/s, LST windows of 10 ms): DNR
    stays exactly once whichever links its own traffic overloads."""
    scot, subs, pubs, seed = scenario
    links = TimedLinks.uniform(scot, capacity, None, window=0.01, queue_threshold=q)
    _exactly_once(_simulate(scot, "dnr", subs, pubs, seed, links=links).report())


@given(scenarios())
def test_dnr_without_congestion_equals_snr(scenario: tuple) -> None:
    scot, subs, pubs, seed = scenario
    sent: dict[str, Counter] = {}
    for mode in ("snr", "dnr"):
        sent[mode] = Counter()
        _simulate(
            scot,
            mode,
            subs,
            pubs,
            seed,
            on_forward=lambda s, d, m, c=sent[mode]: c.update(
                [(s, d, type(m).__name__, getattr(m, "key", getattr(m, "sub_id", None)))]
            ),
        )
    assert sent["snr"] == sent["dnr"]


def test_cbv_never_names_the_receiving_cluster() -> None:
    """Under heavy congestion on fig2-sized SCOTs, every CBV copy is a valid header."""
    from octopis.topology import build_preset

    scot = build_preset("paper75")
    bad: list = []

    def watch(src: str, dst: str, message: object) -> None:
        if isinstance(message, Notification) and message.cbv is not None:
            receiver = scot.brokers[dst].cluster
            sender = scot.brokers[src].cluster
            if message.cbv[receiver] or message.cbv[sender]:
                bad.append((src, dst, message.cbv.to01()))
        if isinstance(message, Subscribe) and message.cbv is not None:
            assert message.cbv.count(1) == 1

    links = InjectedCongestion.random_icols(scot, 0.6, seed=3)
    sim = Simulator(scot, "dnr", seed=3, links=links, on_forward=watch)
    from octopis.workload import generate_workload

    workload = generate_workload(scot, subscribers=300, publishers=10, notifications=5, seed=3)
    sim.replay(workload)
    report = sim.report()
    _exactly_once(report)
    assert report["dnr_case_1"] and report["dnr_case_2"] + report["dnr_case_3"]
    assert not bad


# -- subscriber moves (DESIGN §9) ----------------------------------------------------------


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
    sim = _simulate(
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
    _exactly_once(sim.report())
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
    _exactly_once(report)
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
    sim = _simulate(
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
    fresh = _simulate(
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
    _exactly_once(report)
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
    _exactly_once(report)
    timeline, decisions = report["balance"]["timeline"], report["balance"]["decisions"]
    symbol = {name: sym for name, _, sym in placed}
    first = {}
    for d in decisions:
        first.setdefault(symbol[d["subscriber"]], d)
    print(f"cov {timeline[0]['cov']:.2f} -> {timeline[-1]['cov']:.2f}; {len(decisions)} moves")
    assert first["A"]["target"] == "c:1" and first["B"]["target"] == "f:2"
    assert "most similar" in first["A"]["reason"]
    assert timeline[-1]["cov"] < timeline[0]["cov"] / 2


# -- a new topology version (issue 18) ---------------------------------------------------


def _changed(scot: Scot, data: st.DataObject) -> tuple[str, Scot, str]:
    """A change valid for ``scot`` (drawn), the new version, and for a removal the broker
    each leaving one's subscribers go to ('' for additions)."""
    from octopis.topology_change import add_cluster, add_region, remove_cluster, remove_region

    kinds = ["add-cluster", "add-region"]
    if scot.clusters > 1:
        kinds.append("remove-cluster")
    leaves = sorted(x for x in scot.acyclic if scot.acyclic.degree(x) == 1)
    if leaves:
        kinds.append("remove-region")
    kind = data.draw(st.sampled_from(kinds))
    if kind == "add-cluster":
        return kind, add_cluster(scot), ""
    if kind == "add-region":
        return kind, add_region(scot, "new", data.draw(st.sampled_from(scot.regions))), ""
    if kind == "remove-cluster":
        return kind, remove_cluster(scot, scot.clusters - 1), "cluster 0"
    leaf = data.draw(st.sampled_from(leaves))
    return kind, remove_region(scot, leaf), next(iter(scot.acyclic[leaf]))


def _table(sim: Simulator, broker: str) -> dict[str, tuple]:
    return {
        e.sub_id: (e.last_hop, e.cbv, e.cluster, e.local, e.host, e.hops)
        for e in sim.cores[broker].table.entries.values()
    }


@given(scenarios(), st.sampled_from(["snr", "dnr"]), st.data())
def test_after_a_change_every_table_equals_a_fresh_scot_of_the_new_shape(
    scenario: tuple, mode: str, data: st.DataObject
) -> None:
    """Subscriptions on the brokers that stay; a cluster or a region added or removed; the
    new brokers filled by resync: every broker's table equals, entry by entry, the one a
    fresh SCOT of the new shape has after the same subscriptions. A subscription made
    afterwards costs N' − 1 SBP messages on the new size."""
    scot, subs, _, seed = scenario
    kind, new, _ = _changed(scot, data)
    subs = [(b, s) for b, s in subs if b in new.brokers]
    assume(subs)
    sims = []
    for shape in (scot, new):
        sim = Simulator(shape, mode, seed=seed, latency=LatencyModel(0.001, 0.004), covering="off")
        for i, (broker, subscription) in enumerate(subs):
            sim.subscribe(f"S{i}", broker, subscription)
        sim.run()
        sims.append(sim)
    changed, fresh = sims
    changed.reshape(new)
    changed.run()
    assert sorted(changed.cores) == sorted(fresh.cores)
    for broker in new.brokers:
        assert _table(changed, broker) == _table(fresh, broker), (kind, broker)
    before = changed.report()["sbp_messages"]
    broker = data.draw(st.sampled_from(sorted(new.brokers)))
    changed.subscribe("late", broker, subs[0][1])
    changed.run()
    assert changed.report()["sbp_messages"] - before == len(new.brokers) - 1


@given(scenarios(), st.sampled_from(["snr", "dnr"]), st.data())
def test_publications_during_a_change_reach_everyone_exactly_once(
    scenario: tuple, mode: str, data: st.DataObject
) -> None:
    """Publications flow from every staying broker for 1.5 s while the overlay changes:
    for a removal the leaving brokers' subscribers move first (to cluster 0, or to the
    leaf's tree neighbour) and the brokers go once the moves are done and their links
    are empty; an addition happens at once. Every notification reaches every subscriber
    exactly once; afterwards a subscriber at a new broker (or at a refuge) gets what
    every broker publishes."""
    scot, subs, pubs, seed = scenario
    kind, new, refuge = _changed(scot, data)
    sim = Simulator(
        scot, mode, seed=seed, latency=LatencyModel(0.001, 0.004), oracle_factory=ReferenceMatcher
    )
    for i, (broker, subscription) in enumerate(subs):
        sim.subscribe(f"S{i}", broker, subscription)
    sim.run()
    staying = sorted(b for b in scot.brokers if b in new.brokers)
    for i in range(150):
        broker = staying[i % len(staying)]
        sim.at(sim.now + i * 0.01, sim.publish, f"P{broker}", broker, pubs[i % len(pubs)][1])

    def refuge_of(broker: str) -> str:
        region, cluster = broker.split(":")
        return f"{region}:0" if refuge == "cluster 0" else f"{refuge}:{cluster}"

    if kind.startswith("add"):
        sim.at(sim.now + 0.02, sim.reshape, new)
    else:
        sim.at(sim.now + 0.01, sim.shrink, new, refuge_of)
    sim.run()
    report = sim.report()
    assert report["duplicates"] == report["lost"] == report["unexpected"] == 0
    assert report["delivered"] == report["expected_deliveries"]
    assert report["failures"]["brokers_added" if kind.startswith("add") else "brokers_removed"]
    assert sorted(sim.cores) == sorted(new.brokers)
    joined = sorted(set(new.brokers) - set(scot.brokers)) or staying
    sim.subscribe("newcomer", joined[0], Subscription((Predicate("sym", "eq", "Z"),)))
    sim.run()
    for broker in sorted(new.brokers):
        sim.publish(f"P{broker}", broker, {"x": 0, "sym": "Z"})
    sim.run()
    report = sim.report()
    assert report["delivered"] == report["expected_deliveries"]
    assert sum(n for (s, _, _), n in sim.ledger.received.items() if s == "newcomer") == len(
        new.brokers
    )


@pytest.mark.parametrize(
    ("mode", "advertisements", "refusal"),
    [
        ("bid", False, "routes by BID, which has no resync to fill a new broker"),
        ("dnr", True, "routes by DNR with advertisements, which a relink does not recompute"),
        ("snr", True, None),
    ],
)
def test_a_reshape_is_refused_by_the_nodes_own_relink_rule(
    mode: str, advertisements: bool, refusal: str | None
) -> None:
    """The simulator asks each broker's node (``BrokerNode.relink``, the broker process's
    rule) before it changes anything: refused as the process refuses, nothing changed;
    SNR with advertisements grows, and the subscriptions made before the new region
    joined get its publishers' publications exactly once."""
    from octopis.topology import build_preset
    from octopis.topology_change import add_region

    fig2 = build_preset("fig2")
    new = add_region(fig2, "new", "a")
    sim = Simulator(
        fig2, mode, seed=1, advertisements=advertisements, oracle_factory=ReferenceMatcher
    )
    every = Subscription((Predicate("x", "<", 10),))
    for i, broker in enumerate(sorted(fig2.brokers)):
        if advertisements:
            sim.advertise(f"P{broker}", broker, every)
        sim.subscribe(f"S{i}", broker, Subscription((Predicate("x", "<", 1 + i % 9),)))
    sim.run()
    if refusal is not None:
        tables = {b: _table(sim, b) for b in fig2.brokers}
        with pytest.raises(ValueError, match=refusal):
            sim.reshape(new)
        assert sim.scot == fig2 and sorted(sim.cores) == sorted(fig2.brokers)
        assert sim.failures is None
        assert {b: _table(sim, b) for b in fig2.brokers} == tables
        return
    sim.reshape(new)
    sim.run()
    added = sorted(set(new.brokers) - set(fig2.brokers))
    for broker in added:
        sim.advertise(f"P{broker}", broker, every)
    sim.run()
    for broker in added:
        sim.publish(f"P{broker}", broker, {"x": 0})
    sim.run()
    report = sim.report()
    assert report["delivered"] == report["expected_deliveries"] == 3 * len(fig2.brokers)
    assert report["duplicates"] == report["lost"] == report["unexpected"] == 0


def test_the_elastic_balancer_grows_under_load_and_shrinks_back_without_loss() -> None:
    """fig2 (3 clusters) at 200 publications/s for 20 s (10 s at the quick size, which
    grows by one cluster instead of three), then 10/s for 40 s, brokers of 100 messages/s:
    Dynamoth's elasticity adds clusters while the mean load ratio stays above 1 (LDM
    moves subscribers into them) and removes them, their subscribers moved out first
    (each move across clusters keeps the old subscription the SDK's ``linger``, 10 s, so
    the balancer watches 30 s more), once it stays under 0.3, down to the 3 it started
    with; every notification reaches every subscriber exactly once throughout."""
    from octopis.balance.policy import BalanceOptions, Elasticity
    from octopis.topology import build_preset

    scot = build_preset("fig2")
    sim = Simulator(
        scot, "dnr", seed=1, latency=LatencyModel(0.001, 0.004), oracle_factory=ReferenceMatcher
    )
    brokers = sorted(scot.brokers)
    for i in range(36):
        sim.subscribe(f"S{i}", brokers[i % 18], Subscription((Predicate("x", "<", 3 + i % 5),)))
    sim.run()
    start = sim.now
    loaded = sized(10, 20)
    for i in range(loaded * 200):
        sim.at(
            start + i * 0.005, sim.publish, f"P{brokers[i % 18]}", brokers[i % 18], {"x": i % 10}
        )
    for i in range(400):
        broker = brokers[i % 18]
        sim.at(start + loaded + i * 0.1, sim.publish, f"P{broker}", broker, {"x": i % 10})
    elastic = Elasticity(lr_high=1.0, lr_low=0.3, t_wait=4.0, min_clusters=3)
    sim.balance(BalanceOptions(interval=2.0, beta=5.0, cooldown=4.0), start + 90, 100.0, elastic)
    sim.run()
    report = sim.report()
    _exactly_once({k: v for k, v in report.items() if k != "failures"})
    changes = [c["change"] for c in report["balance"]["elastic"]]
    print(changes, [t["clusters"] for t in report["balance"]["timeline"]])
    grown = changes.count("add-cluster")
    assert grown >= 1 and changes == ["add-cluster"] * grown + ["remove-cluster"] * grown
    assert sim.scot.clusters == 3 and sorted(sim.cores) == brokers
    moved_in = [d for d in report["balance"]["decisions"] if int(d["target"][-1]) >= 3]
    assert moved_in  # the balancer used the new clusters while they were there


def test_a_charged_broker_serves_notifications_in_arrival_order() -> None:
    """One broker charged 10 ms a notification and 1 ms a delivery: ten notifications
    published at once leave 11, 22, ..., 110 ms later (each waits for those before it),
    and the broker was busy for all of it."""
    graph = nx.Graph()
    graph.add_node("a")
    scot = build_scot(graph, 1, name="one")
    (broker,) = scot.brokers
    sim = Simulator(
        scot, "snr", latency=LatencyModel(0.0, 0.0), service=ServiceModel(0.01, 0.0, 0.0, 0.001)
    )
    sim.subscribe("S", broker, Subscription((Predicate("x", ">", 0),)))
    sim.run()
    for _ in range(10):
        sim.publish("P", broker, {"x": 1})
    sim.run()
    assert [round(d, 6) for d in sim.ledger.delays] == [round(0.011 * k, 6) for k in range(1, 11)]
    report = sim.report()
    assert report["delivered"] == report["expected_deliveries"] == 10
    assert report["cpu_busy"]["busiest"] == broker
    assert sim.cpus is not None and abs(sim.cpus.busy_time[broker] - 0.11) < 1e-9


def test_a_receivers_cpu_backlog_overloads_its_senders_link() -> None:
    """Receiver-paced links: a:0 sends a notification every 10 ms to a:1, which takes
    60 ms over each. A copy counts in a:0's output queue until a:1's loop takes it, so at
    205 ms 4 of 20 are taken, 16 wait, and a:0's LST calls the link overloaded (what DNR
    reads); every delivery still arrives once, in order."""
    graph = nx.Graph()
    graph.add_node("a")
    scot = build_scot(graph, 2, name="pair")
    sender, receiver = sorted(scot.brokers)
    sim = Simulator(
        scot, "dnr", latency=LatencyModel(0.0, 0.0), service=ServiceModel(0.01, 0.0, 0.0, 0.05)
    )
    sim.subscribe("S", receiver, Subscription((Predicate("x", ">", 0),)))
    sim.run()
    start = sim.now
    for _ in range(20):
        sim.publish("P", sender, {"x": 1})
    sim.run(until=start + 0.205)
    lst = sim.links.lst[sender]  # type: ignore[attr-defined]
    assert lst.rows[receiver].queue_length == 16
    assert lst.overloaded(receiver)
    sim.run()
    assert lst.rows[receiver].queue_length == 0
    report = sim.report()
    _exactly_once(report)
    assert report["delivered"] == 20 and max(report["target_queue_length"].values()) >= 10
    assert [round(d, 6) for d in sim.ledger.delays] == [
        round(0.01 + 0.06 * (k + 1), 6) for k in range(20)
    ]


def test_a_move_waits_behind_the_notifications_a_busy_broker_holds() -> None:
    """Every message waits for a charged broker's loop in arrival order, a move's as
    well: five notifications queued at the middle broker of a–b–c are routed by the
    path they found, not by the move that arrived behind them, and reach the subscriber
    exactly once."""
    scot = build_scot(nx.path_graph(["a", "b", "c"]), 1, name="line")
    for service in (None, ServiceModel(0.01)):
        sim = Simulator(scot, "snr", latency=LatencyModel(0.0001, 0.0), service=service)
        sim.subscribe("S", "c:0", Subscription((Predicate("x", ">", 0),)))
        sim.run()
        for _ in range(5):
            sim.publish("P", "a:0", {"x": 1})
        sim.move("S", "a:0")
        sim.run()
        report = sim.report()
        assert report["delivered"] == report["expected_deliveries"] == 5
        assert report["lost"] == report["duplicates"] == 0


def test_a_service_model_needs_links_that_measure_the_cpu_queues() -> None:
    from octopis.failure_schedule import Failure
    from octopis.topology import build_preset

    scot = build_preset("fig2")
    with pytest.raises(ValueError, match="receiver-paced timed links"):
        Simulator(scot, "dnr", links=TimedLinks(scot), service=ServiceModel(0.001))
    for sim in (
        Simulator(scot, "dnr", service=ServiceModel(0.001)),
        Simulator(scot, "dnr", links=TimedLinks(scot, receiver_paced=True)),
    ):
        with pytest.raises(ValueError, match="not simulated with a CPU service model"):
            sim.fail(Failure(("b:0",), 1.0, 2.0))


@given(scenarios())
def test_charged_cpu_delays_every_delivery_and_loses_none(scenario: tuple) -> None:
    """With every broker's CPU charged, the same deliveries arrive exactly once, each at
    least the publishing broker's charge later than on free brokers (fixed latencies, so
    that only the charges differ)."""
    scot, subs, pubs, seed = scenario
    fixed = LatencyModel(0.001, 0.0)
    free = _simulate(scot, "dnr", subs, pubs, seed, fixed)
    model = ServiceModel(0.002, 1e-5, 1e-4, 2e-4)
    charged = _simulate(scot, "dnr", subs, pubs, seed, fixed, service=model)
    _exactly_once(charged.report())
    assert set(charged.ledger.received) == set(free.ledger.received)
    for slow, fast in zip(sorted(charged.ledger.delays), sorted(free.ledger.delays), strict=True):
        assert slow >= fast + 0.002 - 1e-9


def test_a_service_model_file_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "service.json"
    path.write_text('{"per_message": 0.0001, "per_copy": -1}')
    with pytest.raises(ValueError, match="per_copy must be a number ≥ 0"):
        ServiceModel.load(path)
    path.write_text('{"per_message": 0.0001, "per_copi": 1}')
    with pytest.raises(ValueError, match=r"unknown field.*per_copi"):
        ServiceModel.load(path)
    good = ServiceModel(0.0001, 1e-8, 2e-5, 3e-5, idle=0.01, source={"commit": "x"})
    path.write_text(json.dumps(good.to_json()))
    assert ServiceModel.load(path) == good


def test_a_background_timer_keeps_no_run_going_but_fires_in_a_run_that_reaches_it() -> None:
    """A broker's maintenance timer (:meth:`EventQueue.background`) is neither pending nor
    waited for by a run without ``until``; a run that reaches its time takes it in order."""
    events, taken = EventQueue(["a"]), []
    events.background(10.0, taken.append, "maintain")
    events.at(2.0, taken.append, "call")
    assert events.pending() == 1
    events.run(lambda dst, src, message: None)
    assert taken == ["call"] and events.now == 2.0 and events.pending() == 0
    events.at(12.0, taken.append, "later")
    events.run(lambda dst, src, message: None)
    assert taken == ["call", "maintain", "later"] and events.pending() == 0
    events.background(20.0, taken.append, "again")
    events.run(lambda dst, src, message: None, until=25.0)
    assert taken[-1] == "again" and events.now == 25.0
