"""A broker's own load, per second over a sliding window (DESIGN §9; Dynamoth's local load
analyzer, its Eq. 1).

Once a second the broker hands :class:`LoadMeter` a :class:`LoadSample`: cumulative counts
of publications taken from its clients, notifications taken from its neighbours,
notification copies sent on each link, deliveries (in all, and to each client still
connected), bytes sent and CPU seconds used. The report gives their rates over the last
``window`` seconds and the *load ratio* LR = output / capacity, where output is
notification copies plus deliveries per second and capacity is configured (``[load]
capacity``, messages/s) or, when it is 0, measured: the output one CPU second has carried
in the window, so that LR is then the broker's CPU utilisation on its routing work.
Counts, never timings, are what it keeps: the hot path pays an integer addition per
message.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

TOP_CLIENTS = 20
"""Clients the report lists by delivery rate (the busiest first)."""


@dataclass(frozen=True)
class LoadSample:
    """Cumulative counts of one broker at loop time ``at``."""

    at: float
    publications: int
    notifications_in: int
    copies_out: dict[str, int]
    """Per neighbour: notification copies sent."""
    delivered: int = 0
    """Notifications delivered to clients, those gone since included."""
    deliveries: Counter[str] = field(default_factory=Counter)
    """Per client of a live connection: notifications delivered."""
    bytes_out: int = 0
    cpu_seconds: float = 0.0


class LoadMeter:
    """Rates and the load ratio of one broker over its last ``window`` samples; ``capacity``
    is its output per second, 0: measured (``[load] window`` and ``capacity``)."""

    def __init__(self, window: int, capacity: float) -> None:
        if window < 1 or capacity < 0:
            raise ValueError("load window must be ≥ 1 sample and capacity ≥ 0")
        self.capacity = capacity
        self._samples: deque[LoadSample] = deque(maxlen=window + 1)

    def sample(self, sample: LoadSample) -> None:
        """Record the counts at one instant (the oldest beyond the window is dropped)."""
        self._samples.append(sample)

    def report(self, top: int = TOP_CLIENTS) -> dict[str, Any]:
        """:func:`load_report` over the window; all rates 0 until two samples are in."""
        if len(self._samples) < 2:
            empty = LoadSample(0.0, 0, 0, {})
            return {**load_report(empty, empty, self.capacity, top), "window_s": 0.0}
        return load_report(self._samples[0], self._samples[-1], self.capacity, top)


def load_report(
    first: LoadSample, last: LoadSample, capacity: float, top: int = TOP_CLIENTS
) -> dict[str, Any]:
    """Rates per second from ``first`` to ``last`` (at least a nanosecond apart), the
    output (copies plus deliveries), the capacity (``capacity``, or 0: measured) and LR;
    the ``top`` clients by delivery rate. The broker process's meter and the
    simulator's balancer both read load this way."""
    span = max(last.at - first.at, 1e-9)
    copies = {n: (c - first.copies_out.get(n, 0)) / span for n, c in last.copies_out.items()}
    deliveries = Counter(
        {c: (n - first.deliveries.get(c, 0)) / span for c, n in last.deliveries.items()}
    )
    delivered = (last.delivered - first.delivered) / span
    output = sum(copies.values()) + delivered
    cpu = (last.cpu_seconds - first.cpu_seconds) / span
    if capacity:
        source = "configured"
    else:
        capacity, source = (output / cpu if cpu > 0 else 0.0), "measured"
    return {
        "window_s": span,
        "publications_in_per_s": (last.publications - first.publications) / span,
        "notifications_in_per_s": (last.notifications_in - first.notifications_in) / span,
        "copies_out_per_s": copies,
        "deliveries_per_s": delivered,
        "busiest_clients": dict(deliveries.most_common(top)),
        "output_per_s": output,
        "bytes_out_per_s": (last.bytes_out - first.bytes_out) / span,
        "cpu_utilisation": cpu,
        "capacity_per_s": capacity,
        "capacity_source": source,
        "load_ratio": output / capacity if capacity else 0.0,
    }
