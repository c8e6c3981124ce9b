"""Broker-hop throughput: one broker process against a bare pyzmq relay (DESIGN §5).

The harness plays the neighbours of broker ``b:0`` of fig2: it installs subscriptions by
sending SBP messages as neighbour ``c:0`` (so matching notifications are forwarded to
``c:0``), pushes notifications into ``b:0`` as neighbour ``a:0`` and counts what arrives at
``c:0``'s endpoint. The relay is the same shape without routing: a process that pulls
messages and pushes them on unchanged, with the same asyncio pattern as the broker's
transport (non-blocking sends, drain loops), in two styles: the textbook pyzmq relay
(``recv_multipart``/``send_multipart``, the issue's baseline) and one built from the
broker's own receive/send primitives, against which the ratio is the cost of decoding,
matching and routing alone. Rates count whole two-part messages.

Each run also reports the CPU time the hop process (every thread of the broker or relay,
ZeroMQ's I/O thread included) spent per notification over the measured window. The two
cores are shared with the harness's sender and receiver, so the rate moves by only about
half of a change in the hop's CPU; CPU per notification, compared round by round, shows
what a change saves in the hop itself.

``HopBench.latency`` measures the other end: notifications sent one at a time at a low
rate, each timed from its send to its arrival downstream (p50, p99). A broker may run
from another source tree (``tree``: a checkout of an earlier commit, built in place), so
that a change is measured beside what it changed in one run.

``python -m bench.hop`` prints the broker's rate and its ratio to each relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, NamedTuple

import aiozmq.rpc
import msgpack
import zmq
import zmq.asyncio
from bitarray import frozenbitarray

from octopis.cluster.launcher import broker_command, find_free_base_port
from octopis.core import Notification, Subscribe, SubState
from octopis.core.codec import Heartbeat, Hello, Synced, encode_peer
from octopis.keys import Keys, connect_securely, make_keys
from octopis.quotes import random_quotes, stock_subscriptions
from octopis.settings import BrokerSettings, Links
from octopis.topology import build_preset
from octopis.transport.peer_input import PEER_BATCH
from octopis.transport.zmqio import FastSocket
from octopis.wire import NOTIFY_HEAD

BROKER, UPSTREAM, DOWNSTREAM = "b:0", "a:0", "c:0"
PLAYED = 1
"""The incarnation of every neighbour the harness plays."""
ACK_EVERY = 1000
"""Notifications the played downstream takes between custody acknowledgements."""


class Downstream:
    """The played downstream neighbour: counts the notifications that arrive, one or a
    batch per message (link-level frames such as the broker's heartbeats are not
    counted), and acknowledges them to the broker's custody every :data:`ACK_EVERY`
    frames, as a real neighbour would."""

    def __init__(self, down: zmq.Socket, up: zmq.Socket, incarnation: int | None) -> None:
        self.down, self.up, self.incarnation = down, up, incarnation
        self.taken = 0
        self.frames = 0
        """Routing frames and heartbeats taken (what a neighbour acknowledges)."""

    def take(self) -> int:
        """Wait for the next message carrying notifications; returns how many it carries;
        ``zmq.Again`` when none came within the socket's receive timeout."""
        deadline = time.monotonic() + self.down.getsockopt(zmq.RCVTIMEO) / 1000
        while True:
            bodies = self.down.recv_multipart()[1:]
            count = sum(body.startswith(NOTIFY_HEAD) for body in bodies)
            self.frames += count
            if count:
                break
            if time.monotonic() > deadline:
                raise zmq.Again
        before = self.taken
        self.taken += count
        if self.incarnation is not None and self.taken // ACK_EVERY > before // ACK_EVERY:
            self.up.send_multipart(
                encode_peer(DOWNSTREAM, Heartbeat(PLAYED, self.incarnation, self.frames, True))
            )
        return count

    def warm_up(self, probe: list[bytes]) -> None:
        """Send ``probe`` until one makes it through, then take whatever else arrives
        within the receive timeout."""
        while True:
            self.up.send_multipart(probe)
            try:
                self.take()
                break
            except zmq.Again:
                continue
        with contextlib.suppress(zmq.Again):
            while True:
                self.take()


def relay_main(pull_endpoint: str, push_endpoint: str, style: str = "pyzmq") -> None:
    """A bare relay: every message pulled is pushed on unchanged, one message a send.

    ``pyzmq``: the textbook relay, ``recv_multipart``/``send_multipart``. ``transport``:
    the broker's own compiled receive and send (:class:`FastSocket`: a drain of whatever
    is waiting, sends without exceptions), so that the ratio against it is the cost of
    decoding, matching and routing alone.
    """

    async def relay() -> None:
        ctx = zmq.asyncio.Context()
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.bind(pull_endpoint)
        push.connect(push_endpoint)
        receive, send = RELAY_STYLES[style](pull, push)
        while True:
            messages = receive()
            if not messages:
                await pull.poll(None, zmq.POLLIN)
                continue
            for frames in messages:
                while not send(frames):
                    await push.poll(None, zmq.POLLOUT)

    asyncio.run(relay())


def _textbook(pull: zmq.Socket, push: zmq.Socket) -> tuple[Callable, Callable]:
    """``recv_multipart`` and ``send_multipart``, non-blocking (on shadows: the plain
    sockets' calls, not asyncio's futures)."""
    inbound = zmq.Socket.shadow(pull.underlying)
    outbound = zmq.Socket.shadow(push.underlying)

    def receive() -> list[list[bytes]]:
        try:
            return [inbound.recv_multipart(zmq.NOBLOCK)]
        except zmq.Again:
            return []

    def send(frames: list[bytes]) -> bool:
        try:
            outbound.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    return receive, send


def _transport(pull: zmq.Socket, push: zmq.Socket) -> tuple[Callable, Callable]:
    """The broker's compiled drain and send (:class:`FastSocket`)."""
    inbound, outbound = FastSocket(pull), FastSocket(push)
    return (lambda: inbound.receive(PEER_BATCH)), outbound.send_parts


RELAY_STYLES: dict[str, Callable[[zmq.Socket, zmq.Socket], tuple[Callable, Callable]]] = {
    "pyzmq": _textbook,
    "transport": _transport,
}
"""Relay style → its (receive, send) on the relay's (pull, push) sockets."""


def _cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has run, summed over its threads, to the nanosecond
    (Linux's ``schedstat``; the clock-tick counts of ``/proc/<pid>/stat`` step by 10 ms,
    3% of a round)."""
    total = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError), open(f"{task.path}/schedstat") as stat:
            total += int(stat.read().split()[0])  # a thread gone meanwhile: its time with it
    return total / 1e9


def _as_neighbour(sock: zmq.Socket, keys: Keys | None, endpoint: str) -> zmq.Socket:
    """Connect ``sock`` to the broker's ``endpoint`` as the played upstream neighbour:
    CURVE with its key pair when the run has ``keys``, in the clear otherwise."""
    if keys is not None:
        connect_securely(sock, keys.broker(UPSTREAM), keys.server_key(endpoint))
    sock.connect(endpoint)
    return sock


def _send_all(endpoint: str, path: str, keys_dir: str, ready: Event, go: Event) -> None:
    """Sender process: load the frames stored at ``path``, connect (with the keys in
    ``keys_dir``, if any), set ``ready``, and once ``go`` is set push them all (blocking
    sends: ZeroMQ's high-water marks pace it to the hop's speed)."""
    frames = msgpack.unpackb(Path(path).read_bytes())
    ctx = zmq.Context()
    up = _as_neighbour(ctx.socket(zmq.PUSH), Keys(keys_dir) if keys_dir else None, endpoint)
    ready.set()
    go.wait()
    for frame in frames:
        up.send_multipart(frame)
    ctx.destroy(linger=-1)


class HopRun(NamedTuple):
    """One run through the hop: notifications per second arriving downstream, and the
    hop process's CPU time (all its threads) per notification, in µs."""

    per_second: float
    cpu_us: float


class HopBench:
    """A broker process (or relay) with its neighbours played by this process."""

    def __init__(self, subscriptions: int, notifications: int, seed: int = 1) -> None:
        base = find_free_base_port(18)
        self.scot = build_preset("fig2", base_port=base)
        self.subscriptions = subscriptions
        quotes = random_quotes(max(notifications, 2000), seed=seed)
        self.filters = stock_subscriptions(quotes, subscriptions, seed=seed)
        self.frames = [
            encode_peer(UPSTREAM, Notification("P", i, 0.0, q))
            for i, q in enumerate(quotes[:notifications])
        ]
        matched = [any(f.matches(q) for f in self.filters) for q in quotes[:notifications]]
        self.forwarded = sum(matched)
        self.matched = [frame for frame, m in zip(self.frames, matched, strict=True) if m]
        """The frames the broker forwards downstream."""
        self.probe = self.matched[0]
        self.keys: Keys | None = None
        """The keys of the current broker run (CurveZMQ), or None (in the clear)."""

    def endpoint(self, broker: str) -> str:
        return self.scot.brokers[broker].endpoint

    def run_broker(
        self,
        tmp: Path,
        mode: str = "snr",
        settings: BrokerSettings | None = None,
        *,
        curve: bool = False,
        tree: Path | None = None,
        latency: tuple[float, int] | None = None,
    ) -> Any:
        """A :class:`HopRun` through a real broker process; with ``curve`` every
        socket of the hop speaks CurveZMQ (keys made in ``tmp``); ``tree``: the broker's
        code comes from that source tree; ``latency`` (rate, count): instead, the hop
        delays in seconds of ``count`` notifications sent one at a time at ``rate``."""
        path = tmp / "fig2.json"
        path.write_text(json.dumps(self.scot.to_json()))
        config = tmp / "broker.toml"
        # The harness plays the neighbours and sends them no heartbeats: detection off.
        config.write_text(
            (settings or BrokerSettings(links=Links(down_after=3600.0))).to_toml(changed_only=True)
        )
        keys_dir = make_keys(tmp / "keys", self.scot.endpoints_by_broker()) if curve else None
        self.keys = Keys(keys_dir) if keys_dir is not None else None
        proc = subprocess.Popen(
            broker_command(path, BROKER, mode, config, "WARNING", keys_dir),
            stdin=subprocess.DEVNULL,
            cwd=tree,
            env=None if tree is None else {**os.environ, "PYTHONPATH": str(tree)},
        )
        try:
            if latency is not None:
                incarnation = asyncio.run(self._install())
                return self._delays(incarnation, *latency)
            return asyncio.run(self._drive(proc.pid, install=True, expected=self.forwarded))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            self.keys = None

    def run_relay(self, style: str = "pyzmq") -> HopRun:
        """A :class:`HopRun` through a bare relay of ``style`` (see :func:`relay_main`)."""
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, bench.hop as h; h.relay_main(*sys.argv[1:])",
                self.endpoint(BROKER),
                self.endpoint(DOWNSTREAM),
                style,
            ],
            stdin=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            return asyncio.run(self._drive(proc.pid, install=False, expected=len(self.frames)))
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    async def _drive(self, hop: int, install: bool, expected: int) -> HopRun:
        incarnation = await self._install() if install else None
        return await asyncio.to_thread(self._pump, hop, expected, incarnation)

    def _pump(self, hop: int, expected: int, incarnation: int | None) -> HopRun:
        """Messages per second arriving downstream while a separate process pushes every
        frame upstream, and the CPU time of process ``hop`` (the broker or relay) per
        message meanwhile. Sender and receiver are separate processes: sharing one
        interpreter, the sender thread held the GIL while the hop queued, starving the
        receiver and measuring the harness rather than the hop."""
        ctx = zmq.Context()
        down = ctx.socket(zmq.PULL)
        if self.keys is not None:  # the broker pushes to c:0 as a CURVE client of its key
            pair = self.keys.broker(DOWNSTREAM)
            down.curve_secretkey, down.curve_publickey = pair.secret, pair.public
            down.curve_server = True
        down.bind(self.endpoint(DOWNSTREAM))
        up = _as_neighbour(ctx.socket(zmq.PUSH), self.keys, self.endpoint(BROKER))
        down.setsockopt(zmq.RCVTIMEO, 500)
        downstream = Downstream(down, up, incarnation)
        spawn = multiprocessing.get_context("spawn")
        ready, go = spawn.Event(), spawn.Event()
        sender = None
        try:
            downstream.warm_up(self.probe)
            down.setsockopt(zmq.RCVTIMEO, 30_000)
            with tempfile.NamedTemporaryFile(suffix=".msgpack") as stored:
                stored.write(msgpack.packb(self.frames))
                stored.flush()
                keys_dir = str(self.keys.directory) if self.keys is not None else ""
                sender = spawn.Process(
                    target=_send_all,
                    args=(self.endpoint(BROKER), stored.name, keys_dir, ready, go),
                )
                sender.start()
                if not ready.wait(60):
                    raise RuntimeError("the sender process did not start")
            cpu_before = _cpu_seconds(hop)
            started = time.perf_counter()
            go.set()
            got = 0
            while got < expected:
                got += downstream.take()
            elapsed = time.perf_counter() - started
            cpu = _cpu_seconds(hop) - cpu_before
            return HopRun(expected / elapsed, 1e6 * cpu / expected)
        finally:
            if sender is not None:
                sender.terminate()
                sender.join()
            ctx.destroy(linger=0)

    def _delays(self, incarnation: int, rate: float, count: int) -> list[float]:
        """Send ``count`` forwarded notifications one at a time, ``1 / rate`` seconds
        apart, each timed until it arrives downstream."""
        ctx = zmq.Context()
        down = ctx.socket(zmq.PULL)
        down.bind(self.endpoint(DOWNSTREAM))
        up = _as_neighbour(ctx.socket(zmq.PUSH), self.keys, self.endpoint(BROKER))
        down.setsockopt(zmq.RCVTIMEO, 5000)
        downstream = Downstream(down, up, incarnation)
        try:
            downstream.warm_up(self.probe)
            delays = []
            for i in range(count):
                started = time.perf_counter()
                up.send_multipart(self.matched[i % len(self.matched)])
                downstream.take()
                delays.append(time.perf_counter() - started)
                pause = 1 / rate - (time.perf_counter() - started)
                if pause > 0:
                    time.sleep(pause)
            return delays
        finally:
            ctx.destroy(linger=0)

    async def _install(self) -> int:
        """Handshake as every neighbour, install the subscriptions; returns the broker's
        incarnation."""
        ctx = zmq.asyncio.Context()
        via = _as_neighbour(ctx.socket(zmq.PUSH), self.keys, self.endpoint(BROKER))
        endpoint = self.scot.brokers[BROKER].control_endpoint
        control = await aiozmq.rpc.connect_rpc(timeout=5)
        if self.keys is not None:
            sock = control.transport.get_extra_info("zmq_socket")
            connect_securely(sock, self.keys.admin(), self.keys.server_key(endpoint))
        await control.transport.connect(endpoint)
        incarnation = (await control.call.status())["incarnation"]
        for neighbour in (UPSTREAM, DOWNSTREAM, "b:1", "b:2"):
            await via.send_multipart(encode_peer(neighbour, Hello(PLAYED, incarnation)))
            serving = Heartbeat(PLAYED, incarnation, 0, True)
            await via.send_multipart(encode_peer(neighbour, serving))
            await via.send_multipart(encode_peer(neighbour, Synced(0, True, False, False)))
        cbv = frozenbitarray("100")
        for i, f in enumerate(self.filters):
            await via.send_multipart(
                encode_peer(
                    DOWNSTREAM, Subscribe(f"s#{i}", DOWNSTREAM, f, SubState.PRIMARY, cbv, 0.0, 1)
                )
            )
        try:
            while (await control.call.stats())["routing_table_size"] < len(self.filters):
                await asyncio.sleep(0.1)
        finally:
            control.close()
            ctx.destroy(linger=1000)
        return incarnation


NO_CUSTODY = BrokerSettings(links=Links(down_after=3600.0, custody_limit=0))
"""The broker with custody off (what a link failure costs is then lost frames)."""


def main() -> None:
    """Print the broker's rate (custody on and off) beside both relays'."""
    bench = HopBench(subscriptions=10_000, notifications=60_000)
    with tempfile.TemporaryDirectory() as tmp:
        broker = bench.run_broker(Path(tmp))
        bare = bench.run_broker(Path(tmp), settings=NO_CUSTODY)
        curve = bench.run_broker(Path(tmp), curve=True)
    relays = {style: bench.run_relay(style) for style in RELAY_STYLES}
    print(
        f"broker {broker.per_second:,.0f} notifications/s ({bench.forwarded} of "
        f"{len(bench.frames)}), {broker.cpu_us:.2f} µs CPU each"
    )
    print(
        f"broker with CurveZMQ {curve.per_second:,.0f} notifications/s, "
        f"ratio {curve.per_second / broker.per_second:.2f}"
    )
    print(
        f"broker without custody {bare.per_second:,.0f} notifications/s, "
        f"custody costs {1 - broker.per_second / bare.per_second:.1%}"
    )
    for style, run in relays.items():
        print(
            f"{style} relay {run.per_second:,.0f} messages/s, {run.cpu_us:.2f} µs CPU each, "
            f"ratio {broker.per_second / run.per_second:.2f}"
        )


if __name__ == "__main__":
    main()
