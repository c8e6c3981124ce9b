"""A broker process's lifetime (DESIGN §2, §8): its guards, link status table, peer links,
client sessions, control RPC and metrics made and bound; its serving loops started; and,
once it is told to stop, everything flushed and closed in order."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import zmq.asyncio

from octopis.core import LinkStatusTable, Notification
from octopis.core.load import LoadSample
from octopis.logs import RateLimitedLog
from octopis.transport.clients import ClientSessions, ClientSettings
from octopis.transport.control import serve_control
from octopis.transport.links import SendPass
from octopis.transport.metrics import serve_metrics
from octopis.transport.peers import PeerLinks, PeerSettings
from octopis.transport.process_mark import clear_running
from octopis.transport.relink import relink
from octopis.transport.security import count_failed_handshakes, start_guards

if TYPE_CHECKING:
    from octopis.transport.broker import Broker, Gateway

log = logging.getLogger("octopis.broker")


class BrokerFailure(RuntimeError):
    """A serving loop of the broker ended with an error; the broker shut down."""


async def serve(broker: Broker, gateway: Gateway | None = None) -> None:
    """Bind and connect ``broker``'s parts, run its loops (and ``gateway``'s: the tasks of
    other client protocols, DESIGN §13) until it stops, then flush and close; raises
    :class:`BrokerFailure` if a loop ended on its own."""
    loop = broker.loop = asyncio.get_running_loop()
    ctx = zmq.asyncio.Context()
    curve, guards = start_guards(
        broker.id,
        broker.keys,
        [n.id for n in broker.info.neighbours],
        RateLimitedLog(log, broker.settings.logs.interval),
        broker.counters,
        ctx,
    )
    broker.curve = curve
    broker.peer_keys = guards[0].allowed["peer"] if guards else set()  # a relink changes them
    broker.lst = LinkStatusTable(
        [n.id for n in broker.info.neighbours],
        broker.settings.lst.window,
        broker.settings.lst.queue_threshold,
        start=loop.time(),
        order=broker.settings.lst.order,
    )
    send_pass = SendPass()
    idle = broker.collector.idle
    broker.peers = PeerLinks(
        broker.id,
        broker.neighbour_endpoints,
        broker.info.endpoint,
        PeerSettings.of(broker.settings),
        broker.lst,
        ctx,
        broker,
        broker.node,
        broker.incarnation,
        curve,
        send_pass,
        lambda: broker.clients.outbox.flow.paced_deliveries,
        idle,
    )
    broker.links = broker.peers.links
    broker.clients = ClientSessions(
        broker.id,
        broker.info.client_endpoint,
        ClientSettings.of(broker.settings),
        ctx,
        broker,
        curve,
        send_pass,
        idle,
    )
    broker.rpc = await serve_control(
        broker,
        broker.inspection,
        broker.info.control_endpoint,
        broker.settings.limits.frame_bytes,
        curve,
        broker.settings.logs.interval,
        partial(relink, broker),
    )
    stop_metrics = None
    if broker.info.metrics_endpoint is not None:

        async def stats() -> dict[str, Any]:
            return broker.inspection.stats()

        stop_metrics = serve_metrics(broker.info.metrics_endpoint, stats, loop)
    work = [
        *broker.peers.tasks(),
        ("clients", broker.clients.serve()),
        ("client timeouts", broker.clients.expire()),
        ("lst", tick_lst(broker)),
        ("load", sample_load(broker)),
        ("durable", broker.replaying.maintain()),
        *(gateway(broker) if gateway is not None else ()),
    ]
    if curve is not None:
        sockets = {
            "peer": (broker.peers.input, ctx),
            "client": (broker.clients.socket, ctx),
            "control": (broker.rpc.transport.get_extra_info("zmq_socket"), guards[1].context),
        }
        warn = RateLimitedLog(log, broker.settings.logs.interval)
        work += [
            (f"{name} handshakes", count_failed_handshakes(sock, c, name, broker.counters, warn))
            for name, (sock, c) in sockets.items()
        ]
    for name, coro in work:
        broker.start_task(name, coro)
    log.info(
        "%s serving (%s, incarnation %x) peers %s clients %s control %s metrics %s retention %s",
        broker.id,
        broker.mode,
        broker.incarnation,
        broker.info.endpoint,
        broker.info.client_endpoint,
        broker.info.control_endpoint,
        broker.info.metrics_endpoint or "off",
        broker.replaying.store.path if broker.replaying.store else "off",
    )
    await broker.stopping.wait()
    await broker.peers.flush(1.0)
    for task in broker.tasks.values():
        task.cancel()
    await asyncio.gather(*broker.tasks.values(), return_exceptions=True)
    broker.rpc.close()
    await broker.rpc.wait_closed()
    if stop_metrics is not None:
        await asyncio.to_thread(stop_metrics)
    broker.peers.close()
    broker.clients.close()
    broker.replaying.close()
    for guard in guards:
        guard.stop()
    ctx.destroy(linger=200)
    if broker.failure is not None:
        raise BrokerFailure(broker.failure)
    clear_running(broker.data_dir, broker.id)
    log.info("%s stopped", broker.id)


async def tick_lst(broker: Broker) -> None:
    """Close LST windows every Δt while links are active (the table also rolls them on
    every enqueue and send: ticks keep CE fresh between events); sleep while idle."""
    loop = asyncio.get_running_loop()
    activity = broker.peers.activity
    while True:
        await activity.wait()
        await asyncio.sleep(broker.settings.lst.window)
        broker.lst.advance(loop.time())


async def sample_load(broker: Broker) -> None:
    """Hand the load analysis a sample of the counts every second (DESIGN §9)."""
    loop = asyncio.get_running_loop()
    clients, links = broker.clients, broker.links
    while True:
        broker.load_meter.sample(
            LoadSample(
                loop.time(),
                clients.counters["publications"],
                broker.received[Notification],
                {name: link.copies for name, link in links.items()},
                clients.counters["deliveries"],
                clients.sessions.delivered(),
                sum(link.bytes_sent for link in links.values()) + clients.outbox.bytes_out,
                sum(broker.process.cpu_times()[:2]),
            )
        )
        await asyncio.sleep(1.0)
