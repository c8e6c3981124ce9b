"""Prometheus metrics of one broker (DESIGN §10), served over HTTP at the topology's
``metrics_endpoint`` (``http://HOST:PORT/metrics``).

Each broker has a registry of its own holding one collector, which reads the broker's
:meth:`~octopis.transport.broker.Broker.stats` on every scrape: nothing is added to the
hot path beyond the matching-time histogram the broker keeps anyway. The scrape runs in
the HTTP server's thread; the stats are taken in the broker's event loop (so they are a
consistent snapshot) and the scrape waits for them at most :data:`SCRAPE_TIMEOUT`
seconds. Label sets are bounded: links are the broker's neighbours, ``event`` and
``kind`` values are the counter names the code defines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from octopis.matching import MATCH_BUCKETS

log = logging.getLogger("octopis.broker.metrics")

SCRAPE_TIMEOUT = 5.0
"""Seconds a scrape waits for the broker's event loop to take its stats."""


class BrokerCollector(Collector):
    """Turns a broker's stats into metric families on each scrape."""

    def __init__(
        self,
        stats: Callable[[], Awaitable[dict[str, Any]]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._stats = stats
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        """Metric families of the broker now (called in the HTTP server's thread)."""
        future = asyncio.run_coroutine_threadsafe(self._stats(), self._loop)
        yield from families(future.result(SCRAPE_TIMEOUT))


def families(stats: dict[str, Any]) -> Iterator[Metric]:
    """The metric families of one broker's stats snapshot."""
    info = InfoMetricFamily("octopis_broker", "Which broker this is")
    info.add_metric([], {"broker": stats["id"], "mode": stats["mode"]})
    yield info
    for name, help_text, value in (
        ("octopis_uptime_seconds", "Seconds since the broker process started", "uptime"),
        ("octopis_routing_table_size", "Subscriptions in the routing table", "routing_table_size"),
        ("octopis_memory_rss_bytes", "Resident memory of the broker process", "memory_rss"),
        ("octopis_links_up", "Links to neighbours that are up", "links_up"),
        ("octopis_ready", "1 once every link is handshaken and every share is in", "ready"),
        ("octopis_serving", "1 once resynced from every live neighbour", "serving"),
        ("octopis_client_backlog", "Messages queued for clients whose pipes are full",
         "client_backlog"),
        ("octopis_client_connections", "Client connections open", "client_connections"),
        ("octopis_deliveries_waiting", "Deliveries waiting for clients.capacity",
         "deliveries_waiting"),
    ):  # fmt: skip
        yield GaugeMetricFamily(name, help_text, value=float(stats[value]))
    yield CounterMetricFamily(
        "octopis_cpu_seconds", "CPU time of the broker process", value=stats["cpu_seconds"]
    )
    counters = stats["counters"]
    yield CounterMetricFamily(
        "octopis_deliveries",
        "Notifications delivered to clients",
        value=counters.get("deliveries", 0),
    )
    yield CounterMetricFamily(
        "octopis_notifications_in",
        "Notifications received from neighbours",
        value=stats["received"].get("notification", 0),
    )
    yield _labelled(CounterMetricFamily, "octopis_events", "Transport events", "event", counters)
    received = stats["received"]
    yield _labelled(CounterMetricFamily, "octopis_messages_in", "Peer messages", "kind", received)
    yield _labelled(
        CounterMetricFamily,
        "octopis_routing_events",
        "Routing core events (DNR cases, tunnels, dedup, resyncs, undeliverable by reason)",
        "event",
        {k: v for k, v in stats["core"].items() if isinstance(v, int | float)},
    )
    yield from _link_families(stats)
    matching = stats["matching"]
    cumulative, buckets = 0, []
    for bound, count in zip((*MATCH_BUCKETS, float("inf")), matching["histogram"], strict=True):
        cumulative += count
        buckets.append((repr(bound) if bound != float("inf") else "+Inf", cumulative))
    yield HistogramMetricFamily(
        "octopis_matching_seconds",
        "Time of one routing-table match (paper §7.2 matching delay)",
        buckets=buckets,
        sum_value=matching["seconds"],
    )
    held = GaugeMetricFamily("octopis_held", "Messages held for later", labels=["what"])
    for what, count in stats["held"].items():
        held.add_metric([what], count)
    yield held
    yield from _load_families(stats["load"])
    yield from _retention_families(stats["retention"])


def _retention_families(retention: dict[str, Any]) -> Iterator[Metric]:
    """The retention store and the durable records (DESIGN §11)."""
    for name, help_text, key in (
        ("octopis_retention_publications", "Publications kept for replay", "retention.rows"),
        ("octopis_retention_bytes", "Bytes of publications kept for replay", "retention.bytes"),
        ("octopis_retention_oldest_timestamp_seconds",
         "When the oldest kept publication was published", "retention.oldest"),
        ("octopis_durable_subscriptions", "Durable subscription records kept", "durable.kept"),
        ("octopis_durable_subscriptions_away", "Durable subscriptions whose client is away",
         "durable.away"),
        ("octopis_replay_answers_paging", "Store answers being sent page by page",
         "replay.answering"),
    ):  # fmt: skip
        if key in retention:
            yield GaugeMetricFamily(name, help_text, value=float(retention[key]))
    yield _labelled(
        CounterMetricFamily,
        "octopis_retention_events",
        "Retention, replay and durable subscription events",
        "event",
        {k: v for k, v in retention.items() if k.split(".")[1] in _RETENTION_EVENTS},
    )


_RETENTION_EVENTS = frozenset(
    {"stored", "trimmed", "commits", "replayed", "rounds", "ended_early", "late", "unknown",
     "made", "claimed", "ended", "abandoned", "refused"}
)  # fmt: skip


def _load_families(load: dict[str, Any]) -> Iterator[Metric]:
    """The load analysis over its window (DESIGN §9): rates, capacity, load ratio."""
    for name, help_text, key in (
        ("octopis_load_ratio", "Output / capacity over the load window", "load_ratio"),
        ("octopis_load_output_per_second", "Copies sent + deliveries per second", "output_per_s"),
        ("octopis_load_capacity_per_second", "Output the broker can carry", "capacity_per_s"),
        ("octopis_load_publications_in_per_second", "Client publications", "publications_in_per_s"),
        ("octopis_load_cpu_utilisation", "CPU seconds per second", "cpu_utilisation"),
        ("octopis_load_bytes_out_per_second", "Bytes sent on links and to clients",
         "bytes_out_per_s"),
    ):  # fmt: skip
        yield GaugeMetricFamily(name, help_text, value=float(load[key]))
    yield _labelled(
        GaugeMetricFamily,
        "octopis_link_copies_out_per_second",
        "Notification copies sent per second over the load window",
        "link",
        load["copies_out_per_s"],
    )


def _labelled(kind: type, name: str, help_text: str, label: str, values: dict) -> Metric:
    family = kind(name, help_text, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([str(key)], value)
    return family


def _link_families(stats: dict[str, Any]) -> Iterator[Metric]:
    """Per-link gauges: queue length, congestion element, state, the LST window counts."""
    lst = stats["lst"]
    queue = GaugeMetricFamily("octopis_link_queue_length", "Frames queued", labels=["link"])
    ce = GaugeMetricFamily(
        "octopis_link_congestion_element", "CE of the last window (paper §5.3)", labels=["link"]
    )
    n_in = GaugeMetricFamily("octopis_link_n_in", "n_in of the last window", labels=["link"])
    n_out = GaugeMetricFamily("octopis_link_n_out", "n_out of the last window", labels=["link"])
    unacked = GaugeMetricFamily(
        "octopis_link_unacknowledged", "Frames sent and not yet acknowledged", labels=["link"]
    )
    state = GaugeMetricFamily(
        "octopis_link_state",
        "1 for the link's state (up, overloaded, down)",
        labels=["link", "state"],
    )
    for link, row in sorted(lst.items()):
        queue.add_metric([link], stats["queue_lengths"][link])
        ce.add_metric([link], row["ce"])
        n_in.add_metric([link], row["n_in"])
        n_out.add_metric([link], row["n_out"])
        unacked.add_metric([link], stats["custody"][link]["unacknowledged"])
        now = "down" if row["down"] else "overloaded" if row["overloaded"] else "up"
        for name in ("up", "overloaded", "down"):
            state.add_metric([link, name], float(name == now))
    yield from (queue, ce, n_in, n_out, unacked, state)


def serve_metrics(
    endpoint: str,
    stats: Callable[[], Awaitable[dict[str, Any]]],
    loop: asyncio.AbstractEventLoop,
) -> Callable[[], None]:
    """Serve the metrics of ``stats`` at ``endpoint`` from a daemon thread; returns the
    function that stops the server."""
    url = urlsplit(endpoint)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(stats, loop))
    server, thread = start_http_server(url.port, addr=url.hostname, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
