"""Link Status Table and congestion element (paper §6.3, Eq. 3; DESIGN §3).

Every outgoing link has an output queue. Per window Δt the table counts ``n_in`` (copies
enqueued) and ``n_out`` (copies sent); when a window closes, CE = n_in / n_out, with
n_out = 0 and n_in > 0 giving ∞ and an idle window giving 1. A link is *overloaded* when
its queue length ≥ Q, or its queue is non-empty and CE > 1. A row also says whether the
link is *down* (failure detection, DESIGN §7). The table reads no clock: the caller passes
the time with every event.

"Least loaded" (DNR's choice among links, DESIGN §3) has two orders:

- ``"ce"`` (the default, the paper's): CE of the last closed window, then queue length.
- ``"bluedove"`` (BlueDove's adaptive policy, DESIGN §9): the estimated processing time
  (q̂ + 1)/μ of the next copy, then queue length. λ = n_in/Δt and μ = n_out/Δt are the
  rates of the last closed window; q̂ = max(0, q + (λ − μ)(t − t')) extrapolates the
  queue length q known at the link's last event t' (enqueue or send) to the table's
  clock t, the latest time any caller has passed (an event on any link, or
  :meth:`~LinkStatusTable.advance`): the table reads no clock, so a broker's estimate is
  as fresh as its last event or tick. A link that sent nothing in the last window has
  no measured service rate; its μ is floored at one copy per window (1/Δt, the lowest
  rate a window can measure), so an idle link costs (q̂ + 1)·Δt rather than ∞ and a
  stalled one's cost still grows with its queue. The floor applies to the division
  only; the extrapolation uses the measured rates. μ is measured throughput,
  not capacity: a link that was offered little looks slower than it could be.
"""

from __future__ import annotations

import math
from typing import Protocol

DEFAULT_LST_WINDOW = 0.05
"""Δt, seconds (DESIGN §3): the one definition every shell and the simulator use."""
DEFAULT_QUEUE_THRESHOLD = 10
"""Q (DESIGN §3): a queue this long marks its link overloaded."""
ORDERS = ("ce", "bluedove")
"""The orders of "least loaded": the paper's CE order and BlueDove's processing time."""
DEFAULT_ORDER = "ce"
"""The paper's order (DESIGN §3)."""


class LinkView(Protocol):
    """What DNR may ask about an outgoing link."""

    def overloaded(self, link: str) -> bool:
        """Whether ``link`` is overloaded now."""

    def load(self, link: str) -> tuple[float, int]:
        """Sort key for "least loaded": (CE, queue length) in the paper's order, or
        (estimated processing time, queue length) in BlueDove's."""

    def down(self, link: str) -> bool:
        """Whether failure detection holds ``link``'s neighbour down (DESIGN §7)."""


class LinkRow:
    """One LST row: counts of the open window, CE of the last closed one, queue length,
    and t' (``last_event``): when ``queue_length`` last changed (BlueDove's extrapolation
    starts there). Typed in ``lst.pxd``: compiled, a row is a C struct."""

    def __init__(self, window_start: float = 0.0, last_event: float = 0.0) -> None:
        self.window_start = window_start
        self.n_in = 0
        self.n_out = 0
        self.ce = 1.0
        self.queue_length = 0
        self.last_n_in = 0
        self.last_n_out = 0
        self.last_event = last_event

    def __repr__(self) -> str:
        return (
            f"LinkRow(window_start={self.window_start}, n_in={self.n_in}, "
            f"n_out={self.n_out}, ce={self.ce}, queue_length={self.queue_length}, "
            f"last_n_in={self.last_n_in}, last_n_out={self.last_n_out}, "
            f"last_event={self.last_event})"
        )


def congestion_element(n_in: int, n_out: int) -> float:
    """CE of one window (Eq. 3): n_in / n_out; ∞ when nothing left, 1 when idle."""
    if n_out:
        return n_in / n_out
    return math.inf if n_in else 1.0


class LinkStatusTable:
    """Per-link n_in, n_out, CE and queue length; implements :class:`LinkView`."""

    def __init__(
        self,
        links: list[str],
        window: float = DEFAULT_LST_WINDOW,
        queue_threshold: int = DEFAULT_QUEUE_THRESHOLD,
        start: float = 0.0,
        order: str = DEFAULT_ORDER,
    ) -> None:
        if window <= 0:
            raise ValueError(f"LST window must be positive, got {window}")
        if queue_threshold < 1:
            raise ValueError(f"queue threshold Q must be ≥ 1, got {queue_threshold}")
        if order not in ORDERS:
            raise ValueError(f"LST order must be one of {', '.join(ORDERS)}, got {order!r}")
        self.window = window
        self.queue_threshold = queue_threshold
        self.order = order
        self.now = start
        """The table's clock: the latest time a caller has passed."""
        self.rows = {link: LinkRow(window_start=start, last_event=start) for link in links}
        self._down: set[str] = set()
        self.notifications_in = 0
        """Notification copies enqueued on any link (``enqueued(..., notification=True)``)."""
        self.notifications_ahead = 0
        """The queue lengths those copies joined, summed (their mean is the queueing a
        copy meets)."""
        self.most_ahead = 0
        """The longest queue one of them joined."""

    def add_link(self, link: str, now: float) -> None:
        """A row for the link to a neighbour that joined (DESIGN §9), down until failure
        detection says otherwise."""
        if link in self.rows:
            raise ValueError(f"the LST has a row for {link} already")
        self.rows[link] = LinkRow(window_start=now, last_event=now)
        self._down.add(link)

    def remove_link(self, link: str) -> None:
        """Drop the row of the link to a neighbour that left."""
        del self.rows[link]
        self._down.discard(link)

    def set_down(self, link: str, down: bool) -> None:
        """Record what failure detection says of ``link`` (DESIGN §7: the row says so)."""
        if down:
            self._down.add(link)
        else:
            self._down.discard(link)

    def down(self, link: str) -> bool:
        """Whether ``link``'s neighbour is held down."""
        return link in self._down

    def enqueued(self, link: str, now: float, notification: bool = False) -> None:
        """One copy entered ``link``'s output queue at ``now``; a ``notification`` copy
        also counts the queue it joined."""
        row: LinkRow = self.rows[link]
        if now >= row.window_start + self.window:
            self._roll(link, now)
        if notification:
            self.notifications_in += 1
            self.notifications_ahead += row.queue_length
            if row.queue_length > self.most_ahead:
                self.most_ahead = row.queue_length
        row.n_in += 1
        row.queue_length += 1
        if now > row.last_event:
            row.last_event = now
        if now > self.now:
            self.now = now

    def sent(self, link: str, now: float, copies: int = 1) -> None:
        """``copies`` left ``link``'s output queue at ``now``."""
        row: LinkRow = self.rows[link]
        if now >= row.window_start + self.window:
            self._roll(link, now)
        row.n_out += copies
        row.queue_length -= copies
        if now > row.last_event:
            row.last_event = now
        if now > self.now:
            self.now = now

    def advance(self, now: float) -> None:
        """Close every window that ended by ``now`` (a periodic tick in real brokers)."""
        for link in self.rows:
            self._roll(link, now)
        self.now = max(self.now, now)

    def overloaded(self, link: str) -> bool:
        """Queue length ≥ Q, or queue non-empty and CE > 1."""
        row: LinkRow = self.rows[link]
        return row.queue_length >= self.queue_threshold or (row.queue_length > 0 and row.ce > 1)

    def load(self, link: str) -> tuple[float, int]:
        """The order of "least loaded": (CE, queue length), or in BlueDove's order
        (:meth:`processing_time`, queue length)."""
        if self.order == "bluedove":
            return (self.processing_time(link), self.rows[link].queue_length)
        row = self.rows[link]
        return (row.ce, row.queue_length)

    def estimated_queue(self, link: str) -> float:
        """q̂ = max(0, q + (λ − μ)(t − t')): ``link``'s queue extrapolated from its last
        event t' to the table's clock t with the last closed window's rates."""
        row = self._roll(link, self.now)
        drift = (row.last_n_in - row.last_n_out) / self.window
        return max(0.0, row.queue_length + drift * (self.now - row.last_event))

    def processing_time(self, link: str) -> float:
        """(q̂ + 1)/μ: when the next copy put on ``link`` would have left (BlueDove's
        estimate), μ floored at one copy per window."""
        q = self.estimated_queue(link)
        mu = max(self.rows[link].last_n_out, 1) / self.window
        return (q + 1) / mu

    def snapshot(self) -> dict[str, dict[str, float | int | bool]]:
        """The table as plain data (for stats RPC and reports); in BlueDove's order each
        row also has its ``processing_time``."""
        table: dict[str, dict[str, float | int | bool]] = {}
        for link, r in self.rows.items():
            row: dict[str, float | int | bool] = {
                "n_in": r.last_n_in,
                "n_out": r.last_n_out,
                "ce": r.ce,
                "queue_length": r.queue_length,
                "overloaded": self.overloaded(link),
                "down": link in self._down,
            }
            if self.order == "bluedove":
                row["processing_time"] = self.processing_time(link)
            table[link] = row
        return table

    def _roll(self, link: str, now: float) -> LinkRow:
        row: LinkRow = self.rows[link]
        end = row.window_start + self.window
        if now >= end:
            row.ce = congestion_element(row.n_in, row.n_out)
            row.last_n_in, row.last_n_out = row.n_in, row.n_out
            row.n_in = row.n_out = 0
            skipped = math.floor((now - end) / self.window)
            if skipped:
                row.ce, row.last_n_in, row.last_n_out = 1.0, 0, 0
            row.window_start = end + skipped * self.window
        return row
