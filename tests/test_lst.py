"""The LST's "least loaded" orders (DESIGN §3, §9): the paper's CE order and BlueDove's
estimated processing time (q̂ + 1)/μ with q̂ extrapolated between events."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octopis.core.lst import DEFAULT_ORDER, ORDERS, LinkStatusTable


def _least_loaded(lst: LinkStatusTable, links: list[str]) -> str:
    """DNR's choice (``clustered._by_load``): the smallest load, then the link name."""
    return min(links, key=lambda link: (*lst.load(link), link))


def _fast_and_slow(order: str) -> LinkStatusTable:
    """Window [0, 0.1): "slow" takes 3 copies and sends none. Window [0.1, 0.2): "slow"
    sends one (CE 0, queue 2, μ = 10/s); "fast" takes 30 and sends 20 (CE 1.5, queue 10,
    μ = 200/s). Clock at 0.2, the end of the second window."""
    lst = LinkStatusTable(["fast", "slow"], window=0.1, order=order)
    for t in (0.01, 0.02, 0.03):
        lst.enqueued("slow", t)
    lst.sent("slow", 0.15)
    for i in range(30):
        lst.enqueued("fast", 0.1 + i * 0.003)
    for i in range(20):
        lst.sent("fast", 0.1 + 0.001 + i * 0.003)
    lst.advance(0.2)
    return lst


def test_ce_order_is_the_default_and_unchanged() -> None:
    assert DEFAULT_ORDER == "ce" and LinkStatusTable(["x"]).order == "ce"
    lst = _fast_and_slow("ce")
    assert lst.load("slow") == (0.0, 2)
    assert lst.load("fast") == (1.5, 10)
    assert "processing_time" not in lst.snapshot()["fast"]


def test_bluedove_prefers_a_longer_queue_served_much_faster() -> None:
    """CE picks "slow" (CE 0 < 1.5); BlueDove's estimate picks "fast": its ten queued copies
    leave in about 55 ms, "slow"'s next copy waits about 250 ms."""
    assert _least_loaded(_fast_and_slow("ce"), ["fast", "slow"]) == "slow"
    lst = _fast_and_slow("bluedove")
    assert _least_loaded(lst, ["fast", "slow"]) == "fast"
    # fast: last event at 0.1 + 29 × 0.003 = 0.187; q̂ = 10 + (300 − 200)(0.2 − 0.187)
    assert lst.estimated_queue("fast") == pytest.approx(11.3)
    assert lst.processing_time("fast") == pytest.approx(12.3 / 200)
    # slow: last event at 0.15; λ = 0, μ = 10/s: q̂ = 2 − 10 × 0.05 = 1.5
    assert lst.estimated_queue("slow") == pytest.approx(1.5)
    assert lst.processing_time("slow") == pytest.approx(2.5 / 10)
    assert lst.load("slow") == (pytest.approx(0.25), 2)
    assert lst.snapshot()["fast"]["processing_time"] == pytest.approx(12.3 / 200)


def test_extrapolation_grows_the_queue_of_a_link_taking_more_than_it_sends() -> None:
    lst = LinkStatusTable(["up"], window=1.0, order="bluedove")
    for i in range(10):  # [0, 1): 10 in, 5 out: λ − μ = +5/s, queue 5
        lst.enqueued("up", 0.05 * i)
    for i in range(5):
        lst.sent("up", 0.5 + 0.1 * i)  # last event 0.9
    lst.advance(1.0)
    assert lst.estimated_queue("up") == pytest.approx(5 + 5 * 0.1)
    lst.advance(1.5)  # still inside window [1, 2): the same rates, further out
    assert lst.estimated_queue("up") == pytest.approx(5 + 5 * 0.6)
    assert lst.processing_time("up") == pytest.approx((5 + 5 * 0.6 + 1) / 5)
    lst.advance(2.5)  # window [1, 2) saw nothing: no rates, no extrapolation
    assert lst.estimated_queue("up") == 5


def test_a_draining_link_is_estimated_down_to_an_empty_queue() -> None:
    lst = LinkStatusTable(["x"], window=1.0, order="bluedove")
    for t in (0.1, 0.2):
        lst.enqueued("x", t)
    lst.advance(1.0)  # [0, 1): 2 in, none out
    lst.sent("x", 1.9)  # [1, 2): none in, 1 out; queue 1 from 1.9 on
    lst.advance(2.0)  # rates of [1, 2): λ − μ = −1/s
    assert lst.estimated_queue("x") == pytest.approx(0.9)
    lst.advance(2.5)
    assert lst.estimated_queue("x") == pytest.approx(0.4)
    lst.advance(2.99)
    assert lst.rows["x"].queue_length == 1 and lst.estimated_queue("x") == 0.0
    assert lst.processing_time("x") == pytest.approx(1.0)  # (0 + 1)/(1 per second)


def test_idle_and_stalled_links_have_the_one_copy_per_window_floor() -> None:
    lst = LinkStatusTable(["idle", "stalled"], window=0.05, order="bluedove")
    for t in (0.0, 0.01, 0.02):
        lst.enqueued("stalled", t)
    lst.advance(0.05)  # stalled: 3 in, none out: CE ∞, μ 0 (floored at 1/Δt = 20/s)
    assert lst.processing_time("idle") == pytest.approx(0.05)  # (0 + 1) × Δt
    stalled = (3 + 60 * 0.03 + 1) * 0.05  # q̂ = 3 + (60 − 0)(0.05 − 0.02)
    assert lst.processing_time("stalled") == pytest.approx(stalled)
    assert _least_loaded(lst, ["stalled", "idle"]) == "idle"


def test_orders_are_checked() -> None:
    assert ORDERS == ("ce", "bluedove")
    with pytest.raises(ValueError, match="order must be one of ce, bluedove"):
        LinkStatusTable(["x"], order="fifo")


_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "send", "advance"]),
        st.sampled_from(["a", "b"]),
        st.floats(0.0, 0.2),
    ),
    max_size=60,
)


@given(_EVENTS, st.floats(0.0, 0.5))
def test_estimates_are_finite_non_negative_and_exact_at_the_last_event(
    events: list[tuple[str, str, float]], later: float
) -> None:
    """Whatever happened: q̂ ≥ 0 and finite, (q̂ + 1)/μ > 0; at the instant of the link's
    last event q̂ is its real queue length; without traffic in the last window the order
    is the queue length's."""
    lst = LinkStatusTable(["a", "b"], window=0.05, order="bluedove")
    now = 0.0
    for kind, link, step in events:
        now += step
        if kind == "enqueue":
            lst.enqueued(link, now)
        elif kind == "send" and lst.rows[link].queue_length:
            lst.sent(link, now)
        else:  # an advance, or a send with nothing queued, which only moves the clock
            kind = "advance"
            lst.advance(now)
        if kind != "advance":
            assert lst.estimated_queue(link) == lst.rows[link].queue_length
    lst.advance(now + later)
    for link in ("a", "b"):
        q, cost = lst.estimated_queue(link), lst.processing_time(link)
        assert 0.0 <= q < float("inf") and 0.0 < cost < float("inf")
    lst.advance(now + later + 0.2)  # past every window with traffic: no rates left
    ordered = sorted(["a", "b"], key=lambda link: lst.load(link))
    assert [lst.rows[link].queue_length for link in ordered] == sorted(
        lst.rows[link].queue_length for link in ("a", "b")
    )


def test_a_row_joins_down_with_a_fresh_window_and_leaves_with_its_state() -> None:
    """A link to a neighbour that joined (issue 18) gets a fresh row, held down until
    detection says otherwise; a second row for it is refused; a removed row is gone, its
    down mark with it."""
    lst = LinkStatusTable(["a"], window=1.0, start=0.0)
    lst.enqueued("a", 0.5)
    lst.add_link("b", 3.2)
    assert lst.down("b") and not lst.down("a")
    assert lst.rows["b"].window_start == 3.2 and lst.rows["b"].queue_length == 0
    with pytest.raises(ValueError, match="has a row for b already"):
        lst.add_link("b", 4.0)
    lst.set_down("b", False)
    lst.enqueued("b", 3.5)
    assert lst.load("b")[1] == 1
    lst.remove_link("b")
    assert "b" not in lst.rows and not lst.down("b")
    assert lst.rows["a"].queue_length == 1


def test_notification_copies_count_the_queue_they_join() -> None:
    """The queueing a notification copy meets (the broker's ``queue_seen``): each one
    adds the queue length it joined, across links; other frames are queued and counted
    in n_in, but not as notifications."""
    lst = LinkStatusTable(["a", "b"])
    lst.enqueued("a", 0.0, notification=True)  # joins 0
    lst.enqueued("a", 0.0)  # a heartbeat: queued, not a notification
    lst.enqueued("a", 0.0, notification=True)  # joins 2
    lst.sent("a", 0.01, 3)
    lst.enqueued("a", 0.02, notification=True)  # joins 0
    for _ in range(4):
        lst.enqueued("b", 0.02, notification=True)  # join 0, 1, 2, 3
    assert (lst.notifications_in, lst.notifications_ahead, lst.most_ahead) == (7, 8, 3)
    assert lst.rows["a"].queue_length == 1 and lst.rows["b"].queue_length == 4
