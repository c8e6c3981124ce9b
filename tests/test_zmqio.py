"""The compiled receive and send of the forwarding path (octopis.transport.zmqio): what
they read and write is exactly what pyzmq reads and writes, a drain stops at its limit,
a full pipe sends nothing, and nothing malformed leaves half a message behind."""

from __future__ import annotations

import pytest
import zmq

from octopis.transport import _zmqio
from octopis.transport.zmqio import FastSocket


@pytest.fixture
def pair():
    """A PUSH → PULL pair in process (inproc: a message sent is waiting at once, so a
    drain sees exactly what was sent, with no wait on an I/O thread)."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind("inproc://zmqio")
    push = ctx.socket(zmq.PUSH)
    push.connect("inproc://zmqio")
    yield push, pull
    ctx.destroy(linger=0)


def test_receive_reads_what_pyzmq_sent_in_order(pair) -> None:
    push, pull = pair
    sent = [[b"a:0", bytes([i]) * i] for i in range(1, 40)] + [[b"solo"], [b"s", b"x", b"y", b""]]
    for message in sent:
        push.send_multipart(message)
    got: list[list[bytes]] = []
    fast = FastSocket(pull)
    while len(got) < len(sent):
        batch = fast.receive(8)
        assert batch, "a drain came back empty with messages waiting"
        got += batch
    assert got == sent
    assert fast.receive(8) == []


def test_receive_stops_at_its_frame_limit(pair) -> None:
    push, pull = pair
    for _ in range(5):
        push.send_multipart([b"b:1", b"1", b"2", b"3"])  # three frames each
    push.send_multipart([b"one"])
    fast = FastSocket(pull)
    assert len(fast.receive(4)) == 2  # 3 frames, then 6 >= 4
    assert len(fast.receive(1)) == 1
    assert len(fast.receive(100)) == 3  # two batches and the one-part message


def test_sends_arrive_as_pyzmq_reads_them(pair) -> None:
    push, pull = pair
    fast = FastSocket(push)
    queue = [[b"c:0", b"body1", 2], [b"c:0", b"body2", 3], [b"c:0", b"body3", 3]]
    assert fast.send_frames(b"c:0", iter(queue), 2)
    assert fast.send_parts([b"only"])
    assert fast.send_parts([b"id", b"n", b"b"])
    assert pull.recv_multipart() == [b"c:0", b"body1", b"body2"]
    assert pull.recv_multipart() == [b"only"]
    assert pull.recv_multipart() == [b"id", b"n", b"b"]


def test_a_full_pipe_sends_nothing() -> None:
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 1)
    push.connect("tcp://127.0.0.1:9")  # nobody listens: only the pipe takes messages
    try:
        fast = FastSocket(push)
        accepted = 0
        while fast.send_parts([b"x", b"y"]):
            accepted += 1
            assert accepted < 100, "the pipe never filled"
        assert fast.send_frames(b"x", [[b"x", b"y", 2]], 1) is False
        assert push.getsockopt(zmq.EVENTS) & zmq.POLLOUT == 0
    finally:
        ctx.destroy(linger=0)


def test_malformed_input_leaves_no_half_message(pair) -> None:
    push, pull = pair
    fast = FastSocket(push)
    with pytest.raises(TypeError):
        fast.send_frames(b"c:0", [[b"c:0", b"ok", 2], [b"c:0", "text", 2]], 2)
    with pytest.raises(ValueError, match="given 1 frames, expected 2"):
        fast.send_frames(b"c:0", [[b"c:0", b"ok", 2]], 2)
    with pytest.raises(TypeError, match="bytes"):
        fast.send_parts([b"a", "b"])
    with pytest.raises(ValueError):
        fast.send_parts([])
    assert fast.send_parts([b"after"])
    assert pull.recv_multipart() == [b"after"]  # nothing of the failed sends went out


def test_a_closed_socket_is_refused(pair) -> None:
    _, pull = pair
    fast = FastSocket(pull)
    pull.close()
    with pytest.raises(zmq.ZMQError) as caught:
        fast.receive(1)
    assert caught.value.errno == zmq.ENOTSOCK


def test_binding_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="zmq_send"):
        _zmqio.bind({name: 1 for name in _zmqio.FUNCTIONS if name != "zmq_send"})
