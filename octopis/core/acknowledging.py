"""When one broker acknowledges what it took from its neighbours (DESIGN §7, §8), sans-IO:
the steps around the receiver's rule (:func:`~octopis.core.custody.take`) and
backpressure (:class:`~octopis.core.pressure.Backpressure`) that the broker process and
the simulator both carry out, each with its own clock and wire.

- Routing messages taken from a neighbour are acknowledged at once, or by the broker's
  one acknowledgement timer, ``ack_delay`` after the first taken since a neighbour's
  last acknowledgement (:meth:`Acknowledgements.taken`).
- An acknowledgement wanted at once looks at backpressure afresh first (unless
  deliveries wait for the clients' capacity: then the timer's look sees the backlog the
  run adds), and goes now, waits for the timer, or is left to the broker's look again
  (every ``ack_interval`` while a neighbour is held back), which acknowledges it
  withheld (:meth:`Acknowledgements.at_once`).
- When the timer fires, every neighbour owed then is acknowledged unless held back
  (:meth:`Acknowledgements.timer_fired`).

The shell says how it looks at backpressure afresh (``refresh``: its queues, its
deliveries waiting, its memory), sends the acknowledgements it is told to, arms the timer
when told, and looks again while a neighbour is held back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from octopis.core.custody import FIRST, NOW, STALE, owed_neighbours, take
from octopis.core.neighbours import Neighbour
from octopis.core.pressure import HELD, LATER, SEND, Backpressure

NOTHING, ARM = 3, 4
"""Besides :data:`~octopis.core.pressure.SEND` (acknowledge now) and
:data:`~octopis.core.pressure.HELD` (left to the look again) of an acknowledgement:
nothing to do now (the timer is armed already, or the messages were stale), or arm the
acknowledgement timer."""

Owed = list[tuple[str, Neighbour]]


class Acknowledgements:
    """One broker's acknowledgements to its neighbours, by the rule ``pressure`` (its
    backpressure) and ``every`` (:func:`~octopis.core.custody.acknowledge_every`); stale
    messages are counted in ``counts``. :attr:`timer` is whether the acknowledgement
    timer is armed: the shell clears it by :meth:`timer_fired` when it fires."""

    __slots__ = ("counts", "every", "pressure", "timer")

    def __init__(self, pressure: Backpressure, every: int, counts: Counter[str]) -> None:
        self.pressure = pressure
        self.every = every
        self.counts = counts
        self.timer = False

    def taken(
        self,
        name: str,
        record: Neighbour,
        count: int,
        refresh: Callable[[], object],
        *,
        notifications: bool = True,
        deliveries_waiting: int = 0,
    ) -> int | None:
        """``count`` routing messages from neighbour ``name`` (``notifications``, or
        another routing message) arrive: None if the node's rule drops them as stale
        (counted), else what becomes of their acknowledgement: :meth:`at_once` when the
        rule says now, :data:`ARM` the timer for the first since the last
        acknowledgement, else :data:`NOTHING`."""
        verdict = take(record, count, self.counts, self.every, notifications=notifications)
        if verdict == STALE:
            return None
        if verdict == NOW:
            return self.at_once(name, refresh, deliveries_waiting)
        return self._arm() if verdict == FIRST else NOTHING

    def at_once(self, name: str, refresh: Callable[[], object], deliveries_waiting: int = 0) -> int:
        """An acknowledgement to ``name`` the rule wants at once (or a RESENT was taken
        with something owed): backpressure looked at afresh (``refresh()``) unless
        ``deliveries_waiting``; then :data:`SEND` it now, :data:`ARM` the timer (or
        :data:`NOTHING`, armed already) while deliveries wait, or :data:`HELD`: the look
        again acknowledges it, withheld (:meth:`Backpressure.acknowledging`)."""
        if not deliveries_waiting:
            refresh()
        fate = self.pressure.acknowledging(name, deliveries_waiting)
        return self._arm() if fate == LATER else fate

    def _arm(self) -> int:
        if self.timer:
            return NOTHING
        self.timer = True
        return ARM

    def timer_fired(
        self, neighbours: Iterable[tuple[str, Neighbour]], refresh: Callable[[], object]
    ) -> tuple[Owed, bool]:
        """The acknowledgement timer fires: the neighbours to acknowledge now (every one
        owed, :func:`~octopis.core.custody.owed_neighbours`, not held back once
        backpressure is looked at afresh), and whether one owed is held back (the look
        again acknowledges it, withheld)."""
        self.timer = False
        owed = owed_neighbours(neighbours)
        if not owed:
            return [], False
        refresh()
        released = self.pressure.released(owed)
        return released, len(released) < len(owed)


__all__ = ["ARM", "HELD", "NOTHING", "SEND", "Acknowledgements"]
