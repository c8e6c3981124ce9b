"""The idle collector (:mod:`octopis.transport.collector`): it passes only with enough
young objects waiting, takes the generation Python's collector would take next, and
never runs when turned off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from octopis.transport.collector import IdleCollector


@pytest.fixture
def thresholds() -> Iterator[None]:
    """Python's automatic passes out of the way: only the collector under test runs."""
    saved = gc.get_threshold()
    gc.collect()
    gc.set_threshold(10**9, saved[1], saved[2])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_it_passes_over_the_young_generation_once_enough_objects_wait(thresholds: None) -> None:
    collector = IdleCollector(young=5000)
    kept = [[i] for i in range(2000)]
    collector.idle()
    assert collector.passes == [0, 0, 0]  # 2,000 waiting: not yet
    kept += [[i] for i in range(4000)]
    collector.idle()
    assert collector.passes == [1, 0, 0]
    assert gc.get_count()[0] < 100  # the young generation was emptied
    assert len(kept) == 6000


def test_it_takes_the_oldest_generation_past_its_threshold(thresholds: None) -> None:
    """As Python counts: a middle pass once more than ``middle`` young passes were taken
    since the last one, a full pass once more than ``old`` middle passes were."""
    collector = IdleCollector(young=1000)
    middle, old = gc.get_threshold()[1:]
    kept: list[list[int]] = []

    def idle_with_young_objects() -> None:
        kept.extend([i] for i in range(1000))
        collector.idle()

    for _ in range(middle + 2):
        idle_with_young_objects()
    assert collector.passes == [middle + 1, 1, 0]
    for _ in range(old * (middle + 2)):
        idle_with_young_objects()
    assert collector.passes == [(old + 1) * (middle + 1), old + 1, 0]
    idle_with_young_objects()
    assert collector.passes == [(old + 1) * (middle + 1), old + 1, 1]
    assert len(kept) == 1000 * ((old + 1) * (middle + 2) + 1)


def test_it_collects_garbage_cycles(thresholds: None) -> None:
    collector = IdleCollector(young=1000)
    for _ in range(2000):
        cycle: list = []
        cycle.append(cycle)
    del cycle
    collector.idle()
    assert collector.passes == [1, 0, 0]
    assert gc.get_count()[0] < 100


def test_turned_off_it_never_collects(thresholds: None) -> None:
    collector = IdleCollector(young=0)
    kept = [[i] for i in range(20_000)]
    collector.idle()
    assert collector.passes == [0, 0, 0]
    assert gc.get_count()[0] >= 20_000
    assert len(kept) == 20_000
