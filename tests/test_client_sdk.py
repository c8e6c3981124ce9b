"""The SDK without brokers (``octopis.client``, DESIGN §7): where a connection goes (an endpoint,
a broker id through a run directory or a topology), what it says when nothing listens,
how much an unread subscriber holds, and a delivery's body."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from conditions import until

from octopis.client import (
    Connection,
    ConnectionGroup,
    NotAClientSocket,
    NothingListening,
    OverlayError,
    Publisher,
    Received,
    Subscriber,
    locate,
)
from octopis.client.link import READ_BATCH, BrokerLink
from octopis.client.streams import SubscriptionStream
from octopis.cluster.launcher import find_free_base_port
from octopis.core import Notification
from octopis.core.codec import encode_body
from octopis.filters.language import as_subscription
from octopis.keys import KEYS_ENV
from octopis.overlay import STATE_FILE
from octopis.topology import build_preset
from octopis.wire import LEFT_AT, pack

pytestmark = pytest.mark.timeout(300)


def test_a_connection_needs_an_endpoint() -> None:
    with pytest.raises(ValueError, match="at least one broker endpoint"):
        Connection([])


def test_a_broker_id_is_found_through_a_run_directory_or_a_topology(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``connect`` would use, without connecting: a broker id gives its client
    endpoint and fail-over list (its cluster first) and the overlay's keys; an endpoint
    the topology places elsewhere is refused at once; no overlay or no such broker says
    what to do."""
    monkeypatch.delenv(KEYS_ENV, raising=False)
    scot = build_preset("fig2")
    topology = tmp_path / "fig2.json"
    topology.write_text(json.dumps(scot.to_json()))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / STATE_FILE).write_text(json.dumps({"topology": str(topology), "secure": True}))
    endpoints, keys = locate("f:2", run_dir=run_dir)
    assert endpoints == scot.client_endpoints("f:2") and keys == run_dir / "keys"
    assert {scot.brokers[b].cluster for b in ("f:2", "e:2")} == {2}
    assert endpoints[1] == scot.brokers["e:2"].client_endpoint  # its cluster, nearest first
    assert locate("f:2", topology=topology) == (endpoints, False)  # no $OCTOPIS_KEYS: clear
    raw = scot.brokers["a:0"].client_endpoint
    assert locate(raw) == ([raw], None)  # as given: keys from $OCTOPIS_KEYS, if set
    assert locate(raw, topology=topology)[0] == scot.client_endpoints("a:0")
    peer = scot.brokers["b:0"].endpoint
    with pytest.raises(NotAClientSocket, match=re.escape(f"{peer} is b:0's peer socket")):
        locate(peer, run_dir=run_dir)
    with pytest.raises(OverlayError, match="no broker 'zz:9'; it has a:0, b:0, c:0"):
        locate("zz:9", run_dir=run_dir)
    with pytest.raises(OverlayError, match=r"no overlay in .*: start one with `octopis up "):
        locate("f:2", run_dir=tmp_path / "none")


def test_a_connection_where_nothing_listens_says_so_before_its_timeout() -> None:
    """Named by the socket's monitor after ``DIAGNOSIS_WAIT`` (2 s) of refused
    connections, not :class:`NoReply` at the open's timeout (10 s): the kind of error
    says which came first, no clock is read."""
    port = find_free_base_port(1)  # reserved here, and nothing binds it
    refused = f"nothing listens at tcp://127.0.0.1:{port} \\(connection refused for 2 s\\)"
    with pytest.raises(NothingListening, match=refused):
        asyncio.run(Publisher.connect(f"tcp://127.0.0.1:{port}", keys=False))


@pytest.mark.parametrize("limit", ["count", "bytes"])
def test_a_subscriber_that_does_not_read_holds_at_most_its_buffer(limit: str) -> None:
    """Deliveries queue in the subscriber's streams until ``buffer`` of them, or
    ``buffer_bytes`` of their encoded size, are held; then the connection's reader stops
    (one stall) and resumes once the application takes one. A withdrawn stream gives back
    what it held."""
    bodies = [
        encode_body(Notification("p", seq, 0.0, {"class": "STOCK", "pad": "x" * 500}, session=1))
        for seq in range(1, 31)
    ]
    size = len(bodies[0])
    options = {"buffer": 10} if limit == "count" else {"buffer_bytes": 10 * size}

    async def scenario() -> None:
        connection = Connection("tcp://127.0.0.1:1", group=ConnectionGroup())
        sub = Subscriber("s", connection, **options)
        stream = SubscriptionStream(sub, "s#1", as_subscription("[class,eq,'STOCK']"))
        sub._streams["s#1"] = stream
        for body in bodies[:9]:
            connection._on_frame([pack(["s"]), body, LEFT_AT.pack(0.0)])
        assert (sub.held, sub.stalls, connection.link._stalls) == (9, 0, [])
        connection._on_frame([pack(["s"]), bodies[9], LEFT_AT.pack(0.0)])
        assert (sub.held, sub.held_bytes, sub.stalls) == (10, 10 * size, 1)
        (room,) = connection.link._stalls
        assert not room.is_set()
        assert (await stream.get()).seq == 1
        assert room.is_set() and (sub.held, sub.held_bytes) == (9, 9 * size)
        stream.release()
        assert (sub.held, sub.held_bytes) == (0, 0)
        connection.socket.close()

    asyncio.run(scenario())


def test_a_delivery_hands_over_its_body_and_a_body_must_be_bytes() -> None:
    """``Received.body`` is the publication's opaque body as it was published; a
    publisher's body that is not bytes is refused before anything is sent."""
    body = b"\x00report\xff"
    notification = Notification("p", 1, 0.0, {"class": "STOCK"}, session=1, body=body)

    async def scenario() -> None:
        connection = Connection("tcp://127.0.0.1:1", group=ConnectionGroup())
        got: list[Received] = []
        sub = Subscriber("s", connection, on_notification=got.append)
        connection._on_frame([pack(["s"]), encode_body(notification), LEFT_AT.pack(0.0)])
        assert [(r.seq, r.body) for r in got] == [(1, body)]
        pub = Publisher("p", connection)
        with pytest.raises(TypeError, match="a publication body is bytes, not str"):
            await pub.publish({"class": "STOCK"}, body="text")  # type: ignore[arg-type]
        assert pub.seq == 0 and sub.name == "s"
        connection.socket.close()

    asyncio.run(scenario())


def test_a_link_reads_every_message_in_order_pauses_while_a_stream_is_full_and_stops() -> None:
    """:class:`BrokerLink` drains its socket from a reader on the event FD: 200 messages
    (over three batches of ``READ_BATCH``) reach ``on_frame`` in order; a stream full
    after the 10th stops reading until there is room, then it reads on; stopping takes
    the reader off the FD; sends reach the broker without waiting."""

    async def scenario() -> None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        got: list[bytes] = []
        room = asyncio.Event()

        def on_frame(parts: list[bytes]) -> None:
            got.append(parts[0])
            if len(got) == 10:
                link.stall_until(room)

        link = BrokerLink(
            ctx, f"tcp://127.0.0.1:{port}", receive_buffer=1000, curve=None, on_frame=on_frame
        )
        loop = asyncio.get_running_loop()
        try:
            link.connect()
            link.start_reading()
            link.send(b"hello")
            identity, hello = await asyncio.wait_for(router.recv_multipart(), 10)
            assert hello == b"hello"
            for i in range(200):
                await router.send_multipart([identity, str(i).encode()])
            await until(
                lambda: len(got) == 10 and link.unread(), "10 read, the rest waiting unread", 10
            )
            fd = link.socket.getsockopt(zmq.FD)
            assert len(got) == 10 and link.reading_paused and link.reading
            # paused, the FD (readable until read) is not watched, or the loop would spin
            assert fd not in loop._selector.get_map()
            assert link.unread()
            room.set()
            await until(lambda: len(got) == 200, "the other 190 read after the pause", 10)
            assert got == [str(i).encode() for i in range(200)]
            assert not link.reading_paused and READ_BATCH < 200
            assert fd in loop._selector.get_map()
            assert link.stop_reading() is None and not link.reading
            assert fd not in loop._selector.get_map()
        finally:
            link.socket.close()
            ctx.destroy(linger=0)

    asyncio.run(scenario())


def test_a_link_keeps_what_its_socket_cannot_take_yet_and_sends_it_once_connected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A socket with no connection takes no message (ZeroMQ says ``EAGAIN``): the link
    keeps them in order, up to ``UNSENT_LIMIT`` (one more is refused, naming the
    endpoint), and its reader sends them once the socket is connected."""
    monkeypatch.setattr("octopis.client.link.UNSENT_LIMIT", 3)

    async def scenario() -> None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        link = BrokerLink(ctx, endpoint, receive_buffer=10, curve=None, on_frame=print)
        try:
            link.start_reading()
            for payload in (b"one", b"two", b"three"):
                link.send(payload)  # not connected yet: no pipe takes them
            with pytest.raises(BufferError, match=f"3 messages wait for the socket to {endpoint}"):
                link.send(b"four")
            link.connect()
            got = [(await asyncio.wait_for(router.recv_multipart(), 10))[1] for _ in range(3)]
            assert got == [b"one", b"two", b"three"]
            link.send(b"five")  # connected: straight to ZeroMQ
            assert (await asyncio.wait_for(router.recv_multipart(), 10))[1] == b"five"
            link.stop_reading()
        finally:
            link.socket.close()
            ctx.destroy(linger=0)

    asyncio.run(scenario())
