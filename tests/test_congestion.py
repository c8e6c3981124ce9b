"""Simulated congestion: timed links feeding the LST, overload schedules, the DNR burst."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from octopis.cli.main import main
from octopis.core.capacity import SendRate, departure
from octopis.sim import InjectedCongestion, Simulator, TimedLinks
from octopis.topology import build_preset
from octopis.workload import HighRatePublisher, generate_workload

FIG2 = build_preset("fig2")
PAPER75 = build_preset("paper75")


def test_timed_links_queue_and_feed_the_lst() -> None:
    links = TimedLinks(FIG2, {("a:0", "b:0"): 10.0}, window=0.05, queue_threshold=3)
    departures = [links.transmit("a:0", "b:0", 0.0) for _ in range(5)]
    assert [a for _, a in departures] == [0, 1, 2, 3, 4]
    assert [d for d, _ in departures] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])

    view = links.view("a:0", 0.05)
    assert view.overloaded("b:0") and view.load("b:0") == (float("inf"), 5)
    view = links.view("a:0", 0.25)  # two sent by now
    assert view.load("b:0")[1] == 3 and view.overloaded("b:0")
    view = links.view("a:0", 0.61)
    assert view.load("b:0")[1] == 0 and not view.overloaded("b:0")
    assert links.transmit("a:0", "a:1", 0.7) == (0.7, 0)  # no capacity: leaves at once


def test_overload_schedule_windows() -> None:
    links = InjectedCongestion.from_schedule(
        [{"link": "b:2>b:0", "from": 1.0, "until": 2.0}, {"link": "b:2>b:1"}], FIG2
    )
    assert not links.view("b:2", 0.5).overloaded("b:0")
    assert links.view("b:2", 1.5).overloaded("b:0")
    assert not links.view("b:2", 2.0).overloaded("b:0")
    assert links.view("b:2", 99.0).overloaded("b:1")
    for bad, message in [
        ({"link": "a:0>f:0"}, "is not a link of fig2"),
        ({"link": "b:2>b:0", "from": 3, "until": 1}, "from < until"),
        ({"from": 1}, "needs a 'link'"),
    ]:
        with pytest.raises(ValueError, match=message):
            InjectedCongestion.from_schedule([bad], FIG2)


BURST = pytest.mark.xdist_group("burst")
"""The burst tests share one worker, and with it :func:`_burst`'s runs."""


@functools.cache
def _burst(mode: str, **limits: float) -> dict:
    """The paper's burst on paper75 in ``mode`` with ``limits``: exactly once, its report
    (run once per worker: the simulation is deterministic; callers only read it)."""
    workload = generate_workload(
        PAPER75,
        subscribers=1000,
        publishers=10,
        notifications=10,
        seed=5,
        hrp=HighRatePublisher(2000, rate_per_minute=60000),
    )
    sim = Simulator(PAPER75, mode, seed=5, links=TimedLinks.uniform(PAPER75, **limits))
    sim.replay(workload)
    report = sim.report()
    assert report["delivered"] == report["expected_deliveries"] > 2000
    assert report["duplicates"] == report["lost"] == report["unexpected"] == 0
    return report


@BURST
@pytest.mark.parametrize(
    "limits",
    [{"link_rate": 500.0}, {"broker_rate": 1500.0}],
    ids=["limited-links", "overwhelmed-brokers"],
)
def test_timed_burst_dnr_shortens_queues_and_delays(limits: dict[str, float]) -> None:
    """The paper's burst: an HRP whose followers sit in other clusters congests its
    target iCOLs; DNR's copies avoid them (deterministic simulation, not a timing)."""
    snr, dnr = _burst("snr", **limits), _burst("dnr", **limits)
    assert dnr["target_queue_length"]["mean"] < 0.8 * snr["target_queue_length"]["mean"]
    assert dnr["notification_delay"]["mean"] < 0.8 * snr["notification_delay"]["mean"]
    assert dnr["dnr_case_1"] > 0 and dnr["dnr_case_3"] > 0
    assert dnr["dnr_kept_off"] > 500  # of 2,000 HRP notifications


@BURST
def test_timed_burst_with_bluedoves_order() -> None:
    """DNR with BlueDove's "least loaded" order (``TimedLinks(order=...)`` feeds every
    LST): still exactly once (checked in ``_burst``) and still keeping copies off the
    overloaded iCOLs, but choosing other carriers than the CE order does."""
    ce = _burst("dnr", broker_rate=1500.0)
    bluedove = _burst("dnr", broker_rate=1500.0, order="bluedove")
    assert bluedove["dnr_kept_off"] > 500
    cases = ("dnr_case_1", "dnr_case_2", "dnr_case_3")
    assert [bluedove[c] for c in cases] != [ce[c] for c in cases]


def test_broker_capacity_is_shared_by_its_links() -> None:
    links = TimedLinks.uniform(FIG2, broker_rate=10.0)
    first = links.transmit("b:0", "a:0", 0.0)
    second = links.transmit("b:0", "c:0", 0.0)
    other = links.transmit("c:0", "b:0", 0.0)
    assert first[0] == pytest.approx(0.1) and second[0] == pytest.approx(0.2)
    assert second[1] == 0  # c:0's own queue was empty; the wait was for the broker
    assert other[0] == pytest.approx(0.1)


def test_a_late_sender_catches_up_within_its_slack_but_never_sends_early() -> None:
    strict, lenient = SendRate(100.0), SendRate(100.0, slack=0.01)
    assert strict.book(1.0) == pytest.approx(1.01)  # a copy takes a whole slot
    assert lenient.book(1.0) == pytest.approx(1.0)  # an idle sender had its slot ready
    # woken 30 ms late: the strict sender's slots start now, the lenient one makes up 10 ms
    assert strict.book(1.04) == pytest.approx(1.05)
    assert lenient.book(1.04) == pytest.approx(1.04)  # booked 1.03-1.04, leaves when ready
    assert lenient.book(1.04) == pytest.approx(1.05)
    with pytest.raises(ValueError, match="positive"):
        SendRate(0.0)


def test_a_copy_passes_the_broker_sender_then_the_link() -> None:
    broker, link = SendRate(10.0), SendRate(5.0)
    assert departure(0.0, [broker, link]) == pytest.approx(0.3)  # 0.1 broker + 0.2 link
    assert departure(0.0, [broker, link]) == pytest.approx(0.5)  # link busy until 0.3


def test_sim_cli_congestion_options(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = [
        "sim",
        "--preset",
        "fig2",
        "--subscribers",
        "60",
        "--publishers",
        "4",
        "--notifications",
        "5",
        "--json",
    ]
    assert main([*base, "--mode", "dnr", "--overload", "0.5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lost"] == report["duplicates"] == 0
    assert report["dnr_case_1"] + report["dnr_case_2"] + report["dnr_case_3"] > 0
    assert (
        main(
            [
                *base,
                "--mode",
                "snr",
                "--capacity",
                "50",
                "--hrp-notifications",
                "50",
                "--hrp-rate",
                "6000",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["target_queue_length"]["max"] > 0 and report["lost"] == 0

    assert main([*base, "--mode", "snr", "--overload", "0.5"]) == 2
    assert "only affect --mode dnr" in capsys.readouterr().err
    schedule = tmp_path / "s.json"
    schedule.write_text('[{"link": "a:0>z:9"}]')
    assert main([*base, "--mode", "dnr", "--overload-schedule", str(schedule)]) == 2
    assert "is not a link of fig2" in capsys.readouterr().err
    assert main([*base, "--mode", "dnr", "--overload", "0.1", "--order", "bluedove"]) == 2
    assert "--order bluedove needs timed links" in capsys.readouterr().err
    assert main([*base, "--mode", "dnr", "--capacity", "50", "--order", "bluedove"]) == 0
    assert json.loads(capsys.readouterr().out)["lost"] == 0
    assert main([*base, "--mode", "dnr", "--capacity", "0"]) == 2
    assert "--capacity must be positive" in capsys.readouterr().err
    assert main([*base, "--mode", "dnr", "--overload", "0.1", "--broker-capacity", "9"]) == 2
    assert "choose injected (--overload*) or timed" in capsys.readouterr().err
    assert main([*base, "--mode", "dnr", "--hrp-notifications", "5", "--hrp-interest", "2"]) == 2
    assert "HRP interest must be within (0, 1]" in capsys.readouterr().err
