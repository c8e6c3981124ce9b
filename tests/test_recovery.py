"""What a broker holds for a neighbour that is down and owes it when it is back
(``octopis.core.recovery``, DESIGN §7): bounds, counts, the withdrawal of a restarted
neighbour's predecessor, and, through the simulator that shares the module with the
broker process, a subscription made while a broker on its path was dead."""

from __future__ import annotations

import pytest

from octopis.core.clustered import ClusteredBroker
from octopis.core.messages import Subscribe
from octopis.core.recovery import Recovery
from octopis.failure_schedule import Failure
from octopis.filters import Predicate, Subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import LatencyModel, Simulator
from octopis.topology import build_preset

FIG2 = build_preset("fig2")
STOCK = Subscription((Predicate("class", "eq", "STOCK"),))


def _sub_id(item: str) -> str | None:
    return item.removeprefix("sub:") if item.startswith("sub:") else None


def test_holds_are_bounded_and_what_does_not_fit_is_counted() -> None:
    recovery: Recovery[str] = Recovery(limit=2)
    recovery.hold_subscriptions("b:0", ["sub:1", "unsub:0"])
    recovery.hold_subscriptions("b:0", ["sub:2"])
    for copy in ("n1", "n2", "n3"):
        recovery.hold_copy("b:0", copy)
    assert recovery.counters == {"sbp_dropped.hold_full": 1, "undeliverable.hold_full": 1}
    assert recovery.held_copies() == 2
    held, carried = recovery.take_subscriptions("b:0", _sub_id)
    assert (held, carried) == (["sub:1", "unsub:0"], {"1"})
    assert recovery.take_subscriptions("b:0", _sub_id) == ([], set())
    assert recovery.release_copies("b:0") == ["n1", "n2"]
    assert recovery.counters["held.released"] == 2
    recovery.hold_copy("c:0", "n4")
    recovery.hold_subscriptions("c:0", ["sub:5"])
    recovery.owed_shares.add("c:0")
    assert recovery.forget("c:0") == 2  # c:0 left the overlay
    assert recovery.owed_shares == set() and recovery.held_copies() == 0


def test_a_restart_makes_held_copies_undeliverable_and_withdraws_the_predecessor() -> None:
    """The copies held for b:0's predecessor are dropped and counted; once b:0 is
    serving, a:0 withdraws what the predecessor hosted (sub ids of another epoch), and
    keeps what b:0's new incarnation subscribed."""
    sim = Simulator(FIG2, "dnr", latency=LatencyModel(0.001, 0.001))
    old = sim.subscribe("old", "b:0", STOCK)
    sim.run()
    core = sim.cores["a:0"]
    assert isinstance(core, ClusteredBroker) and old in core.table.entries
    recovery: Recovery[str] = Recovery(limit=10)
    recovery.hold_copy("b:0", "copy")
    assert recovery.restarted("b:0", "r1.") == ["copy"]
    assert recovery.counters["undeliverable.held_for_restarted"] == 1
    released, withdrawals = recovery.serving(core, "b:0")
    assert released == [] and withdrawals
    assert old not in core.table.entries
    assert recovery.counters["predecessor_entries_withdrawn"] == 1
    assert recovery.serving(core, "b:0") == ([], [])  # once


def test_a_share_leaves_out_what_went_ahead_and_pays_what_was_owed() -> None:
    sim = Simulator(FIG2, "snr", latency=LatencyModel(0.001, 0.001))
    ids = [sim.subscribe(f"S{i}", "a:0", STOCK) for i in range(3)]
    sim.run()
    core = sim.cores["b:0"]
    assert isinstance(core, ClusteredBroker)
    recovery: Recovery[str] = Recovery(limit=10)
    recovery.owed_shares.add("c:0")
    assert recovery.payable(core, lambda n: False) == []
    assert recovery.payable(core, lambda n: True) == ["c:0"]
    share = recovery.share(core, "c:0", {ids[0]})
    assert all(isinstance(m, Subscribe) for m in share)
    assert sorted(m.sub_id for m in share) == sorted(ids[1:])
    assert recovery.owed_shares == set()
    assert recovery.counters["resync_entries_sent"] == 2


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_a_subscription_made_while_a_broker_on_its_path_is_dead_reaches_past_it(
    mode: str,
) -> None:
    """c:0 dies; a:0's subscriber subscribes meanwhile, so b:0 holds the SBP message for
    c:0 (it never arrived). c:0 restarts and is handed it first: it broadcasts it on
    into its side of cluster 0 (d:0, e:0, f:0), which a resync share alone (stored,
    never forwarded) would not reach. Then every broker publishes, and the subscriber
    gets each publication exactly once. Without the hold, the publications from c:0's
    side of cluster 0 find no entry there and are lost."""
    sim = Simulator(
        FIG2, mode, seed=3, latency=LatencyModel(0.001, 0.002), oracle_factory=ReferenceMatcher
    )
    sim.fail(Failure(("c:0",), 0.5, 4.0), 0.0)
    sim.at(1.0, sim.subscribe, "late", "a:0", STOCK)
    brokers = sorted(FIG2.brokers)
    for i, broker in enumerate(brokers):
        sim.at(8.0 + 0.01 * i, sim.publish, f"P{broker}", broker, {"class": "STOCK"})
    sim.run()
    failures = sim.report()["failures"]
    assert failures["sbp_handed_late"] >= 1
    got = {(p, q): n for (s, p, q), n in sim.ledger.received.items() if s == "late"}
    assert sorted(got) == sorted((f"P{b}", 1) for b in brokers)
    assert set(got.values()) == {1}
