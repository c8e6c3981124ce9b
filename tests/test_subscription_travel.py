"""How a subscription travels from a clustered broker is chosen once, when the broker is
made (``octopis.core.subscription_travel``): one way for each combination of covering
and advertisements, each refusing what it cannot do with a message that names it, and
changing nothing when it does. The ways' routing is proved by the laws of
test_core.py, test_covering*.py and test_advertisements.py."""

from __future__ import annotations

import pytest

from octopis.core import make_broker
from octopis.core.messages import ProtocolError
from octopis.core.subscription_travel import Advertised, Covered, CoveredAdvertised, Flood
from octopis.filters.language import parse_subscription
from octopis.topology import build_preset

FIG2 = build_preset("fig2")


@pytest.mark.parametrize("mode", ["snr", "dnr"])
@pytest.mark.parametrize(
    ("covering", "advertisements", "way"),
    [
        ("off", False, Flood),
        ("active", False, Covered),
        ("off", True, Advertised),
        ("active", True, CoveredAdvertised),
    ],
)
def test_each_combination_has_its_way(
    mode: str, covering: str, advertisements: bool, way: type
) -> None:
    core = make_broker(FIG2, "a:0", mode, covering=covering, advertisements=advertisements)
    assert type(core.travel) is way
    assert core.adopts is (way is Flood)
    assert (core.covering is not None, core.advertising is not None) == (
        covering == "active",
        advertisements,
    )


@pytest.mark.parametrize(
    ("covering", "advertisements", "named"),
    [
        ("active", False, "covering"),
        ("off", True, "advertisements"),
        ("active", True, "advertisements"),
    ],
)
def test_adoption_is_refused_naming_the_way(
    covering: str, advertisements: bool, named: str
) -> None:
    core = make_broker(FIG2, "a:0", "snr", covering=covering, advertisements=advertisements)
    sub_id, _ = core.subscribe("S", parse_subscription("[x,>,1]"), 0.0)
    entries = dict(core.table.entries)
    with pytest.raises(
        ProtocolError,
        match=rf"a:0 routes with {named}: {sub_id} cannot be adopted \(the brokers between "
        r"the hosts may .*\); subscribe afresh here and withdraw it at the old host",
    ):
        core.adopt("T", sub_id)
    assert core.table.entries == entries
    assert core.counts()["moves.adopted"] == 0


@pytest.mark.parametrize("covering", ["off", "active"])
def test_without_advertisements_advertising_is_refused_and_nothing_changes(
    covering: str,
) -> None:
    core = make_broker(FIG2, "a:0", "snr", covering=covering)
    with pytest.raises(ProtocolError, match=r"a:0 routes without advertisements; turn them on"):
        core.advertise("P", parse_subscription("[x,>,1]"))
    assert core.advertisements_of("P") == []
    assert core.counts()["advertisements_made"] == 0
    core.check_advertised("P", {"x": 0})  # every publication may be published
