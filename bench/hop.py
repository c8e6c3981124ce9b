"""Broker-hop throughput: one broker process against a bare pyzmq relay (DESIGN §5).

The harness plays the neighbours of broker ``b:0`` of fig2: it installs subscriptions by
sending SBP messages as neighbour ``c:0`` (so matching notifications are forwarded to
``c:0``), pushes notifications into ``b:0`` as neighbour ``a:0`` and counts what arrives at
``c:0``'s endpoint. The relay is the same shape without routing: a process that pulls
frames and pushes them on unchanged, written with the same asyncio/pyzmq pattern as the
broker's transport (non-blocking sends, drain loops), so the ratio isolates the cost of
decoding, matching and routing.

``python -m bench.hop`` prints both rates and the ratio.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiozmq.rpc
import zmq
import zmq.asyncio
from bitarray import frozenbitarray

from octopis.cluster.launcher import broker_command, find_free_base_port
from octopis.core import Notification, Subscribe, SubState
from octopis.quotes import random_quotes, stock_subscriptions
from octopis.topology import build_preset
from octopis.transport.settings import BrokerSettings
from octopis.transport.wire import Hello, encode_peer

BROKER, UPSTREAM, DOWNSTREAM = "b:0", "a:0", "c:0"


def relay_main(pull_endpoint: str, push_endpoint: str) -> None:
    """A bare relay: every frame pulled is pushed on unchanged."""

    async def relay() -> None:
        ctx = zmq.asyncio.Context()
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.bind(pull_endpoint)
        push.connect(push_endpoint)
        inbound = zmq.Socket.shadow(pull.underlying)
        outbound = zmq.Socket.shadow(push.underlying)
        while True:
            try:
                frames = inbound.recv_multipart(zmq.NOBLOCK)

            except zmq.Again:
                await pull.poll(None, zmq.POLLIN)
                continue
            while True:
                try:
                    outbound.send_multipart(frames, zmq.NOBLOCK)
                    break
                except zmq.Again:
                    await push.poll(None, zmq.POLLOUT)

    asyncio.run(relay())


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
        self.probe = self.frames[matched.index(True)]

    def endpoint(self, broker: str) -> str:
        return self.scot.brokers[broker].endpoint

    def run_broker(
        self, tmp: Path, mode: str = "snr", settings: BrokerSettings | None = None
    ) -> float:
        """Notifications per second through a real broker process."""
        path = tmp / "fig2.json"
        path.write_text(json.dumps(self.scot.to_json()))
        config = tmp / "broker.toml"
        config.write_text((settings or BrokerSettings()).to_toml())
        proc = subprocess.Popen(
            broker_command(path, BROKER, mode, config, "WARNING"), stdin=subprocess.DEVNULL
        )
        try:
            return asyncio.run(self._drive(install=True, expected=self.forwarded))
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    def run_relay(self) -> float:
        """Frames per second through the bare relay."""
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, bench.hop as h; h.relay_main(*sys.argv[1:])",
                self.endpoint(BROKER),
                self.endpoint(DOWNSTREAM),
            ],
            stdin=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            return asyncio.run(self._drive(install=False, expected=len(self.frames)))
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    async def _drive(self, install: bool, expected: int) -> float:
        if install:
            await self._install()
        return await asyncio.to_thread(self._pump, expected)

    def _pump(self, expected: int) -> float:
        """Push every frame from one thread, count arrivals in another; blocking sockets,
        so ZeroMQ's high-water marks pace the sender to the hop's speed."""
        ctx = zmq.Context()
        down = ctx.socket(zmq.PULL)
        down.bind(self.endpoint(DOWNSTREAM))
        up = ctx.socket(zmq.PUSH)
        up.connect(self.endpoint(BROKER))
        down.setsockopt(zmq.RCVTIMEO, 500)
        try:
            while True:  # warm up: until one notification makes it through
                up.send_multipart(self.probe)
                try:
                    down.recv()
                    break
                except zmq.Again:
                    continue
            with contextlib.suppress(zmq.Again):
                while True:
                    down.recv()
            down.setsockopt(zmq.RCVTIMEO, 30_000)
            sender = threading.Thread(target=lambda: [up.send_multipart(f) for f in self.frames])
            started = time.perf_counter()
            sender.start()
            for _ in range(expected):
                down.recv()
            elapsed = time.perf_counter() - started
            sender.join()
            return expected / elapsed
        finally:
            ctx.destroy(linger=0)

    async def _install(self) -> None:
        ctx = zmq.asyncio.Context()
        via = ctx.socket(zmq.PUSH)
        via.connect(self.endpoint(BROKER))
        for neighbour in (UPSTREAM, DOWNSTREAM, "b:1", "b:2"):
            await via.send_multipart(encode_peer(neighbour, Hello()))
        cbv = frozenbitarray("100")
        for i, f in enumerate(self.filters):
            await via.send_multipart(
                encode_peer(
                    DOWNSTREAM, Subscribe(f"s#{i}", DOWNSTREAM, f, SubState.PRIMARY, cbv, 0.0, 1)
                )
            )
        control = await aiozmq.rpc.connect_rpc(
            connect=self.scot.brokers[BROKER].control_endpoint, timeout=5
        )
        try:
            while (await control.call.stats())["routing_table_size"] < len(self.filters):
                await asyncio.sleep(0.1)
        finally:
            control.close()
            ctx.destroy(linger=1000)


def main() -> None:
    """Print broker and relay rates side by side."""
    import tempfile

    bench = HopBench(subscriptions=10_000, notifications=20_000)
    with tempfile.TemporaryDirectory() as tmp:
        broker = bench.run_broker(Path(tmp))
    relay = bench.run_relay()
    print(
        f"broker {broker:,.0f} notifications/s, relay {relay:,.0f} frames/s, "
        f"ratio {broker / relay:.2f} ({bench.forwarded} of {len(bench.frames)} forwarded)"
    )


if __name__ == "__main__":
    main()
