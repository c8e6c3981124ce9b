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


def _run(mode: str, seed: int, failure: Failure | None = None) -> tuple[Simulator, float]:
    """Subscribers to everything at every broker but ``KILLED``; ``PUBLISHER`` at
    ``KILLED`` publishes COUNT times, ``KILLED`` failing in the middle of it (``failure``,
    by default dying at ``DIES`` for good); the run, and when publishing began."""
    sim = Simulator(FIG2, mode, seed=seed)
    everything = Subscription((Predicate("x", ">=", 0),))
    for i, broker in enumerate(b for b in FIG2.brokers if b != KILLED):
        sim.subscribe(f"S{i}", broker, everything)
    sim.run()
    start = sim.now
    sim.fail(failure or Failure((KILLED,), DIES, 60.0), start)
    for seq in range(1, COUNT + 1):
        sim.at(start + seq * EVERY, sim.publish, PUBLISHER, KILLED, {"x": seq}, seq)
    sim.run(start + 30.0)
    return sim, start


@pytest.mark.parametrize(("mode", "seed"), [("snr", 1), ("dnr", 2)])
def test_a_publisher_whose_broker_dies_sends_what_it_did_not_confirm_again(
    mode: str, seed: int
) -> None:
    """``KILLED`` dies mid-stream: the publications it accepted and did not confirm, and
    those sent to it dead, are sent again at the next broker of the publisher's list once
    the publisher hears it no more (``CLIENT_LIVENESS``), with their first stamps; those
    it confirmed are not.
    Every subscriber gets each of the COUNT publications once, expected once."""
    sim, _ = _run(mode, seed)
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


@pytest.mark.parametrize(
    ("mode", "seed", "pause"), [("snr", 3, 3.0), ("dnr", 4, 3.0), ("snr", 5, 1.0)]
)
def test_a_publisher_whose_broker_pauses_past_its_liveness_fails_over_and_both_take_it(
    mode: str, seed: int, pause: float
) -> None:
    """``KILLED`` is paused (SIGSTOP) mid-stream for ``pause`` seconds. Past the SDK's
    liveness (1.5 s) the publisher hears it no more and fails over, sending again what it
    had no answer for, first stamps kept; what waited in the paused broker's socket is
    taken there at its resume too, so those publications enter the overlay at both
    brokers, each with its one stamp. A shorter pause is waited out: no fail-over, nothing
    sent twice. Either way every subscriber gets each of the COUNT publications once."""
    sim, start = _run(mode, seed, Failure((KILLED,), DIES, DIES + pause, stall=True))
    counts = sim.failure_totals()
    subscribers = {s for s, _, _ in sim.ledger.expected}
    everything_once = {(s, PUBLISHER, q) for s in subscribers for q in range(1, COUNT + 1)}
    assert len(subscribers) == len(FIG2.brokers) - 1
    assert sim.ledger.expected == set(sim.ledger.received) == everything_once
    assert set(sim.ledger.received.values()) == {1}  # none twice
    assert not sim.publishers.unanswered[PUBLISHER]
    stamps: dict[int, set[float]] = {}
    for copies in sim.published.values():
        for n in copies:
            stamps.setdefault(n.seq, set()).add(n.published_at)
    assert all(len(at) == 1 for at in stamps.values())  # one stamp per publication
    twice = {
        q for q in stamps if sum(q in {n.seq for n in ns} for ns in sim.published.values()) > 1
    }
    if pause < 1.5:
        assert "publishers_failed_over" not in counts and not twice
        assert sim.clients.home[PUBLISHER] == KILLED
        return
    new = sim.clients.home[PUBLISHER]
    assert new != KILLED and counts["publishers_failed_over"] == 1
    assert counts["publications_resent"] > 0
    waited = {n.seq for n in sim.published[KILLED] if n.published_at >= start + DIES}
    assert waited and waited <= twice  # taken by the paused broker at its resume, and by new
