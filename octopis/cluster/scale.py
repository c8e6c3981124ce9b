"""A running overlay grown or shrunk by a cluster or a region (issue 18, DESIGN §9).

:func:`change_overlay` takes a :class:`LocalCluster` of running brokers to a new topology
version (:mod:`octopis.topology_change`):

1. **Leaving brokers' subscribers move** (make-before-break, the balancer's moves): to the
   same region's broker of another cluster when a cluster leaves, to the neighbouring
   region's broker of the same cluster (inside the cluster) when a region leaves. A
   publisher cannot be told to move: a change that would strand one is refused before
   anything moves, naming it.
2. **Remaining brokers whose neighbours change are relinked** (the control RPC's
   ``relink``, each told only its own new neighbours, their endpoints and keys, and the
   cluster count). A relink is refused while a leaving link still carries
   unacknowledged messages or the broker still routes over it; it is retried until the
   timeout.
3. **New brokers start** on the new topology version and are filled by resync from their
   neighbours, as a restarted broker is; the change is done when they and every relinked
   broker are ready (the time from the command to then is reported).
4. **Leaving brokers stop** once every remaining broker is relinked (none links to
   them) and ready.

A change that fails midway (a timeout) is not rolled back: the error says which step,
and the run's state records what runs.

Keys for new brokers are added to the run's keys directory (existing pairs kept), so
clients find the new brokers' public keys.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from octopis.balance.loop import Balancer
from octopis.balance.policy import BalanceOptions, Elasticity
from octopis.cluster.launcher import ClusterError, LocalCluster, stop_pids
from octopis.keys import Keys, make_keys
from octopis.topology import Scot, TopologyError
from octopis.topology_change import (
    add_cluster,
    changed_brokers,
    refuge_turns,
    refuse_stranded_publishers,
    relink_view,
    remove_cluster,
)

log = logging.getLogger("octopis.scale")

POLL = 0.2
"""Seconds between checks while waiting for moves, drains and readiness."""
TRANSIENT = ("still carry", "still routes", "still holds")
"""What a relink refusal says when it only has to wait (a link draining, a withdrawal on
its way); any other refusal is final."""
MOVE_AGAIN = 15.0
"""Seconds after which a subscriber still on a leaving broker is told to move again (a
move across clusters takes the SDK's linger, 10 s by default, to end)."""


async def _until(check: Any, what: str, timeout: float) -> None:
    """Await ``check()`` every :data:`POLL` seconds until it is true; ClusterError naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(POLL)


async def _move_off(
    cluster: LocalCluster, new: Scot, leaving: list[str], timeout: float
) -> dict[str, int]:
    """Tell every subscriber of a ``leaving`` broker to move to one of its refuges in
    ``new``, in turn (:func:`~octopis.topology_change.refuge_turns`)
    and wait until no leaving broker holds a subscription of a client of its own; one
    that arrives meanwhile (a move ordered before) is told too, and one still there
    :data:`MOVE_AGAIN` seconds after its order is told again. Returns the moves ordered
    inside and across clusters."""
    scot = cluster.scot
    _no_publishers({b: await cluster.call(b, "clients") for b in leaving})
    counts = {"inside": 0, "across": 0}
    ordered: dict[tuple[str, str], float] = {}
    refuge = refuge_turns(scot, new)

    async def emptied() -> bool:
        now = time.monotonic()
        held = {b: await cluster.call(b, "clients") for b in leaving}
        _no_publishers(held)  # one may have attached since
        waiting = [
            (b, c) for b, clients in held.items() for c, a in clients.items() if a["subscriptions"]
        ]
        for broker, client in waiting:
            if now - ordered.get((broker, client), -math.inf) < MOVE_AGAIN:
                continue
            target = refuge(broker)
            inside = scot.brokers[target].cluster == scot.brokers[broker].cluster
            try:
                await cluster.call(
                    broker, "move", client, scot.brokers[target].client_endpoint, inside
                )
            except Exception as exc:  # it left meanwhile: the next poll sees
                log.info("move of %s from %s not ordered: %s", client, broker, exc)
                continue
            ordered[(broker, client)] = now
            counts["inside" if inside else "across"] += 1
        return not waiting

    await _until(emptied, "the leaving brokers' subscribers moved", timeout)
    return counts


def _no_publishers(attached: dict[str, dict[str, dict[str, Any]]]) -> None:
    """ClusterError naming the publishers among the leaving brokers' clients, if any
    (:func:`~octopis.topology_change.refuse_stranded_publishers`)."""
    try:
        refuse_stranded_publishers(
            (c, b) for b, cs in attached.items() for c, a in cs.items() if a["publisher"]
        )
    except TopologyError as exc:
        raise ClusterError(str(exc)) from None


async def _relink(cluster: LocalCluster, new: Scot, ids: list[str], timeout: float) -> int:
    """Relink each broker of ``ids`` to its view in ``new``, retrying a refusal that only
    has to wait (:data:`TRANSIENT`) until ``timeout``; returns retries."""
    keys = Keys(cluster.keys_dir) if cluster.keys_dir is not None else None
    public = (lambda b: keys.broker_public(b).decode()) if keys is not None else None
    retries = 0

    async def one(broker_id: str) -> None:
        nonlocal retries
        view = msgspec.to_builtins(relink_view(new, broker_id, public))
        deadline = time.monotonic() + timeout
        while True:
            try:
                await cluster.call(broker_id, "relink", view)
                return
            except Exception as exc:  # refused; the error says why
                if not any(word in str(exc) for word in TRANSIENT) or time.monotonic() > deadline:
                    raise ClusterError(f"{broker_id} refused its new view: {exc}") from None
                retries += 1
                await asyncio.sleep(POLL)

    await asyncio.gather(*(one(b) for b in ids))
    return retries


def write_version(cluster: LocalCluster, new: Scot) -> Path:
    """Write ``new`` next to the run's state as the next topology version; returns it."""
    versions = sorted(cluster.run_dir.glob(f"{new.name}.v*.json"))
    path = cluster.run_dir / f"{new.name}.v{len(versions) + 2}.json"
    path.write_text(json.dumps(new.to_json(), indent=1))
    return path.resolve()


async def change_overlay(
    cluster: LocalCluster, new: Scot, pids: dict[str, int] | None = None, timeout: float = 120.0
) -> dict[str, Any]:
    """Take the running ``cluster`` to ``new`` (module docstring); ``pids`` are the
    recorded processes of brokers not started by ``cluster`` itself. Returns what it did:
    brokers added, removed and relinked, moves, relink retries, and ``seconds`` from the
    call to every new and relinked broker being ready (and ``total`` to the end)."""
    started = time.monotonic()
    old = cluster.scot
    if cluster.mode == "bid":
        raise ClusterError("BID has no resync to fill a new broker: change an SNR or DNR overlay")
    added, removed, relinked = changed_brokers(old, new)
    if new.clusters != old.clusters:
        relinked = [b for b in new.brokers if b in old.brokers]
    moves = await _move_off(cluster, new, removed, timeout) if removed else {}
    if cluster.keys_dir is not None and added:
        make_keys(cluster.keys_dir, new.endpoints_by_broker())
    retries = await _relink(cluster, new, relinked, timeout)
    cluster.topology_path = write_version(cluster, new)
    cluster.scot = new
    cluster.local = [b for b in cluster.local if b in new.brokers] + added
    for broker_id in added:
        cluster.spawn_one(broker_id)
    if added or relinked:
        await cluster.wait_ready(timeout, added + relinked)
    ready = time.monotonic() - started
    await _stop(cluster, removed, pids or {})
    log.info(
        "%s: %d brokers added, %d removed, %d relinked",
        new.name,
        *map(len, (added, removed, relinked)),
    )
    return {
        "added": added,
        "removed": removed,
        "relinked": relinked,
        "moves": moves,
        "relink_retries": retries,
        "seconds": ready,
        "total": time.monotonic() - started,
        "topology": str(cluster.topology_path),
    }


async def _stop(cluster: LocalCluster, removed: list[str], pids: dict[str, int]) -> None:
    """Stop the leaving brokers (they flush first) and forget their control clients."""
    for broker_id in removed:
        client = cluster.forget(broker_id)
        process = cluster.processes.pop(broker_id, None)
        pid = process.pid if process is not None else pids.pop(broker_id, None)
        if client is not None:
            client.close()
        if pid is not None:
            reap = {pid: process} if process is not None else None
            await asyncio.to_thread(stop_pids, {broker_id: pid}, 10.0, reap)


def elastic_reshape(
    cluster: LocalCluster, pids: dict[str, int], timeout: float = 120.0
) -> Callable[[str], Awaitable[Scot]]:
    """The balancer's ``reshape`` for ``cluster``: ``add-cluster`` or ``remove-cluster``
    (the last one) carried out by :func:`change_overlay`, the run's state recorded after
    each (``pids``: the processes it recorded)."""

    async def reshape(change: str) -> Scot:
        scot = cluster.scot
        if change == "add-cluster":
            new = add_cluster(scot)
        elif change == "remove-cluster":
            new = remove_cluster(scot, scot.clusters - 1)
        else:
            raise ValueError(f"no elastic change {change!r}")
        try:
            await change_overlay(cluster, new, pids, timeout)
        finally:
            cluster.write_state(pids)
        return new

    return reshape


def elastic_balancer(
    cluster: LocalCluster,
    options: BalanceOptions,
    elastic: Elasticity,
    pids: dict[str, int] | None = None,
    timeout: float = 120.0,
) -> Balancer:
    """A balancer of ``cluster`` (kept control connections) that also grows and shrinks
    it by a cluster as ``elastic`` decides (:func:`elastic_reshape`)."""
    return Balancer(
        cluster.scot,
        cluster.ask,
        options,
        call=cluster.call,
        elastic=elastic,
        reshape=elastic_reshape(cluster, pids if pids is not None else {}, timeout),
    )
