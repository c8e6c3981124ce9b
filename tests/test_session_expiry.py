"""When a broker drops a client silent past its timeout (DESIGN §7, §8), one rule for the
broker process and the simulator: :class:`~octopis.core.sessions.Liveness`. The process
runs its timer every tick and calls :meth:`Liveness.ticked`; the simulator judges at
the tick :meth:`Liveness.due` names and, after a pause, runs the late tick
:meth:`Liveness.after_pause`. Both drop a client cut off at ``cut`` at the same tick,
last heard at the same time, with a pause of the broker excused by the same
:func:`~octopis.core.neighbours.stall` (the simulator once dropped it at exactly
``cut + CLIENT_TIMEOUT``, and excused a pause only if the drop fell due during it)."""

from __future__ import annotations

import random

import pytest

from octopis.core.sessions import Liveness
from octopis.defaults import CLIENT_TIMEOUT
from octopis.failure_schedule import Failure
from octopis.filters.language import parse_subscription
from octopis.sim import Simulator
from octopis.topology import build_preset

FIG2 = build_preset("fig2")
Pause = tuple[float, float] | None
"""A pause of the client's host: (from, to), or None."""


def process_drop(cut: float, pause: Pause) -> tuple[float, float]:
    """When the broker process's client timer (``ClientConnections.expire``: one tick
    after the last, fired at the resume if it fell due during ``pause``) drops a client
    heard last at ``cut``, and when it was last heard then (stalls excused)."""
    liveness: Liveness[str] = Liveness(CLIENT_TIMEOUT)
    liveness.heard("S", cut)
    while True:
        fires = liveness.woke + liveness.tick
        if pause is not None and pause[0] <= fires < pause[1]:
            fires = pause[1]
        if liveness.ticked(fires, caught_up=True):
            return fires, liveness.forget("S")


def simulator_drop(cut: float, pause: Pause) -> tuple[float, float]:
    """When the simulator's host drops its subscriber whose connection fails at ``cut``
    (its host paused during ``pause``), and when the node says it was last heard."""
    sim = Simulator(FIG2, "snr", seed=1, covering="off")
    sim.subscribe("S", "c:0", parse_subscription("[x,<,5]"))
    sim.run()
    if pause is not None:
        sim.fail(Failure(("c:0",), *pause, stall=True))
    sim.fail_client("S", cut)
    dropped: list[tuple[float, float]] = []
    gone = sim._client_gone

    def client_gone(host: str, client: str, heard: float) -> None:
        if (host, client) == ("c:0", "S"):
            dropped.append((sim.now, heard))
        gone(host, client, heard)

    sim._client_gone = client_gone  # type: ignore[method-assign]
    sim.run()
    assert sim.failure_counts["clients_dropped"] == 1
    (drop,) = dropped
    return drop


@pytest.mark.parametrize(
    ("cut", "pause", "dropped"),
    [
        (1.0, None, (12.5, 1.0)),  # the first tick past 11 (the simulator: at 11)
        (1.0, (3.0, 9.0), (16.5, 5.0)),  # the tick due at 5 fires at 9, 4 s late: excused
        (1.0, (10.5, 14.0), (14.0, 1.0)),  # 1.5 s late, under a tick: not excused
        (5.0, None, (17.5, 5.0)),  # not at 15: silent for exactly the timeout is alive
    ],
)
def test_a_cut_client_is_dropped_at_the_tick_the_process_drops_it(
    cut: float, pause: Pause, dropped: tuple[float, float]
) -> None:
    """Ticks every 2.5 s (a quarter of the 10 s timeout) from 0: a client last heard at
    ``cut`` is dropped at the first tick more than 10 s after, a pause excused by as
    much as the tick came late past a tick, whether or not the drop fell due during it
    (the simulator once dropped them at 11.0, 11.0, 14.5 and 15.0)."""
    assert process_drop(cut, pause) == dropped
    assert simulator_drop(cut, pause) == dropped


@pytest.mark.parametrize("seed", range(24))
def test_the_simulator_drops_a_silent_client_when_the_process_does(seed: int) -> None:
    """Cuts and pauses drawn at random, a pause after the cut (before the drop falls due,
    across it, or after it; one before would have the subscriber fail over, leave and
    say bye first): the same tick, the same last hearing."""
    rng = random.Random(seed)
    cut = rng.uniform(0.5, 20.0)
    start = cut + rng.uniform(0.1, 15.0)
    pause = None if seed % 4 == 0 else (start, start + rng.uniform(0.5, 12.0))
    assert simulator_drop(cut, pause) == pytest.approx(process_drop(cut, pause))


def test_due_names_the_first_tick_past_the_timeout() -> None:
    """:meth:`Liveness.due`: the earliest silence decides; strictly past the timeout; at
    the next tick for a client silent past it already; None for none."""
    liveness: Liveness[str] = Liveness(4.0)  # a tick each second
    assert liveness.due() is None
    liveness.start(0.5)
    liveness.heard("a", 3.0)
    assert liveness.due() == 7.5  # 7.0 is exactly the timeout
    liveness.heard("b", 0.2)
    assert liveness.due() == 4.5
    assert liveness.after_pause(1.0, 1.4, caught_up=True) == []  # its tick at 1.5: on time
    assert liveness.woke == 0.5
    assert liveness.after_pause(6.0, 9.7, caught_up=True) == ["b"]  # 3.2 s late
    assert liveness.last_seen["a"] == pytest.approx(3.0 + 3.2)
    assert liveness.due() == pytest.approx(10.7)
