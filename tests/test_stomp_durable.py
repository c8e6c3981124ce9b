"""A durable STOMP subscription's protocol (octopis.gateway.durable through
octopis.gateway.session), sans-IO: the SDK's durable requests (subscribe, claim, ack,
replay) made for ActiveMQ's ``client-id`` and ``activemq.subscriptionName``; the past
joined with live deliveries, each once, in publisher order; what the client did not
acknowledge left in the record."""

from __future__ import annotations

import logging
from collections import Counter
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock

import pytest

from octopis.gateway.frames import Frame
from octopis.gateway.listener import Connection, Listener
from octopis.gateway.session import Effects, SessionLimits, StompSession
from octopis.settings import Clients, Stomp
from octopis.wire import ClaimedRecord, pack
from octopis.wire.client import (
    AckRequest,
    ClaimRequest,
    ReplayRequest,
    SubscribeRequest,
    decode_request,
)

LIMITS = SessionLimits(subscriptions=4, selector_subscriptions=16, unacked=100, heart_beat=(0, 0))
CLIENT = "stomp:app-1/audit"


def _notify(seq: int, publisher: str = "pub", session: int = 7) -> bytes:
    return pack([3, publisher, seq, 0.0, {"class": "T", "k": seq}, None, None, None, session, b""])


def _requests(out: Effects) -> list[Any]:
    return [decode_request(r) for r in out.requests]


DONE = {
    "answered": [],
    "unstored": [],
    "silent": [],
    "gaps": [],
    "published": 0,
    "late": False,
    "truncated": [],
    "claimed": [],
}
"""The fields of a ``replay_done`` notice a test leaves out (its broker says them all)."""


def _reply(s: StompSession, **reply: Any) -> Effects:
    return s.from_broker([pack({**DONE, **reply} if reply["op"] == "replay_done" else reply)])


def _durable(ack: str, selector: str = "k > 0 OR k < -5") -> tuple[StompSession, list[Any]]:
    """A session whose durable subscription is subscribed; the claims it sent."""
    s = StompSession(lambda login, passcode: None, 7, LIMITS)
    s.received(Frame("CONNECT", {"accept-version": "1.2", "client-id": "app-1"}), 0.0)
    headers = {
        "id": "d",
        "destination": "/topic/T",
        "selector": selector,
        "ack": ack,
        "activemq.subscriptionName": "audit",
    }
    subscribes = _requests(s.received(Frame("SUBSCRIBE", headers), 0.0))
    assert all(type(r) is SubscribeRequest and r.client == CLIENT for r in subscribes)
    names = [str(i) for i in range(len(subscribes))]
    assert [r.durable for r in subscribes] == names
    claims: list[Any] = []
    for i, r in enumerate(subscribes):
        claims += _requests(_reply(s, op="subscribed", req=r.req, sub_id=f"x#{i}"))
    assert [(type(c), c.durable) for c in claims] == [(ClaimRequest, n) for n in names]
    for c in claims:
        assert _reply(s, op="claiming", req=c.req, id=f"c{c.durable}").frames == []
    return s, claims


def _ns(out: Effects) -> list[int]:
    return [int(f.shared.split("k:")[1].split("\n")[0]) for f in out.frames]


def test_a_claimed_record_is_replayed_with_the_live_messages_each_once_in_order() -> None:
    s, _ = _durable("auto")
    held = s.from_broker([pack([CLIENT]), _notify(5)])  # live, while the past is asked for
    assert held.frames == []
    record = ClaimedRecord("b:1", ("[class,eq,'T'],[k,>,0]",), (("pub", 7, 2),), 10.0, 20.0)
    older = ClaimedRecord("c:0", ("[class,eq,'T'],[k,<,-5]",), (("pub", 7, 1),), 5.0, 15.0)
    assert _reply(s, op="replay_done", id="c0", claimed=[record]).requests == []
    then = _requests(_reply(s, op="replay_done", id="c1", claimed=[older]))
    acks, [replay] = then[:-1], then[-1:]
    assert {a.durable for a in acks} == {"0", "1"} and all(type(a) is AckRequest for a in acks)
    assert all(a.since == [("pub", 7, 2)] and a.after == 5.0 for a in acks)
    assert type(replay) is ReplayRequest and replay.since == [("pub", 7, 2)]
    assert replay.after == 5.0 and replay.historic and len(replay.filters) == 2
    _reply(s, op="replaying", req=replay.req, id="r")
    _reply(s, op="replayed", id="r", bodies=[_notify(4), _notify(3), _notify(5)])
    done = _reply(s, op="replay_done", id="r", claimed=[])
    assert _ns(done) == [3, 4, 5]  # the past in publisher order, 5 once
    assert [a.since for a in _requests(done)] == [[("pub", 7, 5)]] * 2
    again = s.from_broker([pack([CLIENT]), _notify(5), pack([CLIENT]), _notify(6)])
    assert _ns(again) == [6]


def test_a_new_durable_subscription_goes_live_with_what_waited() -> None:
    s, _ = _durable("auto", "k > 0")
    s.from_broker([pack([CLIENT]), _notify(1)])
    done = _reply(s, op="replay_done", id="c0", claimed=[])
    assert _ns(done) == [1]
    assert [a.since for a in _requests(done)] == [[("pub", 7, 1)]]


def test_a_claim_left_with_silent_brokers_is_the_client_policys_gap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The claims' answers are the client policy's to judge
    (``DurableProgress.claim_answered``), as the SDK's: brokers silent to any disjunct's
    claim leave a gap, which the session hands the listener to log (at most one line
    per log interval, however many subscriptions tell one); the subscription goes live
    all the same."""
    s, _ = _durable("auto")
    _reply(s, op="replay_done", id="c0", claimed=[], silent=["b:1"])
    done = _reply(s, op="replay_done", id="c1", claimed=[], silent=[])
    assert _requests(done) == []
    why = "its record may be kept at a broker that did not answer"
    assert done.gaps == [(CLIENT, why)]
    assert _ns(s.from_broker([pack([CLIENT]), _notify(1)])) == [1]  # live
    listener = Listener(
        SimpleNamespace(counters=Counter()),  # type: ignore[arg-type]
        Stomp(),
        Clients(),
        None,
        log_interval=60.0,
    )
    connection = Connection(listener, AsyncMock(), AsyncMock(), "test")
    with caplog.at_level(logging.WARNING, logger="octopis.broker.stomp"):
        for _ in range(3):
            connection.apply(Effects(gaps=done.gaps))
    assert [r.getMessage() for r in caplog.records] == [f"durable {CLIENT}: {why}"]


def test_the_record_keeps_what_comes_before_the_first_unacknowledged_message() -> None:
    s, _ = _durable("client-individual", "k > 0")
    _reply(s, op="replay_done", id="c0", claimed=[])
    out = s.from_broker([p for n in (1, 2, 3, 4) for p in (pack([CLIENT]), _notify(n))])
    acks = [f.headers["ack"] for f in out.frames]
    assert out.requests == []  # nothing is acknowledged to the record before an ACK
    [ack] = _requests(s.received(Frame("ACK", {"id": acks[0]}), 0.0))
    assert ack.since == [("pub", 7, 1)]
    assert _requests(s.received(Frame("ACK", {"id": acks[2]}), 0.0)) == []  # 2 is still open
    [ack] = _requests(s.received(Frame("ACK", {"id": acks[1]}), 0.0))
    assert ack.since == [("pub", 7, 3)]  # 4 stays owed: it comes again after a reconnect


def test_a_durable_subscription_needs_a_client_id() -> None:
    s = StompSession(lambda login, passcode: None, 7, LIMITS)
    s.received(Frame("CONNECT", {"accept-version": "1.2"}), 0.0)
    headers = {"id": "d", "destination": "/topic/T", "activemq.subscriptionName": "audit"}
    out = s.received(Frame("SUBSCRIBE", headers), 0.0)
    assert out.close and out.requests == []
    assert "needs a client-id header on CONNECT" in out.frames[0].headers["message"]


def test_a_claim_by_another_connection_closes_this_one() -> None:
    s, _ = _durable("auto", "k > 0")
    out = _reply(s, op="withdrawn", client=CLIENT, sub_id="x#0")
    assert out.close and "claimed by another connection" in out.frames[0].headers["message"]
