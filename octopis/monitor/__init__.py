"""``octopis monitor``: a live web view of a running overlay (DESIGN §10).

The monitor reads nothing but the brokers' Prometheus endpoints
(:mod:`octopis.transport.metrics`), so it needs no keys and can run anywhere those are
reachable. Every ``interval`` seconds it scrapes them all at once and keeps one snapshot:
per broker whether it answered, its deliveries and notifications in (totals and rates
since the previous snapshot), its output over the load window (the busiest first on the
page), its routing-table size, its DNR cases and tunnels (totals) and its retention store
(publications, bytes, oldest), its client connections, its mean matching time since the
previous snapshot (the paper's matching delay) and its output over the last
:data:`HISTORY` snapshots; per directed link its queue, CE, state (up, overloaded, down)
and the notification copies per second the sending broker counts over its load window;
the overlay's totals; and the routing events of the last few minutes as they happened
(each DNR case, detour and tunnel counted by a broker between two snapshots).

The page (``/``) draws the SCOT as a grid of clusters × regions scaled to the window
(regions as rows when the window is too narrow for them as columns), with aCOLs along the
clusters and each region's iCOLs on lanes of their own beside it; it colours each link by
the worse state of its two directions and draws it as wide as the traffic on it (both
directions' copies per second, in the legend's classes), marks the brokers that host
clients, rings the brokers where DNR cases or tunnels happen now, and lists the brokers in
a table that sorts and filters, with a sparkline of each one's recent output. It updates
from ``/events`` (server-sent events, one snapshot each) without reloading; a viewer that
leaves ends its stream quietly. ``/topology`` and ``/snapshot`` serve the same data as JSON
for tools.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from importlib import resources
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from octopis.topology import ACOL, Scot, regions_in_drawing_order

log = logging.getLogger("octopis.monitor")

SCRAPE_TIMEOUT = 2.0
"""Seconds a scrape of one broker may take before it counts as not answering."""

MAX_VIEWERS = 32
"""Event streams served at once; a further page is refused (503) until one closes."""

STATE_RANK = {"up": 0, "overloaded": 1, "down": 2, "unknown": 3}
"""Worse states rank higher; a link is drawn in the worse state of its two directions
(:func:`link_state`)."""

ROUTING_EVENTS = (
    "dnr_case_1",
    "dnr_case_2",
    "dnr_case_3",
    "dnr_detour",
    "snr.cbv_detour",
    "tunnel.started",
    "tunnel.relayed",
    "tunnel.arrived",
)
"""The routing core's counters the monitor follows (``octopis_routing_events``): DNR's
Cases I–III and its detour round a square, SNR's detour of a dead iCOL's clusters, and a
tunnel's start, relays and arrival round a dead aCOL (DESIGN §3, §7)."""

RECENT_EVENTS = 200
"""Routing events the snapshot carries (the newest last)."""

HISTORY = 60
"""Snapshots of each broker's output the snapshot carries (its sparkline), the oldest
first."""


def topology_view(scot: Scot) -> dict[str, Any]:
    """What the page draws: regions in drawing order, clusters, brokers, undirected links."""
    return {
        "name": scot.name,
        "regions": regions_in_drawing_order(scot.acyclic),
        "clusters": scot.clusters,
        "brokers": [
            {"id": b.id, "region": b.region, "cluster": b.cluster, "type": b.type}
            for b in scot.brokers.values()
        ],
        "links": _links(scot),
    }


def _links(scot: Scot) -> list[dict[str, str]]:
    return sorted(
        (
            {"a": min(u, v), "b": max(u, v), "kind": "aCOL" if kind == ACOL else "iCOL"}
            for u, v, kind in scot.graph.edges(data="link")
        ),
        key=lambda link: (link["a"], link["b"]),
    )


def parse_metrics(text: str) -> dict[str, Any]:
    """The figures the monitor shows, out of one broker's Prometheus text."""
    figures: dict[str, Any] = {"links": {}, "routing": {}, "retention": {}}
    links, routing, retention = figures["links"], figures["routing"], figures["retention"]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name in ("octopis_deliveries_total", "octopis_notifications_in_total"):
                figures[name.removeprefix("octopis_").removesuffix("_total")] = value
            elif name == "octopis_routing_table_size":
                figures["table"] = int(value)
            elif name == "octopis_load_output_per_second":
                figures["output_per_s"] = value
            elif name == "octopis_client_connections":
                figures["clients"] = int(value)
            elif name == "octopis_matching_seconds_sum":
                figures["matching_seconds"] = value
            elif name == "octopis_matching_seconds_count":
                figures["matches"] = int(value)
            elif name == "octopis_link_copies_out_per_second":
                links.setdefault(labels["link"], {})["rate"] = value
            elif name == "octopis_load_ratio":
                figures["load_ratio"] = value
            elif name == "octopis_routing_events_total" and labels["event"] in ROUTING_EVENTS:
                routing[labels["event"]] = int(value)
            elif name == "octopis_retention_publications":
                retention["rows"] = int(value)
            elif name == "octopis_retention_bytes":
                retention["bytes"] = int(value)
            elif name == "octopis_retention_oldest_timestamp_seconds":
                retention["oldest"] = value
            elif name == "octopis_link_queue_length":
                links.setdefault(labels["link"], {})["queue"] = int(value)
            elif name == "octopis_link_congestion_element":
                links.setdefault(labels["link"], {})["ce"] = value
            elif name == "octopis_link_state" and value == 1:
                links.setdefault(labels["link"], {})["state"] = labels["state"]
    return figures


def link_state(links: dict[str, dict[str, Any]], a: str, b: str) -> str:
    """The state of the link between ``a`` and ``b``: the worse of its two directions
    that a broker reported (the survivor's view of a link to a dead broker is "down"),
    "unknown" when neither did."""
    known = [links[d]["state"] for d in (f"{a}>{b}", f"{b}>{a}") if "state" in links.get(d, {})]
    return max(known, key=STATE_RANK.__getitem__, default="unknown")


def overlay_totals(
    brokers: dict[str, dict[str, Any]],
    links: dict[str, dict[str, Any]],
    undirected: list[dict[str, str]],
) -> dict[str, Any]:
    """The overlay's totals of one snapshot: brokers answering, links by state (each the
    worse of its two directions), rates, routing-table entries, routing events and
    retention summed over the brokers (the oldest retained publication overall)."""
    answering = [b for b in brokers.values() if b["up"]]
    states = dict.fromkeys(STATE_RANK, 0)
    for link in undirected:
        states[link_state(links, link["a"], link["b"])] += 1
    totals: dict[str, Any] = {
        "brokers": len(brokers),
        "brokers_up": len(answering),
        "links": states,
        "routing": {
            event: sum(b["routing"].get(event, 0) for b in answering) for event in ROUTING_EVENTS
        },
    }
    for key in ("table", "deliveries_per_s", "notifications_in_per_s", "output_per_s", "clients"):
        totals[key] = sum(b.get(key, 0) for b in answering)
    kept = [b["retention"] for b in answering if b["retention"]]
    oldest = [r["oldest"] for r in kept if "oldest" in r]
    totals["retention"] = {
        "rows": sum(r.get("rows", 0) for r in kept),
        "bytes": sum(r.get("bytes", 0) for r in kept),
        **({"oldest": min(oldest)} if oldest else {}),
    }
    return totals


class Monitor:
    """Scrapes every broker of ``scot`` every ``interval`` seconds; keeps the latest
    snapshot and wakes the page streams on each."""

    def __init__(self, scot: Scot, interval: float = 0.5) -> None:
        self.scot = scot
        self.interval = interval
        self.links = _links(scot)
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        """Routing events as they happened: time, broker, event, count (the newest last)."""
        self.snapshot: dict[str, Any] = {
            "time": 0.0,
            "brokers": {},
            "links": {},
            "totals": overlay_totals({}, {}, self.links),
            "events": [],
        }
        self._fresh = asyncio.Condition()
        self._scraped = asyncio.Event()
        self._previous: dict[str, dict[str, Any]] = {}
        self._history: dict[str, deque[float]] = {}

    async def run(self) -> None:
        """Scrape until cancelled."""
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)
        ) as session:
            while True:
                started = time.monotonic()
                await self._scrape_all(session)
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def _scrape_all(self, session: aiohttp.ClientSession) -> None:
        brokers = [b for b in self.scot.brokers.values() if b.metrics_endpoint]
        texts = await asyncio.gather(*(self._scrape(session, b.metrics_endpoint) for b in brokers))
        now = time.time()
        snapshot: dict[str, Any] = {"time": now, "brokers": {}, "links": {}}
        for broker, text in zip(brokers, texts, strict=True):
            if text is None:
                snapshot["brokers"][broker.id] = {"up": False, "routing": {}, "retention": {}}
                continue
            figures = parse_metrics(text)
            entry = {"up": True, **{k: v for k, v in figures.items() if k != "links"}}
            self._follow(broker.id, entry, now)
            snapshot["brokers"][broker.id] = entry
            for neighbour, link in figures["links"].items():
                snapshot["links"][f"{broker.id}>{neighbour}"] = link
        snapshot["totals"] = overlay_totals(snapshot["brokers"], snapshot["links"], self.links)
        snapshot["events"] = list(self.recent)
        async with self._fresh:
            self.snapshot = snapshot
            self._scraped.set()
            self._fresh.notify_all()

    def _follow(self, broker_id: str, entry: dict[str, Any], now: float) -> None:
        """Rates and the mean matching time since this broker's previous snapshot, its
        output history, and the routing events it counted meanwhile (a counter that went
        down belongs to a restarted broker: all of it is new)."""
        history = self._history.setdefault(broker_id, deque(maxlen=HISTORY))
        history.append(round(entry.get("output_per_s", 0.0), 1))
        entry["history"] = list(history)
        before = self._previous.get(broker_id)
        self._previous[broker_id] = {"time": now, **entry}
        if before is None or now <= before["time"]:
            return
        for key in ("deliveries", "notifications_in"):
            entry[f"{key}_per_s"] = (entry.get(key, 0) - before.get(key, 0)) / (
                now - before["time"]
            )
        matches = entry.get("matches", 0) - before.get("matches", 0)
        if matches > 0:
            spent = entry.get("matching_seconds", 0.0) - before.get("matching_seconds", 0.0)
            entry["match_delay"] = spent / matches
        for event, count in entry["routing"].items():
            earlier = before["routing"].get(event, 0)
            new = count - earlier if count >= earlier else count
            if new:
                self.recent.append({"time": now, "broker": broker_id, "event": event, "count": new})

    async def _scrape(self, session: aiohttp.ClientSession, endpoint: str) -> str | None:
        try:
            async with session.get(endpoint) as response:
                response.raise_for_status()
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("no metrics from %s: %s", endpoint, exc)
            return None

    async def current_snapshot(self) -> dict[str, Any]:
        """The latest snapshot, once the first scrape of every broker has ended (a
        request made while the monitor starts never gets an empty overlay)."""
        await self._scraped.wait()
        return self.snapshot

    async def next_snapshot(self) -> dict[str, Any]:
        """Wait for the next snapshot."""
        async with self._fresh:
            await self._fresh.wait()
            return self.snapshot


def make_app(monitor: Monitor) -> web.Application:
    """The monitor's web application: the page, its event stream and the JSON views."""
    page = resources.files("octopis.monitor").joinpath("page.html").read_text()
    view = topology_view(monitor.scot)
    viewers = [0]  # event streams open now

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def topology(request: web.Request) -> web.Response:
        return web.json_response(view)

    async def snapshot(request: web.Request) -> web.Response:
        return web.json_response(await monitor.current_snapshot())

    async def events(request: web.Request) -> web.StreamResponse:
        if viewers[0] >= MAX_VIEWERS:
            raise web.HTTPServiceUnavailable(text=f"{MAX_VIEWERS} viewers already watch")
        viewers[0] += 1
        try:
            return await _stream(request)
        except ConnectionResetError:  # the viewer closed the page: nothing to report
            return web.Response(status=204)
        finally:
            viewers[0] -= 1
            log.info("a viewer left (%d watching)", viewers[0])

    async def _stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        first = await monitor.current_snapshot()
        await response.write(f"data: {json.dumps(first)}\n\n".encode())
        while True:
            data = await monitor.next_snapshot()
            await response.write(f"data: {json.dumps(data)}\n\n".encode())

    async def start_scraping(app: web.Application) -> Any:
        task = asyncio.create_task(monitor.run())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/topology", topology)
    app.router.add_get("/snapshot", snapshot)
    app.router.add_get("/events", events)
    app.cleanup_ctx.append(start_scraping)
    return app


def serve_monitor(scot: Scot, host: str, port: int, interval: float) -> None:
    """Serve the monitor of ``scot`` at ``http://host:port/`` until interrupted."""
    print(f"monitor of {scot.name} at http://{host}:{port}/", flush=True)
    web.run_app(make_app(Monitor(scot, interval)), host=host, port=port, print=None)
