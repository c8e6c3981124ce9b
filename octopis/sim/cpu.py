"""Each broker's event loop as one server in the simulator, charged by a
:class:`~octopis.sim.service.ServiceModel` (the costs measured on the broker processes).

Messages wait for their broker's CPU in arrival order: every message from a neighbour,
and local publications (one event loop, as in the processes). Other messages cost
nothing; a notification keeps the CPU busy for its measured cost, its copies and
deliveries going out when that time is up.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from octopis.core import Action, Deliver, Forward, Notification
from octopis.sim.events import EventQueue
from octopis.sim.service import ServiceModel


class BrokerCpus:
    """The CPUs of ``brokers``. What a broker's loop does with a message is ``take(broker,
    sender or None for a local publication, message)`` (its actions); ``dispatch(broker,
    actions)`` carries them out; ``entries(broker)`` is its routing table's size (the
    cost model reads it)."""

    def __init__(
        self,
        service: ServiceModel,
        brokers: Iterable[str],
        events: EventQueue,
        take: Callable[[str, str | None, Any], list[Action]],
        dispatch: Callable[[str, list[Action]], None],
        entries: Callable[[str], int],
    ) -> None:
        self.service = service
        self._queues: dict[str, deque[tuple[str | None, Any]]] = {b: deque() for b in brokers}
        """Messages waiting for each broker's CPU, FIFO: (sender, or None for a local
        publication; the message), or (None, the actions of a client's operation)."""
        self._busy: set[str] = set()
        self.charged_until = 0.0
        """When the last CPU charge so far ends."""
        self.busy_time: Counter[str] = Counter()
        """Seconds each broker's CPU was charged."""
        self._events = events
        self._take = take
        self._dispatch = dispatch
        self._entries = entries

    def queue(self, broker: str, src: str | None, message: Any) -> None:
        """``message`` from ``src`` (None: a local publication) waits for ``broker``'s
        CPU, which takes it at once if it is idle."""
        self._queues[broker].append((src, message))
        if broker not in self._busy:
            self._serve(broker)

    def behind(self, broker: str, actions: list[Action]) -> bool:
        """A client operation's ``actions`` at ``broker`` go out behind what its loop
        holds (copies of notifications it has taken or queued), as the processes' one
        loop sends them: True if they were queued, False if it holds nothing (carry
        them out now)."""
        if broker in self._busy or self._queues[broker]:
            self._queues[broker].append((None, actions))
            return True
        return False

    def waiting_publications(self) -> int:
        """Local publications waiting for their broker's CPU now."""
        return sum(
            1
            for queue in self._queues.values()
            for src, message in queue
            if src is None and type(message) is Notification
        )

    def _serve(self, broker: str) -> None:
        """``broker``'s event loop takes its oldest messages now, in order: each is
        handled with the link status of now; other messages cost nothing, and the first
        notification keeps the CPU busy for its measured cost, its copies and deliveries
        going out when that time is up (:meth:`_served`)."""
        queue = self._queues[broker]
        while queue:
            src, message = queue.popleft()
            if type(message) is list:  # a client operation's actions (behind)
                self._dispatch(broker, message)
                continue
            actions = self._take(broker, src, message)
            if type(message) is not Notification:
                self._dispatch(broker, actions)
                continue
            copies = sum(type(a) is Forward for a in actions)
            deliveries = sum(type(a) is Deliver for a in actions)
            cost = self.service.notification(self._entries(broker), copies, deliveries)
            now = self._events.now
            self.busy_time[broker] += cost
            self.charged_until = max(self.charged_until, now + cost)
            self._busy.add(broker)
            self._events.at(now + cost, self._served, broker, actions)
            return
        self._busy.discard(broker)

    def _served(self, broker: str, actions: list[Action]) -> None:
        self._dispatch(broker, actions)
        self._serve(broker)
