"""Durable subscribers in the seeded nemesis (``octopis.nemesis.scenarios``, DESIGN §7, §11):
they are drawn and hold to their contract, and the seeds that found bugs in them pass."""

from __future__ import annotations

from dataclasses import replace

import pytest

from octopis.defaults import LOOKBACK
from octopis.failure_schedule import Failure
from octopis.nemesis import scenarios as nemesis
from octopis.nemesis.scenarios import draw, run, simulate


def test_durable_subscribers_are_drawn_and_hold_to_their_contract() -> None:
    """Durable subscribers leave and come back (some past ``LOOKBACK``, some where they
    left), fail over when their host dies, claim their records and replay: each gets
    every publication of its filter once, or a gap it was told of."""
    scenarios = [draw(seed) for seed in range(120)]
    runs = [d for s in scenarios for d in s.durables]
    assert len(runs) >= 20
    assert any(d[3] is not None and d[4] > nemesis.DURATION + LOOKBACK for d in runs)
    counts: dict[str, int] = {}
    for scenario in scenarios:
        if not scenario.durables:
            continue
        sim, withdrawn, asked = simulate(scenario)
        problems, verdict = nemesis.check(sim, withdrawn, asked)
        assert problems == [], (scenario.seed, problems)
        for c in sim.durable_clients.values():
            for key, n in c.counts.items():
                counts[key] = counts.get(key, 0) + n
        durable = verdict["kinds"]["durable"]
        assert durable["delivered"] + durable["lost"] + durable["refused"] == durable["expected"]
    assert counts["claimed"] >= 10 and counts["replayed"] > 0
    assert counts.get("failed_over", 0) >= 1


@pytest.mark.parametrize("mode", ["snr", "dnr", "bid"])
def test_a_durable_client_that_leaves_during_its_failover_replay_is_owed_it(mode: str) -> None:
    """D0's host c:2 dies at 1.0 s, restarts at 1.5 s and dies again at 2.2 s, for good;
    D0 fails over when its heartbeat watch judges c:2 silent (2.5-3.0 s) to b:2, whose
    replay round waits for c:2 (dead, not yet declared down), and leaves at 3.1 s before
    the answer. Back at a:1 at 3.5 s, its claim
    finds b:2's copy of its record; c:2, which keeps the copy that began with the
    subscription, is silent. What Pa:0 published at 1.2-2.0 s is owed from b:2's copy
    itself: it owes from the fail-over replay's start, not from the fail-over (SNR and
    DNR lost the three without a count or a gap, BID with a gap, nemesis seed 134)."""
    scenario = nemesis.Scenario(
        0,
        "fig2",
        mode,
        "off",
        False,
        (("S0", "a:0", 5),),
        ((1.2, "a:0", 1), (1.5, "a:0", 2), (2.0, "a:0", 3), (4.0, "a:0", 4)),
        (Failure(("c:2",), 1.0, 1.5), Failure(("c:2",), 2.2, 6.0)),
        durables=(("D0", "c:2", 9, 3.1, 3.5, "a:1"),),
    )
    sim, withdrawn, asked = simulate(scenario)
    problems, verdict = nemesis.check(sim, withdrawn, asked)
    assert problems == []
    durable = verdict["kinds"]["durable"]
    assert durable["expected"] == durable["delivered"] == 4, durable
    assert durable["duplicated"] == 0
    counts = sim.durable_clients["D0"].counts
    assert counts["failed_over"] == counts["claimed"] == 1


DURABLES = {
    2: (("D0", "b:0", 6, 1.180874, 43.931836, "b:0"), ("D1", "c:0", 1, 1.496455, 3.21961, "c:0")),
    115: (("D0", "b:1", 7, 0.981522, 3.944099, "f:1"), ("D1", "b:1", 4, 0.885335, 3.650649, "c:2")),
    85: (("D0", "b:0", 6, 2.737036, 3.505457, "c:0"), ("D1", "e:1", 6, 3.946953, 41.521295, "e:1")),
    265: (("D0", "d:1", 7, 3.736057, 5.302052, "b:0"),),
}
"""Durable subscribers of seeds that found bugs, as drawn when they did (the draw has
changed since: fewer durable subscribers per seed)."""


@pytest.mark.parametrize(
    ("seed", "found"),
    [
        (2, "a durable client back where it left after more than LOOKBACK was owed only the "
            "last LOOKBACK of what publishers it had not heard from published"),
        (85, "BID: a subscription withdrawn while a link was cut flooded again behind its "
             "withdrawal for ever; and a claim resumed from a copy made at a fail-over, "
             "which began then"),
        (115, "overlapping crashes of one broker restarted it twice, the second time alive, "
              "wiping a durable client's subscription unannounced"),
        (265, "a copy held for a paused broker, released after a durable subscription was "
              "made anew, came twice"),
    ],
)  # fmt: skip
def test_the_durable_seeds_that_found_bugs_pass(seed: int, found: str) -> None:
    scenario = draw(seed, composites=False, stores=False)
    scenario = replace(scenario, durables=DURABLES[seed])
    verdict = run(scenario)
    assert verdict.passed, (found, verdict.problems)
    assert verdict.kinds["durable"]["expected"] > 0
