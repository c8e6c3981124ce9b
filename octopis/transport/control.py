"""The control plane of one broker: an aiozmq RPC (DESIGN §4, §10)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import aiozmq.rpc
import zmq

from octopis.logs import FloodFilter
from octopis.transport.security import Curve


class Inspectable(Protocol):
    """What the control RPC reads of a broker (``transport/inspection.py``)."""

    def status(self) -> dict[str, Any]: ...
    def stats(self) -> dict[str, Any]: ...
    def subscriptions(self) -> dict[str, list]: ...
    def table(self) -> dict[str, dict[str, Any]]: ...
    def resync_view(self, neighbour: str) -> list[str]: ...
    def load(self, top: int) -> dict[str, Any]: ...
    def attached_clients(self) -> dict[str, dict[str, int | bool | list[str]]]: ...


class Operable(Protocol):
    """What the control RPC asks a broker for or to do."""

    def move_client(self, client: str, to: str, inside: bool) -> list[str]: ...
    def stop(self) -> None: ...


class ControlHandler(aiozmq.rpc.AttrHandler):
    """``status``, ``stats``, ``subscriptions``, ``table``, ``resync_view``, ``load``,
    ``move``, ``clients``, ``relink`` and ``shutdown``."""

    def __init__(
        self,
        broker: Operable,
        inspection: Inspectable,
        relink: Callable[[object], dict[str, Any]],
    ) -> None:
        self._broker = broker
        self._inspection = inspection
        self._relink = relink

    @aiozmq.rpc.method
    def status(self) -> dict:
        """Identity, incarnation, readiness, and each link's state."""
        return self._inspection.status()

    @aiozmq.rpc.method
    def stats(self) -> dict:
        """Counters, routing-table size, LST, queue lengths, matching time, detections."""
        return self._inspection.stats()

    @aiozmq.rpc.method
    def subscriptions(self) -> dict:
        """Per stored subscription: [seconds from issue to storage here, hops from host]."""
        return self._inspection.subscriptions()

    @aiozmq.rpc.method
    def table(self) -> dict:
        """The routing table: per subscription id its filter, last hop, cluster, host."""
        return self._inspection.table()

    @aiozmq.rpc.method
    def resync_view(self, neighbour: str) -> list:
        """The sub ids this broker hands ``neighbour`` when it restarts (resync)."""
        return self._inspection.resync_view(neighbour)

    @aiozmq.rpc.method
    def load(self, top: int = 20) -> dict:
        """Rates per second over the load window, output, capacity, load ratio and the
        ``top`` clients by delivery rate (DESIGN §9)."""
        if type(top) is not int or not 0 <= top <= 10_000:
            raise ValueError(f"top must be an integer in [0, 10000], not {top!r}")
        return self._inspection.load(top)

    @aiozmq.rpc.method
    def move(self, client: str, to: str, inside: bool) -> list:
        """Tell client ``client`` to move its subscriptions to the broker whose client
        endpoint is ``to`` (``inside``: of this broker's cluster, so by adoption; else by
        subscribing afresh there); returns the sub ids (DESIGN §9)."""
        if type(client) is not str or type(to) is not str or type(inside) is not bool:
            raise ValueError("move takes a client name, a client endpoint and inside: bool")
        return self._broker.move_client(client, to, inside)

    @aiozmq.rpc.method
    def clients(self) -> dict:
        """The clients attached here (``name@connection``): subscriptions held here,
        whether each has published here, and the interests of its subscriptions."""
        return self._inspection.attached_clients()

    @aiozmq.rpc.method
    def relink(self, view: dict) -> dict:
        """Take this broker's view in a new topology version: its neighbours (labels, peer
        endpoint, public key) and the number of clusters; returns the neighbours added
        and removed (DESIGN §9)."""
        return self._relink(view)

    @aiozmq.rpc.method
    def shutdown(self) -> bool:
        """Flush output queues and exit."""
        asyncio.get_running_loop().call_soon(self._broker.stop)
        return True


async def serve_control(
    broker: Operable,
    inspection: Inspectable,
    endpoint: str,
    frame_bytes: int,
    curve: Curve | None,
    log_interval: float,
    relink: Callable[[object], dict[str, Any]],
) -> aiozmq.rpc.Service:
    """Start the control RPC of ``broker`` (read through ``inspection``) at ``endpoint``;
    a caller sending a message over ``frame_bytes`` is disconnected (ZMQ_MAXMSGSIZE).
    With ``curve``, only the admin key gets in (ZAP domain ``control``). What aiozmq logs
    about undecodable calls is written at most once per ``log_interval`` seconds. A
    ``relink`` call takes the broker's view in a new topology version."""
    rpc_log = logging.getLogger("aiozmq.rpc")
    if not any(isinstance(f, FloodFilter) for f in rpc_log.filters):
        rpc_log.addFilter(FloodFilter(log_interval))
    service = await aiozmq.rpc.serve_rpc(ControlHandler(broker, inspection, relink))
    sock = service.transport.get_extra_info("zmq_socket")
    sock.setsockopt(zmq.MAXMSGSIZE, frame_bytes)
    if curve is not None:
        curve.serve(sock, "control")
    await service.transport.bind(endpoint)
    return service
