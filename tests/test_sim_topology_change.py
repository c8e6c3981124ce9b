"""A new topology version in the simulator (issue 18): after a cluster or a region is added
or removed every table equals a fresh SCOT's of the new shape, publications during the
change reach everyone exactly once, a reshape is refused by the node's own relink rule,
and the elastic balancer grows and shrinks the overlay without loss."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from laws import sized
from sim_scenarios import changed_scot, exactly_once, scenarios

from octopis.filters.language import Predicate, Subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import LatencyModel, Simulator


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
    kind, new, _ = changed_scot(scot, data)
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
    kind, new, refuge = changed_scot(scot, data)
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
    sim.balance(BalanceOptions(interval=2.0, beta=5.0, cooldown=4.0), start + 130, 100.0, elastic)
    sim.run()
    report = sim.report()
    exactly_once({k: v for k, v in report.items() if k != "failures"})
    changes = [c["change"] for c in report["balance"]["changes"]]
    print(changes, [t["clusters"] for t in report["balance"]["timeline"]])
    grown = changes.count("add-cluster")
    assert grown >= 1 and changes == ["add-cluster"] * grown + ["remove-cluster"] * grown
    assert sim.scot.clusters == 3 and sorted(sim.cores) == brokers
    moved_in = [d for d in report["balance"]["decisions"] if int(d["target"][-1]) >= 3]
    assert moved_in  # the balancer used the new clusters while they were there


def test_the_elastic_shrink_sends_a_leaving_brokers_subscribers_where_octopis_scale_does() -> None:
    """fig2 grown to four clusters, three subscribers on each broker of the last; no load,
    so the elasticity rule removes that cluster after ``t_wait``: each leaving broker's
    subscribers move to its region's brokers of clusters 0, 1 and 2, one each, in the
    order :func:`~octopis.topology_change.refuge_turns` gives ``octopis scale``."""
    from octopis.balance.policy import BalanceOptions, Elasticity
    from octopis.topology import build_preset
    from octopis.topology_change import add_cluster, refuge_turns, remove_cluster

    scot = add_cluster(build_preset("fig2"))
    sim = Simulator(scot, "dnr", seed=1, latency=LatencyModel(0.001, 0.004))
    leaving = sorted(b for b in scot.brokers if scot.brokers[b].cluster == 3)
    homes = {f"S{b}-{k}": b for b in leaving for k in range(3)}
    for subscriber, broker in homes.items():
        sim.subscribe(subscriber, broker, Subscription((Predicate("x", "<", 3),)))
    sim.run()
    refuge = refuge_turns(scot, remove_cluster(scot, 3))
    expected = {s: refuge(b) for s, b in homes.items()}  # in the order the shrink moves them
    elastic = Elasticity(lr_high=1.0, lr_low=0.3, t_wait=1.0, min_clusters=3)
    sim.balance(BalanceOptions(interval=1.0, cooldown=60.0), sim.now + 30, 100.0, elastic)
    sim.run()
    report = sim.report()
    assert [c["change"] for c in report["balance"]["changes"]] == ["remove-cluster"]
    assert sim.scot.clusters == 3
    assert {s: sim._home[s] for s in homes} == expected
    assert len(set(expected.values())) == 3 * len(build_preset("fig2").regions)


def test_a_shrink_that_would_strand_a_publisher_is_refused_and_the_balancer_logs_it() -> None:
    """A publisher attached to a broker of the last cluster: the simulator's shrink
    refuses before anything moves, naming it, as ``octopis scale`` does
    (``refuse_stranded_publishers``); the elasticity rule's shrink is logged with that
    error and the overlay keeps its shape. A dry run (``act`` off) changes nothing."""
    from octopis.balance.policy import BalanceOptions, Elasticity
    from octopis.topology import TopologyError, build_preset
    from octopis.topology_change import add_cluster, remove_cluster

    scot = add_cluster(build_preset("fig2"))
    for act in (True, False):
        sim = Simulator(scot, "dnr", seed=1, latency=LatencyModel(0.001, 0.004))
        sim.subscribe("S", "a:3", Subscription((Predicate("x", "<", 3),)))
        sim.run()
        sim.publish("Pb:3", "b:3", {"x": 1})
        sim.run()
        with pytest.raises(TopologyError, match="Pb:3 at b:3"):
            sim.shrink(remove_cluster(scot, 3), lambda b: b)
        assert not sim.retiring and not sim.moving("S")
        elastic = Elasticity(lr_high=1.0, lr_low=0.3, t_wait=1.0, min_clusters=3)
        options = BalanceOptions(interval=1.0, cooldown=60.0, act=act)
        sim.balance(options, sim.now + 5, 100.0, elastic)
        sim.run()
        changes = sim.report()["balance"]["changes"]
        assert sim.scot.clusters == 4 and sim._home["S"] == "a:3"
        if act:
            assert changes and all(c["change"] == "remove-cluster" for c in changes)
            assert all("Pb:3 at b:3" in c["error"] for c in changes)
        else:
            assert not changes
