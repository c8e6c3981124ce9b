"""The client protocol declared once (issue 55, "The wire declared once"; DESIGN §4):
every reply and notice a broker sends is a struct of :mod:`octopis.wire.client`, read
back by :func:`decode_reply` into its kind; one the SDK cannot read is refused by name
and leaves the connection serving; and no module outside :mod:`octopis.wire` spells a
protocol body as a map of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import pytest
from test_layers import PACKAGE

from octopis.client import Connection
from octopis.core import Notification, Tunnel
from octopis.core.codec import encode_body
from octopis.wire import ClaimedRecord, pack
from octopis.wire.client import (
    AckedReply,
    AdoptedReply,
    AdvertisedReply,
    AliveReply,
    BrokerMessage,
    ByeReply,
    ClaimingReply,
    CompositeDroppedNotice,
    CompositeNotice,
    DroppedNotice,
    ErrorReply,
    MoveNotice,
    OverflowNotice,
    PublishedReply,
    PublishRequest,
    ReleasedNotice,
    ReplayDoneNotice,
    ReplayedNotice,
    ReplayingReply,
    ReplyError,
    RequestError,
    SubscribedReply,
    SubscribeRequest,
    UnsubscribedReply,
    WelcomeReply,
    WithdrawnNotice,
    decode_reply,
    decode_request,
    is_reply,
    op_of,
    read_notify,
)

QUOTE = {"class": "STOCK", "symbol": "MSFT", "close": 28.1, "volume": 1200}
SAMPLES = [
    WelcomeReply(req=1, broker="a:0", mode="dnr", cluster=0, region="a", timeout=10.0),
    AliveReply(req=2),
    ByeReply(req=3),
    SubscribedReply(req=4, sub_id="a:0#1"),
    UnsubscribedReply(req=5, sub_id="a:0#1"),
    AdoptedReply(req=6, sub_id="a:0#1"),
    AdvertisedReply(req=7, adv_id="a:0@1"),
    ReplayingReply(req=8, id="a:0/1"),
    ClaimingReply(req=9, id="a:0/2"),
    AckedReply(req=10),
    PublishedReply(req=11, seq=42),
    ErrorReply(req=12, message="not kept: the disk is full", error="not_kept"),
    MoveNotice(client="s", to="tcp://127.0.0.1:5001", inside=True, sub_ids=["a:0#1"]),
    ReleasedNotice(client="s", sub_id="a:0#1"),
    WithdrawnNotice(client="s", sub_id="a:0#1"),
    ReplayedNotice(client="s", id="a:0/1", bodies=[b"\x93\x03"]),
    ReplayDoneNotice(
        client="s",
        id="a:0/1",
        answered=["a:0"],
        unstored=["b:0"],
        silent=["c:1"],
        gaps=[("P", 7, 1, 4)],
        published=3,
        late=False,
        truncated=[],
        claimed=[ClaimedRecord("b:0", (), (("P", 7, 4),), 1.0, 2.0)],
    ),
    CompositeNotice(
        client="c",
        sub_id="a:0#2",
        parts=[("P", 7, 1, 1.5, {"class": "STOCK"}, [0])],
        dropped=0,
        late=1,
        cut=0,
    ),
    CompositeDroppedNotice(client="c", sub_id="a:0#2", dropped=3, late=0, cut=1),
    DroppedNotice(reason="slow consumer: backlog over clients.backlog_limit", req=13),
    OverflowNotice(dropped=2),
]


def test_every_reply_and_notice_decodes_into_its_kind() -> None:
    """Each declared kind has a sample here (a kind added without one fails), and what
    the broker encodes, the SDK decodes into the same struct."""
    assert {type(m) for m in SAMPLES} == set(BrokerMessage.__args__)
    for message in SAMPLES:
        assert decode_reply(pack(message)) == message


def test_a_reply_is_a_map_tagged_by_op() -> None:
    """On the wire a reply is the map a client in any language reads: ``op``, ``req``
    and the declared fields by name."""
    assert msgspec.msgpack.decode(pack(SubscribedReply(req=4, sub_id="a:0#1"))) == {
        "op": "subscribed",
        "req": 4,
        "sub_id": "a:0#1",
    }
    assert op_of(SubscribeRequest(client="s", filter="[x,>,1]")) == "subscribe"
    assert op_of({"op": "explode"}) == "explode"


def test_a_newer_brokers_extra_fields_are_ignored() -> None:
    payload = pack({"op": "published", "req": 1, "seq": 5, "stored_at": "disk"})
    assert decode_reply(payload) == PublishedReply(req=1, seq=5)
    assert is_reply(pack(ByeReply(req=1)), ByeReply)
    assert not is_reply(payload, ByeReply) and not is_reply(b"\xc1", ByeReply)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"\xc1 not msgpack", "reply is not msgpack"),
        (pack({"op": "subscribed", "req": 1}), "missing required field `sub_id`"),
        (pack({"op": "published", "req": 1, "seq": "five"}), r"Expected `int`, got `str`"),
        (pack({"op": "teleported"}), "Invalid value 'teleported'"),
        (pack([1, 2]), "Expected `object`, got `array`"),
    ],
)
def test_a_malformed_reply_names_the_problem(payload: bytes, problem: str) -> None:
    with pytest.raises(ReplyError, match=problem):
        decode_reply(payload)


def test_a_reply_the_sdk_cannot_read_is_kept_in_errors_and_the_connection_reads_on() -> None:
    connection = Connection(["tcp://127.0.0.1:1"])
    told: list[object] = []
    connection.on_notice("s", told.append)
    connection._on_frame([pack({"op": "subscribed", "req": 1})])
    notice = ReleasedNotice(client="s", sub_id="a:0#1")
    connection._on_frame([pack(notice)])
    assert connection.errors[-1].startswith("bad reply: Object missing required field")
    assert told == [notice]


def test_a_client_request_decodes_into_its_kind() -> None:
    request = decode_request(
        pack({"op": "publish", "client": "c", "seq": 3, "published_at": 1, "publication": "x"})
    )
    assert request == PublishRequest(client="c", seq=3, published_at=1.0, publication="x")


@pytest.mark.parametrize(
    ("request_", "problem"),
    [
        ({"op": "publish", "client": "c"}, "missing required field `seq`"),
        ({"op": "nope", "client": "c"}, "unknown op 'nope'; expected one of hello"),
        ({"op": "hello", "client": ""}, "at `$.client`"),
        ({"op": "hello", "client": "c" * 257}, "at `$.client`"),
        ({"op": "hello", "client": "c", "x": 1}, "unknown field `x`"),
        (
            {"op": "publish", "client": "c", "seq": -1, "published_at": 0, "publication": "x"},
            "at `$.seq`",
        ),
        ({"op": "unsubscribe", "client": "c", "sub_id": 5}, "at `$.sub_id`"),
        (
            {
                "op": "publish",
                "client": "c",
                "seq": 1,
                "published_at": 0,
                "publication": "x",
                "session": 2**63,
            },
            "at `$.session`",
        ),
        ([1, 2], "Expected `object`, got `array`"),
    ],
)
def test_malformed_client_requests_name_the_problem(request_: object, problem: str) -> None:
    with pytest.raises(RequestError) as caught:
        decode_request(pack(request_))
    assert problem in str(caught.value)


def test_a_client_reads_a_delivery_by_name() -> None:
    n = Notification("P", 8, 12.5, QUOTE, tunnel=Tunnel(0, "a", "b", 0), session=3)
    read = read_notify(encode_body(n))
    assert (read.publisher, read.seq, read.publication, read.session) == ("P", 8, QUOTE, 3)


def hand_spelled_bodies(root: Path, excluded: frozenset[str]) -> list[str]:
    """Each map literal under ``root`` with a constant ``"op"`` key (a protocol body
    spelled by hand), outside ``excluded`` (paths relative to ``root``):
    ``file:line``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = str(path.relative_to(root))
        if relative in excluded:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "op" for k in node.keys
            ):
                found.append(f"{relative}:{node.lineno}")
    return found


HARNESS = frozenset({"cluster/harness.py"})
"""The experiment harness's own commands to its worker processes (``ready``, ``done``,
``close``): not the client protocol."""


def test_no_module_spells_a_protocol_body_by_hand() -> None:
    assert hand_spelled_bodies(PACKAGE, HARNESS) == []


def test_the_hand_spelled_body_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "replies.py").write_text('x = 1\nREPLY = {"op": "alive", "req": 1}\n')
    assert hand_spelled_bodies(tmp_path, frozenset()) == ["replies.py:2"]
