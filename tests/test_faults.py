"""The nemesis's faults on broker processes (DESIGN §7): fig2 over three network namespaces
(a cluster per host), SNR and DNR with covering on, a pipelined publisher at ``a:0`` and
subscribers live, failed over, durable and historic (:mod:`bench.fault_run`). Each test
injects one fault mid-stream, heals it, and checks every subscriber: each confirmed
publication delivered exactly once, or a gap reported to that subscriber; a full disk
refuses by name and loses nothing it confirmed.

The namespaces need root and ``ip netns`` (the ``namespaces`` fixture skips without them).

Each fault runs once on processes, in one mode (:data:`MODE_OF`): the eight are split
between an SNR and a DNR overlay, so both modes meet real faults. The same fault in the
other mode is a routing law the seeded nemesis checks on the brokers' own node
(tests/test_nemesis.py ``test_the_seeds_pass``: crashes, pauses, partitions, one-way
links, delay spikes and full disks drawn in SNR, DNR and BID, covering on and off).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_docs import ROOT, fenced_blocks

from bench.faults import FAULTS, Overlay, markdown, passes
from octopis.cluster.netns import Namespaces
from octopis.settings import load_settings

SECONDS = 4.0
COUNT = 240
"""Publications per scenario, at 30/s: 8 s of publishing."""


MODE_OF = {
    "crash": "snr",
    "delay": "snr",
    "reset": "snr",
    "disk": "snr",
    "pause": "dnr",
    "cut": "dnr",
    "one-way": "dnr",
    "stall": "dnr",
}
"""The mode each fault runs in on processes: DNR takes the faults that leave a link's
queue growing (a pause, a cut, a one-way drop, a stalled link), where its detours
act."""
ONE_WORKER = pytest.mark.xdist_group("faults")
"""The faults run on one worker, one after another, so that each mode's overlay (module
scope, its parameter too) is set up once for its faults: pytest tore it down and set it
up again for every fault (8 setups of ~5 s and teardowns of ~3 s instead of 2), as the
parametrization's direct ``kind`` made the overlay's parameter function-scoped, and
between other modules' tests on a worker it would again."""


@pytest.fixture(scope="module")
def overlay(
    request: pytest.FixtureRequest, namespaces: Namespaces, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Overlay]:
    """fig2 on the namespaces' hosts in the mode, the link a:0 – a:1 through the proxy."""
    with Overlay(namespaces, tmp_path_factory.mktemp(request.param), request.param) as up:
        yield up


@ONE_WORKER
@pytest.mark.processes
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("overlay", "kind"),
    [(mode, k) for mode in ("snr", "dnr") for k in FAULTS if MODE_OF[k] == mode],
    indirect=["overlay"],
    scope="module",  # else a direct argument makes the overlay's parameter per test
)
def test_a_fault_loses_nothing_confirmed_and_delivers_once(overlay: Overlay, kind: str) -> None:
    report = overlay.run(kind, SECONDS, count=COUNT)
    print(markdown([report]))
    for row in report["subscribers"]:
        print(row)
    assert report["confirmed"] + report["refused"] == report["sent"] == COUNT
    assert report["unconfirmed"] == 0
    refusals = report["refusals"]
    if kind == "disk":  # each names the store; the first, the disk's error
        assert report["refused"] > 0 and any("full" in r for r in refusals), refusals
        assert all("a:N.retention.sqlite" in r for r in refusals), refusals
    else:
        assert report["refused"] == 0, refusals
    for row in report["subscribers"]:
        assert row["expected_deliveries"] == report["confirmed"], row
        # refused after its copies left (the commit failed at the end of the pass): said so
        assert row["unexpected"] <= report["refused_delivered"], row
        assert passes(row), row
    assert report["refused_delivered_unsaid"] == 0
    live = [r for r in report["subscribers"] if r["subscriber"].startswith("live")]
    assert all(r["lost"] == 0 for r in live), live
    if kind in ("cut", "one-way"):  # each link cut once goes down once: no flapping heal
        assert report["links_down"] > 0
        assert report["link_down_most"] == 1, report["links_down"]


def test_the_table_names_each_fault() -> None:
    """A report's row (what ``bench.faults`` writes into RESULTS) names the fault, its
    counts summed over the subscribers and the verdict; a loss passes only with a gap
    still open for that subscriber (one reported and filled later is no excuse)."""
    row = {"expected_deliveries": 10, "delivered": 9, "duplicates": 0, "lost": 1, "unexpected": 0}
    report = {
        "mode": "dnr",
        "fault": FAULTS["cut"],
        "seconds": 4.0,
        "heal_s": 1.5,
        "load": 3.5,
        "caught_up_s": None,
        "refused": 0,
        "refused_delivered": 0,
        "passed": False,
        "links_down": 24,
        "subscribers": [{**row, "gaps_reported": 1, "gaps_filled": 1, "gaps_open": 0}],
    }
    line = markdown([report]).splitlines()[-1]
    cells = "| DNR | host h1 cut off both ways (veth down) | 4 | 10 | 9 | 0 | 1 | 1/1/0 | 24 |"
    assert line == cells + " 1.5 | 3.5 | – | 0 (0) | FAIL |"
    assert not passes(report["subscribers"][0])
    assert passes({**report["subscribers"][0], "gaps_open": 1})


def test_the_guides_settings_example_turns_fsync_on(tmp_path: Path) -> None:
    """The failures guide's settings file, as written, makes every commit an fsync."""
    blocks = [b for b in fenced_blocks(ROOT / "docs/guides/failures.md") if b.language == "toml"]
    assert len(blocks) == 1
    path = tmp_path / "broker.toml"
    path.write_text(blocks[0].code)
    assert load_settings(path).retention.sync == "full"
