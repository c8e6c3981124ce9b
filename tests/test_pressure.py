"""The backpressure rule of a broker (``octopis.core.pressure``, DESIGN §8), sans-IO: fed
queue lengths, waiting deliveries and an RSS, it says which neighbours are held back,
whose acknowledgements are withheld, and which episodes start; and a simulated broker
pressed as a process is (``test_flow_control.py``) obeys it alike."""

from __future__ import annotations

from collections import Counter

import networkx as nx
import pytest

from octopis.core.neighbours import Neighbour
from octopis.core.pressure import CLIENTS, HELD, LATER, SEND, Backpressure
from octopis.defaults import ACK_INTERVAL
from octopis.filters.language import Predicate, Subscription
from octopis.sim import LatencyModel, Simulator
from octopis.sim.congestion import TimedLinks
from octopis.sim.custody import LinkCustody
from octopis.topology import build_scot, complete_factor

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


def test_an_acknowledgement_wanted_at_once_waits_for_deliveries_or_a_look_again() -> None:
    """Both shells ask the rule what becomes of an acknowledgement the node wants at once,
    and whom the acknowledgement timer acknowledges: sent now; later, with the timer,
    while deliveries wait for the clients' capacity; held back for the look again
    (which counts it withheld) while another neighbour's link is full."""
    counters: Counter[str] = Counter()
    rule = _rule(counters)
    owed = [("b", Neighbour(received=2)), ("c", Neighbour(received=1))]
    assert rule.acknowledging("c", 0) == SEND and rule.released(owed) == owed
    assert rule.acknowledging("c", 3) == LATER
    rule.check({"b": 10, "c": 0}, 0, 0)
    assert rule.acknowledging("c", 0) == HELD and rule.acknowledging("b", 0) == SEND
    assert rule.released(owed) == owed[:1]
    assert counters["backpressure.acks_withheld"] == 0  # counted by the look again alone


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


def test_timed_links_say_what_waits_on_each_output_queue() -> None:
    """What a simulated broker's rule is fed of its output queues: the copies that have
    not left by ``now`` (read without bringing the LST up to ``now``)."""
    scot = build_scot(nx.path_graph(["a", "b"]), complete_factor(1), name="pair")
    links = TimedLinks(scot, {("a:0", "b:0"): 10.0})
    departures = [links.transmit("a:0", "b:0", 0.0)[0] for _ in range(3)]
    assert departures == pytest.approx([0.1, 0.2, 0.3])
    assert links.waiting("a:0", 0.0) == {"b:0": 3}
    assert links.waiting("a:0", 0.1) == {"b:0": 2}  # the first leaves at 0.1
    assert links.waiting("a:0", 0.25) == {"b:0": 1} and links.waiting("a:0", 0.4) == {"b:0": 0}
    assert links.lst["a:0"].rows["b:0"].queue_length == 3  # the LST is not touched
    assert links.waiting("b:0", 0.0) == {"a:0": 0}


def _pressed_line(queue_limit: int) -> tuple[Simulator, LinkCustody, int]:
    """The process test's line (``test_a_slow_link_slows_the_publisher_two_hops_back``)
    simulated: b:0 → c:0 carries 250 copies/s, custody holds 50 per link and retains
    nothing; 1,000 publications from a:0 at once, to a subscriber on c:0. Returns the run,
    its custody and the most frames seen waiting on b:0's link to c:0."""
    scot = build_scot(nx.path_graph(["a", "b", "c"]), complete_factor(1), name="line")
    links = TimedLinks(scot, {("b:0", "c:0"): 250.0})
    sim = Simulator(scot, "snr", seed=1, links=links, latency=LatencyModel(0.001, 0.002))
    custody = sim._failure_state().custody = LinkCustody(0.0, 50, queue_limit=queue_limit)
    sim.subscribe("S", "c:0", Subscription((Predicate("x", ">=", 0),)))
    sim.run()
    longest = 0

    def look() -> None:
        nonlocal longest
        queued = links.waiting("b:0", sim.now)["c:0"]
        longest = max(longest, queued + len(custody.waiting.get(("b:0", "c:0"), ())))
        if sim.ledger.summary()["lost"]:
            sim.at(sim.now + 0.005, look)

    start = sim.now
    for i in range(1000):
        sim.at(start, sim.publish, "P", "a:0", {"x": i})
    sim.at(start, look)
    sim.run()
    return sim, custody, longest


def test_a_pressed_simulated_broker_holds_back_its_other_neighbour() -> None:
    """As on processes: b:0's queue toward c:0 stops near ``queue_limit`` because b:0
    withholds its acknowledgements from a:0, whose custody fills; nothing is lost or
    repeated. With the limit out of reach, nothing is held back and the queue takes
    in all a:0 sends (what the simulator did before it fed the rule)."""
    sim, custody, longest = _pressed_line(queue_limit=100)
    summary = sim.ledger.summary()
    assert summary["delivered"] == 1000 and summary["duplicates"] == summary["lost"] == 0
    counts = custody.counts()
    assert counts["backpressure.episodes"] >= 1 and counts["backpressure.acks_withheld"] > 0
    # withheld once per look, every ack_interval, as the process's tick does; not once per
    # message taken from a:0 while it is held back (747 here when the simulator did)
    assert counts["backpressure.acks_withheld"] <= sim.now / ACK_INTERVAL + 2
    assert 100 <= longest <= 100 + 2 * custody.custody_limit
    sim, custody, longest = _pressed_line(queue_limit=10_000)
    assert "backpressure.episodes" not in custody.counts()
    assert longest > 900
