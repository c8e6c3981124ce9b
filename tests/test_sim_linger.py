"""A simulated subscriber moves across clusters as the SDK does (DESIGN §9,
``client_policy.moves.move_across``): subscribe at the new broker, linger, withdraw the
old subscription, whether or not the new one has spread, which no client can tell."""

from __future__ import annotations

import pytest

from octopis.defaults import LINGER
from octopis.filters.language import Predicate, Subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import LatencyModel, Simulator
from octopis.topology import build_preset


@pytest.mark.parametrize(("linger", "lost"), [(0.0, True), (0.004, True), (LINGER, False)])
def test_a_move_across_clusters_withdraws_after_linger_spread_or_not(
    linger: float, lost: bool
) -> None:
    """On fig2 with 1 ms links, S's new subscription at a:1 takes 5 ms to reach the
    publisher's broker f:0; with a ``linger`` shorter than that the publications of the
    window are lost (the simulator once waited until every broker held the new
    subscription, hiding this); with the default, none is lost and none repeated."""
    sim = Simulator(
        build_preset("fig2"),
        "snr",
        seed=1,
        latency=LatencyModel(0.001, 0.0),
        oracle_factory=ReferenceMatcher,
        covering="off",
    )
    sim.subscribe("S", "f:0", Subscription((Predicate("x", "<", 10),)))
    sim.run()
    sim.move("S", "a:1", linger=linger)
    for i in range(10):
        sim.at(sim.now + i * 0.001, sim.publish, "P", "f:0", {"x": 1})
    sim.run()
    report = sim.report()
    assert (report["lost"] > 0) == lost
    assert report["delivered"] + report["lost"] == 10
    assert report.get("duplicated", 0) == 0
    assert sim.moves["across"] == sim.moves["withdrawn"] == 1


def test_the_session_left_at_a_failover_lingers_from_the_end_of_the_replay() -> None:
    """S's host c:0 is paused past the SDK's liveness: S fails over to the next broker of
    its list and asks for a replay, whose answers a 2 s delay spike holds back. As the
    SDK's connection does (its ``resume_clients`` includes the replay), S keeps the
    session it left at c:0 for ``LINGER`` after the replay ends, not after it
    re-subscribed: at fail-over + ``LINGER`` + 0.5 s it has not said bye yet. Every
    publication reaches S once either way."""
    from octopis.defaults import CLIENT_LIVENESS
    from octopis.failure_schedule import Failure

    scot = build_preset("fig2")
    sim = Simulator(scot, "snr", seed=3)
    sim.subscribe("S", "c:0", Subscription((Predicate("x", "<", 5),)))
    sim.run()
    start = sim.now
    new = scot.failover_order("c:0")[0]
    sim.fail(Failure(("c:0",), 1.0, 4.0, stall=True), start)
    for neighbour in scot.graph[new]:  # the replay's answers come 2 s late
        sim.slow_link(neighbour, new, start + 2.4, start + 2.6, 2.0)
    for i in range(200):
        sim.at(start + i * 0.05, sim.publish, "Pa:0", "a:0", {"x": i % 10})
    failed_over = start + 1.0 + CLIENT_LIVENESS
    sim.run(failed_over + LINGER + 0.5)
    assert sim._home["S"] == new and sim.replay_counts["done"] == 1
    assert "clients_left" not in sim.failure_counts  # still lingering
    sim.run()
    assert sim.failure_counts["clients_left"] == 1
    report = sim.report()
    assert report["delivered"] == report["expected_deliveries"] == 100
    assert report["lost"] == report["duplicates"] == 0
