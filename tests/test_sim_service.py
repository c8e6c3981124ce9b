"""Charged CPU in the simulator (``octopis.sim.service``): a broker serves in arrival order,
a receiver's backlog overloads its sender's link, a move waits behind what a busy broker
holds, and charged CPU delays every delivery and loses none."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given
from sim_scenarios import exactly_once, scenarios, simulate

from octopis.filters.language import Predicate, Subscription
from octopis.sim import LatencyModel, Simulator, TimedLinks
from octopis.sim.service import ServiceModel
from octopis.topology import build_scot


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
    exactly_once(report)
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
    free = simulate(scot, "dnr", subs, pubs, seed, fixed)
    model = ServiceModel(0.002, 1e-5, 1e-4, 2e-4)
    charged = simulate(scot, "dnr", subs, pubs, seed, fixed, service=model)
    exactly_once(charged.report())
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
