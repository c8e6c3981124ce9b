"""Store faults in the nemesis (``octopis.nemesis.store_faults``, DESIGN §7): a full disk
refuses by name while the broker keeps serving; a power failure loses only what its store's
``sync`` allows, and the verdict says so."""

from __future__ import annotations

import pytest

from octopis.nemesis import scenarios as nemesis
from octopis.nemesis.scenarios import run, simulate
from octopis.nemesis.store_faults import DiskFull, PowerLoss


def _one_publisher(faults: tuple, historics: tuple = ()) -> nemesis.Scenario:
    """Pc:0 publishes every 0.1 s from 0.1 to 3.9 s; S0 at a:0 takes everything."""
    publications = tuple((round(0.1 * i, 6), "c:0", i % 9) for i in range(1, 40))
    return nemesis.Scenario(
        0, "fig2", "snr", "off", False, (("S0", "a:0", 9),), publications, faults,
        historics=historics,
    )  # fmt: skip


def test_a_full_disk_refuses_by_name_and_the_broker_keeps_serving() -> None:
    """c:0's disk is full from 1.0 to 2.0 s: the publication whose commit fails was routed
    already (S0 may get it) and is refused to its publisher; the next ones are refused
    before routing for ``REFUSE_FOR``; once the disk has room again c:0 confirms again. S0
    gets every publication confirmed, the refused ones count refused, nothing is lost."""
    sim, withdrawn, asked = simulate(_one_publisher((DiskFull("c:0", 1.0, 2.0),)))
    problems, counts = nemesis.check(sim, withdrawn, asked)
    assert problems == []
    retention = sim.retention
    assert retention.refused and all("disk is full" in r for r in retention.refused.values())
    before = sim.failure_totals()["publications_refused.not_kept"]  # c:0's node counted them
    assert before > 0
    confirmed = sorted(seq for (_, seq) in retention.confirmed)
    assert confirmed[-1] == 39 and len(confirmed) + len(retention.refused) + before == 39
    assert sim.nodes["c:0"].serving
    assert counts["stores"]["refused"] == len(retention.refused) + before
    assert counts["lost"] == counts["silent"] == 0 and counts["stores"]["store_lost"] == 0


@pytest.mark.parametrize("sync", ["normal", "full"])
def test_a_power_failure_loses_only_what_sync_allows_and_says_so(sync: str) -> None:
    """c:0's machine loses power at 2.0 s and starts again at 3.0 s; H0 asks a:0 at 6 s for
    what was published in [0, 5). With ``sync = "normal"`` c:0's store loses the commits
    of the last 0.45 s (1.6-1.9 s, confirmed): the verdict names the store and why; H0 is
    told no gap for them, since no store can tell what a power failure took (the
    process's SQLite file cannot, and the simulator's store answers as it does); with
    ``full`` nothing confirmed is lost and H0 gets all of it."""
    scenario = _one_publisher(
        (PowerLoss("c:0", 2.0, 3.0, sync, 0.45),), ((6.0, "H0", "a:0", 9, 0.0, 5.0),)
    )
    verdict = run(scenario)
    assert verdict.passed, verdict.problems
    historic = verdict.kinds["historic"]
    if sync == "full":
        assert verdict.stores["store_lost"] == 0 and verdict.losses == []
        assert historic["lost"] == 0 and historic["delivered"] > 0
        return
    assert verdict.stores["store_lost"] == 4
    assert verdict.losses == [
        "4 confirmed publications: c:0's retention store lost it: committed within 0.450 s "
        "of a power failure, not yet on disk (sync normal)"
    ]
    assert historic["lost"] == 4 and historic["silent"] == 0
    sim, _, asked = simulate(scenario)
    (asker,) = {q.asker for q in asked.values()}
    assert not any(p == "Pc:0" for p, _, _, _ in sim.store_gaps.get(asker, ()))
