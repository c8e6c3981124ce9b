"""What leaves a broker's client socket (DESIGN §4, §8): deliveries, replies and notices,
per connection in order.

Deliveries made during a send pass wait for its end and leave as one message per
connection (at most :data:`DELIVERIES_PER_MESSAGE` each). What is refused, what waits
for ``clients.capacity`` and when it leaves, what a connection whose pipe is full may
queue and what a slow consumer loses are the node's rules
(:class:`~octopis.core.client_flow.ClientFlow`); this module sends, sleeps and polls as
they say, and logs.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from octopis.core.client_flow import ClientFlow
from octopis.logs import RateLimitedLog
from octopis.settings import Clients
from octopis.transport.links import LOOP_SLACK, InputWaiter, SendPass
from octopis.transport.zmqio import FastSocket
from octopis.wire import LEFT_AT, pack
from octopis.wire.client import Notice, Reply

if TYPE_CHECKING:
    from octopis.transport.connections import ClientSession

DELIVERIES_PER_MESSAGE = 16
"""Deliveries one message to a connection carries at most: ZeroMQ's high-water mark
(``clients.sndhwm``) counts messages, so a stalled connection holds at most this many
times as many deliveries in ZeroMQ."""


PIPE_FULL = zmq.Again()
"""What :meth:`ClientOutbox._try_send` returns for a connection whose pipe is full (made
once: pyzmq's exceptions cost microseconds to construct)."""


class ClientOutbox:
    """The client socket's output (see the module docstring). It shares with the client
    sessions their ``connections`` (each one's backlog), the gateways' ``outlets``, the
    ``dropped`` reasons and the ``counters``; ``drop`` drops a slow consumer. ``settings``:
    the ``[clients]`` section (capacity, backlog and publish window, slow policy,
    timeout, queue limit)."""

    def __init__(
        self,
        broker_id: str,
        settings: Clients,
        fast: FastSocket,
        send_pass: SendPass,
        connections: dict[bytes, ClientSession],
        outlets: dict[bytes, Callable[[list[bytes]], bool]],
        counters: Counter[str],
        warn: RateLimitedLog,
        drop: Callable[[bytes, str], object],
    ) -> None:
        self.broker_id = broker_id
        self.settings = settings
        self._fast = fast
        self.send_pass = send_pass
        self.connections = connections
        self.outlets = outlets
        self.counters = counters
        self._warn = warn
        self.drop = drop
        self.flow: ClientFlow[tuple[bytes, list[bytes]]] = ClientFlow(
            broker_id, settings, LOOP_SLACK, counters
        )
        """The client side's flow control: refusals, pacing, backlogs, slow consumers."""
        self.dropped = self.flow.dropped
        """Connections dropped as slow consumers → the reason."""
        self.waiter: InputWaiter | None = None
        """The socket's input waiter, poked after each send (set when the input starts)."""
        self._held: dict[bytes, list[bytes]] = {}
        """Deliveries of the open send pass, per connection: ``[names, body, ...]``."""
        self._held_count: Counter[bytes] = Counter()
        """Per connection: the deliveries (client names) in :attr:`_held`, counted only
        when deliveries are paced (nothing else reads them)."""
        self._pacing: asyncio.Task[None] | None = None
        self.bytes_out = 0
        """Bytes of notifications delivered (the load analysis reads it, DESIGN §9)."""

    def notify(self, identity: bytes, message: Reply | Notice) -> None:
        """Send a notice to a connection behind the deliveries made before it: those held
        for it in this send pass, and those waiting for ``clients.capacity`` (a
        ``released`` notice must follow the old host's last delivery)."""
        parts = self._held.pop(identity, None)
        if parts:
            self._out(identity, parts, self._held_count.pop(identity, 0))
        if self.flow.paced:
            self.flow.wait((identity, [pack(message)]), 0)
            self._pace()
        else:
            self.send(identity, [pack(message)])

    def deliver(self, deliveries: dict[bytes, list[str]], body: bytes) -> None:
        """Send one notification (its NOTIFY ``body``) to the named clients of each
        connection: ``[names, body]`` per connection; during a send pass, a connection's
        deliveries wait for its end and leave as one message ``[names, body, names,
        body, ...]``."""
        send_pass = self.send_pass
        held = self._held
        counted = self._held_count if self.flow.pacer is not None else None
        connections = self.connections
        self.bytes_out += len(body) * len(deliveries)
        for identity, names in deliveries.items():
            self.counters["deliveries"] += len(names)
            connection = connections.get(identity)
            if connection is not None:
                connection.delivered.update(names)
            if not send_pass.open:
                self._out(identity, [pack(names), body], len(names))
                continue
            if counted is not None:
                counted[identity] += len(names)
            if identity in held:
                held[identity] += (pack(names), body)
            else:
                held[identity] = [pack(names), body]
                if len(held) == 1:
                    send_pass.hold(self, self._send_held)

    def _send_held(self, now: float) -> None:
        """The end of a send pass: each connection's deliveries in messages of at most
        :data:`DELIVERIES_PER_MESSAGE`; one whose pipe is full queues them one by one, so
        its backlog counts deliveries."""
        held, self._held = self._held, {}
        counts = self._held_count
        if counts:
            self._held_count = Counter()
        for identity, parts in held.items():
            self._out(identity, parts, counts[identity])

    def _out(self, identity: bytes, parts: list[bytes], count: int) -> None:
        """Deliveries ``[names, body, ...]`` (``count`` client names in all) to a
        connection: at once, or, when ``clients.capacity`` has no slot for them now,
        queued for :meth:`_release_paced`."""
        flow = self.flow
        if flow.pacer is None or flow.admit(
            (identity, parts), count, asyncio.get_running_loop().time()
        ):
            self._flush(identity, parts)
        else:
            self._pace()

    def _pace(self) -> None:
        """Messages wait for ``clients.capacity``: release them as it says."""
        if self._pacing is None:
            self._pacing = asyncio.get_running_loop().create_task(self._release_paced())

    async def _release_paced(self) -> None:
        """Send the queued messages in order, each once the flow control says its slots
        of ``clients.capacity`` have passed."""
        loop = asyncio.get_running_loop()
        flow = self.flow
        try:
            while flow.paced:
                wait = flow.due(loop.time())
                if wait > 0:
                    await asyncio.sleep(wait)
                self._flush(*flow.release())
        finally:
            self._pacing = None

    def _flush(self, identity: bytes, parts: list[bytes]) -> None:
        """Send deliveries ``[names, body, ...]`` to a connection in messages of at most
        :data:`DELIVERIES_PER_MESSAGE`."""
        step = 2 * DELIVERIES_PER_MESSAGE
        connection = self.connections.get(identity)
        for i in range(0, len(parts), step):
            if connection is not None and connection.backlog:
                for j in range(i, len(parts), 2):
                    self.send(identity, parts[j : j + 2])
                break
            batch = parts[i : i + step]
            if len(batch) > 2:
                self.counters["deliveries_batched"] += len(batch) // 2
            self.send(identity, batch)

    def send(self, identity: bytes, parts: list[bytes]) -> None:
        """Send to a connection now, or queue behind its backlog when its pipe is full.
        Replies go this way: they wait for no delivery (``clients.capacity`` paces
        deliveries and the notices that must follow them, not answers to requests).

        The ROUTER is also read through an :class:`InputWaiter`; every send pokes it, so
        a send that consumes ZeroMQ's edge-triggered event cannot strand a request.
        """
        connection = self.connections.get(identity)
        if connection is not None and connection.backlog:
            if self.flow.backlog_takes(len(connection.backlog), parts):
                connection.backlog.append(parts)
            else:
                self._slow_consumer(identity, connection, parts)
            return
        problem = self._try_send(identity, parts)
        if problem is None:
            return
        if problem is PIPE_FULL and connection is not None:
            if len(parts) > 2:  # a batch of deliveries queues as single ones
                connection.backlog = deque(parts[i : i + 2] for i in range(0, len(parts), 2))
            else:
                connection.backlog = deque([parts])
            asyncio.get_running_loop().create_task(self._drain(identity, connection))
        else:
            self.counters["undeliverable"] += 1
            self._warn.warning(
                "unreachable",
                "%s cannot reach client %s: %s",
                self.broker_id,
                identity.hex(),
                problem,
            )

    def _slow_consumer(
        self, identity: bytes, connection: ClientSession, parts: list[bytes]
    ) -> None:
        """``parts`` found the connection's backlog full: ``clients.slow_policy`` as the
        flow control applies it (:meth:`ClientFlow.overflow`)."""
        backlog = connection.backlog
        assert backlog is not None
        overflow = self.flow.overflow(identity, backlog, parts)
        notice = overflow.notice
        if notice is None:
            connection.overflowed += overflow.dropped
            self._warn.warning(
                "overflow",
                "%s dropped the oldest delivery queued for slow client connection %s "
                "(clients.backlog_limit = %d)",
                self.broker_id,
                identity.hex(),
                self.flow.backlog_limit,
            )
            return
        self.drop(identity, notice.reason)
        backlog.append([pack(notice)])

    def _try_send(self, identity: bytes, parts: list[bytes]) -> BaseException | None:
        """Send ``parts`` to a connection now: None, or why not (:data:`PIPE_FULL` when
        its pipe is full). Deliveries (more than one part) end with when they left."""
        outlet = self.outlets.get(identity)
        if outlet is not None:
            return None if outlet(parts) else PIPE_FULL
        message = [identity, *parts]
        if len(parts) > 1:
            message.append(LEFT_AT.pack(time.time()))
        try:
            return None if self._fast.send_parts(message) else PIPE_FULL
        except zmq.ZMQError as exc:
            return exc
        finally:
            if self.waiter is not None:
                self.waiter.poke()

    async def _drain(self, identity: bytes, connection: ClientSession) -> None:
        """Send the backlog as the pipe takes it (polling every 1–50 ms while it is full).
        A live connection is waited for (its backlog is bounded by the slow-consumer
        policy); one dropped meanwhile is given ``clients.timeout`` to take its notice,
        then what is left counts as undeliverable."""
        backlog = connection.backlog
        assert backlog is not None
        loop = asyncio.get_running_loop()
        progress = loop.time()
        pause = 0.001
        while backlog:
            problem = self._try_send(identity, backlog[0])
            if problem is None:
                backlog.popleft()
                progress, pause = loop.time(), 0.001
                if not backlog and (notice := self.flow.drained(connection.overflowed)):
                    backlog.append([pack(notice)])
                    connection.overflowed = 0
            elif problem is PIPE_FULL and self.flow.keeps_waiting(
                identity in self.connections, loop.time() - progress
            ):
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.05)
            else:
                self.counters["undeliverable"] += len(backlog)
                self._warn.warning(
                    "lost",
                    "%s lost client %s with %d frames queued: %s",
                    self.broker_id,
                    identity.hex(),
                    len(backlog),
                    f"it took nothing for {self.settings.timeout:g} s"
                    if problem is PIPE_FULL
                    else problem,
                )
                backlog.clear()
        connection.backlog = None

    def backlog(self) -> int:
        """Frames queued for clients whose pipes are full."""
        return sum(len(c.backlog or ()) for c in self.connections.values())

    def close(self) -> None:
        """Stop pacing deliveries."""
        if self._pacing is not None:
            self._pacing.cancel()
