"""The flow control of a broker's client side (``octopis.core.client_flow``, DESIGN §8),
sans-IO: which publications are refused, which deliveries wait for
``clients.capacity`` and when each leaves, what a full pipe's backlog takes, and what a
slow consumer loses."""

from __future__ import annotations

from collections import Counter, deque
from types import SimpleNamespace

import pytest

from octopis.core.client_flow import DROPPED_KEPT, ClientFlow
from octopis.settings import Clients
from octopis.wire.client import DroppedNotice, OverflowNotice


def _flow(counters: Counter[str], slack: float = 0.0, **settings: object) -> ClientFlow[str]:
    limits = {"queue_limit": 4, "publish_window": 2, "backlog_limit": 3, "body_bytes": 10}
    return ClientFlow("b:0", Clients(**{**limits, **settings}), slack, counters)


def test_publications_are_refused_by_body_window_and_deliveries_waiting() -> None:
    counters: Counter[str] = Counter()
    flow = _flow(counters, capacity=10.0)
    assert flow.refuse_body(10) is None
    assert "clients.body_bytes = 10" in (flow.refuse_body(11) or "")
    assert flow.refuse_publication(1) is None
    assert "clients.publish_window = 2" in (flow.refuse_publication(2) or "")
    flow.wait("m", 4)
    assert "clients.queue_limit = 4" in (flow.refuse_publication(0) or "")
    assert counters == Counter(
        {
            "publications_refused.body_bytes": 1,
            "publications_refused.window": 1,
            "publications_refused.deliveries_waiting": 1,
            "deliveries_paced": 4,
        }
    )


def test_without_capacity_everything_leaves_at_once() -> None:
    flow = _flow(Counter())
    assert flow.admit("m", 100, 0.0) and not flow.paced


def test_deliveries_leave_at_capacity_in_order_with_notices_behind_them() -> None:
    """10 deliveries a second, half a second of slack: the first message's slots fit in
    the slack and it leaves at once; the next waits for its slots to pass; a notice (0
    deliveries) keeps its place behind, and what follows is booked at the head."""
    counters: Counter[str] = Counter()
    flow = _flow(counters, capacity=10.0, slack=0.5)
    assert flow.admit("first", 5, 10.0)  # slots 9.5–10.0: leaves now
    assert not flow.admit("second", 5, 10.0)  # slots 10.0–10.5: waits
    flow.wait("notice", 0)
    assert not flow.admit("third", 1, 10.0)  # behind those waiting, not booked yet
    assert flow.paced_deliveries == 6 and flow.paced_peak == 6
    assert flow.due(10.0) == pytest.approx(0.5)
    assert flow.due(10.5) == 0.0 and flow.release() == "second"
    assert flow.due(10.5) == 0.0 and flow.release() == "notice"
    assert flow.due(10.5) == pytest.approx(0.1)  # booked at the head: after second's
    assert flow.release() == "third"
    assert flow.paced_deliveries == 0 and flow.paced_peak == 6 and not flow.paced
    assert counters["deliveries_paced"] == 6


def test_a_full_backlog_takes_replies_within_the_publish_window() -> None:
    flow = _flow(Counter())
    delivery, reply = [b"names", b"body"], [b"reply"]
    assert flow.backlog_takes(2, delivery) and not flow.backlog_takes(3, delivery)
    assert flow.backlog_takes(4, reply) and not flow.backlog_takes(5, reply)


def test_drop_oldest_drops_the_oldest_delivery_and_keeps_replies() -> None:
    counters: Counter[str] = Counter()
    flow = _flow(counters, slow_policy="drop_oldest")
    backlog = deque([[b"reply"], [b"n", b"old", b"n", b"older"], [b"n", b"mid"]])
    overflow = flow.overflow(b"\x01", backlog, [b"n", b"new"])
    assert (overflow.dropped, overflow.reason) == (2, None)
    assert list(backlog) == [[b"n", b"mid"], [b"n", b"new"], [b"reply"]]
    assert counters["deliveries_dropped.slow_consumer"] == 2 and not flow.dropped
    assert overflow.notice is None  # told once its backlog drains, with the count
    assert flow.drained(overflow.dropped) == OverflowNotice(dropped=2)
    assert flow.drained(0) is None and flow.refusal(b"\x01") is None


def test_disconnect_names_the_reason_counts_the_loss_and_remembers_a_bounded_few() -> None:
    counters: Counter[str] = Counter()
    flow = _flow(counters)
    backlog = deque([[b"reply"], [b"n", b"a", b"n", b"b"]])
    overflow = flow.overflow(b"\x01", backlog, [b"n", b"c"])
    assert overflow.dropped == 3 and "clients.backlog_limit = 3" in (overflow.reason or "")
    assert flow.dropped[b"\x01"] == overflow.reason and not backlog  # lost with it
    assert overflow.notice == DroppedNotice(reason=overflow.reason)
    assert counters["slow_consumers_dropped"] == 1
    assert counters["deliveries_dropped.slow_consumer"] == 3
    assert flow.refusal(b"\x02") is None and counters["requests_refused.dropped"] == 0
    for _ in range(2):  # each later request is told again
        assert flow.refusal(b"\x01") == overflow.notice
    assert counters["requests_refused.dropped"] == 2
    for i in range(DROPPED_KEPT + 5):
        flow.overflow(i.to_bytes(4, "big"), deque(), [b"reply"])  # a reply: disconnect
    assert len(flow.dropped) == DROPPED_KEPT and b"\x01" not in flow.dropped


def test_a_dropped_connections_backlog_is_waited_for_only_until_the_timeout() -> None:
    flow = _flow(Counter(), timeout=5.0)
    assert flow.keeps_waiting(connected=True, idle=60.0)
    assert flow.keeps_waiting(connected=False, idle=4.9)
    assert not flow.keeps_waiting(connected=False, idle=5.0)


def test_an_unknown_slow_policy_is_refused() -> None:
    limits = SimpleNamespace(**{f: getattr(Clients(), f) for f in Clients.__struct_fields__})
    limits.slow_policy = "ignore"
    with pytest.raises(ValueError, match=r"clients\.slow_policy"):
        ClientFlow("b:0", limits, 0.0, Counter())
