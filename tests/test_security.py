"""CurveZMQ and ZAP on a broker's sockets (``octopis.transport.security``, DESIGN §8):
outsiders get nothing through the peer, client and control sockets of fig2's brokers, and
every attempt is counted. The same attacks on an ``--insecure`` overlay get through, so
these checks can fail. Processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiozmq.rpc
import pytest
import zmq
import zmq.asyncio
from conditions import closing_control, until

from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster, prepare_topology
from octopis.core import Notification
from octopis.core.codec import Hello, encode_peer
from octopis.filters.language import parse_publication
from octopis.keys import KEYS_ENV, KeyPair, Keys, connect_securely
from octopis.settings import BrokerSettings
from octopis.wire import pack

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

TARGET = "c:0"
IMPERSONATED = "b:0"
"""A neighbour of :data:`TARGET` whose name the forged peer frames carry."""
FILTER = "[class,eq,'STOCK'],[symbol,eq,'OCTO']"
QUOTE = "[class,'STOCK'],[symbol,'OCTO'],[close,1.5]"
SILENCE = 2.0
"""Seconds an outsider waits for an answer that must not come."""


@pytest.fixture(params=[True, False], ids=["keys", "insecure"])
def fig2(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalCluster]:
    """fig2 in DNR mode, with keys (the SDK finds them through $OCTOPIS_KEYS) or without."""
    scot, path = prepare_topology(tmp_path, preset="fig2")
    cluster = LocalCluster(
        scot, path, "dnr", tmp_path, BrokerSettings(), secure=request.param, forked=True
    )
    cluster.spawn()
    if cluster.keys_dir is not None:
        monkeypatch.setenv(KEYS_ENV, str(cluster.keys_dir))
    else:
        monkeypatch.delenv(KEYS_ENV, raising=False)
    try:
        asyncio.run(closing_control(cluster, cluster.wait_ready(120)))
        yield cluster
    finally:
        cluster.stop()


def _stranger() -> KeyPair:
    """A key pair no keys directory lists."""
    public, secret = zmq.curve_keypair()
    return KeyPair(public, secret)


def _socket(kind: int, endpoint: str, keys: Keys | None, pair: KeyPair | None) -> zmq.Socket:
    """A raw socket to ``endpoint``: in the clear, or CURVE with ``pair`` (the server's
    key from ``keys``)."""
    sock = zmq.asyncio.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if pair is not None and keys is not None:
        connect_securely(sock, pair, keys.server_key(endpoint))
    sock.connect(endpoint)
    return sock


async def _send(sock: zmq.Socket, parts: list[bytes]) -> bool:
    """Send, or give up after :data:`SILENCE` seconds (a socket whose handshake failed
    has no peer to send to)."""
    try:
        await asyncio.wait_for(sock.send_multipart(parts), SILENCE)
    except TimeoutError:
        return False
    return True


async def _answer(sock: zmq.Socket, request: dict) -> bytes | None:
    """Send a client request; its answer, or None after :data:`SILENCE` seconds."""
    if await _send(sock, [pack({**request, "req": 1})]) and await sock.poll(
        SILENCE * 1000, zmq.POLLIN
    ):
        return (await sock.recv_multipart())[-1]
    return None


async def _control(endpoint: str, keys: Keys | None, pair: KeyPair | None) -> object:
    """A control RPC client with ``pair`` (or none), as an outsider would make it."""
    client = await aiozmq.rpc.connect_rpc(timeout=SILENCE)
    if pair is not None and keys is not None:
        connect_securely(
            client.transport.get_extra_info("zmq_socket"), pair, keys.server_key(endpoint)
        )
    await client.transport.connect(endpoint)
    return client


async def _outsiders(cluster: LocalCluster) -> dict:
    """Every attack at once on :data:`TARGET`, beside a legitimate subscriber and
    publisher there; returns what came through."""
    scot = cluster.scot
    target = scot.brokers[TARGET]
    keys = Keys(cluster.keys_dir) if cluster.keys_dir is not None else None
    stranger = _stranger()
    status = (await cluster.ask([TARGET], "status", 5.0))[TARGET]
    sub = await Subscriber.connect(target.client_endpoint, "legit")
    stream = await sub.subscribe(FILTER)

    async def spread() -> bool:
        sizes = await cluster.ask(list(scot.brokers), "stats", 5.0)
        return all(s is not None and s["routing_table_size"] == 1 for s in sizes.values())

    await until(spread, "the subscription crosses the overlay", 30)
    sockets: list[zmq.Socket] = []

    async def attacks(pair: KeyPair | None) -> tuple[list[bytes | None], object]:
        """A peer, a client and a control caller with ``pair`` (or in the clear), each
        on its own socket at once: each refused one waits out :data:`SILENCE`."""
        peer = _socket(zmq.PUSH, target.endpoint, keys, pair)
        client = _socket(zmq.DEALER, target.client_endpoint, keys, pair)
        sockets.extend((peer, client))

        async def as_peer() -> None:
            hello = Hello(secrets.randbits(63) | 1, status["incarnation"])
            forged = Notification("forger", 1, time.time(), parse_publication(QUOTE))
            for message in (hello, forged):
                await _send(peer, encode_peer(IMPERSONATED, message))

        async def as_client() -> list[bytes | None]:
            return [
                await _answer(client, request)
                for request in (
                    {"op": "subscribe", "client": "intruder", "filter": FILTER},
                    {"op": "unsubscribe", "client": "legit", "sub_id": stream.sub_id},
                )
            ]

        async def as_controller() -> object:
            control = await _control(target.control_endpoint, keys, pair)
            try:
                return await asyncio.wait_for(control.call.status(), SILENCE)
            except TimeoutError:
                return None
            finally:
                control.close()

        _, answers, answer = await asyncio.gather(as_peer(), as_client(), as_controller())
        return answers, answer

    came: dict = {"client_answers": [], "control_answers": []}
    try:
        # in the clear, and with a key nobody allowed, at once
        for answers, answer in await asyncio.gather(attacks(None), attacks(stranger)):
            came["client_answers"] += answers
            came["control_answers"].append(answer)
        pub = await Publisher.connect(scot.brokers["a:0"].client_endpoint, "legit-pub")
        await pub.publish(QUOTE)
        await pub.close()
        received = []
        while True:
            try:
                n = await stream.get(SILENCE)
            except TimeoutError:
                break
            received.append((n.publisher, n.seq))
        came["received"] = received
        came["stats"] = (await cluster.ask([TARGET], "stats", 5.0))[TARGET]
        control = await _control(target.control_endpoint, keys, None)
        try:
            came["shutdown"] = await asyncio.wait_for(control.call.shutdown(), SILENCE)
        except TimeoutError:
            came["shutdown"] = None
        finally:
            control.close()
        with contextlib.suppress(subprocess.TimeoutExpired):  # an obeyed shutdown ends it
            await asyncio.to_thread(cluster.processes[TARGET].wait, 1.0)
        came["alive_after"] = (await cluster.ask([TARGET], "status", 2.0))[TARGET] is not None
    finally:
        for sock in sockets:
            sock.close(0)
        await sub.close()
        await cluster.close_control()
    return came


def test_outsiders_get_nothing_through_and_are_counted(fig2: LocalCluster) -> None:
    """With keys: a peer, client and control caller in the clear or with a key nobody
    allowed get no answer, the forged notification is not delivered, the forged
    subscription and unsubscription are not applied, ``shutdown()`` is refused, and the
    broker counts each attempt (failed handshakes per socket, refused keys per ZAP
    domain). Insecure, the same attacks get through."""
    came = asyncio.run(_outsiders(fig2))
    counters = came["stats"]["counters"]
    if fig2.keys_dir is not None:
        assert came["received"] == [("legit-pub", 1)]
        assert came["client_answers"] == [None] * 4
        assert came["control_answers"] == [None, None]
        assert came["shutdown"] is None and came["alive_after"]
        for socket in ("peer", "client", "control"):
            assert counters.get(f"handshakes_failed.{socket}", 0) >= 2, socket
            assert counters.get(f"auth_refused.{socket}", 0) >= 1, socket
        assert came["stats"]["routing_table_size"] == 1  # the legitimate subscription
    else:
        assert ("forger", 1) in came["received"]
        assert [a is not None for a in came["client_answers"]] == [True] * 4
        assert all(a is not None for a in came["control_answers"])
        assert came["shutdown"] is True and not came["alive_after"]
        assert came["stats"]["routing_table_size"] == 3  # the intruder's two came in
        assert not any(k.startswith(("handshakes_failed", "auth_refused")) for k in counters)
