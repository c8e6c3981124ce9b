"""bench.peers: the workload as JMS selectors and STOMP headers, and one live run of
OctopiS beside ActiveMQ Classic on a single broker, both counted against the oracle."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench.peers import ACTIVEMQ_HOME, jms_selector, main, stomp_headers
from octopis.filters.language import parse_subscription


def test_a_subscription_becomes_the_selector_of_the_same_conjunction() -> None:
    """Names a JMS identifier cannot hold are spelled out, numbers become floating
    literals (ActiveMQ compares a STOMP string property with those numerically), LIKE
    patterns escape their wildcards."""
    subscription = parse_subscription(
        "[class,eq,'STOCK'],[openClose%Diff,>,0],[volume,>=,919400],[symbol,str-prefix,'A_%'],"
        "[symbol,str-postfix,'Q'],[name,str-contains,'it\\'s'],[low,isPresent],[date,neq,'x'],"
        "[close,<>,-2.5]"
    )
    assert jms_selector(subscription) == (
        "a_class = 'STOCK' AND a_openClose_pct_Diff > 0.0 AND a_volume >= 919400.0 AND "
        "a_symbol LIKE 'A!_!%%' ESCAPE '!' AND a_symbol LIKE '%Q' ESCAPE '!' AND "
        "a_name LIKE '%it''s%' ESCAPE '!' AND a_low IS NOT NULL AND a_date <> 'x' AND "
        "a_close <> -2.5"
    )


def test_string_order_has_no_selector() -> None:
    with pytest.raises(ValueError, match="str-lt"):
        jms_selector(parse_subscription("[symbol,str-lt,'M']"))


def test_a_publication_becomes_properties_under_the_same_names() -> None:
    assert stomp_headers({"class": "STOCK", "openClose%Diff": -0.095, "volume": 800400}) == {
        "a_class": "STOCK",
        "a_openClose_pct_Diff": "-0.095",
        "a_volume": "800400",
    }


@pytest.mark.processes
def test_octopis_and_activemq_carry_the_same_workload_exactly_once(tmp_path: Path) -> None:
    """One broker of each (OctopiS with its defaults and with retention and covering
    off), 30 subscribers of real quotes (selectors of every operator the stock workload
    uses), three publishers: both phases exactly once on every system against the same
    oracle, and the table holds each and the defaults' ratios to the others."""
    if not (ACTIVEMQ_HOME / "bin" / "activemq.jar").is_file() or not shutil.which("java"):
        if os.environ.get("OCTOPIS_REQUIRE_ACTIVEMQ"):
            pytest.fail("ActiveMQ missing although CI installs it (.ci/setup)")
        pytest.skip("needs Apache ActiveMQ Classic (Debian: apt-get install activemq)")
    argv = ["--shapes", "single", "--runs", "1", "--subscribers", "30", "--publishers", "3"]
    argv += [
        "--notifications",
        "80",
        "--rate",
        "60",
        "--warmup",
        "40",
        "--quiet",
        "3",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    report = json.loads((tmp_path / "peers.json").read_text())
    systems = report["shapes"]["single"]
    plain = "OctopiS (DNR, retention and covering off)"
    assert sorted(systems) == ["ActiveMQ 5.17", "OctopiS (DNR)", plain]
    for name, figures in systems.items():
        for phase in ("fixed", "flood"):
            counts = figures[phase]
            assert counts["expected_deliveries"] > 30, (name, phase, counts)
            assert counts["delivered"] == counts["expected_deliveries"], (name, phase, counts)
            assert counts["duplicates"] == counts["lost"] == counts["unexpected"] == 0, counts
        assert figures["p99_ms"] >= figures["p50_ms"] > 0
    table = (tmp_path / "peers.md").read_text()
    assert "| single | OctopiS (DNR) / ActiveMQ 5.17 |" in table
    assert f"| single | OctopiS (DNR) / {plain} |" in table
