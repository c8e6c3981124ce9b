"""A simulated subscriber whose connection failed may connect to that same broker again
(DESIGN §7: its own broker comes last on its fail-over list): the new connection is a new
one, as a broker process keys each (``<connection>/<name>``), not the failed one."""

from __future__ import annotations

import networkx as nx
from test_failures import _law, _run

from octopis.failure_schedule import Failure
from octopis.topology import build_scot, complete_factor


def test_a_subscriber_back_at_the_broker_its_connection_failed_to_loses_nothing() -> None:
    """The pair r0:0, r0:1 (one region): r0:0 dies for good at the first publication and
    S0's connection to its own, live broker r0:1 fails at the same moment. S0 tries r0:0
    (silent for the liveness), then r0:1 again, where it subscribes anew 3 s after the
    cut and asks for a replay.

    Lost before (found by ``test_up_to_three_failures_while_publishing``): the simulator
    kept the failed connection as the pair (S0, r0:1), so what r0:1 delivered to S0's new
    connection and its replay's answer were dropped as if sent on the failed one; S0 lost
    21 publications of Pr0:0 (seqs 1, 2, 6-10, 13, 14) and Pr0:1 with no count and no
    gap, and the drop of the failed connection 10 s after the cut would have withdrawn the
    new connection's subscription too (the simulator keys a client's session by its name).

    Now: S0 gets every publication, its replay tells it that r0:0's store never answered,
    and it is still subscribed at r0:1 at the end."""
    scot = build_scot(nx.empty_graph(["r0"]), complete_factor(2), name="pair")
    failures = [Failure(("r0:0",), 0.0, None)]
    clients = [("S0", 0.0)]
    sim = _run(scot, "dnr", failures, seed=0, subscribers=30, publications=30, clients=clients)
    report = _law(sim)
    assert sim.first_home["S0"] == sim._home["S0"] == "r0:1" and len(sim.outages["S0"]) == 1
    assert report["host_alive"]["lost"] == 0
    assert report["host_alive"]["delivered"] == report["host_alive"]["expected_deliveries"]
    assert sim.replay_gaps["S0"] == {"r0:0"}
    assert sim.nodes["r0:1"].sessions.subscriptions("S0")
    assert "clients_dropped" not in report
