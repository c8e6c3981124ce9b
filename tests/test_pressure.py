"""The backpressure rule of a broker (``octopis.core.pressure``, DESIGN §8), sans-IO: fed
queue lengths, waiting deliveries and an RSS, it says which neighbours are held back,
whose acknowledgements are withheld, and which episodes start."""

from __future__ import annotations

from collections import Counter

import pytest

from octopis.core.neighbours import Neighbour
from octopis.core.pressure import CLIENTS, Backpressure

MB = 1 << 20


def _rule(counters: Counter[str]) -> Backpressure:
    return Backpressure(queue_limit=10, deliveries_limit=5, budget_mb=64, counters=counters)


def test_a_full_link_holds_back_every_other_neighbour_once_per_episode() -> None:
    counters: Counter[str] = Counter()
    rule = _rule(counters)
    assert rule.check({"b": 9, "c": 0}, 0, 0) is None
    assert rule.full == set() and not rule.holds("b") and not rule.holds("c")
    pressed = rule.check({"b": 10, "c": 0}, 0, 0)
    assert pressed is not None and pressed.full == {"b": 10} and pressed.memory is None
    assert rule.full == {"b"}
    assert rule.holds("c") and not rule.holds("b")  # the full link's own is acknowledged
    assert rule.check({"b": 12, "c": 0}, 0, 0) is None  # the same episode
    assert counters["backpressure.episodes"] == 1
    pressed = rule.check({"b": 12, "c": 10}, 0, 0)  # another link fills: a new one
    assert pressed is not None and pressed.full == {"b": 12, "c": 10}
    assert rule.holds("b") and rule.holds("c")
    assert rule.check({"b": 0, "c": 0}, 0, 0) is None and rule.full == set()
    assert counters["backpressure.episodes"] == 2


def test_deliveries_waiting_hold_back_every_neighbour() -> None:
    counters: Counter[str] = Counter()
    rule = _rule(counters)
    assert rule.check({"b": 0}, 4, 0) is None
    pressed = rule.check({"b": 0}, 5, 0)
    assert pressed is not None and pressed.full == {CLIENTS: 5}
    assert rule.holds("b")
    assert counters["backpressure.episodes"] == 1


def test_over_the_memory_budget_the_longest_link_with_data_is_full() -> None:
    counters: Counter[str] = Counter()
    rule = _rule(counters)
    assert rule.check({"b": 0, "c": 0}, 0, 65 * MB) is None  # nothing waits: not pressing
    assert not rule.pressing and counters["memory.pressure_episodes"] == 0
    pressed = rule.check({"b": 1, "c": 3}, 0, 65 * MB)
    assert pressed is not None and (pressed.memory, pressed.longest_waiting) == ("c", 3)
    assert rule.full == {"c"} and rule.pressing and rule.holds("b")
    again = rule.check({"b": 1, "c": 2}, 0, 65 * MB)
    assert again is None  # the same episode
    assert rule.check({"b": 1, "c": 2}, 0, 64 * MB) is None  # at the budget: under
    assert not rule.pressing and rule.full == set()
    assert counters["memory.pressure_episodes"] == 1
    assert counters["backpressure.episodes"] == 1


def test_a_withheld_acknowledgement_repeats_the_last_count_and_is_counted() -> None:
    counters: Counter[str] = Counter()
    rule = _rule(counters)
    state = Neighbour(received=7, acked=3)
    rule.check({"b": 10, "c": 0}, 0, 0)
    assert rule.acknowledge("c", state) == 3 and state.acked == 3
    assert counters["backpressure.acks_withheld"] == 1
    assert rule.acknowledge("b", state) == 7 and state.acked == 7  # its own link is full
    rule.forget("b")  # b left the overlay
    assert rule.full == set() and rule.acknowledge("c", state) == 7
    assert counters["backpressure.acks_withheld"] == 1


def test_the_tick_shortens_only_while_a_neighbour_is_held() -> None:
    rule = _rule(Counter())
    assert rule.tick(0.1, 0.02) == 0.1
    rule.check({"b": 10}, 0, 0)
    assert rule.tick(0.1, 0.02) == 0.02
    assert rule.tick(0.01, 0.02) == 0.01


@pytest.mark.parametrize("limits", [(0, 5, 64), (10, 0, 64), (10, 5, 0)])
def test_limits_below_one_are_refused(limits: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="≥ 1"):
        Backpressure(*limits, Counter())
