"""Backpressure of one broker (DESIGN §8): which neighbours it holds back, and why — the
rule, sans-IO, fed plain numbers by the broker process.

A neighbour is held back (its acknowledgements withheld, so its custody fills and it
stops sending) while a link to another neighbour has ``links.queue_limit`` frames
waiting, while more than ``clients.queue_limit`` deliveries wait for
``clients.capacity`` (every neighbour then, named :data:`CLIENTS`), or, over the memory
budget (``memory.budget_mb``), while the longest link has anything waiting. The full
link's own neighbour is still acknowledged: what it sends never goes back to it, and
withholding from it could lock two brokers that wait on each other.

The process reads its queues, its waiting deliveries and its RSS, hands them to
:meth:`Backpressure.check`, and logs what that returns (:class:`Pressed`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from octopis.core.custody import acknowledgement, owed
from octopis.core.neighbours import Neighbour

CLIENTS = "(clients)"
"""The name :attr:`Backpressure.full` gives the broker's own clients when more than
``clients.queue_limit`` deliveries wait for ``clients.capacity``: every neighbour is then
held back."""


SEND, LATER, HELD = range(3)
"""What :meth:`Backpressure.acknowledging` says of an acknowledgement wanted at once."""


@dataclass(frozen=True)
class Pressed:
    """What a check started, for the broker's log: ``memory``: over the memory budget
    with ``longest`` holding ``longest_waiting`` frames (None: no memory episode
    started); ``full``: every neighbour held back → what waits on it, when a
    backpressure episode started (empty: none started)."""

    memory: str | None
    longest_waiting: int
    full: dict[str, int]


class Backpressure:
    """What holds a broker's neighbours back, refreshed by :meth:`check`; episodes are
    counted in ``counters`` (``backpressure.episodes``, ``memory.pressure_episodes``,
    ``backpressure.acks_withheld``). ``queue_limit``: ``links.queue_limit``;
    ``deliveries_limit``: ``clients.queue_limit``; ``budget_mb``: ``memory.budget_mb``."""

    def __init__(
        self, queue_limit: int, deliveries_limit: int, budget_mb: int, counters: Counter[str]
    ) -> None:
        if queue_limit < 1 or deliveries_limit < 1 or budget_mb < 1:
            raise ValueError(
                "backpressure needs links.queue_limit, clients.queue_limit and "
                f"memory.budget_mb ≥ 1 (got {queue_limit}, {deliveries_limit}, {budget_mb})"
            )
        self.queue_limit = queue_limit
        self.deliveries_limit = deliveries_limit
        self.budget_mb = budget_mb
        self.counters = counters
        self.full: set[str] = set()
        """Neighbours whose link has ``queue_limit`` frames waiting, or whose link is the
        longest while the broker is over its memory budget, and :data:`CLIENTS`."""
        self.pressing = False
        """Over the memory budget with data waiting: a link is held as full."""

    def check(self, queues: Mapping[str, int], waiting: int, rss: int) -> Pressed | None:
        """Refresh :attr:`full` from the frames waiting on each neighbour's link
        (``queues``), the ``waiting`` deliveries and the broker's ``rss`` (bytes); count
        the episodes that start and return them for the log (None: none started). Over
        the memory budget, the link with the longest queue counts as full (if anything
        waits on it): the broker takes in no faster than it sends out until it is back
        under."""
        if not queues and waiting < self.deliveries_limit:  # the common case: nothing waits
            self.pressing = False
            if self.full:
                self.full = set()
            return None
        full = {n for n, queued in queues.items() if queued >= self.queue_limit}
        if waiting >= self.deliveries_limit:
            full.add(CLIENTS)
        memory, longest_waiting = None, 0
        if rss > self.budget_mb << 20 and queues:
            longest = max(queues, key=queues.__getitem__)
            pressing = queues[longest] > 0
            if pressing:
                full.add(longest)
            if pressing and not self.pressing:
                self.counters["memory.pressure_episodes"] += 1
                memory, longest_waiting = longest, queues[longest]
            self.pressing = pressing
        else:
            self.pressing = False
        started = bool(full - self.full)
        if started:
            self.counters["backpressure.episodes"] += 1
        self.full = full
        if not started and memory is None:
            return None
        held = {n: waiting if n == CLIENTS else queues[n] for n in sorted(full)} if started else {}
        return Pressed(memory, longest_waiting, held)

    def holds(self, name: str) -> bool:
        """Whether neighbour ``name``'s acknowledgements are withheld (as :attr:`full`
        last said): something other than its own link is full."""
        full = self.full
        return bool(full) and (len(full) > 1 or name not in full)

    def acknowledging(self, name: str, deliveries_waiting: int) -> int:
        """What becomes of an acknowledgement to ``name`` the node's rule wants at once
        (:func:`~octopis.core.custody.take` said ``NOW``, or a RESENT was taken), once
        the shell has refreshed the rule (:meth:`check`) unless deliveries wait: :data:`SEND`
        it now; :data:`LATER`, with the broker's acknowledgement timer, while
        ``deliveries_waiting`` wait for the clients' capacity (the run about to be routed
        may add to that backlog, which the timer's check then sees); :data:`HELD` while
        ``name`` is held back (:meth:`holds`): the broker's look again (every
        ``ack_interval``, :meth:`tick`) acknowledges it, withheld and counted
        (:meth:`acknowledge`). Both shells carry this out."""
        if deliveries_waiting:
            return LATER
        return HELD if self.holds(name) else SEND

    def released(self, owed: list[tuple[str, Neighbour]]) -> list[tuple[str, Neighbour]]:
        """Of the ``owed`` neighbours (:func:`~octopis.core.custody.owed_neighbours`) the
        broker's acknowledgement timer acknowledges, those not held back; the others are
        left to the look again, which counts what it withholds (both shells)."""
        return [(name, record) for name, record in owed if not self.holds(name)]

    def acknowledge(self, name: str, state: Neighbour) -> int:
        """The count a heartbeat to ``name`` acknowledges: what was taken from it, or,
        while it is held back (:meth:`holds`), the count last acknowledged (a withheld
        acknowledgement is counted)."""
        withheld = self.holds(name)
        if withheld:
            self.counters["backpressure.acks_withheld"] += owed(state)
        return acknowledgement(state, withheld)

    def forget(self, name: str) -> None:
        """Neighbour ``name`` left the overlay: its link no longer counts."""
        self.full.discard(name)

    def tick(self, calm: float, ack_interval: float) -> float:
        """Seconds to the next look at the links: ``calm``, or at most ``ack_interval``
        while a neighbour is held back (its withheld acknowledgements are released then)."""
        return min(ack_interval, calm) if self.full else calm
