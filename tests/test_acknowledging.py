"""When a broker acknowledges what it took from its neighbours
(``octopis.core.acknowledging``, DESIGN §7, §8), sans-IO: the steps around the receiver's
rule and backpressure that the broker process (``PeerOutput``) and the simulator
(``CustodyEvents``) both carry out. ``test_link_rules.py`` checks that both call them."""

from __future__ import annotations

from collections import Counter

from octopis.core.acknowledging import ARM, HELD, NOTHING, SEND, Acknowledgements
from octopis.core.neighbours import Neighbour, Phase
from octopis.core.pressure import Backpressure


def _acks(counts: Counter[str]) -> Acknowledgements:
    pressure = Backpressure(queue_limit=10, deliveries_limit=5, budget_mb=64, counters=counts)
    return Acknowledgements(pressure, every=4, counts=counts)


def _record() -> Neighbour:
    return Neighbour(phase=Phase.SYNCED, up=True)


class Refreshes:
    """A shell's look at backpressure afresh: counts the looks."""

    def __init__(self) -> None:
        self.looks = 0

    def __call__(self) -> None:
        self.looks += 1


def test_stale_messages_are_dropped_and_counted_without_an_acknowledgement() -> None:
    counts: Counter[str] = Counter()
    acks, refresh = _acks(counts), Refreshes()
    record = Neighbour(phase=Phase.HANDSHAKING, up=True)
    assert acks.taken("b", record, 3, refresh) is None
    assert counts["stale_frames"] == 3 and record.received == 0
    assert not acks.timer and refresh.looks == 0


def test_one_timer_covers_what_every_neighbour_sent_until_it_fires() -> None:
    """The first notification since an acknowledgement arms the broker's one timer; what
    comes before it fires, from any neighbour, waits for it; when it fires every
    neighbour owed is acknowledged, and the next first arms it again."""
    acks, refresh = _acks(Counter()), Refreshes()
    b, c = _record(), _record()
    assert acks.taken("b", b, 1, refresh) == ARM
    assert acks.taken("c", c, 1, refresh) == NOTHING
    assert acks.taken("b", b, 1, refresh) == NOTHING
    released, held = acks.timer_fired([("b", b), ("c", c), ("d", _record())], refresh)
    assert [name for name, _ in released] == ["b", "c"] and not held
    assert refresh.looks == 1  # looked at afresh before acknowledging
    for _, record in released:
        acks.pressure.acknowledge("b", record)
    assert acks.taken("c", c, 1, refresh) == ARM


def test_an_acknowledgement_wanted_at_once_looks_at_backpressure_first() -> None:
    """Asked for, or ``every`` owed, or a message other than a notification: sent now
    after a fresh look at backpressure; held for the look again while another link is
    full; left to the timer (without a look) while deliveries wait for the clients."""
    counts: Counter[str] = Counter()
    acks, refresh = _acks(counts), Refreshes()
    record = _record()
    assert acks.taken("b", record, 1, refresh, notifications=False) == SEND
    assert refresh.looks == 1
    assert acks.taken("b", record, 4, refresh) == SEND  # every (4) owed
    record.asked = True
    waiting = acks.taken("b", record, 1, refresh, deliveries_waiting=7)
    assert (waiting, refresh.looks, acks.timer) == (ARM, 2, True)

    def fill_c() -> None:
        acks.pressure.check({"c": 10}, 0, 0)

    assert acks.at_once("b", fill_c) == HELD
    assert acks.at_once("c", fill_c) == SEND  # its own link's neighbour is not held


def test_the_timer_leaves_a_neighbour_held_back_to_the_look_again() -> None:
    acks = _acks(Counter())
    b, c = Neighbour(received=2), Neighbour(received=1)
    released, held = acks.timer_fired(
        [("b", b), ("c", c)], lambda: acks.pressure.check({"b": 10}, 0, 0)
    )
    assert [name for name, _ in released] == ["b"] and held
    assert acks.timer_fired([], lambda: None) == ([], False)
