"""STOMP frames (octopis.gateway.frames) and the typing of headers
(octopis.gateway.headers): decoding, encoding, negotiation, limits, and a fuzz run whose
full size (100,000 frames and more) is ``bench/stomp_fuzz.py``."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.stomp_fuzz import fuzz
from octopis.gateway.frames import (
    SERVER_COMMANDS,
    Decoder,
    Frame,
    FrameError,
    FrameLimits,
    encode,
    error_frame,
    negotiate,
)
from octopis.gateway.headers import HeaderError, headers_of, publication_of, typed_value

LIMITS = FrameLimits(header_bytes=8192, headers=64, body_bytes=65536)


def _all(decoder: Decoder, data: bytes) -> list[Frame]:
    decoder.feed(data)
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    return out


def test_a_frame_is_read_whole_and_in_pieces() -> None:
    data = b"SEND\ndestination:/topic/STOCK\nsymbol:MSFT\n\nhello\0\n\n"
    [frame] = _all(Decoder(LIMITS), data)
    assert frame == Frame("SEND", {"destination": "/topic/STOCK", "symbol": "MSFT"}, b"hello")
    decoder = Decoder(LIMITS)
    got = [f for b in data for f in _all(decoder, bytes([b]))]
    assert got == [frame]
    assert decoder.heartbeats == 2


def test_crlf_content_length_nul_in_body_and_repeated_headers() -> None:
    data = b"SEND\r\ndestination:/topic/A\r\nx:1\r\nx:2\r\ncontent-length:3\r\n\r\na\0b\0"
    [frame] = _all(Decoder(LIMITS), data)
    assert frame.headers["x"] == "1" and frame.body == b"a\0b"


def test_escapes_by_version() -> None:
    data = b"SEND\nk:a\\cb\\nc\\\\d\\re\n\n\0"
    assert _all(Decoder(LIMITS, version="1.2"), data)[0].headers["k"] == "a:b\nc\\d\re"
    with pytest.raises(FrameError, match=r"undefined escape sequence '\\\\r'"):
        _all(Decoder(LIMITS, version="1.1"), data)
    assert _all(Decoder(LIMITS, version="1.0"), data)[0].headers["k"] == "a\\cb\\nc\\\\d\\re"
    # CONNECT is never escaped (a passcode may hold a backslash)
    assert _all(Decoder(LIMITS), b"CONNECT\npasscode:a\\q\n\n\0")[0].headers["passcode"] == "a\\q"


def test_encode_round_trips_through_the_decoder() -> None:
    frame = Frame("MESSAGE", {"destination": "/topic/x", "odd:name": "a\nb\\c"}, b"\0body")
    for version in ("1.1", "1.2"):
        decoder = Decoder(LIMITS, commands=SERVER_COMMANDS, version=version)
        [back] = _all(decoder, encode(frame, version))
        assert back.headers == {**frame.headers, "content-length": "5"}
        assert back.body == frame.body
    with pytest.raises(FrameError, match=r"cannot be written in a 1\.0 frame"):
        encode(frame, "1.0")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"FOO\n\n\0", "unknown command 'FOO'"),
        (b"SEND\nnocolon\n\n\0", "header line 'nocolon' has no ':'"),
        (b"SEND\ncontent-length:x\n\n\0", "content-length 'x' is not a number"),
        (b"SEND\ncontent-length:2\n\nabc\0", "is not NUL"),
        (b"SEND\ncontent-length:99\n\n", "content-length 99 is over 16 bytes"),
        (b"SEND\n\n" + b"x" * 17, "body over 16 bytes"),
        (b"SEND\nh:" + b"x" * 70, "frame headers over 64 bytes"),
        (b"SEND\n" + b"a:b\n" * 5 + b"\n\0", "over 4 headers"),
        (b"SEND\nk:\xff\n\n\0", "not UTF-8"),
        (b"\0", "a NUL where a command was expected"),
    ],
)
def test_bad_input_is_refused_naming_the_problem(data: bytes, problem: str) -> None:
    limits = FrameLimits(header_bytes=64, headers=4, body_bytes=16)
    with pytest.raises(FrameError, match=re.escape(problem)):
        _all(Decoder(limits), data)


def test_negotiation() -> None:
    s = negotiate({"accept-version": "1.0,1.1,1.2", "heart-beat": "1000,5000"}, (2000, 3000))
    assert (s.version, s.send_every, s.expect_every) == ("1.2", 5000, 3000)
    assert negotiate({}, (2000, 3000)).version == "1.0"
    assert negotiate({"accept-version": "1.1", "heart-beat": "0,0"}, (1, 1)).send_every == 0
    with pytest.raises(FrameError, match=r"no supported version in accept-version '2\.0'"):
        negotiate({"accept-version": "2.0"}, (0, 0))
    with pytest.raises(FrameError, match="heart-beat 'x' is not two numbers"):
        negotiate({"accept-version": "1.2", "heart-beat": "x"}, (0, 0))


def test_error_frame_names_the_problem() -> None:
    frame = error_frame("unknown command 'FOO'", receipt_id="7")
    assert frame.headers["message"] == "unknown command 'FOO'"
    assert frame.headers["receipt-id"] == "7" and frame.body == b"unknown command 'FOO'"


@given(st.binary(max_size=300))
def test_any_bytes_give_frames_or_a_frame_error(data: bytes) -> None:
    decoder = Decoder(FrameLimits(header_bytes=128, headers=8, body_bytes=64))
    with contextlib.suppress(FrameError):
        _all(decoder, data)


def test_fuzz_small() -> None:
    """The fuzz program on 5,000 frames: no crash, and the decoders' memory stays flat."""
    report = fuzz(frames=5_000, seed=1)
    assert report.frames == 5_000
    assert report.crashes == 0
    assert report.decoded > 0 and report.refused > 0
    assert report.growth_bytes < 256 * 1024, report


# ----------------------------------------------------------------------------------------
# Typed headers


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("27.9", 27.9),
        ("-3", -3),
        ("1e3", 1000.0),
        ("0", 0),
        ("007", "007"),
        ("+5", "+5"),
        (".5", ".5"),
        ("0x1F", "0x1F"),
        ("NaN", "NaN"),
        ("1e999", "1e999"),
        (str(2**53 + 1), str(2**53 + 1)),
        ("MSFT", "MSFT"),
        ("", ""),
    ],
)
def test_a_header_that_is_a_json_number_is_a_number(text: str, value: object) -> None:
    got = typed_value(text)
    assert got == value and type(got) is type(value)


def test_publication_of_a_send() -> None:
    headers = {
        "destination": "/topic/STOCK",
        "content-length": "5",
        "receipt": "r1",
        "symbol": "MSFT",
        "close": "27.9",
        "zip": "02134",
        "account": "42",
        "octopis-strings": "account, other",
    }
    p = publication_of(headers)
    assert p == {"class": "STOCK", "symbol": "MSFT", "close": 27.9, "zip": "02134", "account": "42"}
    back = headers_of(p)
    assert back["destination"] == "/topic/STOCK" and back["octopis-strings"] == "account"
    assert publication_of(back) == p


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({}, "missing header 'destination'"),
        ({"destination": "/queue/x"}, "only /topic/<name> destinations"),
        ({"destination": "/topic/"}, "only /topic/<name> destinations"),
        ({"destination": "/topic/a", "class": "b"}, "header 'class' is not allowed"),
        ({"destination": "/topic/a", "a b": "1"}, "header 'a b': not a valid attribute name"),
        ({"destination": "/topic/a", "s": "x" * 2000}, "over limits.string_length"),
    ],
)
def test_headers_that_cannot_be_a_publication(headers: dict, problem: str) -> None:
    with pytest.raises(HeaderError, match=re.escape(problem)):
        publication_of(headers)
