"""Each broker's load analysis (``octopis.core.load``, DESIGN §9): rates over a
sliding window and the load ratio, from synthetic samples, and on a line of three broker
processes counted against what the harness sent and received."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest
from conditions import accounting, closing_control, reader_on, tables_hold, until

from octopis.client import Publisher
from octopis.cluster.launcher import LocalCluster
from octopis.core.load import LoadMeter, LoadSample, load_report
from octopis.settings import BrokerSettings, Load, settings_from_data


def _sample(at: float, n: int, cpu: float, **clients: int) -> LoadSample:
    delivered = sum(clients.values())
    return LoadSample(at, n, 2 * n, {"b:0": 3 * n}, delivered, Counter(clients), 100 * n, cpu)


def test_rates_are_counts_over_the_window_and_lr_is_output_over_capacity() -> None:
    meter = LoadMeter(window=4, capacity=1000.0)
    assert meter.report()["load_ratio"] == 0.0 and meter.report()["window_s"] == 0.0
    for second in range(10):  # 10 publications a second, window keeps the last 4 s
        meter.sample(_sample(float(second), 10 * second, 0.1 * second, alice=5 * second))
    report = meter.report(top=1)
    assert report["window_s"] == pytest.approx(4.0)
    assert report["publications_in_per_s"] == pytest.approx(10.0)
    assert report["notifications_in_per_s"] == pytest.approx(20.0)
    assert report["copies_out_per_s"] == {"b:0": pytest.approx(30.0)}
    assert report["deliveries_per_s"] == pytest.approx(5.0)
    assert report["output_per_s"] == pytest.approx(35.0)
    assert report["load_ratio"] == pytest.approx(0.035)
    assert report["capacity_source"] == "configured"
    assert report["bytes_out_per_s"] == pytest.approx(1000.0)
    assert report["busiest_clients"] == {"alice": pytest.approx(5.0)}


def test_measured_capacity_makes_lr_the_cpu_utilisation() -> None:
    meter = LoadMeter(window=10, capacity=0.0)
    meter.sample(_sample(0.0, 0, 0.0, a=0, b=0))
    meter.sample(_sample(2.0, 100, 0.5, a=300, b=100))
    report = meter.report()
    assert report["capacity_source"] == "measured"
    assert report["cpu_utilisation"] == pytest.approx(0.25)
    # output 150 + 200 per second carried by a quarter of a CPU: capacity 1,400 /s
    assert report["capacity_per_s"] == pytest.approx(1400.0)
    assert report["load_ratio"] == pytest.approx(0.25)
    assert list(report["busiest_clients"]) == ["a", "b"]


def test_deliveries_to_a_client_gone_meanwhile_still_count_as_output() -> None:
    meter = LoadMeter(window=10, capacity=100.0)
    meter.sample(LoadSample(0.0, 0, 0, {}, 0, Counter(left=0, stays=0)))
    meter.sample(LoadSample(1.0, 0, 0, {}, 50, Counter(stays=20)))  # "left" said bye
    report = meter.report()
    assert report["deliveries_per_s"] == pytest.approx(50.0)
    assert report["load_ratio"] == pytest.approx(0.5)
    assert report["busiest_clients"] == {"stays": pytest.approx(20.0)}


def test_a_report_between_two_samples_is_the_meters_rule() -> None:
    """The simulator's balancer reads load between two samples with the meter's rule."""
    first, last = _sample(0.0, 0, 0.0, a=0), _sample(2.0, 100, 0.0, a=300)
    report = load_report(first, last, capacity=200.0)
    assert report["output_per_s"] == pytest.approx(150.0 + 150.0)
    assert report["load_ratio"] == pytest.approx(1.5)
    meter = LoadMeter(window=10, capacity=200.0)
    meter.sample(first)
    meter.sample(last)
    assert meter.report() == report


def test_load_settings_are_checked() -> None:
    settings = settings_from_data({"load": {"window": 30, "capacity": 5000}})
    assert (settings.load.window, settings.load.capacity) == (30, 5000.0)
    with pytest.raises(ValueError, match=r"load\.window"):
        settings_from_data({"load": {"window": 0}})
    with pytest.raises(ValueError, match="≥ 1"):
        LoadMeter(window=0, capacity=0.0)


@pytest.mark.processes
def test_each_broker_counts_its_share_of_a_stream(
    line_of: Callable[[BrokerSettings], LocalCluster],
) -> None:
    """a:0 takes the publications, b:0 relays them, c:0 delivers them to its one reader:
    over the window, each broker's counts (rate × window) are exactly the harness's."""
    total = 400
    cluster = line_of(BrokerSettings(load=Load(window=30)))
    got: Counter[int] = Counter()

    async def scenario() -> dict[str, dict]:
        reader = await reader_on(cluster, "c:0", got)
        await until(lambda: tables_hold(cluster, 1), "the subscription spreads", 20)
        pub = await Publisher.connect(cluster.scot.brokers["a:0"].client_endpoint, "feed")
        for i in range(total):
            await pub.publish({"class": "STOCK", "close": float(i)}, wait=False)
            if i % 50 == 49:
                await asyncio.sleep(0.1)
        await pub.flush(60)
        await until(lambda: len(got) >= total, "every notification arrives", 60)

        async def counted() -> bool:  # each broker samples on its own second
            loads = await cluster.ask(["a:0", "b:0", "c:0"], "load", 5, 5)
            counts = [
                loads[broker][key] * loads[broker]["window_s"]
                for broker, key in (
                    ("a:0", "publications_in_per_s"),
                    ("b:0", "notifications_in_per_s"),
                    ("c:0", "deliveries_per_s"),
                )
            ]
            return all(round(n) == total for n in counts)

        await until(counted, "every broker's window holds the whole stream", 10)
        loads = await cluster.ask(["a:0", "b:0", "c:0"], "load", 5, 5)
        await pub.close()
        await reader.close()
        return loads

    loads = asyncio.run(closing_control(cluster, scenario()))
    counts = accounting("reader", total, got)
    assert counts["delivered"] == total and counts["duplicates"] == counts["lost"] == 0

    def count(broker: str, key: str, link: str | None = None) -> int:
        load = loads[broker]
        rate = load[key] if link is None else load[key][link]
        return round(rate * load["window_s"])

    print({b: round(load["load_ratio"], 3) for b, load in loads.items()})
    assert count("a:0", "publications_in_per_s") == total
    assert count("a:0", "copies_out_per_s", "b:0") == total
    assert count("b:0", "notifications_in_per_s") == total
    assert count("b:0", "copies_out_per_s", "c:0") == total
    assert count("b:0", "copies_out_per_s", "a:0") == 0
    assert count("c:0", "deliveries_per_s") == total
    (busiest,) = loads["c:0"]["busiest_clients"]
    assert busiest.startswith("reader@")
    assert all(load["capacity_source"] == "measured" for load in loads.values())
    assert loads["c:0"]["load_ratio"] > 0
