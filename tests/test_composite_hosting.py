"""The node's composite hosting (``octopis.core.composite_hosting``, DESIGN §12), on a real
routing core: parts under one local key, one notice per match, drops told at most once
per interval, no move, withdrawal of every part."""

from __future__ import annotations

from collections import Counter

import pytest

from octopis.core import Notification, ProtocolError, make_broker
from octopis.core.composite_hosting import REPORT_INTERVAL, HostedComposites
from octopis.core.sessions import ClientTable, SessionRefused, adopt
from octopis.filters.composite import parse_composite
from octopis.filters.language import parse_subscription
from octopis.sim import Simulator
from octopis.topology import build_preset
from octopis.wire.client import CompositeDroppedNotice, CompositeNotice, Notice


def _hosting(max_held: int = 100) -> tuple[HostedComposites, list[tuple[str, Notice]], Counter]:
    core = make_broker(build_preset("fig2"), "a:0", "dnr")
    told: list[tuple[str, Notice]] = []
    counts: Counter[str] = Counter()
    hosted = HostedComposites(
        core.subscribe,
        core.unsubscribe,
        lambda client, notice: told.append((client, notice)) is None,
        max_held,
        5.0,
        counts,
    )
    return hosted, told, counts


def test_a_composite_is_one_id_whose_parts_share_one_local_key() -> None:
    hosted, told, counts = _hosting()
    sub_id, actions = hosted.subscribe(
        "c/1", parse_composite("{[x,<,3]} & {[x,>,6]} within 1s"), 0.0
    )
    assert actions and sub_id.endswith("&") and hosted.holds("c/1", sub_id)
    assert not hosted.holds("c/2", sub_id)
    key = hosted.by_id[sub_id].key
    assert hosted.deliver("c/1", Notification("P", 1, 0.0, {"x": 1}), 0.1) is False
    assert hosted.deliver(key, Notification("P", 1, 0.0, {"x": 1}), 0.1) is True
    assert told == []
    assert hosted.deliver(key, Notification("P", 2, 0.5, {"x": 9}), 0.6) is True
    assert [type(n) for _, n in told] == [CompositeNotice] and told[0][0] == "c/1"
    assert [part[:3] for part in told[0][1].parts] == [("P", 0, 1), ("P", 0, 2)]
    assert counts["composite.matches"] == 1 and counts["composite.parts"] == 2
    assert hosted.movable_problem(sub_id) is not None and hosted.movable_problem("s1") is None
    withdrawn = hosted.unsubscribe("c/1", sub_id)
    assert withdrawn and sub_id not in hosted.by_id and key not in hosted.by_key


@pytest.mark.parametrize("gap", [0.2, REPORT_INTERVAL])
def test_drops_are_told_at_most_once_per_interval(gap: float) -> None:
    """A join over ``max_held`` lets publications go; the client hears of it at once, then
    not again within :data:`REPORT_INTERVAL`, with the totals each time."""
    hosted, told, _ = _hosting(max_held=1)
    sub_id, _ = hosted.subscribe("c/1", parse_composite("{[x,<,3]} & {[x,>,6]} within 9s"), 0.0)
    key = hosted.by_id[sub_id].key
    for seq in range(1, 4):  # three left parts: two let go
        hosted.deliver(key, Notification("P", seq, 0.0, {"x": 1}), 0.0)
    hosted.deliver(key, Notification("P", 4, 0.0, {"x": 1}), gap)
    dropped = [n.dropped for _, n in told if type(n) is CompositeDroppedNotice]
    assert dropped == ([1, 3] if gap >= REPORT_INTERVAL else [1])


def test_a_hosted_composite_is_refused_an_adoption_by_the_session_rule() -> None:
    """:func:`~octopis.core.sessions.adopt` (a broker process's adopt request) refuses a
    composite its broker hosts by name and holds nothing for the client; without the
    hosted composites the id reaches the core (which knows no such subscription)."""
    hosted, _, _ = _hosting()
    core = make_broker(build_preset("fig2"), "a:0", "snr", covering="off")
    sub_id, _ = hosted.subscribe("c/1", parse_composite("{[x,<,3]} & {[x,>,6]} within 1s"), 0.0)
    table = ClientTable(limit=5)
    with pytest.raises(SessionRefused, match=f"{sub_id} is a composite subscription"):
        adopt(core, table, "c/2", "bob", sub_id, hosted)
    with pytest.raises(ProtocolError):
        adopt(core, table, "c/2", "bob", sub_id)
    assert table.subscriptions("c/2") == set()


def test_a_client_subscription_goes_to_the_host_only_when_composite() -> None:
    """:meth:`HostedComposites.local_subscribe` hosts a composite and hands any other
    subscription to the routing core as it is; :meth:`local_unsubscribe` withdraws each
    from where it went (another client's composite id is not its to withdraw)."""
    hosted, _, counts = _hosting()
    plain, actions = hosted.local_subscribe("c/1", parse_subscription("[x,<,3]"), 0.0)
    assert actions and not plain.endswith("&") and not hosted.by_id
    composite, _ = hosted.local_subscribe(
        "c/1", parse_composite("{[x,<,3]} & {[x,>,6]} within 1s"), 0.0
    )
    assert hosted.holds("c/1", composite) and counts["composite.subscriptions"] == 1
    with pytest.raises(ProtocolError):  # the core knows no subscription by that id
        hosted.local_unsubscribe("c/2", composite)
    assert hosted.local_unsubscribe("c/1", composite) and not hosted.by_id
    assert hosted.local_unsubscribe("c/1", plain)


def test_a_simulated_broker_withdraws_a_gone_clients_composite_through_its_hosting() -> None:
    """The simulator's node withdraws as the process's does (``local_unsubscribe``, given
    at its construction): a composite client gone takes every part out of the routing
    table, everywhere, and the composite out of its host."""
    sim = Simulator(build_preset("fig2"), "snr", seed=1, covering="off")
    sub_id = sim.composites.subscribe(
        "C", "a:0", parse_composite("{[x,<,3]} & {[x,>,6]} within 1s")
    )
    sim.run()
    hosted = sim.brokers.composites["a:0"]
    parts = hosted.by_id[sub_id].part_ids
    assert all(p in core.table.entries for core in sim.cores.values() for p in parts)
    withdrawn, actions, _ = sim.nodes["a:0"].client_gone("C", sim.now, None)
    assert withdrawn == [sub_id] and actions and not hosted.holds("C", sub_id)
    sim._dispatch("a:0", actions)
    sim.run()
    assert not any(p in core.table.entries for core in sim.cores.values() for p in parts)
