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
