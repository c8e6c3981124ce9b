"""Each broker's Prometheus endpoint (DESIGN §10) on a running fig2: scraped over HTTP,
parsed with prometheus_client's own parser, and checked against the control RPC and
against what the subscriber counted."""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conditions import accounting, closing_control, until
from conftest import secure_fig2
from prometheus_client.parser import text_string_to_metric_families

from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster
from octopis.settings import BrokerSettings

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


@pytest.fixture
def fig2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    yield from secure_fig2(tmp_path, monkeypatch, BrokerSettings())


def scrape(endpoint: str) -> dict[str, dict[tuple, float]]:
    """Metric samples of one endpoint: sample name → {sorted label items: value}."""
    with urllib.request.urlopen(endpoint, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_every_broker_serves_metrics_that_agree_with_its_rpc(fig2: LocalCluster) -> None:
    """A subscriber on f:2, a publisher on a:0, 200 notifications: the deliveries summed
    over every broker's endpoint equal what the subscriber got and the RPC's counters;
    routing-table sizes and matching counts equal the RPC's; each link shows one state."""
    scot = fig2.scot
    got: Counter[int] = Counter()

    async def scenario() -> tuple[int, dict, dict]:
        sub = await Subscriber.connect(
            scot.client_endpoints("f:2"), "s", on_notification=lambda n: got.update([n.seq])
        )
        await sub.subscribe("[class,eq,'STOCK'],[price,>,0.5]")
        pub = await Publisher.connect(scot.client_endpoints("a:0"), "p")

        async def everywhere() -> bool:
            stats = await fig2.call_all("stats")
            return all(s["routing_table_size"] == 1 for s in stats.values())

        await until(everywhere, "subscription everywhere", 30)
        for i in range(200):
            await pub.publish({"class": "STOCK", "price": 1.0 if i % 2 else 0.1})
        await until(lambda: len(got) >= 100, "deliveries", 30)
        await pub.close()

        async def load_measured() -> bool:  # the load analysis needs two samples
            stats = await fig2.call_all("stats")
            return all(s["load"]["window_s"] > 0 for s in stats.values())

        await until(load_measured, "a load window on every broker", 30)
        stats = await fig2.call_all("stats")
        metrics = {
            b: await asyncio.to_thread(scrape, info.metrics_endpoint)
            for b, info in scot.brokers.items()
        }
        await sub.close()  # it says bye: the tables empty, and the metrics show it

        async def withdrawn() -> bool:
            for info in scot.brokers.values():
                now = await asyncio.to_thread(scrape, info.metrics_endpoint)
                if now["octopis_routing_table_size"][()] != 0:
                    return False
            return True

        await until(withdrawn, "withdrawal seen in the metrics", 30)
        return 100, stats, metrics

    expected, stats, metrics = asyncio.run(closing_control(fig2, scenario()))
    counts = accounting("s", expected, got)
    assert counts["lost"] == counts["duplicates"] == 0 and counts["delivered"] == expected
    assert len(metrics) == 18
    deliveries = sum(m["octopis_deliveries_total"][()] for m in metrics.values())
    assert sum(m["octopis_matching_seconds_count"][()] for m in metrics.values()) >= 200
    assert deliveries == expected == sum(s["counters"].get("deliveries", 0) for s in stats.values())
    for broker, m in metrics.items():
        rpc = stats[broker]
        assert m["octopis_broker_info"] == {(("broker", broker), ("mode", "dnr")): 1.0}
        assert m["octopis_routing_table_size"][()] == rpc["routing_table_size"] == 1
        assert m["octopis_matching_seconds_count"][()] >= rpc["matching"]["calls"]
        assert rpc["gc"]["threshold"][0] == BrokerSettings().memory.gc_young  # memory.gc_young
        assert rpc["gc"]["frozen"] > 0  # what the broker was built from is frozen
        assert m["octopis_notifications_in_total"][()] >= rpc["received"].get("notification", 0)
        links = {n.id for n in scot.brokers[broker].neighbours}
        queue = m["octopis_link_queue_length"]
        assert {dict(labels)["link"] for labels in queue} == links
        states = Counter()
        for labels, value in m["octopis_link_state"].items():
            states[dict(labels)["link"]] += value
            assert value == 0 or dict(labels)["state"] == "up"
        assert states == Counter(dict.fromkeys(links, 1.0))
        copies = m["octopis_link_copies_out_per_second"]  # the load analysis, DESIGN §9
        assert {dict(labels)["link"] for labels in copies} == links
        assert m["octopis_load_ratio"][()] >= 0 and m["octopis_load_cpu_utilisation"][()] >= 0
        kept = rpc["retention"]  # the retention store and durable records, DESIGN §11
        assert m["octopis_retention_publications"][()] == kept["retention.rows"]
        assert m["octopis_retention_bytes"][()] == kept["retention.bytes"]
        assert m["octopis_durable_subscriptions"][()] == kept["durable.kept"] == 0
