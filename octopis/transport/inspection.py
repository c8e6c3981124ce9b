"""What a broker process shows of itself (DESIGN §10): its status, statistics, stored
subscriptions, routing table and resync view, for the control RPC (``octopis status``,
the monitor, the balancer) and the Prometheus collector. It only reads; routing never
calls it."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

from octopis.core import ClusteredBroker
from octopis.core.resync import resync_messages
from octopis.transport.clients import STOMP_IDENTITY

DURABLES_LISTED = 100
"""Durable subscription records a stats snapshot lists (their count is in ``retention``)."""


class BrokerInspection:
    """The read-only views of one serving :class:`~octopis.transport.broker.Broker`
    (called in its event loop)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        """The broker (typed ``Any``: naming its class here would tie the two modules in
        an import circle; it is the one that builds this)."""

    def status(self) -> dict[str, Any]:
        """Identity, incarnation, readiness and each link's state."""
        broker = self.broker
        return {
            "id": broker.id,
            "mode": broker.mode,
            "ready": broker.ready,
            "serving": broker.node.serving,
            "incarnation": broker.incarnation,
            "links_up": sum(not broker.lst.down(n) for n in broker.links),
            "neighbours": len(broker.links),
            "links": broker.peers.snapshot(asyncio.get_running_loop().time()),
            "routing_table_size": len(broker.core.table),
            "missing_shares": broker.node.status()["missing_shares"],
            "owed_shares": broker.node.status()["owed_shares"],
            "pid": os.getpid(),
            "memory_rss": broker.process.memory_info().rss,
            "memory_budget": broker.peers.pressure.snapshot(),
            "cpu_seconds": sum(broker.process.cpu_times()[:2]),
        }

    def subscriptions(self) -> dict[str, list]:
        """Per stored subscription: [seconds from issue to storage here, hops from host]."""
        broker = self.broker
        entries = broker.core.table.entries
        return {
            sub_id: [broker.subscription_delay.get(sub_id, 0.0), entry.hops]
            for sub_id, entry in entries.items()
        }

    def resync_view(self, neighbour: str) -> list[str]:
        """The sub ids this broker would hand ``neighbour`` if it restarted now (its share
        of the restarted broker's table, DESIGN §7); empty in BID, which has no resync."""
        broker = self.broker
        if neighbour not in broker.links:
            raise ValueError(f"{neighbour} is not a neighbour of {broker.id}")
        if not isinstance(broker.core, ClusteredBroker):
            return []
        return [m.sub_id for m in resync_messages(broker.core, neighbour)]

    def table(self) -> dict[str, dict[str, Any]]:
        """The routing table entry by entry (for comparing brokers' views)."""
        broker = self.broker
        return {
            sub_id: {
                "filter": e.subscription.to_text(),
                "last_hop": e.last_hop,
                "cluster": e.cluster,
                "host": e.host,
                "local": e.local,
            }
            for sub_id, e in broker.core.table.entries.items()
        }

    def stats(self) -> dict[str, Any]:
        """Messages by kind, routing-table size, LST, queue lengths, custody and dedup
        fill (with what their limits dropped), held messages, matching time, and the
        cyclic collector's passes per generation."""
        broker = self.broker
        broker.lst.advance(asyncio.get_running_loop().time())
        core = dict(broker.core.counts())
        connections = broker.clients.connections
        return {
            **self.status(),
            "uptime": time.time() - broker.started,
            "counters": dict(
                broker.counters
                + broker.node.counts()
                + broker.peers.counters
                + broker.clients.counters
                + broker.clients.table.counters
            ),
            "received": {kind.__name__.lower(): n for kind, n in broker.received.items()},
            "core": core,
            "retention": broker.replaying.stats,
            "durables": broker.replaying.durables.listed(DURABLES_LISTED),
            "lst": broker.lst.snapshot(),
            "queue_lengths": {name: len(link.queue) for name, link in broker.links.items()},
            "batches": {
                name: {"messages": link.messages, "frames": link.sent}
                for name, link in broker.links.items()
            },
            "client_backlog": broker.clients.outbox.backlog(),
            "client_connections": len(connections),
            "stomp_connections": sum(c.startswith(STOMP_IDENTITY) for c in connections),
            "deliveries_waiting": broker.clients.outbox.flow.paced_deliveries,
            "deliveries_waiting_max": broker.clients.outbox.flow.paced_peak,
            "load": broker.load_meter.report(0),
            "custody": {
                name: {
                    "unacknowledged": len(link.custody),
                    "pending": len(link.custody.pending),
                    "retained": len(link.custody.retained),
                    "times_full": link.custody.stops,
                    "retain_evicted": link.custody.evicted,
                }
                for name, link in broker.links.items()
            },
            "dedup": {
                "remembered": len(broker.core.dedup),
                "forgotten": broker.core.dedup.forgotten,
            },
            "held": broker.node.status()["held"],
            "detections": list(broker.peers.detections),
            "queue_seen": {
                "copies": broker.lst.notifications_in,
                "total": broker.lst.notifications_ahead,
                "max": broker.lst.most_ahead,
            },
            "matching": {
                "calls": broker.clock.calls,
                "seconds": broker.clock.seconds,
                "histogram": list(broker.clock.histogram),
                "routing_steps": core.get("matching", 0),
            },
            "gc": {
                "threshold": list(gc.get_threshold()),
                "collections": [generation["collections"] for generation in gc.get_stats()],
                "frozen": gc.get_freeze_count(),
                "idle_passes": list(broker.collector.passes),
            },
        }

    def load(self, top: int) -> dict[str, Any]:
        """The load analysis's report: rates over the window, output, capacity, LR and
        the ``top`` clients by delivery rate (DESIGN §9, Dynamoth's Eq. 1)."""
        return self.broker.load_meter.report(top)

    def attached_clients(self) -> dict[str, dict[str, int | bool | list[str]]]:
        """The clients attached here (``name@connection``): how many subscriptions each
        holds here, whether it has published here, and what its subscriptions ask for by
        equality (``Subscription.interests``, for the balancer's SDM)."""
        return self.broker.clients.sessions.attached()
