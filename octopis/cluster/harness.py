"""The clients of an ``octopis run``: the workload's subscribers and publishers, in the
run's own process or spread over worker processes so that one process's event loop does
not set the pace of what is measured.

:class:`ClientSide` is one share of the clients: a connection per broker (shared by that
broker's clients, failing over along the topology's list), subscribing and publishing on
the workload's schedule (times from a wall-clock start, so processes agree on it), and
handing subscription ids, publications and deliveries to callbacks. The run keeps the
ledger; :class:`WorkerPool` runs shares in processes of their own and carries those
callbacks back to it over a ZeroMQ socket on 127.0.0.1, in batches.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from octopis.client import (
    Connection,
    ConnectionGroup,
    Publisher,
    Received,
    Subscriber,
)
from octopis.defaults import CLIENT_LIVENESS
from octopis.topology import Scot
from octopis.wire import pack, unpack
from octopis.workload import PublicationEvent, SubscriptionEvent

SUBSCRIBING_AT_ONCE = 256
"""Subscriptions a share has in flight at once."""
REPORT_EVERY = 0.05
"""Seconds a worker batches what it reports before sending it."""

Delivery = tuple[str, str, int, float, float, float]
"""``(subscriber, publisher, seq, published_at, received_at, left_broker_at)``."""


@dataclass
class Share:
    """What one share of the clients does: its brokers' client endpoint lists (own broker
    first) and the workload's events on those brokers."""

    endpoints: dict[str, list[str]]
    subscriptions: list[SubscriptionEvent]
    publications: list[PublicationEvent]
    keys: Path | None = None
    time_scale: float = 1.0
    liveness: float = CLIENT_LIVENESS
    """The SDK connections' ``liveness``: seconds of a broker's silence before failing over."""


@dataclass
class Callbacks:
    """Where a share's results go."""

    subscribed: Callable[[int, str], None]
    """(index of the subscription event, its sub id)."""
    published: Callable[[str, int, float], None]
    """(publisher, seq, wall time sent)."""
    delivered: Callable[[Delivery], None]


@dataclass
class ShareStats:
    """What the share's connections saw, per broker."""

    outages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    duplicates_absorbed: int = 0
    errors: list[str] = field(default_factory=list)
    """Error replies nobody waited for (a request answered after its timeout, say)."""
    refused: list[str] = field(default_factory=list)
    """Why publications were refused."""
    late_max_s: float = 0.0
    moves: int = 0
    """Moves the share's subscribers made (DESIGN §9)."""
    stale_moves: int = 0
    """Move orders the share's subscribers ignored as stale."""
    unclaimed: int = 0
    """Deliveries for a subscriber that had moved off the connection they came on."""
    repeats_forgotten_early: int = 0
    """Deliveries forgotten before the repeat horizon (the group's limit was reached)."""
    replays: int = 0
    """Replays the share's subscribers asked for after a fail-over (DESIGN §11)."""
    replayed: int = 0
    """Publications those replays delivered (not delivered before)."""
    replay_repeats: int = 0
    """Publications replays answered that had been delivered already (dropped)."""
    replay_gaps: list[dict[str, Any]] = field(default_factory=list)
    """What replays could not fill (the first 100)."""
    replayed_late: int = 0
    """Publications answered late, by a part that was silent when its replay ended (a
    broker that restarted), and delivered then."""

    @property
    def failovers(self) -> int:
        """Fail-overs of the share's connections (a broker silent past their liveness)."""
        return sum(len(o) for o in self.outages.values())


REPLAY_GAPS_KEPT = 100
"""Replay gaps a run reports in full (all are counted)."""


def _replay_stats(
    records: list[dict[str, Any]],
) -> tuple[int, int, int, list[dict[str, Any]], int]:
    """Replays, publications replayed, repeats dropped, gaps (as plain data) and
    publications replayed late of the subscribers' replay records."""
    gaps = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in vars(r["gap"]).items()}
        for r in records
        if r["gap"] is not None
    ]
    return (
        len(records),
        sum(r["replayed"] for r in records),
        sum(r["repeats"] for r in records),
        gaps[:REPLAY_GAPS_KEPT],
        sum(r["late_replayed"] for r in records),
    )


def split(events: Sequence[SubscriptionEvent | PublicationEvent], parts: int) -> list[list[str]]:
    """The brokers the events name, dealt round-robin into at most ``parts`` lists
    (busiest first, so the shares carry similar numbers of clients)."""
    counts: dict[str, int] = {}
    for e in events:
        counts[e.broker] = counts.get(e.broker, 0) + 1
    ordered = sorted(counts, key=lambda b: (-counts[b], b))
    return [ordered[i::parts] for i in range(parts) if ordered[i::parts]]


def share_of(
    scot: Scot,
    brokers: list[str],
    subscriptions: list[SubscriptionEvent],
    publications: list[PublicationEvent],
    keys: Path | None,
    time_scale: float,
    liveness: float = CLIENT_LIVENESS,
) -> tuple[Share, list[int]]:
    """The share of the clients on ``brokers``, and the run-wide index of each of its
    subscription events."""
    mine = set(brokers)
    indices = [i for i, s in enumerate(subscriptions) if s.broker in mine]
    share = Share(
        {b: scot.client_endpoints(b) for b in brokers},
        [subscriptions[i] for i in indices],
        [p for p in publications if p.broker in mine],
        keys,
        time_scale,
        liveness,
    )
    return share, indices


RECENT_DELIVERIES = 1_048_576
"""Deliveries a share remembers at most for dropping repeats during moves and fail-overs
(for the group's 30 s horizon; the SDK's linger is 10 s): its subscribers together
receive up to ~10,000/s in the experiments."""


class ClientSide:
    """One share of the clients, in this process's event loop."""

    def __init__(self, share: Share, callbacks: Callbacks, indices: list[int]) -> None:
        self.share = share
        self.callbacks = callbacks
        self.indices = indices
        """The run-wide index of each of the share's subscription events."""
        self.connections: dict[str, Connection] = {}
        self.subscribers: dict[str, Subscriber] = {}
        self.publishers: dict[str, Publisher] = {}
        self.late_max_s = 0.0
        self.group = ConnectionGroup(limit=RECENT_DELIVERIES)

    async def attach(self) -> None:
        """Open a connection per broker; make the subscribers and publishers."""
        for broker, endpoints in self.share.endpoints.items():
            connection = Connection(
                endpoints, keys=self.share.keys, group=self.group, liveness=self.share.liveness
            )
            await connection.open()
            self.connections[broker] = connection
        delivered = self.callbacks.delivered

        def received(n: Received) -> None:
            delivered(
                (n.subscriber, n.publisher, n.seq, n.published_at, n.received_at, n.left_broker_at)
            )

        for s in self.share.subscriptions:
            if s.subscriber not in self.subscribers:
                self.subscribers[s.subscriber] = Subscriber(
                    s.subscriber, self.connections[s.broker], on_notification=received
                )
        for p in self.share.publications:
            if p.publisher not in self.publishers:
                self.publishers[p.publisher] = Publisher(p.publisher, self.connections[p.broker])

    async def subscribe(self, start: float) -> None:
        """Each subscription at its (scaled) time after the wall-clock ``start``."""
        window = asyncio.Semaphore(SUBSCRIBING_AT_ONCE)
        scale = self.share.time_scale

        async def one(index: int, event: SubscriptionEvent) -> None:
            delay = start + event.time * scale - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            async with window:
                stream = await self.subscribers[event.subscriber].subscribe(event.subscription)
            self.callbacks.subscribed(index, stream.sub_id)

        await asyncio.gather(
            *(one(i, e) for i, e in zip(self.indices, self.share.subscriptions, strict=True))
        )

    async def publish(self, start: float) -> None:
        """Each publication at its (scaled) time after the wall-clock ``start``, then
        until every one is acknowledged (or refused, kept in the publisher's ``refused``)."""
        scale = self.share.time_scale
        for event in self.share.publications:
            delay = start + event.time * scale - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.late_max_s = max(self.late_max_s, -delay)
            self.callbacks.published(event.publisher, event.seq, time.time())
            await self.publishers[event.publisher].publish(
                event.publication, wait=False, seq=event.seq
            )
        for publisher in self.publishers.values():
            await publisher.flush()

    def stats(self) -> ShareStats:
        """Outages, absorbed repeats and refusals of the share's connections."""
        connections = [s for c in self.connections.values() for s in c.family]
        return ShareStats(
            {b: [o for s in c.family for o in s.outages] for b, c in self.connections.items()},
            sum(c.duplicates_absorbed for c in connections),
            [e for c in connections for e in c.errors],
            [r for p in self.publishers.values() for r in p.refused],
            self.late_max_s,
            sum(len(s.moves) for s in self.subscribers.values()),
            sum(s.stale_moves for s in self.subscribers.values()),
            sum(c.unclaimed for c in connections),
            self.group.forgotten_early,
            *_replay_stats([r for s in self.subscribers.values() for r in s.replays]),
        )

    async def close(self) -> None:
        """Close every connection (their clients say bye)."""
        for connection in self.connections.values():
            await connection.close()


def worker_main(endpoint: str, share: Share, indices: list[int]) -> None:
    """A worker process: run ``share`` as the parent at ``endpoint`` commands it,
    reporting back in batches every :data:`REPORT_EVERY` seconds."""
    asyncio.run(_work(endpoint, share, indices))


async def _work(endpoint: str, share: Share, indices: list[int]) -> None:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(endpoint)
    pending: dict[str, list] = {"subscribed": [], "published": [], "delivered": []}
    side = ClientSide(
        share,
        Callbacks(
            lambda i, sub_id: pending["subscribed"].append((i, sub_id)),
            lambda p, seq, at: pending["published"].append((p, seq, at)),
            pending["delivered"].append,
        ),
        indices,
    )

    async def report() -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY)
            await flush()

    async def flush() -> None:
        for kind, items in pending.items():
            if items:
                await sock.send(pack({"op": kind, "items": list(items)}))
                items.clear()

    reporter = asyncio.create_task(report())
    try:
        await side.attach()
        await sock.send(pack({"op": "ready"}))
        while True:
            command = unpack(await sock.recv())
            op = command["op"]
            if op == "subscribe":
                await side.subscribe(command["start"])
            elif op == "publish":
                await side.publish(command["start"])
            elif op == "close":  # (and "report": nothing to do but answer)
                stats = side.stats()
                await side.close()
            await flush()
            if op != "close":
                stats = side.stats()
            await sock.send(pack({"op": "done", "phase": op, "stats": vars(stats)}))
            if op == "close":
                return
    finally:
        reporter.cancel()
        sock.close()
        ctx.term()


class WorkerPool:
    """Shares of the clients in worker processes, driven from the run's event loop."""

    def __init__(self, shares: list[tuple[Share, list[int]]], callbacks: Callbacks) -> None:
        self.shares = shares
        self.callbacks = callbacks
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self._endpoint = f"tcp://127.0.0.1:{port}"
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._workers: list[bytes] = []
        self._waiting: set[bytes] = set()
        self._done = asyncio.Event()
        self._reader: asyncio.Task | None = None
        self.stats: dict[bytes, ShareStats] = {}
        """Each worker's share stats as of its last finished phase."""

    async def start(self, timeout: float = 120.0) -> None:
        """Start the workers; return once each has attached its clients."""
        spawn = multiprocessing.get_context("spawn")
        for share, indices in self.shares:
            process = spawn.Process(
                target=worker_main, args=(self._endpoint, share, indices), daemon=True
            )
            process.start()
            self._processes.append(process)
        self._reader = asyncio.create_task(self._read())
        await self._phase(None, timeout)

    async def run(self, op: str, start: float, timeout: float) -> None:
        """Have every worker ``subscribe`` or ``publish`` from wall time ``start`` (or
        ``report`` its stats); return once all have done so."""
        await self._phase({"op": op, "start": start}, timeout)

    def share_stats(self) -> ShareStats:
        """The workers' stats together."""
        together = ShareStats()
        for stats in self.stats.values():
            together.outages.update(stats.outages)
            together.duplicates_absorbed += stats.duplicates_absorbed
            together.errors += stats.errors
            together.refused += stats.refused
            together.late_max_s = max(together.late_max_s, stats.late_max_s)
            together.moves += stats.moves
            together.stale_moves += stats.stale_moves
            together.unclaimed += stats.unclaimed
            together.repeats_forgotten_early += stats.repeats_forgotten_early
            together.replays += stats.replays
            together.replayed += stats.replayed
            together.replay_repeats += stats.replay_repeats
            together.replayed_late += stats.replayed_late
            together.replay_gaps = (together.replay_gaps + stats.replay_gaps)[:REPLAY_GAPS_KEPT]
        return together

    async def close(self, timeout: float = 60.0) -> None:
        """Close the workers' connections, collect their stats and stop them."""
        try:
            if len(self._workers) == len(self.shares):
                await self._phase({"op": "close"}, timeout)
        finally:
            if self._reader is not None:
                self._reader.cancel()
            for process in self._processes:
                process.join(5)
                if process.is_alive():
                    process.kill()
                    process.join()
            self._sock.close(0)
            self._ctx.term()

    async def _phase(self, command: dict | None, timeout: float) -> None:
        """Send ``command`` to every worker and wait until each says it is done; None:
        wait until every worker has said it is ready."""
        self._done.clear()
        self._waiting = set(self._workers)
        if command is not None:
            for worker in self._workers:
                await self._sock.send_multipart([worker, pack(command)])
        what = command["op"] if command else "ready"
        deadline = time.monotonic() + timeout
        while not self._done.is_set():
            if dead := [p.exitcode for p in self._processes if p.exitcode not in (None, 0)]:
                raise RuntimeError(f"a client worker exited with status {dead[0]}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"client workers not done with {what!r} in {timeout:g} s")
            try:
                await asyncio.wait_for(self._done.wait(), min(remaining, 1.0))
            except TimeoutError:
                continue

    async def _read(self) -> None:
        callbacks = self.callbacks
        while True:
            worker, body = await self._sock.recv_multipart()
            message = unpack(body)
            op = message["op"]
            if op == "delivered":
                for item in message["items"]:
                    callbacks.delivered(tuple(item))
            elif op == "published":
                for publisher, seq, at in message["items"]:
                    callbacks.published(publisher, seq, at)
            elif op == "subscribed":
                for index, sub_id in message["items"]:
                    callbacks.subscribed(index, sub_id)
            elif op == "ready":
                self._workers.append(worker)
                if len(self._workers) == len(self.shares):
                    self._done.set()
            elif op == "done":
                self.stats[worker] = ShareStats(**message["stats"])
                self._waiting.discard(worker)
                if not self._waiting:
                    self._done.set()
