"""The waits of ``octopis run`` (DESIGN §4, §7): until the subscription broadcast has
settled, until what was published has arrived (or nothing more can), until the overlay
is quiet; and a watch on the harness's own event loop, whose stalls read as silent
clients to the brokers."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

from tqdm import tqdm

from octopis.accounting import DeliveryLedger
from octopis.cluster.launcher import ClusterError, LocalCluster

log = logging.getLogger("octopis.run")

AskLive = Callable[[str], Awaitable[dict[str, Any]]]
"""A control call asked of every live broker: method → broker → answer."""
STALL_DUMP_AFTER = 5.0
"""Seconds the harness's event loop may stall before every thread's stack is written to
``<run-dir>/logs/harness-stalls.log``: a stuck harness reads as silent clients to the
brokers, which drop them after ``clients.timeout``."""
IDLE_DRAIN = 2.0
"""Seconds without a delivery after which a drain stops early if the overlay is idle:
what is still missing then (a failure's losses) can no longer come."""


async def settle(
    cluster: LocalCluster,
    baseline: dict[str, dict[str, Any]],
    ours: Collection[str],
    *,
    covering: bool,
    attach: bool,
    timeout: float = 300.0,
) -> float:
    """Seconds until every broker of ``cluster`` stores every subscription of the run
    (``ours``), queues are empty and counters still (``baseline``: each broker's stats
    before the run). Brokers the run started hold nothing else, so their table sizes
    tell; on an ``attach``-ed overlay, whose other subscriptions may come and go meanwhile
    (a client of an earlier run still being dropped, say), each broker's subscription ids
    do. With ``covering`` (DESIGN §12) a broker holds only what was not covered on the
    way to it: then every table holds at least its hosts' own and no table changes any
    more. :class:`ClusterError` after ``timeout`` seconds."""
    started = time.monotonic()
    total = len(ours)
    want = {b: s["routing_table_size"] + total for b, s in baseline.items()}
    before = sum(s["routing_table_size"] for s in baseline.values())
    previous = None
    sizes_before: dict[str, int] = {}
    while time.monotonic() - started < timeout:
        stats = await cluster.call_all("stats")
        sizes = {b: s["routing_table_size"] for b, s in stats.items()}
        if covering or any("covering.quenched" in s["core"] for s in stats.values()):
            stored = sizes == sizes_before and sum(sizes.values()) >= before + total
        elif attach:
            held = await cluster.call_all("subscriptions")
            stored = all(set(ours) <= held[b].keys() for b in held)
        else:
            stored = sizes == want
        busy = sum(sum(s["queue_lengths"].values()) for s in stats.values())
        sent = sum(s["core"].get("sent.subscribe", 0) for s in stats.values())
        if stored and not busy and sent == previous:
            return time.monotonic() - started
        previous, sizes_before = sent, sizes
        await asyncio.sleep(0.2)
    raise ClusterError(f"subscription broadcast did not settle within {timeout:.0f} s")


async def drain(
    ledger: DeliveryLedger, ask_live: AskLive, bar: tqdm, drain_timeout: float
) -> float:
    """Seconds until every delivery the ``ledger`` expects came (shown on ``bar``), or
    none came for ``drain_timeout`` seconds, or the overlay (``ask_live``: every live
    broker's answer) carries nothing more and none came for :data:`IDLE_DRAIN` seconds;
    then a quiet period to catch duplicates."""
    started = time.monotonic()
    expected = ledger.expected
    last_progress, last_count = time.monotonic(), -1
    while True:
        received = sum(ledger.received.values())
        bar.n = min(received, len(expected))
        bar.refresh()
        if received != last_count:
            last_progress, last_count = time.monotonic(), received
        if expected <= ledger.received.keys():
            break
        silent = time.monotonic() - last_progress
        if silent > drain_timeout:
            log.warning(
                "no delivery for %.0f s; %d expected deliveries missing",
                drain_timeout,
                len(expected - ledger.received.keys()),
            )
            break
        if silent > IDLE_DRAIN and not carrying(await ask_live("stats")):
            log.warning(
                "the overlay is idle, no delivery for %.0f s; %d expected deliveries missing",
                silent,
                len(expected - ledger.received.keys()),
            )
            break
        await asyncio.sleep(0.05 if silent <= IDLE_DRAIN else 0.5)
    await quiet(ledger, ask_live)
    return time.monotonic() - started


async def quiet(ledger: DeliveryLedger, ask_live: AskLive, period: float = 0.5) -> None:
    """Until all broker queues are empty and no delivery arrived for ``period`` seconds."""
    while True:
        before = sum(ledger.received.values())
        await asyncio.sleep(period)
        busy = carrying(await ask_live("stats"), custody=False)
        if not busy and sum(ledger.received.values()) == before:
            return


def carrying(stats: dict[str, dict[str, Any]], *, custody: bool = True) -> int:
    """Messages the brokers of ``stats`` still carry toward someone: queued on links or
    for clients, and (``custody``) unacknowledged or held for a neighbour or a client."""
    total = 0
    for s in stats.values():
        total += sum(s["queue_lengths"].values()) + s["client_backlog"] + s["deliveries_waiting"]
        if custody:
            total += sum(s["held"].values())
            total += sum(link["unacknowledged"] for link in s["custody"].values())
    return total


async def watch_stalls(path: Path) -> None:
    """Warn when this event loop ran late by more than a second; dump every thread's
    stack into ``path`` if it stalls :data:`STALL_DUMP_AFTER` seconds."""
    loop = asyncio.get_running_loop()
    with open(path, "a") as out:
        try:
            woke = loop.time()
            while True:
                faulthandler.dump_traceback_later(STALL_DUMP_AFTER, file=out)
                await asyncio.sleep(1.0)
                now = loop.time()
                if now - woke > 2.0:
                    log.warning("the harness's event loop stalled %.1f s", now - woke - 1.0)
                woke = now
        finally:
            faulthandler.cancel_dump_traceback_later()
