"""Peer-link frames (octopis.transport.wire, DESIGN §4): every message kind survives the
round trip, and every malformed frame is a WireError that names the problem."""

from __future__ import annotations

import math

import msgpack
import pytest
from bitarray import frozenbitarray

from octopis.core import Notification, Subscribe, SubState, Unsubscribe
from octopis.filters import parse_subscription
from octopis.transport.wire import (
    HELLO,
    NOTIFY,
    Hello,
    WireError,
    decode_peer,
    encode_body,
    encode_peer,
)

QUOTE = {"class": "STOCK", "symbol": "MSFT", "close": 28.1, "volume": 1200}


def body(*fields: object) -> list[bytes]:
    return [b"a:0", msgpack.packb(list(fields))]


@pytest.mark.parametrize(
    "message",
    [
        Notification("P", 7, 12.5, QUOTE),
        Notification("P", 8, 12.5, QUOTE, cbv=frozenbitarray("0110")),
        Notification("P", 9, 12.5, QUOTE, destinations=(("b:0", "b:0#1"), ("c:1", "c:1#4"))),
        Subscribe(
            "a:0#3",
            "a:0",
            parse_subscription("[class,eq,'STOCK'],[close,>,27.5]"),
            SubState.SECONDARY,
            frozenbitarray("100"),
            3.25,
            2,
        ),
        Unsubscribe("a:0#3", SubState.PRIMARY),
    ],
)
def test_round_trip(message: object) -> None:
    sender, decoded = decode_peer(encode_peer("a:0", message))
    assert sender == "a:0"
    assert decoded == message
    assert type(decoded) is type(message)


def test_hello_round_trip() -> None:
    sender, message = decode_peer(encode_peer("c:2", Hello()))
    assert sender == "c:2"
    assert type(message) is Hello


def good_notify(**change: object) -> list:
    fields = {"publisher": "P", "seq": 1, "at": 1.0, "pub": QUOTE, "cbv": None, "dests": None}
    fields.update(change)
    return [NOTIFY, *fields.values()]


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        ([b"a:0"], "frame has 1 parts"),
        ([b"a:0", b"x", b"y"], "frame has 3 parts"),
        ([b"\xff", msgpack.packb([HELLO])], "sender part is not UTF-8"),
        ([b"a:0", b"\xc1"], "is not msgpack"),
        ([b"a:0", msgpack.packb({"kind": 3})], "is not [kind, ...]"),
        (body(), "is not [kind, ...]"),
        (body(True), "frame kind must be an integer"),
        (body(3.0, "P"), "frame kind must be an integer"),
        (body(9), "unknown frame kind 9"),
        (body(HELLO, "extra"), "HELLO frame has 2 fields"),
        (body(*good_notify()[:-1]), "NOTIFY frame has 6 fields"),
        (body(*good_notify(publisher="")), "publisher must be a non-empty string"),
        (body(*good_notify(seq="1")), "seq must be an integer"),
        (body(*good_notify(at=math.nan)), "published_at must be a finite number"),
        (body(*good_notify(at=math.inf)), "published_at must be a finite number"),
        (body(*good_notify(pub={"close": [1]})), "attribute 'close'"),
        (body(*good_notify(pub={})), "empty publication"),
        (body(*good_notify(cbv=[b"\x80", True])), "CBV must be [bytes, nbits]"),
        (body(*good_notify(cbv=[b"\x80", 9])), "CBV must be [bytes, nbits]"),
        (body(*good_notify(dests=[["b:0"]])), "NOTIFY destinations must be"),
        (body(1, "s", "a:0", "[class,eq", 1, [b"\x80", 3], 0.0, 0), "bad content from a:0"),
        (body(2, "s#1", 3), "subscription state must be 1 or 2, got 3"),
    ],
)
def test_malformed_frames_name_the_problem(frame: list[bytes], problem: str) -> None:
    with pytest.raises(WireError) as caught:
        decode_peer(frame)
    assert problem in str(caught.value)


def test_encode_rejects_what_it_cannot_carry() -> None:
    with pytest.raises(TypeError, match="cannot encode str"):
        encode_body("hello")  # type: ignore[arg-type]
