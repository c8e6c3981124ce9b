"""One STOMP connection's protocol state (octopis.gateway.session), sans-IO: frames in,
broker requests and frames out; and the STOMP logins (octopis.gateway.credentials)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from octopis.gateway.credentials import CREDENTIALS_FILE, Credentials, CredentialsError, add_user
from octopis.gateway.frames import Frame, encode
from octopis.gateway.session import DeliveryCache, Effects, SessionLimits, StompSession
from octopis.wire import pack
from octopis.wire.client import ReplayDoneNotice, UnsubscribedReply, decode_request

LIMITS = SessionLimits(subscriptions=4, selector_subscriptions=16, unacked=3, heart_beat=(0, 0))
NOTIFY = [3, "pub", 1, 0.0, {"class": "T", "k": 1}, None, None, None, 7, b""]
"""A delivery's NOTIFY body as :func:`octopis.wire.delivery_fields` reads it."""


def _session(version: str = "1.2") -> StompSession:
    s = StompSession(lambda login, passcode: None, 7, LIMITS)
    s.received(Frame("CONNECT", {"accept-version": version}), 0.0)
    return s


def _deliver(s: StompSession, name: str, seq: int = 1) -> Effects:
    body = list(NOTIFY)
    body[2] = seq
    return s.from_broker([pack([name]), pack(body)])


def test_connect_first_and_logins() -> None:
    s = StompSession(lambda login, passcode: None, 7, LIMITS)
    out = s.received(Frame("SEND", {"destination": "/topic/T"}), 0.0)
    assert out.close and "expected CONNECT or STOMP" in out.frames[0].headers["message"]
    refusing = StompSession(lambda login, passcode: f"no {login}", 7, LIMITS)
    out = refusing.received(Frame("STOMP", {"accept-version": "1.2", "login": "eve"}), 0.0)
    assert out.close and out.frames[0].headers["message"] == "no eve"
    assert not refusing.connected


def test_subscribe_receipt_waits_for_every_disjunct() -> None:
    s = _session()
    h = {"id": "a", "destination": "/topic/T", "selector": "k IN ('x', 'y')", "receipt": "r"}
    out = s.received(Frame("SUBSCRIBE", h), 0.0)
    requests = [decode_request(r) for r in out.requests]
    assert [r.filter for r in requests] == [
        "[class,eq,'T'],[k,eq,'x']",
        "[class,eq,'T'],[k,eq,'y']",
    ]
    assert {r.client for r in requests} == {"stomp/a"} and out.frames == []
    first = s.from_broker([pack({"op": "subscribed", "req": requests[0].req, "sub_id": "1"})])
    assert first.frames == []
    second = s.from_broker([pack({"op": "subscribed", "req": requests[1].req, "sub_id": "2"})])
    assert second.frames == [Frame("RECEIPT", {"receipt-id": "r"})]
    out = s.received(Frame("UNSUBSCRIBE", {"id": "a", "receipt": "u"}), 0.0)
    unsubs = [decode_request(r) for r in out.requests]
    assert sorted(u.sub_id for u in unsubs) == ["1", "2"] and out.frames == []
    s.from_broker([pack(UnsubscribedReply(req=unsubs[0].req, sub_id=unsubs[0].sub_id))])
    done = s.from_broker([pack(UnsubscribedReply(req=unsubs[1].req, sub_id=unsubs[1].sub_id))])
    assert done.frames == [Frame("RECEIPT", {"receipt-id": "u"})]


def test_a_reply_the_gateway_cannot_read_ends_the_session_with_an_error_naming_it() -> None:
    s = _session()
    out = s.from_broker([pack({"op": "subscribed", "req": 1})])
    assert out.close and "missing required field `sub_id`" in out.frames[0].headers["message"]


def test_send_receipt_is_the_brokers_confirm() -> None:
    s = _session()
    h = {"destination": "/topic/T", "k": "1.5", "receipt": "p"}
    out = s.received(Frame("SEND", h), 12.5)
    [request] = [decode_request(r) for r in out.requests]
    assert request.publication == {"class": "T", "k": 1.5} and request.published_at == 12.5
    assert out.frames == [] and s.unanswered == 1
    answer = s.from_broker([pack({"op": "published", "req": request.req, "seq": request.seq})])
    assert answer.frames == [Frame("RECEIPT", {"receipt-id": "p"})] and s.unanswered == 0


def test_a_body_travels_unchanged_into_the_message() -> None:
    s = _session()
    body = b"\x00opaque\nbytes:\x00"
    out = s.received(Frame("SEND", {"destination": "/topic/T", "k": "1"}, body), 1.0)
    [request] = [decode_request(r) for r in out.requests]
    assert request.body == body and request.publication == {"class": "T", "k": 1}
    s.received(Frame("SUBSCRIBE", {"id": "a", "destination": "/topic/T"}), 0.0)
    delivered = s.from_broker([pack(["stomp/a"]), pack([*NOTIFY[:-1], body])])
    assert [f.body for f in delivered.frames] == [body]
    assert s.from_broker([pack(["stomp/a"]), pack(NOTIFY)]).frames[0].body == b""


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (Frame("SEND", {"destination": "/topic/T", "transaction": "t"}), "transactions"),
        (Frame("BEGIN", {"transaction": "t"}), "BEGIN is not supported"),
        (Frame("SUBSCRIBE", {"destination": "/topic/T"}), "SUBSCRIBE needs an 'id'"),
        (Frame("SUBSCRIBE", {"id": "1", "destination": "/topic/T", "ack": "x"}), "ack mode 'x'"),
        (
            Frame(
                "SUBSCRIBE",
                {"id": "1", "destination": "/topic/T", "activemq.subscriptionName": "d"},
            ),
            "needs a client-id header on CONNECT",
        ),
        (
            Frame("SUBSCRIBE", {"id": "1", "destination": "/topic/T", "selector": "k IS NULL"}),
            "absent",
        ),
        (Frame("ACK", {"id": "9"}), "ACK of '9': no such message waits"),
        (Frame("UNSUBSCRIBE", {"id": "9"}), "no subscription '9'"),
    ],
)
def test_refusals_close_with_an_error(frame: Frame, problem: str) -> None:
    out = _session().received(frame, 0.0)
    assert out.close and out.requests == []
    assert problem in out.frames[0].headers["message"]


def test_client_acks_are_cumulative_and_bounded() -> None:
    s = _session()
    s.received(Frame("SUBSCRIBE", {"id": "c", "destination": "/topic/T", "ack": "client"}), 0.0)
    s.received(
        Frame("SUBSCRIBE", {"id": "i", "destination": "/topic/T", "ack": "client-individual"}), 0.0
    )
    acks = [
        _deliver(s, name, n).frames[0].headers["ack"]
        for n, name in enumerate(["stomp/c", "stomp/i", "stomp/c"])
    ]
    assert s.received(Frame("ACK", {"id": acks[2]}), 0.0).frames == []  # settles both of c
    assert list(s._unacked) == [acks[1]]
    overflow = [_deliver(s, "stomp/i", n) for n in range(10, 13)]
    assert overflow[-1].close and "wait for ACK" in overflow[-1].frames[0].headers["message"]


def test_each_delivery_once_per_subscription_and_none_after_unsubscribe() -> None:
    s = _session()
    s.received(Frame("SUBSCRIBE", {"id": "a", "destination": "/topic/T"}), 0.0)
    out = s.from_broker([pack(["stomp/a", "stomp/gone"]), pack(NOTIFY)])
    assert [f.headers["subscription"] for f in out.frames] == ["a"]
    assert out.frames[0].shared == "destination:/topic/T\nk:1\n"
    assert "ack" not in out.frames[0].headers


def test_credentials(tmp_path: Path) -> None:
    path = add_user(tmp_path, "alice", "s3cret-pass")
    assert path.name == CREDENTIALS_FILE and path.stat().st_mode & 0o777 == 0o600
    assert "s3cret-pass" not in path.read_text()
    creds = Credentials.load(tmp_path)
    assert creds.check("alice", "s3cret-pass") is None
    assert creds.check("alice", "s3cret-pass") is None  # remembered
    assert "wrong passcode" in (creds.check("alice", "nope") or "")
    assert "needs login and passcode" in (creds.check(None, None) or "")
    os.chmod(path, 0o644)
    with pytest.raises(CredentialsError, match="readable by others"):
        Credentials.load(tmp_path)
    with pytest.raises(CredentialsError, match="at least 8 characters"):
        add_user(tmp_path, "bob", "short")


def test_an_everywhere_receipt_waits_for_a_round_behind_the_subscriptions() -> None:
    s = _session()
    h = {
        "id": "a",
        "destination": "/topic/T",
        "selector": "k IN ('x', 'y')",
        "receipt": "r",
        "octopis.everywhere": "true",
    }
    subscribes = [decode_request(r) for r in s.received(Frame("SUBSCRIBE", h), 30.0).requests]
    s.from_broker([pack({"op": "subscribed", "req": subscribes[0].req, "sub_id": "1"})])
    last = s.from_broker([pack({"op": "subscribed", "req": subscribes[1].req, "sub_id": "2"})])
    [probe] = [decode_request(r) for r in last.requests]
    assert last.frames == [] and probe.client == "stomp/a"
    assert probe.filters == [r.filter for r in subscribes]
    assert probe.since == [] and probe.after == probe.until == 30.0  # an empty window
    assert s.from_broker([pack({"op": "replaying", "req": probe.req, "id": "p"})]).frames == []
    echo = {"answered": [], "unstored": [], "gaps": [], "published": 0, "truncated": []}
    notice = ReplayDoneNotice(id="p", silent=["c:1"], late=False, claimed=[], **echo)
    done = s.from_broker([pack(notice)])
    assert done.frames == [Frame("RECEIPT", {"receipt-id": "r", "octopis-silent": "c:1"})]


def test_connections_sharing_a_cache_get_each_notification_whole() -> None:
    cache = DeliveryCache()
    a, b = (StompSession(lambda login, passcode: None, 7, LIMITS, cache) for _ in range(2))
    for s in (a, b):
        s.received(Frame("CONNECT", {"accept-version": "1.2"}), 0.0)
        s.received(Frame("SUBSCRIBE", {"id": "x", "destination": "/topic/T"}), 0.0)
    bodies = [
        pack([*NOTIFY[:4], {"class": "T", "k": k}, *NOTIFY[5:-1], b"b%d" % k]) for k in (1, 2)
    ]
    parts = [pack(["stomp/x"]), bodies[0], pack(["stomp/x"]), bodies[1]]
    for s in (a, b):  # a send pass: each connection's deliveries in turn
        frames = s.from_broker(parts).frames
        assert [encode(f) for f in frames] == [
            f"MESSAGE\nsubscription:x\nmessage-id:{n}\ndestination:/topic/T\nk:{n}\n"
            f"content-length:2\n\nb{n}\0".encode()
            for n in (1, 2)
        ]
