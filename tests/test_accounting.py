"""The delivery ledger and the series the experiments plot (``octopis.accounting``)."""

from __future__ import annotations

from octopis.accounting import DeliveryLedger, delivery_series
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
