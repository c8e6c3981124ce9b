"""Simulated time: the simulator's scheduled calls and the messages in flight on its links,
taken in (time, sequence) order from one binary heap.

A plain heap rather than a process-based library: a 1,000-broker run moves ~10^7 messages
and a generator per message would dominate the run time. Links are FIFO, so the messages
in flight on one link are already in that order: each link keeps them in a queue and
only its first is in the heap, which therefore holds at most one entry per link besides
the scheduled calls, however many messages are in flight (3,000 subscriptions issued at
once put 337,000 on the links). A message in flight is one tuple ``(arrival, seq,
destination, source, message, queue)``; a scheduled call is ``(time, seq, None, function,
arguments, None)``, a background one (a broker's maintenance timer, which keeps no run
going: :meth:`EventQueue.background`) ``(time, seq, None, function, arguments, True)``.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused meanwhile (and restored after), which
    changes no result: it only defers collecting cycles. Events leave garbage that
    reference counting frees at once, while every full collection would walk all the
    live entries and messages (a sixth of a 1,000-broker run; about two thirds of
    building paper75's 75 cores in a test process)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class EventQueue:
    """Scheduled calls and the messages in flight on each directed link, in (time,
    sequence) order; :attr:`now` is the time of the event being taken."""

    def __init__(self, brokers: Iterable[str]) -> None:
        self.now = 0.0
        self.wall = 0.0
        """Seconds of real time spent in :meth:`run`."""
        self._heap: list[tuple] = []
        self._seq = 0
        self._background = 0
        """Background calls in the heap."""
        self.in_flight: dict[str, dict[str, deque[tuple]]] = {b: {} for b in brokers}
        """Per sender and receiver (a directed link), its messages in flight in arrival
        order (the first one is also in the heap)."""

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at simulated time ``when`` (not before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, None, fn, args, None))

    def background(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at simulated time ``when`` (not before now) if the run gets
        there: a timer a broker process keeps running while idle (its maintenance), which
        a run without ``until`` does not wait for and :meth:`pending` does not count."""
        self._seq += 1
        self._background += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, None, fn, args, True))

    def send(self, src: str, dst: str, arrival: float, message: Any) -> None:
        """Put ``message`` on the link ``src → dst``, to arrive at ``arrival`` but never
        before the message sent ahead of it (FIFO links)."""
        links = self.in_flight[src]
        queue = links.get(dst)
        if queue is None:
            queue = links[dst] = deque()
        elif queue and queue[-1][0] > arrival:
            arrival = queue[-1][0]
        self._seq += 1
        queue.append((arrival, self._seq, dst, src, message, queue))
        if len(queue) == 1:
            heapq.heappush(self._heap, queue[0])

    def last_arrival(self, src: str, dst: str) -> float:
        """When the last message in flight on ``src → dst`` arrives (now if none)."""
        queue = self.in_flight[src].get(dst)
        return queue[-1][0] if queue else self.now

    def carrying(self, src: str, dst: str) -> int:
        """How many messages are in flight on ``src → dst``."""
        return len(self.in_flight[src].get(dst, ()))

    def add(self, broker: str) -> None:
        """``broker`` joined the overlay: its links carry nothing yet."""
        self.in_flight[broker] = {}

    def remove(self, broker: str) -> None:
        """``broker`` left the overlay (nothing is in flight from it)."""
        del self.in_flight[broker]

    def drop_link(self, src: str, dst: str) -> None:
        """The link ``src → dst`` is gone from the overlay (nothing is in flight on it)."""
        self.in_flight[src].pop(dst, None)

    def pending(self) -> int:
        """Events not yet taken: scheduled calls (not background ones), and one per link
        carrying messages."""
        return len(self._heap) - self._background

    def messages(self) -> Iterable[Any]:
        """Every message in flight."""
        return (item[4] for links in self.in_flight.values() for q in links.values() for item in q)

    def run(self, arrive: Callable[[str, str, Any], None], until: float = math.inf) -> None:
        """Take events in time order until none is left but background calls (or
        ``until`` is reached, background ones taken too): call the scheduled functions,
        and ``arrive(destination, source, message)`` for each message that arrives; the
        cyclic garbage collector is paused meanwhile (:func:`collector_paused`)."""
        started = time.perf_counter()
        events = self._heap
        pop, push = heapq.heappop, heapq.heappush
        endless = until == math.inf
        with collector_paused():
            while events and events[0][0] <= until:
                if endless and len(events) == self._background:
                    break
                self.now, _, dst, a, b, queue = pop(events)
                if dst is None:
                    if queue:
                        self._background -= 1
                    a(*b)
                    continue
                queue.popleft()
                if queue:
                    push(events, queue[0])
                arrive(dst, a, b)
        if until != math.inf:
            self.now = max(self.now, until)
        self.wall += time.perf_counter() - started


class Sampler:
    """Reads ``measure()`` on ``events``' clock every so often (:meth:`start`) into
    :attr:`timeline`."""

    def __init__(self, events: EventQueue, measure: Callable[[], int]) -> None:
        self._events = events
        self._measure = measure
        self.timeline: list[tuple[float, int]] = []
        """(seconds since the sampling started, the measure) samples."""

    def start(self, start: float, end: float, every: float) -> None:
        """Sample every ``every`` seconds from ``start`` on, until ``end`` is reached and
        the measure reads 0."""
        if every <= 0:
            raise ValueError(f"sample_every must be > 0, got {every}")
        self._events.at(start, self._sample, start, end, every)

    def _sample(self, start: float, end: float, every: float) -> None:
        now, value = self._events.now, self._measure()
        self.timeline.append((now - start, value))
        if now < end or value:
            self._events.at(now + every, self._sample, start, end, every)
