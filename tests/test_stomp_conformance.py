"""Conformance with ActiveMQ: the same stomp.py program (bench/stomp_conformance.py), 20
and more selectors covering every operator of the subset, run against Debian's ActiveMQ
Classic and against OctopiS's STOMP listener, gets the same messages for each selector;
the selectors OctopiS refuses on purpose are refused with an ERROR naming the part."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers import PeersError, activemq_jar
from bench.stomp_conformance import DIFFERENT, SAME, compare

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]


def test_activemq_and_octopis_select_the_same_messages(tmp_path: Path) -> None:
    try:
        activemq_jar()
    except PeersError as exc:
        pytest.fail(f"ActiveMQ is needed (.ci/setup installs it): {exc}")
    assert len(SAME) >= 20
    operators = " ".join(SAME).upper()
    for word in (
        "=",
        "<>",
        "<",
        ">",
        "<=",
        ">=",
        "BETWEEN",
        " IN ",
        "LIKE",
        "ESCAPE",
        "IS NOT NULL",
        " AND ",
        " OR ",
        "NOT (",
        "NOT BETWEEN",
        "NOT IN",
        "NOT LIKE",
    ):
        assert word in operators, word
    rows = compare(300, tmp_path, exact=True)
    for selector, expected, amq, ours in rows:
        print(
            selector,
            expected if isinstance(expected, str) else len(expected),
            amq if isinstance(amq, str) else len(amq),
            ours if isinstance(ours, str) else len(ours),
        )
        if selector in DIFFERENT:
            assert isinstance(ours, str) and ours.startswith("refused: ") and selector in ours
            assert isinstance(amq, list) and (expected == "-" or amq == expected)
        else:
            assert amq == ours == expected, selector
    assert sum(1 for s, expected, _, _ in rows if s in SAME and expected) >= 20  # not vacuous
