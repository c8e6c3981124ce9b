"""The rules of a client's requests (``octopis.core.client_requests``, DESIGN §4, §7, §8,
§11, §12) that the broker process and the simulator both call: a malformed filter or
publication, and a request past a limit, is refused with a message naming the problem
and changes nothing; a durable subscription's record follows its subscription; and
which failures are the client's."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from octopis.core import ProtocolError, UnadvertisedPublication, make_broker
from octopis.core.client_flow import ClientFlow
from octopis.core.client_requests import (
    DurableRequest,
    RequestRefused,
    acknowledge,
    admit_publication,
    adopt,
    advertise,
    published,
    refusal,
    subscribe,
    unsubscribe,
)
from octopis.core.codec import decode_body, encode_body
from octopis.core.durable import DurableError, Durables
from octopis.core.replay import Replay, check_replay_filters
from octopis.core.sessions import ClientTable, SessionRefused
from octopis.filters.language import FilterError
from octopis.settings import Clients
from octopis.topology import build_preset
from octopis.wire import WireError
from octopis.wire.client import ErrorReply, PublishedReply

FIG2 = build_preset("fig2")


class Made:
    """A shell's ``local_subscribe`` that records what it was asked to make."""

    def __init__(self) -> None:
        self.made: list[tuple[str, Any, float]] = []

    def __call__(self, key: str, subscription: Any, now: float) -> tuple[str, list]:
        self.made.append((key, subscription, now))
        return f"s{len(self.made)}", []


def _flow(counters: Counter[str], **settings: Any) -> ClientFlow:
    return ClientFlow("b:0", Clients(**settings), 0.0, counters)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[x,<]", "position"),
        ("[x,~,1]", "position"),
        ("", "subscription"),
    ],
)
def test_a_malformed_subscription_is_refused_naming_the_problem_and_changes_nothing(
    text: str, problem: str
) -> None:
    """Parsed before anything: nothing is made, held, or attached (not even a durable
    record), and the refusal names what is wrong."""
    table, made, records = ClientTable(limit=5), Made(), Durables("b:0", 60.0, 5)
    with pytest.raises(FilterError, match=problem):
        subscribe(table, "k", "alice", text, made, 1.0, DurableRequest(records, "d", "k"))
    assert made.made == [] and table.subscriptions("k") == set()
    assert records.records == {} and not records.dirty


def test_a_subscription_is_parsed_made_held_and_its_durable_record_attached() -> None:
    table, made, records = ClientTable(limit=5), Made(), Durables("b:0", 60.0, 5)
    sub_id, actions = subscribe(
        table, "k", "alice", "[x,<,5]", made, 2.0, DurableRequest(records, "d", "conn")
    )
    assert (sub_id, actions) == ("s1", []) and table.subscriptions("k") == {"s1"}
    assert [(key, s.to_text(), now) for key, s, now in made.made] == [("k", "[x,<,5]", 2.0)]
    record = records.records[("alice", "d")]
    assert (record.key, record.sub_id, record.filters) == ("conn", "s1", ("[x,<,5]",))


def test_past_the_limits_a_subscription_is_refused_by_name_before_it_is_made() -> None:
    """The client's limit (``limits.subscriptions_per_client``), then a durable one's:
    a composite cannot be durable, nor a new record past ``durable.max``."""
    table, made, records = ClientTable(limit=1), Made(), Durables("b:0", 60.0, 1)
    subscribe(table, "k", "alice", "[x,<,5]", made, 0.0, DurableRequest(records, "d", "k"))
    with pytest.raises(SessionRefused, match=r"alice already holds 1 subscriptions"):
        subscribe(table, "k", "alice", "[x,<,6]", made, 0.0)
    table.limit = 5
    with pytest.raises(DurableError, match="cannot be durable"):
        subscribe(
            table,
            "k",
            "alice",
            "{[a,eq,'x']} || {[b,eq,'y']}",
            made,
            0.0,
            DurableRequest(records, "e", "k"),
        )
    with pytest.raises(DurableError, match=r"b:0 keeps 1 durable subscriptions already"):
        subscribe(table, "k", "alice", "[x,<,6]", made, 0.0, DurableRequest(records, "e", "k"))
    assert len(made.made) == 1 and table.subscriptions("k") == {"s1"}
    assert list(records.records) == [("alice", "d")]


def test_an_unsubscription_ends_a_durable_record_unless_it_moved() -> None:
    """Only what the client holds (nothing withdrawn otherwise); a durable one's record
    ends, and its copies elsewhere are to be claimed; one that moved goes uncounted."""
    table, made, records = ClientTable(limit=5), Made(), Durables("b:0", 60.0, 5)
    withdrawn: list[tuple[str, str]] = []

    def withdraw(key: str, sub_id: str) -> list:
        withdrawn.append((key, sub_id))
        return []

    for name in ("d", "e"):
        subscribe(table, "k", "alice", "[x,<,5]", made, 0.0, DurableRequest(records, name, "k"))
    with pytest.raises(SessionRefused, match="bob holds no subscription s1"):
        unsubscribe(table, "other", "bob", "s1", withdraw, records)
    assert withdrawn == [] and len(records.records) == 2
    actions, claim = unsubscribe(table, "k", "alice", "s1", withdraw, records)
    assert (actions, withdrawn) == ([], [("k", "s1")]) and claim is not None
    assert unsubscribe(table, "k", "alice", "s2", withdraw, records, moved=True) == ([], None)
    assert records.records == {} and records.stats["durable.ended"] == 1


def test_a_durable_adoption_past_durable_max_is_refused_before_anything_is_adopted() -> None:
    """The record's room is checked first: the core, which would refuse this adoption
    itself (no such subscription in the cluster), is not even asked."""
    core = make_broker(FIG2, "c:0", "snr", covering="off")
    table, records = ClientTable(limit=5), Durables("c:0", 60.0, 1)
    records.attach("bob", "kept", "other", "c:0/1", ("[x,<,5]",), 0.0)
    with pytest.raises(DurableError, match=r"keeps 1 durable subscriptions already"):
        adopt(core, table, "k", "alice", "c:1/1", durable=DurableRequest(records, "d", "k"))
    assert table.subscriptions("k") == set() and list(records.records) == [("bob", "kept")]
    with pytest.raises(ProtocolError, match="c:1/1 is not a subscription"):
        adopt(core, table, "k", "alice", "c:1/1")


def test_a_malformed_advertisement_or_replay_filter_is_refused_by_name() -> None:
    core = make_broker(FIG2, "c:0", "snr", covering="off", advertisements=True)
    with pytest.raises(FilterError, match="position"):
        advertise(core, "k", "[x,<")
    assert core.advertisements_of("k") == []
    adv_id, actions = advertise(core, "k", "[x,<,5]")
    assert core.advertisements_of("k") == [adv_id] and actions
    check_replay_filters(["[x,<,5]", "[y,eq,'a']"])
    with pytest.raises(FilterError, match="position"):
        check_replay_filters(["[x,<,5]", "[y,="])


def test_a_bad_replay_filter_is_refused_with_one_message_from_a_client_and_a_neighbour() -> None:
    """A replay whose second filter does not parse: a client's request is refused with the
    parser's message (what the broker process replies), and a neighbour's REPLAY frame is
    refused naming its sender and the same message; both by one rule,
    :func:`~octopis.core.replay.check_replay_filters`. A claim's empty list passes, and a
    REPLAY whose filters parse decodes to what was sent."""
    filters = ("[x,<,5]", "[y,=")
    with pytest.raises(FilterError) as bad:
        check_replay_filters(list(filters))
    told = refusal(bad.value)
    assert told is not None and told.reply == ErrorReply(message=str(bad.value))
    assert "position 5" in str(bad.value)
    with pytest.raises(WireError) as refused:
        decode_body("b:0", encode_body(Replay("b:0/1", "b:0", filters, (), 0.0, 3.0)))
    assert str(refused.value) == f"bad content from b:0: {bad.value}"
    assert check_replay_filters([]) == ()
    good = Replay("b:0/2", "b:0", filters[:1], (), 0.0, 3.0)
    assert decode_body("b:0", encode_body(good)) == good


def test_an_acknowledgement_names_a_durable_subscription_kept_here() -> None:
    records = Durables("b:0", 60.0, 5)
    with pytest.raises(RequestRefused, match="b:0 keeps no durable subscription 'd'"):
        acknowledge(records, "alice", "d", [("p", 0, 3)], 1.0)
    records.attach("alice", "d", "k", "s1", ("[x,<,5]",), 0.0)
    records.dirty.clear()
    acknowledge(records, "alice", "d", [("p", 0, 3)], 1.0)
    assert records.records[("alice", "d")].updated == 1.0 and records.dirty


@pytest.mark.parametrize(
    ("publication", "problem"),
    [
        ("[x,", "position"),
        ({}, "empty publication"),
        ({"x": True}, "x"),
        (["x", 1], "must be a dict"),
    ],
)
def test_a_malformed_publication_is_refused_naming_the_problem(
    publication: Any, problem: str
) -> None:
    counters: Counter[str] = Counter()
    with pytest.raises(FilterError, match=problem):
        admit_publication(_flow(counters), publication, 0, 0)
    assert counters == Counter()


def test_a_publication_is_refused_for_its_body_then_its_form_then_the_window() -> None:
    """In that order, each counted by the flow control, and the refusal names the limit."""
    counters: Counter[str] = Counter()
    flow = _flow(counters, body_bytes=10, publish_window=2)
    with pytest.raises(RequestRefused, match=r"11 bytes .* clients.body_bytes = 10"):
        admit_publication(flow, "[x,", 11, 5)
    with pytest.raises(FilterError):
        admit_publication(flow, "[x,", 10, 5)
    with pytest.raises(RequestRefused, match=r"2 publications .* \(clients\.publish_window = 2\)"):
        admit_publication(flow, "[x,1]", 10, 2)
    assert admit_publication(flow, "[x,1]", 10, 1) == {"x": 1}
    assert admit_publication(flow, {"x": 1.5}, 0, 0) == {"x": 1.5}
    assert counters == Counter(
        {"publications_refused.body_bytes": 1, "publications_refused.window": 1}
    )


def test_a_publication_is_answered_taken_or_not_kept() -> None:
    assert published(7) == PublishedReply(seq=7)
    assert published(7, "the disk is full") == ErrorReply(
        message="the disk is full", error="not_kept"
    )


def test_the_client_is_refused_for_its_own_failures_only() -> None:
    """An unadvertised publication gets its own error and counter, unwarned; the request
    rules' refusals are the client's errors; anything else is the broker's (None)."""
    unadvertised = refusal(UnadvertisedPublication("p advertised nothing"))
    assert unadvertised is not None
    assert unadvertised.reply == ErrorReply(message="p advertised nothing", error="unadvertised")
    assert (unadvertised.counter, unadvertised.warn) == ("publications_refused.unadvertised", False)
    for exc in (
        RequestRefused("r"),
        SessionRefused("s"),
        DurableError("d"),
        FilterError("f"),
        ProtocolError("p"),
    ):
        refused = refusal(exc)
        assert refused is not None
        assert refused == (ErrorReply(message=str(exc)), "client_errors", True)
    assert refusal(RuntimeError("bug")) is None
    assert refusal(KeyError("k")) is None
