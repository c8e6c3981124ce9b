"""Peer-link frames (declared in octopis.wire, converted by octopis.core.codec,
DESIGN §2, §4, §7): every message kind survives the round trip with the bytes it always
had, the routing messages and the compiled NOTIFY path agree with the declarations, and
every malformed frame is refused with an error that names the problem (the client
protocol's: tests/test_wire_client.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import msgpack
import msgspec
import pytest
from bitarray import frozenbitarray
from hypothesis import given, settings
from hypothesis import strategies as st
from laws import sized

from octopis._match import plain_notification
from octopis.core import (
    Advertise,
    Move,
    Notification,
    Rehost,
    Subscribe,
    SubState,
    Tunnel,
    Unadvertise,
    Unsubscribe,
)
from octopis.core.codec import (
    Heartbeat,
    Hello,
    Synced,
    WireError,
    _same_fields,
    decode_body,
    decode_body_in_full,
    decode_peer,
    decode_plain_notification,
    encode_body,
    encode_peer,
)
from octopis.core.replay import Claimed, Replay, ReplayData, ReplayEcho
from octopis.filters.language import parse_subscription
from octopis.filters.limits import VALID_ATTRIBUTES
from octopis.wire import (
    BODIES,
    HEARTBEAT,
    HELLO,
    NOTIFY,
    PLAIN_NIL,
    PLAIN_NOTIFY,
    SYNCED,
    NotifyBody,
    SubscribeBody,
    body_positions,
    kind_name,
)
from octopis.wire.client import (
    delivery_fields,
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
        Notification("P", 10, 12.5, QUOTE, tunnel=Tunnel(2, "d", "b", 0b10)),
        Notification("P", 11, 12.5, QUOTE, session=2**63 - 1),
        Notification("P", 12, 12.5, QUOTE, body=b"\x00opaque\xff" * 100),
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
        Move("a:0#3", "a:1"),
        Rehost("a:0#3", "a:1"),
        Advertise("a:0!1", "a:0", parse_subscription("[class,eq,'STOCK']"), SubState.PRIMARY),
        Advertise("a:0!1", "a:0", parse_subscription("[x,>,1]"), SubState.SECONDARY, "r2"),
        Unadvertise("a:0!1", SubState.SECONDARY),
    ],
)
def test_round_trip(message: object) -> None:
    sender, decoded = decode_peer(encode_peer("a:0", message))
    assert sender == "a:0"
    assert decoded == message
    assert type(decoded) is type(message)


@pytest.mark.parametrize(
    "message",
    [
        Hello(7, 0),
        Hello(2**63 - 1, 9),
        Heartbeat(3, 0, 0, False),
        Heartbeat(3, 9, 12_000, True),
        Synced(0, True, False, False),
        Synced(40, complete=False, wants_share=True, predecessor=False),
        Synced(0, True, False, predecessor=True),
    ],
)
def test_link_messages_round_trip(message: Hello | Heartbeat | Synced) -> None:
    sender, decoded = decode_peer(encode_peer("c:2", message))
    assert sender == "c:2"
    assert decoded == message
    assert type(decoded) is type(message)


@pytest.fixture
def names_known() -> Iterator[set[str]]:
    """The process's cache of attribute names already validated
    (:data:`~octopis.filters.limits.VALID_ATTRIBUTES`, which the compiled path reads), as
    it was before the test, whatever earlier tests in this worker left in it: a test may
    add names or take them out, and gets the cache back as it found it."""
    saved = set(VALID_ATTRIBUTES)
    try:
        yield VALID_ATTRIBUTES
    finally:
        VALID_ATTRIBUTES.clear()
        VALID_ATTRIBUTES.update(saved)


def test_a_delivery_reads_the_notify_body_it_carries(names_known: set[str]) -> None:
    n = Notification("P", 8, 12.5, QUOTE, cbv=frozenbitarray("0110"))
    assert delivery_fields(encode_body(n)) == ("P", 8, 12.5, QUOTE, 0, b"")
    with_body = encode_body(n._replace(cbv=None, body=b"\x00\xffbytes"))
    assert delivery_fields(with_body) == ("P", 8, 12.5, QUOTE, 0, b"\x00\xffbytes")
    names_known.update(QUOTE)
    assert decode_plain_notification(with_body).body == b"\x00\xffbytes"
    names_known.discard("volume")  # a name not validated yet: the full decoding decides
    assert decode_plain_notification(with_body) is None
    assert decode_body("a:0", with_body).body == b"\x00\xffbytes"


def good_notify(**change: object) -> list:
    fields = {
        "publisher": "P",
        "seq": 1,
        "at": 1.0,
        "pub": QUOTE,
        "cbv": None,
        "dests": None,
        "tunnel": None,
        "session": 0,
        "body": b"",
    }
    fields.update(change)
    return [NOTIFY, *fields.values()]


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        ([b"a:0"], "frame has 1 parts"),
        ([b"a:0", b"x", b"y"], "frame has 3 parts"),
        ([b"\xff", msgpack.packb([HELLO, 1, 0])], "sender part is not UTF-8"),
        ([b"a:0", b"\xc1"], "is not msgpack"),
        ([b"a:0", msgpack.packb([HELLO, "x", 1]) + b"\xc1"], "is not msgpack: Messag"),
        ([b"a:0", msgpack.packb([NOTIFY, "P", 1, 1.0, 7])[:-1]], "is not msgpack: Input"),
        ([b"a:0", msgpack.packb({"kind": 3})], "is not [kind, ...]"),
        (body(), "is not [kind, ...]"),
        (body(True), "frame kind must be an integer"),
        (body(3.0, "P"), "frame kind must be an integer"),
        (body(99), "unknown frame kind 99"),
        (body(HELLO, 1), "HELLO frame has 2 fields"),
        (body(HELLO, -1, 0), "HELLO incarnation from a:0: Expected `int` >= 0"),
        (body(HELLO, 1, 2**63), "HELLO peer_incarnation from a:0: Expected `int` <= 9223"),
        (body(HEARTBEAT, "x", 0, 0, False), "HEARTBEAT incarnation from a:0: Expected `int`"),
        (body(HEARTBEAT, 1, 2, -3, False), "HEARTBEAT acked from a:0"),
        (body(HEARTBEAT, 1, 2, 3, 1), "HEARTBEAT serving from a:0: Expected `bool`"),
        (body(HEARTBEAT, 1), "HEARTBEAT frame has 2 fields, expected 5"),
        (body(SYNCED, 3, True, 0, False), "SYNCED wants_share from a:0: Expected `bool`"),
        (body(SYNCED, 3), "SYNCED frame has 2 fields"),
        (body(SYNCED, 3, True, True, True, True), "SYNCED frame has 6 fields, expected 5"),
        (body(*good_notify()[:-1]), "NOTIFY frame has 9 fields, expected 10"),
        (body(*good_notify(body="text")), "NOTIFY body from a:0: Expected `bytes`, got `str`"),
        (body(*good_notify(session=-1)), "NOTIFY session from a:0: Expected `int` >= 0"),
        (body(*good_notify(session=2**63)), "NOTIFY session from a:0: Expected `int` <= "),
        (body(*good_notify(session=None)), "NOTIFY session from a:0: Expected `int`, got `None`"),
        (body(*good_notify(tunnel=[0, "a", "b"])), "NOTIFY tunnel from a:0: Expected `array`"),
        (body(*good_notify(tunnel=[-1, "a", "b", 0])), "NOTIFY tunnel from a:0"),
        (body(*good_notify(tunnel=[0, "", "b", 0])), "NOTIFY tunnel from a:0"),
        (body(*good_notify(publisher="")), "NOTIFY publisher from a:0: Expected `str` of length"),
        (body(*good_notify(seq="1")), "NOTIFY seq from a:0: Expected `int`, got `str`"),
        (body(*good_notify(seq=-1)), "NOTIFY seq from a:0"),
        (body(*good_notify(seq=2**64 - 1)), "NOTIFY seq from a:0"),
        (body(*good_notify(at=math.nan)), "NOTIFY published_at from a:0"),
        (body(*good_notify(at=math.inf)), "NOTIFY published_at from a:0"),
        (body(*good_notify(at=1e300)), "NOTIFY published_at from a:0"),
        (body(*good_notify(pub={"close": [1]})), "attribute 'close'"),
        (body(*good_notify(pub={"close": 2**60})), "attribute 'close'"),
        (body(*good_notify(pub={})), "empty publication"),
        (body(*good_notify(cbv=[b"\x80", True])), "NOTIFY cbv from a:0: Expected `int`"),
        (body(*good_notify(cbv=[b"\x80", 9])), "CBV must be [bytes, nbits]: 9 bits in 1 bytes"),
        (body(*good_notify(dests=[["b:0"]])), "NOTIFY destinations from a:0"),
        (body(1, "s", "a:0", "[class,eq", 1, [b"\x80", 3], 0.0, 0), "bad content from a:0"),
        (body(2, "s#1", 3), "UNSUBSCRIBE state from a:0: Invalid enum value 3"),
        (body(6, "s#1", ""), "MOVE host from a:0"),
        (body(11, "a!1", "a:0", "[x,>,1]", 1, ""), "ADVERTISE via from a:0"),
    ],
)
def test_malformed_frames_name_the_problem(frame: list[bytes], problem: str) -> None:
    with pytest.raises(WireError) as caught:
        decode_peer(frame)
    assert problem in str(caught.value)


def test_encode_rejects_what_it_cannot_carry() -> None:
    with pytest.raises(TypeError, match="cannot encode str"):
        encode_body("hello")  # type: ignore[arg-type]


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.binary(max_size=2),
    st.lists(st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=2),
)
PUBLICATIONS = st.one_of(
    st.dictionaries(st.sampled_from(["class", "symbol", "close", "volume"]), FIELD_VALUES),
    st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**64 - 1), max_size=2),
    FIELD_VALUES,
)


VALID_FIELDS = (
    st.sampled_from(["P", "publisher-7"]),
    st.sampled_from([0, 1, 2**63 - 1]) | st.integers(0, 2**63 - 1),
    st.sampled_from([0, 1e12, -1e12, 1.7e9]) | st.floats(-1e12, 1e12) | st.integers(-10, 10),
    st.dictionaries(
        st.sampled_from(["class", "symbol", "close", "volume"]),
        st.text(max_size=3) | st.floats(-1e6, 1e6) | st.integers(-(2**53), 2**53),
        min_size=1,
    ),
    st.sampled_from([0, 2**63 - 1]) | st.integers(0, 2**63 - 1),
)
EDGES = st.sampled_from([-1, 2**63, 2**64 - 1, 1.0000001e12, -2e12, math.nan, math.inf, 2**53 + 1])


def test_only_a_plain_notification_takes_the_compiled_path(names_known: set[str]) -> None:
    """The compiled path gives the plain notification (once the full decoding has
    checked its attribute names) as the full decoding does, and None (never an error)
    for anything else: a CBV-carrying copy, another kind, bytes
    that are not msgpack; the input pass then decodes those in full, once."""
    plain = Notification("P", 1, 0.0, {"class": "STOCK", "open": 1.5})
    with_cbv = plain._replace(cbv=frozenbitarray("010"))
    subscribe = Subscribe(
        "s#1", "a:0", parse_subscription("[x,>,1]"), SubState.PRIMARY, frozenbitarray("100"), 0.0, 1
    )
    names_known.clear()  # a cache that another test filled to its bound takes no more
    assert decode_body("a:0", encode_body(plain)) == plain  # its names are now known
    assert decode_plain_notification(encode_body(plain)) == plain
    assert decode_body_in_full("a:0", encode_body(plain)) == plain
    for other in (with_cbv, subscribe):
        body = encode_body(other)
        assert decode_plain_notification(body) is None
        assert decode_body_in_full("a:0", body) == decode_body("a:0", body) == other
    for garbage in (b"", b"\x99", b"\x99\x03\xc1", b"\xc1 not msgpack"):
        assert decode_plain_notification(garbage) is None
        with pytest.raises(WireError):
            decode_body("a:0", garbage)


@settings(max_examples=sized(150, 600), deadline=None)
@given(
    fields=st.tuples(*VALID_FIELDS),
    broken=st.sampled_from([None, 0, 1, 2, 3, 4]),
    wrong=st.one_of(FIELD_VALUES, EDGES, PUBLICATIONS),
    extra=st.sampled_from([None, None, None, 0, [b"\x80", 1]]),
)
def test_the_plain_notification_path_accepts_only_what_the_full_decoding_does(
    fields: tuple, broken: int | None, wrong: object, extra: object
) -> None:
    """A NOTIFY body goes through the C-checked plain shape first; whatever it accepts,
    the full decoding accepts as the same notification, and whatever the full decoding
    refuses is refused, in the full decoding's words. ``fields`` (publisher, seq,
    published_at, publication, session) are valid but the ``broken`` one, which is
    ``wrong``; ``extra`` is a CBV or something that is not one."""
    values = list(fields)
    if broken is not None:
        values[broken] = wrong
    publisher, seq, published_at, publication, session = values
    body_fields = [
        NOTIFY,
        publisher,
        seq,
        published_at,
        publication,
        extra,
        None,
        None,
        session,
        b"",
    ]
    frame = [b"a:0", msgpack.packb(body_fields)]
    try:
        full = decode_body_in_full("a:0", frame[1])
    except WireError as exc:
        assert decode_plain_notification(frame[1]) is None
        with pytest.raises(WireError) as refused:
            decode_peer(frame)
        assert str(refused.value) == str(exc)
        return
    assert decode_plain_notification(frame[1]) in (None, full)
    assert decode_peer(frame) == ("a:0", full)


def test_every_kind_has_one_declaration_in_the_order_of_kinds() -> None:
    """A body's tag is its kind, each kind is declared once, and the names in errors
    come from the declarations."""
    tags = [msgspec.inspect.type_info(b).tag for b in BODIES]
    assert tags == list(range(len(BODIES)))
    assert [kind_name(b) for b in BODIES] == [
        "HELLO",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "NOTIFY",
        "HEARTBEAT",
        "SYNCED",
        "MOVE",
        "REHOST",
        "REPLAY",
        "REPLAY_DATA",
        "REPLAY_ECHO",
        "ADVERTISE",
        "UNADVERTISE",
        "RESENT",
        "ASK",
    ]


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (Notification("P", 7, 12.5, QUOTE), [3, "P", 7, 12.5, QUOTE, None, None, None, 0, b""]),
        (
            Notification(
                "P",
                8,
                1.0,
                QUOTE,
                frozenbitarray("011"),
                (("b", "b#1"),),
                Tunnel(2, "d", "b", 1),
                5,
                b"b",
            ),
            [3, "P", 8, 1.0, QUOTE, [b"\x60", 3], [["b", "b#1"]], [2, "d", "b", 1], 5, b"b"],
        ),
        (
            Subscribe("s#1", "a", parse_subscription("[x,>,1]"), SubState.SECONDARY, None, 2.5, 3),
            [1, "s#1", "a", "[x,>,1]", 2, None, 2.5, 3],
        ),
        (Unsubscribe("s#1", SubState.PRIMARY), [2, "s#1", 1]),
        (Move("s#1", "b"), [6, "s#1", "b"]),
        (Rehost("s#1", "b"), [7, "s#1", "b"]),
        (
            Advertise("a!1", "a", parse_subscription("[x,>,1]"), SubState.SECONDARY, "r"),
            [11, "a!1", "a", "[x,>,1]", 2, "r"],
        ),
        (Unadvertise("a!1", SubState.PRIMARY), [12, "a!1", 1]),
        (Hello(7, 9), [0, 7, 9]),
        (Heartbeat(7, 9, 11, True), [4, 7, 9, 11, True]),
        (Synced(4, True, False, True), [5, 4, True, False, True]),
        (
            Replay("r", "a", ("[x,>,1]",), (("P", 1, 2),), 5.0, 3.0),
            [8, "r", "a", ["[x,>,1]"], [["P", 1, 2]], 5.0, 3.0, 1, None, 0, 0, ""],
        ),
        (
            ReplayData("r", (Notification("P", 7, 12.5, QUOTE),)),
            [9, "r", [msgpack.packb([3, "P", 7, 12.5, QUOTE, None, None, None, 0, b""])]],
        ),
        (
            ReplayEcho(
                "r",
                answered=("b",),
                gaps=(("P", 1, 2, 3),),
                published=4,
                claimed=(Claimed("b", ("[x,>,1]",), (("P", 1, 2),), 4.0, 6.0),),
            ),
            [
                10,
                "r",
                False,
                ["b"],
                [],
                [],
                [["P", 1, 2, 3]],
                4,
                [],
                [["b", ["[x,>,1]"], [["P", 1, 2]], 4.0, 6.0]],
            ],
        ),
    ],
)
def test_the_bytes_on_the_wire_are_the_kind_and_the_fields(
    message: object, fields: list[object]
) -> None:
    """A body is ``[kind, ...fields]``, every field at its declared place (a NOTIFY
    carries its opaque body last, empty when it has none)."""
    assert encode_body(message) == msgpack.packb(fields)


def test_routing_messages_agree_with_their_declarations() -> None:
    """The codec converts by name and the compiled path builds a ``Notification`` from
    the fields after the kind: both hold only while the fields agree, which is checked
    when the codec is imported; the check refuses a message that differs."""
    assert Notification._fields == NotifyBody.__struct_fields__
    with pytest.raises(TypeError, match=r"Move.*differs from its wire declaration"):
        _same_fields(Move, SubscribeBody)


def test_the_compiled_path_takes_its_positions_from_the_declaration() -> None:
    """The plain NOTIFY shape is the declaration with nil CBV, destinations and tunnel,
    its head is the array of kind and fields, and the compiled reader checks the field
    the declaration names ``publication``: pointed at another field, it takes nothing."""
    declared = msgspec.structs.fields(NotifyBody)
    plain = PLAIN_NOTIFY.__args__
    assert len(plain) == 1 + len(declared)
    for field, kind in zip(declared, plain[1:], strict=True):
        nil = field.name in PLAIN_NIL
        assert kind is None if nil else kind == field.type
    head, decoder, errors, _, cls, publication = decode_plain_notification.args
    assert head == bytes([0x90 | len(plain), NOTIFY])
    assert publication == body_positions(NotifyBody)["publication"] == 4
    n = Notification("P", 1, 0.0, {"class": "STOCK", "open": 1.5})
    known = set(n.publication)  # the names, known whatever the suite learned before
    for other in range(1, len(plain)):
        found = plain_notification(head, decoder, errors, known, cls, other, encode_body(n))
        assert (found == n) is (other == publication)
