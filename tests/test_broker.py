"""The broker object in-process (octopis.transport.broker): what happens when one of its
serving loops fails; the log formats of a broker process; a neighbour's batch with bad
bodies among good ones, sent to a broker process by this test playing its neighbours.
Process-level routing is in tests/test_cluster.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import aiozmq.rpc
import msgspec
import pytest
import zmq
import zmq.asyncio
from bitarray import frozenbitarray
from conditions import until

from octopis.cluster.launcher import broker_command, find_free_base_port
from octopis.core import Notification, Subscribe, SubState, Unsubscribe
from octopis.core.codec import (
    Heartbeat,
    Hello,
    Synced,
    decode_body,
    encode_body,
    encode_peer,
)
from octopis.filters.language import parse_subscription
from octopis.settings import BrokerSettings, Links, Lst
from octopis.topology import Scot, build_preset
from octopis.transport import serving
from octopis.transport.broker import Broker
from octopis.transport.serving import BrokerFailure, serve
from octopis.wire import NOTIFY_HEAD
from octopis.wire.client import PublishRequest


def test_a_failed_serving_loop_shuts_the_broker_down_with_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "dnr", BrokerSettings(), keys=None)

    async def broken_tick_loop() -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("LST sampling broke")

    monkeypatch.setattr(serving, "tick_lst", lambda _: broken_tick_loop())
    with pytest.raises(BrokerFailure, match="task 'lst' ended: RuntimeError"):
        asyncio.run(asyncio.wait_for(serve(broker), timeout=30))
    assert "LST sampling broke" in caplog.text


def test_the_brokers_lst_orders_as_its_settings_say(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``[lst] order = "bluedove"`` reaches the LST DNR routes with (and its stats rows)."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "dnr", BrokerSettings(lst=Lst(order="bluedove")), keys=None)

    async def report_the_order() -> None:
        rows = broker.lst.snapshot().values()
        assert rows and all("processing_time" in row for row in rows)
        raise RuntimeError(f"LST order {broker.lst.order}")

    monkeypatch.setattr(serving, "tick_lst", lambda _: report_the_order())
    with pytest.raises(BrokerFailure, match="task 'lst' ended: RuntimeError"):
        asyncio.run(asyncio.wait_for(serve(broker), timeout=30))
    assert "LST order bluedove" in caplog.text


def test_routing_that_fails_before_taking_a_run_drops_it_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """If routing fails before it takes the first notification of a run, handing the
    rest over again would fail the same way: the peer input counts the failure and the
    run's notifications as internal errors, and goes on with the next body."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "snr", BrokerSettings(links=Links(down_after=3600.0)), keys=None)

    def broken_routing(sender: str, run: object, now: float) -> None:
        raise RuntimeError("routing broke")

    async def feed_a_run() -> None:
        peers = broker.peers
        table = peers.neighbours
        table.heard("a:0", 0.0)
        table.met("a:0", PLAYED)
        table.hello("a:0", names_us=True)
        table.share("a:0")
        state = table["a:0"]
        monkeypatch.setattr(broker, "peer_notifications", broken_routing)
        heartbeat = encode_peer("a:0", Heartbeat(PLAYED, 0, 0, True))[1]
        peers.receiver.on_message([b"a:0", _quote(1), _quote(2), heartbeat], 0.0)
        raise RuntimeError(
            f"internal_errors {peers.counters['internal_errors']}, "
            f"serving a:0 {state.serving}, received {state.received}"
        )

    monkeypatch.setattr(serving, "tick_lst", lambda _: feed_a_run())
    with pytest.raises(BrokerFailure, match="internal_errors 3, serving a:0 True, received 2"):
        asyncio.run(asyncio.wait_for(serve(broker), timeout=30))
    assert "routing broke" in caplog.text


def test_a_pass_past_its_deadline_leaves_the_rest_of_a_run_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The peer input looks at its pass's deadline after each body that is not a
    notification (a heartbeat, a malformed body), even amid one run from one neighbour:
    past it, the notifications before that body are routed and the bodies after it are
    left for the next pass (the index of the first is returned). Handed over pass after
    pass with the deadline always past, a run is routed whole, in order, once."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "snr", BrokerSettings(links=Links(down_after=3600.0)), keys=None)
    routed: list[list[int]] = []
    passes: list[int] = []
    taken: list[int] = []

    def routing(sender: str, run: Iterator[tuple[Notification, bytes]], now: float) -> None:
        routed.append([message.seq for message, _ in run])

    async def feed_a_run() -> None:
        peers = broker.peers
        table = peers.neighbours
        table.heard("a:0", 0.0)
        table.met("a:0", PLAYED)
        table.hello("a:0", names_us=True)
        table.share("a:0")
        state = table["a:0"]
        monkeypatch.setattr(broker, "peer_notifications", routing)
        heartbeat = encode_peer("a:0", Heartbeat(PLAYED, 0, 0, True))[1]
        bad = b"\xc1 not msgpack"
        frame = [b"a:0", _quote(1), _quote(2), bad, _quote(3), heartbeat, _quote(4)]
        while len(frame) > 1:
            left_at = peers.receiver.on_message(frame, 0.0, deadline=0.0)
            passes.append(left_at)
            frame = [frame[0], *frame[left_at:]]
        taken.append(state.received)
        broker.stop()
        await asyncio.Event().wait()

    monkeypatch.setattr(serving, "tick_lst", lambda _: feed_a_run())
    asyncio.run(asyncio.wait_for(serve(broker), timeout=30))
    assert passes == [4, 3, 2]
    assert routed == [[1, 2], [3], [4]]
    assert taken == [4] and broker.peers.counters["wire_errors"] == 1


def test_routing_bodies_sent_before_the_handshake_named_us_are_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From a neighbour that is up but whose HELLO has not named this incarnation of ours
    (frames queued for an earlier process), the peer input takes no routing body: the
    node's rule (``core.custody.take``) drops a run of notifications and a subscription
    message alike, each counted in ``stale_frames``, none taken. Once the handshake names
    us, the same bodies are taken and routed."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "snr", BrokerSettings(links=Links(down_after=3600.0)), keys=None)
    handed: list[object] = []
    seen: list[tuple[int, int]] = []

    def routing(sender: str, run: Iterator[tuple[Notification, bytes]], now: float) -> None:
        handed.append([message.seq for message, _ in run])

    def message(sender: str, message: object, body: bytes, now: float) -> None:
        handed.append(type(message).__name__)

    async def feed() -> None:
        peers = broker.peers
        table = peers.neighbours
        table.heard("a:0", 0.0)
        table.met("a:0", PLAYED)
        state = table["a:0"]
        monkeypatch.setattr(broker, "peer_notifications", routing)
        monkeypatch.setattr(broker, "peer_message", message)
        subscription = parse_subscription("[class,eq,'STOCK']")
        subscribe = encode_body(
            Subscribe("a:0#1", "a:0", subscription, SubState.PRIMARY, frozenbitarray("100"), 0.0)
        )
        frame = [b"a:0", _quote(1), _quote(2), subscribe]
        peers.receiver.on_message(frame, 0.0)
        seen.append((peers.counters["stale_frames"], state.received))
        table.hello("a:0", names_us=True)
        peers.receiver.on_message(frame, 0.0)
        seen.append((peers.counters["stale_frames"], state.received))
        broker.stop()
        await asyncio.Event().wait()

    monkeypatch.setattr(serving, "tick_lst", lambda _: feed())
    asyncio.run(asyncio.wait_for(serve(broker), timeout=30))
    assert seen == [(3, 0), (3, 3)]
    assert handed == [[1, 2], "Subscribe"]


@pytest.mark.processes
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_broker_logs_name_the_broker_and_component(tmp_path: Path, log_format: str) -> None:
    """``octopis-broker --log-format json`` writes one JSON object per line (time, level,
    broker, logger, message); text lines carry the same broker id and logger."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    path = tmp_path / "fig2.json"
    path.write_text(json.dumps(scot.to_json()))
    command = broker_command(path, "b:0", "dnr", log_level="INFO", log_format=log_format)
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if "serving" in line:
                break
    finally:
        process.terminate()
        after = process.communicate(timeout=30)[1]  # what it said while stopping
    assert process.returncode == 0 and lines and "serving" in lines[-1], (lines, after)
    if log_format == "json":
        entries = [json.loads(line) for line in lines]
        assert all(e["broker"] == "b:0" and e["logger"].startswith("octopis") for e in entries)
        assert {"time", "level", "message"} <= entries[-1].keys()
        assert entries[-1]["time"].endswith("Z") and entries[-1]["level"] == "INFO"
    else:
        assert all(" b:0 octopis." in line for line in lines), lines


PLAYED = 1
"""The incarnation of the neighbours the batch test plays."""


def _quote(seq: int, cbv: frozenbitarray | None = None) -> bytes:
    return encode_body(Notification("P", seq, 0.0, {"class": "STOCK", "n": seq}, cbv))


async def _one_batch(scot: Scot, batch: list[bytes], expected: int) -> tuple[list, dict]:
    """Play b:0's neighbours a:0 and c:0: handshake, an empty share each (a neighbour is
    routed through once it serves and has handed its share), subscribe to every quote as c:0,
    send ``batch`` as one message from a:0; returns the notification bodies that reach
    c:0 (once ``expected`` did, or after 5 s) and b:0's stats."""
    ctx = zmq.asyncio.Context()
    down = ctx.socket(zmq.PULL)
    down.bind(scot.brokers["c:0"].endpoint)
    up = ctx.socket(zmq.PUSH)
    up.connect(scot.brokers["b:0"].endpoint)
    control = await aiozmq.rpc.connect_rpc(connect=scot.brokers["b:0"].control_endpoint, timeout=30)
    try:
        incarnation = (await control.call.status())["incarnation"]
        for neighbour in ("a:0", "c:0"):
            await up.send_multipart(encode_peer(neighbour, Hello(PLAYED, incarnation)))
            await up.send_multipart(encode_peer(neighbour, Heartbeat(PLAYED, incarnation, 0, True)))
            await up.send_multipart(encode_peer(neighbour, Synced(0, True, False, False)))
        stock = parse_subscription("[class,eq,'STOCK']")
        subscribe = Subscribe("s#1", "c:0", stock, SubState.PRIMARY, frozenbitarray("100"), 0.0, 1)
        await up.send_multipart(encode_peer("c:0", subscribe))

        async def installed() -> bool:
            return (await control.call.stats())["routing_table_size"] == 1

        await until(installed, "the subscription installed", 30)
        await up.send_multipart(batch)
        got: list[bytes] = []
        deadline = asyncio.get_running_loop().time() + 5
        while len(got) < expected and await down.poll(_ms_until(deadline)):
            got += [
                body for body in (await down.recv_multipart())[1:] if body.startswith(NOTIFY_HEAD)
            ]
        return got, await control.call.stats()
    finally:
        control.close()
        ctx.destroy(linger=0)


def _ms_until(deadline: float) -> int:
    return max(0, round(1000 * (deadline - asyncio.get_running_loop().time())))


@pytest.mark.processes
def test_a_batch_from_a_neighbour_loses_only_its_bad_bodies(tmp_path: Path) -> None:
    """A message from neighbour a:0 carrying good notifications, a malformed body, a
    notification that breaks the protocol (a CBV naming b:0's own cluster) and a
    heartbeat: the two bad bodies are counted (``wire_errors``, ``protocol_errors``)
    and dropped; every good notification is forwarded once, in order, with the body it
    came in."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    path = tmp_path / "fig2.json"
    path.write_text(json.dumps(scot.to_json()))
    config = tmp_path / "broker.toml"
    config.write_text(BrokerSettings(links=Links(down_after=3600.0)).to_toml(changed_only=True))
    good = [_quote(seq) for seq in range(1, 6)]
    heartbeat = encode_peer("a:0", Heartbeat(PLAYED, 0, 0, True))[1]
    bodies = [
        good[0],
        good[1],
        b"\xc1 not msgpack",
        good[2],
        _quote(99, frozenbitarray("100")),
        good[3],
        heartbeat,
        good[4],
    ]
    process = subprocess.Popen(broker_command(path, "b:0", "snr", config), stdin=subprocess.DEVNULL)
    try:
        got, stats = asyncio.run(_one_batch(scot, [b"a:0", *bodies], len(good)))
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert got == good
    counters = stats["counters"]
    assert counters.get("wire_errors", 0) == 1
    assert counters.get("protocol_errors", 0) == 1
    assert counters.get("internal_errors", 0) == 0
    assert stats["received"]["notification"] == len(good) + 1


def test_a_publication_refused_while_resyncing_is_neither_kept_nor_answered(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A broker still resyncing whose publication hold is full refuses a local
    publication with an error: its retention store does not keep it (a replay could
    otherwise give what the publisher was told was refused) and its receipt is never
    answered (the error is the one answer)."""
    from octopis.core.custody import PublishReceipt

    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "snr", BrokerSettings(), keys=None, data_dir=tmp_path)
    answered: list[int] = []

    async def publish_while_resyncing() -> None:
        broker.node.publication_hold = 0  # nothing more may wait for serving
        receipt = PublishReceipt(lambda: answered.append(1))
        refused = "nothing"
        try:
            broker.publish(Notification("p", 1, 0.0, {"x": 1}), receipt)
        except ValueError as exc:  # a ClientError: the client's answer
            refused = type(exc).__name__
        store = broker.replaying.store
        raise RuntimeError(f"refused {refused}, pending {store.pending}, copies {receipt.copies}")

    monkeypatch.setattr(serving, "tick_lst", lambda _: publish_while_resyncing())
    with pytest.raises(BrokerFailure, match="refused ClientError, pending 0, copies 0"):
        asyncio.run(asyncio.wait_for(serve(broker), timeout=30))
    assert not answered


def test_a_publication_its_publisher_did_not_wait_for_is_committed_with_the_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A publication taken while its connection has none unanswered, and alone in its
    pass, is awaited: the store commits it as the idle pass ends. One followed in the same
    pass by another of its connection (its publisher pipelines) is not: its connection's
    ``Unanswered`` clears its ``alone``, and both wait for the commit timer."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "snr", BrokerSettings(), keys=None, data_dir=tmp_path)

    def publish(seq: int) -> bytes:
        request = PublishRequest(
            client="p", req=seq, seq=seq, published_at=time.time(), publication={"x": 1}
        )
        return msgspec.msgpack.encode(request)

    async def two_passes() -> None:
        store = broker.replaying.store
        assert store is not None
        broker.clients.requests(b"awaits", [publish(1)])
        awaited = (store.pending, store.stats["retention.commits"])
        broker.clients.requests(b"pipelines", [publish(1), publish(2)])
        pipelined = (store.pending, store.stats["retention.commits"])
        raise RuntimeError(f"awaited {awaited}, pipelined {pipelined}")

    monkeypatch.setattr(serving, "tick_lst", lambda _: two_passes())
    with pytest.raises(BrokerFailure, match=r"awaited \(0, 1\), pipelined \(2, 1\)"):
        asyncio.run(asyncio.wait_for(serve(broker), timeout=30))


@pytest.mark.processes
def test_what_waits_for_a_healed_link_leaves_in_the_order_it_was_sent(tmp_path: Path) -> None:
    """b:0 (a process) with neighbours a:0 and c:0 played by this test; c:0's endpoint is
    not bound, so what b:0 puts on its link to c:0 waits there. a:0's subscription s#1
    waits; c:0 falls silent and is declared down (the subscription is taken back and held
    for it); a:0 withdraws s#1 while c:0 is down; then c:0 binds its endpoint and is
    heard again as the same process. c:0 gets the subscription, then its withdrawal: the
    withdrawal put on the link during the outage does not overtake what was held."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    path = tmp_path / "fig2.json"
    path.write_text(json.dumps(scot.to_json()))
    process = subprocess.Popen(broker_command(path, "b:0", "snr"), stdin=subprocess.DEVNULL)
    try:
        got = asyncio.run(_withdrawn_during_an_outage(scot))
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert got == [("Subscribe", "s#1"), ("Unsubscribe", "s#1")]


async def _withdrawn_during_an_outage(scot: Scot) -> list[tuple[str, str]]:
    """The scenario of the test above; returns the subscription messages c:0 gets from
    b:0 after the heal, in order, once both came (or after 30 s)."""
    ctx = zmq.asyncio.Context()
    up = ctx.socket(zmq.PUSH)
    up.connect(scot.brokers["b:0"].endpoint)
    control = await aiozmq.rpc.connect_rpc(connect=scot.brokers["b:0"].control_endpoint, timeout=30)
    alive = {"a:0", "c:0"}
    beats: asyncio.Task | None = None
    try:
        incarnation = (await control.call.status())["incarnation"]

        async def beat() -> None:  # the played neighbours' heartbeats (each 0.1 s)
            while True:
                for name in sorted(alive):
                    await up.send_multipart(
                        encode_peer(name, Heartbeat(PLAYED, incarnation, 0, True))
                    )
                await asyncio.sleep(0.1)

        for neighbour in ("a:0", "c:0"):
            await up.send_multipart(encode_peer(neighbour, Hello(PLAYED, incarnation)))
            await up.send_multipart(encode_peer(neighbour, Heartbeat(PLAYED, incarnation, 0, True)))
            await up.send_multipart(encode_peer(neighbour, Synced(0, True, False, False)))
        beats = asyncio.create_task(beat())

        async def link(name: str) -> dict:
            return (await control.call.status())["links"][name]

        async def serving() -> bool:
            status = await control.call.status()
            return status["serving"] and all(
                status["links"][n]["state"] == "up" for n in ("a:0", "c:0")
            )

        async def table_size(size: int) -> bool:
            return (await control.call.status())["routing_table_size"] == size

        await until(serving, "b:0 serving, a:0 and c:0 up", 30)
        stock = parse_subscription("[class,eq,'STOCK']")
        subscribe = Subscribe("s#1", "a:0", stock, SubState.PRIMARY, frozenbitarray("100"), 0.0, 1)
        await up.send_multipart(encode_peer("a:0", subscribe))
        await until(partial(table_size, 1), "s#1 stored at b:0 (and put on the link to c:0)", 30)
        alive.discard("c:0")

        async def c0_down() -> bool:
            return (await link("c:0"))["state"] == "down"

        await until(c0_down, "c:0 declared down", 30)
        await up.send_multipart(encode_peer("a:0", Unsubscribe("s#1", SubState.PRIMARY)))
        await until(partial(table_size, 0), "s#1 withdrawn at b:0 (while c:0 is down)", 30)
        down = ctx.socket(zmq.PULL)
        down.bind(scot.brokers["c:0"].endpoint)
        alive.add("c:0")
        got: list[tuple[str, str]] = []
        deadline = asyncio.get_running_loop().time() + 30
        while len(got) < 2 and await down.poll(_ms_until(deadline)):
            for body in (await down.recv_multipart())[1:]:
                message = decode_body("b:0", body)
                if type(message) in (Subscribe, Unsubscribe):
                    got.append((type(message).__name__, message.sub_id))
        return got
    finally:
        if beats is not None:
            beats.cancel()
        control.close()
        ctx.destroy(linger=0)
