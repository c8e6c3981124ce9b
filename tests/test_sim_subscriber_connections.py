"""A simulated subscriber's connections through failures, as the SDK's (DESIGN §7, §11):
one whose connection failed may connect to that same broker again (its own broker comes
last on its fail-over list), and the new connection is a new one, as a broker process
keys each (``<connection>/<name>``), not the failed one; one whose tries end (every
broker of its list gone for good) stops waiting for the replay it asked, with a gap, and
one cut off for good without a replay under way ends the run with every broker in its gap."""

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


def test_a_subscriber_whose_tries_end_is_told_the_replay_it_waited_for() -> None:
    """The trio r0:0, r0:1, r0:2 (one region) dies for good: r0:0 at the first
    publication, r0:2 1 s later, r0:1 2 s later. S13 (at r0:0) fails over to r0:1 after
    the liveness and asks for a replay there, which waits for its dead neighbours' silence;
    r0:1 dies before it answers. S13 tries r0:2, r0:0 and r0:1 again, all silent, and its
    tries end (every broker of its list gone for good).

    Lost before (found by ``test_up_to_three_failures_while_publishing``): its replay's wait
    never ended, as nothing cut it short but a later fail-over, so S13 was told no gap and
    the live deliveries its seam held were never delivered; eight publications of Pr0:0,
    Pr0:1 and Pr0:2 were lost with no count and no gap (so for the other five subscribers
    that failed over to r0:1).

    Now its wait ends as the SDK's does past its timeout, with no answer: what the seam
    held is delivered and the gap names every broker."""
    scot = build_scot(nx.empty_graph(["r0"]), complete_factor(3), name="trio")
    failures = [
        Failure(("r0:0",), 0.0, None),
        Failure(("r0:1",), 2.0, None),
        Failure(("r0:2",), 1.0, None),
    ]
    sim = _run(scot, "dnr", failures, seed=0, subscribers=30, publications=30)
    report = _law(sim)
    assert sim.first_home["S13"] == "r0:0" and sim._home["S13"] == "r0:1"
    assert sim.replay_gaps["S13"] == set(scot.brokers)
    replays = report["replays"]
    assert replays["cut_short"] == replays["requests"] > 0
    assert replays["gaps"] == report["subscribers_stranded"] == 30  # the rest: no replay
    assert not sim.seams


def test_a_subscriber_cut_off_for_good_ends_the_run_knowing_it() -> None:
    """The pair r0:0, r0:1: S0's connection to its broker fails at 1 s, and both brokers
    die for good at 2 s, before S0's fail-over begins (the liveness, 1.5 s after the
    cut). S0 tries both, silent, and its tries end; it never subscribes again.

    Lost before (found by hunting with ``test_up_to_three_failures_while_publishing``'s
    schedules): what its broker delivered on the failed connection between 1 s and 2 s
    (Pr0:0's seq 6) had no count and no gap; S0 had no replay under way, so only a
    subscriber waiting for one was told anything when its tries ended.

    Now every subscriber whose tries end is counted (``subscribers_stranded``) and ends
    the run with every broker in its gap: it is cut off since its connection failed and
    knows it, and only its lost brokers held what was published since."""
    scot = build_scot(nx.empty_graph(["r0"]), complete_factor(2), name="pair")
    failures = [Failure(("r0:0",), 2.0, None), Failure(("r0:1",), 2.0, None)]
    clients = [("S0", 1.0)]
    sim = _run(scot, "dnr", failures, seed=0, subscribers=30, publications=30, clients=clients)
    report = _law(sim)
    assert report["deliveries_to_cut_clients"] > 0
    assert report["subscribers_stranded"] == 30 == len(sim.stranded)
    assert "S0" not in sim.outages and sim.replay_gaps["S0"] == set(scot.brokers)
