"""Routing laws as properties over random SCOTs, subscriptions, publications and latencies.
Subscriber moves and the balancers: tests/test_sim_moves.py; a new topology version:
tests/test_sim_topology_change.py; charged CPU: tests/test_sim_service.py."""

from __future__ import annotations

from collections import Counter

import networkx as nx
from hypothesis import given
from hypothesis import strategies as st
from sim_scenarios import exactly_once, scenarios, simulate

from octopis.core import Notification, Subscribe
from octopis.sim import InjectedCongestion, Simulator, TimedLinks
from octopis.sim.events import EventQueue


@given(scenarios())
def test_snr_laws(scenario: tuple) -> None:
    scot, subs, pubs, seed = scenario
    sim = simulate(scot, "snr", subs, pubs, seed)
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
    exactly_once(report)


@given(scenarios())
def test_bid_laws(scenario: tuple) -> None:
    scot, subs, pubs, seed = scenario
    sim = simulate(scot, "bid", subs, pubs, seed)
    n, e = len(scot.brokers), scot.graph.number_of_edges()
    report = sim.report()
    assert report["sbp_messages"] == len(subs) * (2 * e - (n - 1))
    assert report["sbp_duplicates"] == len(subs) * (2 * e - (n - 1) - (n - 1))
    assert all(len(core.table) == len(subs) for core in sim.cores.values())
    exactly_once(report)


@given(scenarios(), st.sampled_from(["snr", "dnr", "bid"]), st.data())
def test_unsubscribe_removes_everywhere_and_stops_deliveries(
    scenario: tuple, mode: str, data: st.DataObject
) -> None:
    scot, subs, pubs, seed = scenario
    sim = simulate(scot, mode, subs, pubs, seed)
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
    exactly_once(sim.report())
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

    sim = simulate(scot, "dnr", subs, pubs, seed, links=links, on_forward=watch)
    exactly_once(sim.report())
    assert all(count <= 1 for count in on_overloaded.values())


@given(scenarios(), st.floats(20.0, 2000.0), st.integers(1, 5))
def test_dnr_laws_under_dynamic_congestion(scenario: tuple, capacity: float, q: int) -> None:
    """Real output queues (links of ``capacity`` messages/s, LST windows of 10 ms): DNR
    stays exactly once whichever links its own traffic overloads."""
    scot, subs, pubs, seed = scenario
    links = TimedLinks.uniform(scot, capacity, None, window=0.01, queue_threshold=q)
    exactly_once(simulate(scot, "dnr", subs, pubs, seed, links=links).report())


@given(scenarios())
def test_dnr_without_congestion_equals_snr(scenario: tuple) -> None:
    scot, subs, pubs, seed = scenario
    sent: dict[str, Counter] = {}
    for mode in ("snr", "dnr"):
        sent[mode] = Counter()
        simulate(
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
    exactly_once(report)
    assert report["dnr_case_1"] and report["dnr_case_2"] + report["dnr_case_3"]
    assert not bad


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
