"""When a client judges its broker silent (DESIGN §7), sans-IO: the SDK's heartbeat watch,
which its connections run tick by tick and the simulator's clients run to the tick that
fails them over.

A connection heartbeats its broker every :func:`heartbeat_interval` seconds; it fails
over once :data:`BEATS_MISSED` heartbeats in a row, the first sent ``liveness`` seconds
ago or more, were followed by nothing at all from the broker. Counting heartbeats rather
than seconds keeps a stall of the client's own process from reading as the broker's
silence. A broker that stops answering is thus noticed ``liveness`` seconds after the
first heartbeat it leaves unanswered: more than ``liveness`` and at most ``liveness``
plus one interval after it was last heard, as the connection's ticks fall.
"""

from __future__ import annotations

import math
import zlib

from octopis.defaults import CLIENT_LIVENESS, CLIENT_TIMEOUT

BEATS_MISSED = 3
"""Unanswered heartbeats in a row after which a broker may be judged silent."""
RESOLUTION = 1e-9
"""Seconds below which two times are the same (ticks computed as sums of intervals)."""


def heartbeat_interval(timeout: float = CLIENT_TIMEOUT, liveness: float = CLIENT_LIVENESS) -> float:
    """Seconds between a connection's heartbeats: often enough for its broker, which
    drops a client silent past ``timeout``, and for :data:`BEATS_MISSED` of them to fit
    in ``liveness``."""
    return min(timeout / 4, liveness / BEATS_MISSED)


class SilenceWatch:
    """One connection's judgement of its broker's silence (see the module docstring)."""

    __slots__ = ("first_unanswered", "liveness", "missed")

    def __init__(self, liveness: float = CLIENT_LIVENESS) -> None:
        self.liveness = liveness
        self.first_unanswered: float | None = None
        """When the first heartbeat nothing has answered since was sent."""
        self.missed = 0

    def tick(self, now: float, heard: float, answered: bool = False) -> bool:
        """The heartbeat tick at ``now``, the broker last heard at ``heard``
        (``answered``: input waits unread, or reading is paused behind deliveries: the
        broker did answer, this process is behind). True: the broker is silent (fail
        over, and the watch starts again); False: send a heartbeat now."""
        first = self.first_unanswered
        if first is not None and (answered or heard >= first):
            first, self.missed = None, 0
        if first is not None:
            self.missed += 1
            if self.missed >= BEATS_MISSED and now - first >= self.liveness - RESOLUTION:
                self.first_unanswered, self.missed = None, 0
                return True
        self.first_unanswered = now if first is None else first
        return False


def phase_of(client: str, seed: int, interval: float) -> float:
    """Where in its heartbeat interval a simulated ``client``'s ticks fall (a run of
    ``seed``): drawn from both, the same in every run of that seed."""
    return zlib.crc32(f"{seed}/{client}".encode()) % 1_000_000 / 1_000_000 * interval


def silence_noticed(
    silent_from: float, phase: float, interval: float, liveness: float = CLIENT_LIVENESS
) -> float:
    """When a connection whose ticks fall at ``phase`` + k × ``interval`` judges its
    broker silent, the broker having answered nothing since ``silent_from``: its
    :class:`SilenceWatch` run tick by tick from there."""
    watch = SilenceWatch(liveness)
    beat = math.ceil((silent_from - phase) / interval - RESOLUTION)
    while not watch.tick(phase + beat * interval, silent_from):
        beat += 1
    return phase + beat * interval
