"""The simulator's publishers fail over as the SDK's do (DESIGN §4, §7,
:mod:`octopis.sim.publishers`): what a dead broker did not confirm is sent again at the
next broker of the publisher's list, with its sequence number, and every subscriber gets
each publication once (the brokers' edge dedup keeps a copy that came both ways once).
The process test ``tests/test_cluster.py::test_killed_hosts_lose_no_subscriber_anything``
kills a broker under the SDK's publishers the same way."""

from __future__ import annotations

import pytest

from octopis.failure_schedule import Failure
from octopis.filters.language import Predicate, Subscription
from octopis.sim import Simulator
from octopis.topology import build_preset

FIG2 = build_preset("fig2")
KILLED = "c:0"
PUBLISHER = f"P{KILLED}"
COUNT = 600
EVERY = 0.001
"""Seconds between two publications: COUNT of them span the death and the fail-over."""
DIES = 0.3005
"""Seconds into publishing when ``KILLED`` dies (and stays dead)."""


def _run(mode: str, seed: int) -> Simulator:
    """Subscribers to everything at every broker but ``KILLED``; ``PUBLISHER`` at
    ``KILLED`` publishes COUNT times, ``KILLED`` dying in the middle of it."""
    sim = Simulator(FIG2, mode, seed=seed)
    everything = Subscription((Predicate("x", ">=", 0),))
    for i, broker in enumerate(b for b in FIG2.brokers if b != KILLED):
        sim.subscribe(f"S{i}", broker, everything)
    sim.run()
    start = sim.now
    sim.fail(Failure((KILLED,), DIES, 60.0), start)
    for seq in range(1, COUNT + 1):
        sim.at(start + seq * EVERY, sim.publish, PUBLISHER, KILLED, {"x": seq}, seq)
    sim.run(start + 30.0)
    return sim


@pytest.mark.parametrize(("mode", "seed"), [("snr", 1), ("dnr", 2)])
def test_a_publisher_whose_broker_dies_sends_what_it_did_not_confirm_again(
    mode: str, seed: int
) -> None:
    """``KILLED`` dies mid-stream: the publications it accepted and did not confirm, and
    those sent to it dead, are sent again at the next broker of the publisher's list once
    the publisher hears it no more (``CLIENT_LIVENESS``), with their first stamps; those
    it confirmed are not.
    Every subscriber gets each of the COUNT publications once, expected once."""
    sim = _run(mode, seed)
    counts = sim.failure_totals()
    retention = sim.retention
    subscribers = {s for s, _, _ in sim.ledger.expected}
    assert len(subscribers) == len(FIG2.brokers) - 1
    everything = {(s, PUBLISHER, q) for s in subscribers for q in range(1, COUNT + 1)}
    assert sim.ledger.expected == everything
    assert sim.ledger.notifications == COUNT  # each expected once, when first accepted
    assert set(sim.ledger.received) == everything
    assert set(sim.ledger.received.values()) == {1}  # none twice
    new = sim.clients.home[PUBLISHER]
    assert new != KILLED and counts["publishers_failed_over"] == 1
    at_killed = {q for p, q in retention.confirmed if retention.confirmed[(p, q)] == KILLED}
    resent = set(range(1, COUNT + 1)) - at_killed
    assert counts["publications_resent"] == len(resent) > 0
    assert {retention.confirmed[(PUBLISHER, q)] for q in resent} == {new}
    routed_at_killed = {n.seq for n in sim.published[KILLED]}
    assert routed_at_killed - at_killed  # accepted there, unconfirmed, sent again
    sent_to_the_dead = {q for p, q in sim.publishers.entered}  # entered the overlay late
    assert sent_to_the_dead == resent - routed_at_killed and sent_to_the_dead
    assert not sim.publishers.unanswered[PUBLISHER]
    assert "publications_refused" not in counts
    stamps = {n.seq: n.published_at for n in sim.published[KILLED]}
    again = {n.seq: n.published_at for n in sim.published[new] if n.seq in stamps}
    assert again and all(stamps[q] == at for q, at in again.items())  # the same stamp
