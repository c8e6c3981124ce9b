"""Covering (``[routing] covering = "active"``) on broker processes: the setting reaches
every broker's core, SBP sends fewer messages, and every subscriber still gets every
matching notification exactly once, also when a broker is killed and restarted (its
neighbours hand it their covering share, and it passes that on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cluster import (
    _dnr_run_with_failures,
    _exactly_once,
    _run,
    no_leftover_brokers,  # noqa: F401 (autouse: no broker left behind)
)

from octopis.failure_schedule import Failure
from octopis.transport.settings import BrokerSettings

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]
COVERING = BrokerSettings(covering="active")


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_fig2_with_covering(tmp_path: Path, mode: str) -> None:
    """Stock subscriptions that cover one another: fewer SBP messages than N − 1 each,
    and every delivery exactly once."""
    report = _run(
        tmp_path, "fig2", mode, settings=COVERING, subscribers=150, publishers=6, notifications=15
    )
    _exactly_once(report)
    assert report["sbp_messages"] < 0.9 * 17 * report["subscriptions_made"], report


def test_a_restarted_broker_under_covering_loses_no_subscriber_anything(tmp_path: Path) -> None:
    """fig2, DNR with covering: c:0 (an inner broker hosting subscribers and a publisher)
    is killed 2 s into publishing and restarted at 6 s. Subscribers on live brokers, and
    the killed host's after they fail over and replay, get everything exactly once."""
    report, _, _ = _dnr_run_with_failures(
        tmp_path / "fig2-covering",
        "fig2",
        [Failure(("c:0",), 2.0, 6.0)],
        set(),
        settings=COVERING,
        subscribers=150,
        publishers=12,
        notifications=100,
        rate_per_minute=600,
        seed=4,
    )
    failures = report["failures"]
    print(json.dumps(failures["replays"], indent=1))
    assert failures["host_alive"]["expected_deliveries"] > 300
    for group in ("host_alive", "host_dead"):
        counts = failures[group]
        assert counts["lost"] == counts["duplicates"] == counts["unexpected"] == 0, (
            group,
            counts,
            failures[f"{group}_lost_samples"],
        )
