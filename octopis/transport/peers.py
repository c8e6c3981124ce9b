"""A broker's peer links (DESIGN §7), composed of three parts with one job each:

- :class:`~octopis.transport.peer_output.PeerOutput`, the sending side: one
  :class:`OutputLink` per neighbour, and the acknowledgements backpressure withholds;
- :class:`~octopis.transport.peer_liveness.PeerLiveness`: handshakes with incarnations,
  heartbeats heard, failure detection, the start of serving;
- :class:`~octopis.transport.peer_input.PeerInput`, the receiving side: one PULL for
  every neighbour's frames, read in passes.

Serving. A broker is *serving* once every live neighbour has handed it its resync state
(or is down); heartbeats carry the flag, and a neighbour's LST row says down until the
neighbour is up, synced and serving, so traffic takes detours around a broker that is
still filling its table (DESIGN §7).

What these frames mean is not decided here: each HELLO, heartbeat, SYNCED and silence
moves the neighbour's state machine in the broker's node
(:class:`~octopis.core.neighbours.Neighbours`), which says whether its frames are for
us, whether to route through it, and when the broker serves
(:meth:`~octopis.core.node.BrokerNode.serve_if_ready`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

import zmq.asyncio

from octopis.core import LinkStatusTable
from octopis.core.node import BrokerNode
from octopis.logs import RateLimitedLog
from octopis.settings import BrokerSettings, Links
from octopis.transport.links import Activity, OutputLink, SendPass
from octopis.transport.peer_events import PeerEvents
from octopis.transport.peer_input import PeerInput
from octopis.transport.peer_liveness import PeerLiveness
from octopis.transport.peer_output import PeerOutput
from octopis.transport.pressure import PressureGauge
from octopis.transport.security import Curve

log = logging.getLogger("octopis.broker.peers")


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """What a broker's peer links read of its settings: the ``[links]`` section,
    ``limits.frame_bytes``, and for backpressure ``clients.queue_limit`` (deliveries
    waiting that hold the neighbours back) and ``memory.budget_mb``; ``logs.interval``
    for their warnings."""

    links: Links
    frame_bytes: int
    deliveries_limit: int
    budget_mb: int
    log_interval: float

    @classmethod
    def of(cls, settings: BrokerSettings) -> PeerSettings:
        """The peer links' part of ``settings``."""
        return cls(
            settings.links,
            settings.limits.frame_bytes,
            settings.clients.queue_limit,
            settings.memory.budget_mb,
            settings.logs.interval,
        )


class PeerLinks:
    """Peer input, output links, handshakes and failure detection of one broker: the
    three parts of the module docstring, made and run together."""

    def __init__(
        self,
        broker_id: str,
        endpoints: dict[str, str],
        bind: str,
        settings: PeerSettings,
        lst: LinkStatusTable,
        ctx: zmq.asyncio.Context,
        events: PeerEvents,
        node: BrokerNode,
        incarnation: int,
        curve: Curve | None = None,
        send_pass: SendPass | None = None,
        waiting_deliveries: Callable[[], int] = lambda: 0,
        idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.id = broker_id
        self.lst = lst
        self.node = node
        self.neighbours = node.neighbours
        self.counters: Counter[str] = Counter()
        self.activity = Activity()
        send_pass = send_pass or SendPass()
        warn = RateLimitedLog(log, settings.log_interval)
        links = settings.links
        self.pressure = PressureGauge(
            broker_id,
            links.queue_limit,
            settings.deliveries_limit,
            settings.budget_mb,
            self.counters,
            warn,
        )
        """Which neighbours are held back, and why (checked every tick, DESIGN §8)."""
        self.output = PeerOutput(
            broker_id,
            incarnation,
            links,
            ctx,
            lst,
            self.neighbours,
            self.pressure,
            lambda: node.serving,
            waiting_deliveries,
            self.counters,
            self.activity,
            send_pass,
            curve,
        )
        self.links = self.output.links
        self.liveness = PeerLiveness(
            broker_id,
            incarnation,
            node,
            lst,
            self.output,
            events,
            self.counters,
            heartbeat=links.heartbeat,
            down_after=links.down_after,
            ack_interval=links.ack_interval,
        )
        self.receiver = PeerInput(
            broker_id,
            bind,
            settings.frame_bytes,
            ctx,
            self.neighbours,
            events,
            self.liveness,
            self.output,
            self.counters,
            warn,
            send_pass,
            idle,
            curve,
        )
        self.input = self.receiver.socket
        self.detections = self.liveness.detections
        for name, endpoint in endpoints.items():
            self.output.open(name, endpoint)
            self.receiver.welcome(name)

    def add(self, name: str, endpoint: str, now: float) -> Coroutine[None, None, None]:
        """A link to ``name``, a neighbour that joined the overlay (DESIGN §9), at
        ``endpoint``: down (never heard) until its handshake; our HELLO waits on it.
        Returns the coroutine that serves it (the broker runs it as a task)."""
        if name in self.links:
            raise ValueError(f"{self.id} has a link to {name} already")
        link = self.output.open(name, endpoint)
        self.receiver.welcome(name)
        self.lst.add_link(name, now)
        self.output.hello(name, now)
        return link.run()

    def remove(self, name: str) -> OutputLink:
        """Drop the link to ``name``, a neighbour that left; what waits on it is dropped
        with it (the caller checked that nothing does: :meth:`PeerOutput.carrying`).
        Returns the link, for the caller to close once the task serving it has ended."""
        link = self.output.close(name)
        self.receiver.depart(name)
        self.lst.remove_link(name)
        return link

    def tasks(self) -> list[tuple[str, Coroutine[None, None, None]]]:
        """The coroutines that serve the links: (name, coroutine)."""
        loop = asyncio.get_running_loop()
        self.liveness.start(loop.time())
        return [
            *((f"link {n}", link.run()) for n, link in self.links.items()),
            ("peers", self.receiver.run(loop)),
            ("liveness", self.liveness.run(loop, self.receiver.caught_up)),
        ]

    def snapshot(self, now: float) -> dict[str, dict[str, object]]:
        """Per neighbour: state, incarnation, silence, restarts, queue length."""
        return {
            name: {
                "state": "up" if s.up else "down",
                "phase": s.describe(),
                "serving": s.serving,
                "incarnation": s.incarnation,
                "silent": now - s.last_heard,
                "restarts": s.restarts,
                "queue_length": len(self.links[name].queue),
                "custody": len(self.links[name].custody),
                "full": name in self.pressure.rule.full,
            }
            for name, s in self.neighbours.items()
        }

    async def flush(self, timeout: float) -> None:
        """Give queued frames up to ``timeout`` seconds to leave (clean shutdown)."""
        await self.output.flush(timeout)

    def close(self) -> None:
        """Stop watching the input socket."""
        self.receiver.close()
