"""The delivery ledger, the series the experiments plot and the parts of a simulated run's
report (``octopis.accounting``)."""

from __future__ import annotations

from octopis.accounting import (
    DeliveryLedger,
    cpu_shares,
    delivery_series,
    failure_report,
    replay_summary,
    simulation_report,
)
from octopis.filters.language import parse_publication, parse_subscription


def test_ledger_counts_expected_delivered_duplicated_lost_and_unexpected() -> None:
    ledger = DeliveryLedger()
    ledger.subscribed("s1", "a", parse_subscription("[class,eq,'STOCK']"))
    ledger.subscribed("s2", "b", parse_subscription("[class,eq,'STOCK'],[price,>,5]"))
    assert ledger.published("p", 1, parse_publication("[class,'STOCK'],[price,7]")) == 2
    assert ledger.published("p", 2, parse_publication("[class,'STOCK'],[price,1]")) == 1
    ledger.unsubscribed("a")
    assert ledger.published("p", 3, parse_publication("[class,'STOCK'],[price,1]")) == 0
    for key in (("s1", "p", 1), ("s1", "p", 1), ("s2", "p", 1), ("s2", "p", 2)):
        ledger.delivered(*key)
    assert ledger.summary() == {
        "expected_deliveries": 3,
        "delivered": 2,
        "duplicates": 1,
        "lost": 1,
        "unexpected": 1,
    }
    assert ledger.summary(lambda key: key[0] == "s1")["lost"] == 1


def test_delivery_series_bins_by_time_and_counts_losses_at_publication() -> None:
    series = delivery_series(
        100.0,
        0.5,
        published=[100.1, 100.2, 101.7],
        arrivals=[(100.3, 0.2), (101.9, 0.2), (101.95, 0.4)],
        lost=[100.2],
    )
    assert [b["t"] for b in series] == [0.0, 0.5, 1.0, 1.5]
    assert [b["published"] for b in series] == [2, 0, 0, 1]
    assert [b["delivered"] for b in series] == [1, 0, 0, 2]
    assert [b["lost"] for b in series] == [1, 0, 0, 0]
    assert abs(series[3]["delay_mean"] - 0.3) < 1e-9
    assert series[3]["delay_max"] == 0.4


def test_the_ledger_lists_each_delivery_in_order_duplicates_repeated() -> None:
    ledger = DeliveryLedger()
    for key in (("s2", "p", 1), ("s1", "p", 2), ("s1", "p", 2)):
        ledger.delivered(*key)
    assert [tuple(r.values()) for r in ledger.deliveries()] == [
        ("s1", "p", 2),
        ("s1", "p", 2),
        ("s2", "p", 1),
    ]
    assert list(next(ledger.deliveries())) == ["subscriber", "publisher", "seq"]


def _simulated(run: dict, **parts: object) -> dict:
    nothing: dict = {
        "covering": "active",
        "moves": {},
        "balance": None,
        "times": (2.5, 0.1),
        "cpu_busy": None,
        "target_queue": [],
        "timeline": [],
        "failures": None,
    }
    return simulation_report(run, **{**nothing, **parts})


def test_a_simulated_report_adds_only_what_there_is_in_a_fixed_order() -> None:
    assert _simulated({"mode": "bid"}) == {"mode": "bid", "sim_time": 2.5, "wall_time": 0.1}
    report = _simulated(
        {"mode": "snr"},
        moves={"inside": 1},
        balance={"rounds": 2},
        cpu_busy={"busiest": "a"},
        target_queue=[0, 2],
        timeline=[(0.1234567, 3)],
        failures={"detections": 1},
    )
    assert list(report) == [
        "mode",
        "covering",
        "moves",
        "balance",
        "sim_time",
        "wall_time",
        "cpu_busy",
        "target_queue_length",
        "queue_timeline",
        "failures",
    ]
    assert report["target_queue_length"]["max"] == 2
    assert report["queue_timeline"] == [[0.123457, 3]]


def test_cpu_shares_name_the_busiest_cpu_and_the_mean() -> None:
    assert cpu_shares({}, 0.0, 2, 0.0) is None
    shares = cpu_shares({"a": 1.0, "b": 3.0}, 4.0, 2, 0.05)
    assert shares == {
        "busiest": "b",
        "busiest_share": 0.75,
        "mean_share": 0.5,
        "idle_not_charged": 0.05,
    }


def test_a_failure_report_holds_the_counts_the_split_and_the_replays() -> None:
    replays = replay_summary({"requests": 2}, {"s1"}, {"s1": {"a"}, "s2": set()}, {})
    assert replays == {"requests": 2, "subscribers_failed_over": 1, "gaps": 1, "seam_gaps": 0}
    split = {"host_alive": {"lost": 0}, "host_dead": {"lost": 1}}
    core = {"held.x": 1, "sent.notification": 9}
    report = failure_report({"detections": 1}, 0, core, split, replays)
    assert report == {"detections": 1, "held.x": 1, **split, "replays": replays}
    assert failure_report({}, 3, {}, split, replays)["undeliverable.held_at_end"] == 3
