"""Failures in the simulator (DESIGN §7): dead brokers, down links, detection, custody.

The model is the transport's, in simulated time:

- A failure takes effect at once: copies in flight on a failed link, or to or from a dead
  broker, never arrive. A dead broker loses its state.
- Each end of a failed link *detects* it ``detection`` seconds later (the transport's
  ``links.down_after``); only then does its core see the link as down and route around it.
- Custody: a sender keeps every copy it sent on a link for ``retain`` seconds after
  sending (the transport keeps acknowledged frames as long, in case the receiver dies
  before passing them on). At detection, the copies sent since ``failure − retain`` go
  back to the sender's core (``reroute``); edge dedup absorbs those that had arrived.
- A broker that dies takes with it the copies still in flight from it
  (``undeliverable.died_in_flight``) and those it had sent on an already failed link
  before it detected the failure (``undeliverable.died_in_custody``): only it could have
  routed them again. Both are counted, with the notification; they are the losses
  custody cannot prevent (the publisher's host dying right after accepting, say).
- A restarted broker comes back empty, with a new sub-id epoch; each neighbour hands it
  first the subscription messages that never reached its predecessor, then what SBP
  would have given it (resync) — at once, or, if the neighbour is dead, cut off or
  missing a share itself, when it can (until then the restarted broker routes toward
  that side as if it matched) — and withdraws the predecessor's subscriptions once the
  restarted broker is serving. What a broker holds for a neighbour and owes it is
  :mod:`octopis.core.recovery`'s, the broker process's rules.

Failures are read by :mod:`octopis.failure_schedule` (times in seconds of simulated time
from the start of publishing).
"""

from __future__ import annotations

import math
from collections import deque

from octopis.core import LinkView

DEFAULT_DETECTION = 1.0
DEFAULT_RETAIN = 1.0


class FailureState:
    """Which brokers are dead and which directed links are down, physically and as each
    sender has detected; the custody window of every directed link."""

    def __init__(self, detection: float = DEFAULT_DETECTION, retain: float = DEFAULT_RETAIN):
        if detection < 0 or retain < 0:
            raise ValueError("detection and retain must not be negative")
        self.detection = detection
        self.retain = retain
        self.dead: set[str] = set()
        self.cut: set[tuple[str, str]] = set()
        """Directed links failed as links (independent of dead brokers)."""
        self.detected: dict[str, set[str]] = {}
        """Per broker, the neighbours it has detected as down."""
        self.failed_at: dict[tuple[str, str], float] = {}
        self.syncing: dict[str, set[str]] = {}
        """Restarted brokers, each with the neighbours whose resync has not arrived."""
        self.shares_in_flight: dict[tuple[str, str], object] = {}
        """Resync shares handed and not yet arrived, per directed link (a token each)."""
        self._custody: dict[tuple[str, str], deque[tuple[float, object]]] = {}

    def broken(self, src: str, dst: str) -> bool:
        """Whether a copy on ``src → dst`` is lost (link cut or an end dead)."""
        return src in self.dead or dst in self.dead or (src, dst) in self.cut

    def sent(self, src: str, dst: str, now: float, message: object) -> None:
        """Keep ``message`` in ``src``'s custody for ``dst``."""
        window = self._custody.get((src, dst))
        if window is None:
            window = self._custody[(src, dst)] = deque()
        window.append((now, message))
        horizon = now - self.retain - self.detection
        while window and window[0][0] < horizon:
            window.popleft()

    def take_back(self, src: str, dst: str) -> list[object]:
        """The copies ``src`` sent to ``dst`` since ``failure − retain``; custody emptied."""
        since = self.failed_at.get((src, dst), -math.inf) - self.retain
        window = self._custody.pop((src, dst), deque())
        return [message for when, message in window if when >= since]

    def forget(self, broker: str) -> list[object]:
        """A dead broker's own custody and detections die with it; returns the copies it
        had sent on links already failed (they never arrived, and only it could have
        routed them again)."""
        lost: list[object] = []
        for link in [link for link in self._custody if link[0] == broker]:
            failed = self.failed_at.get(link, math.inf)
            lost += [message for when, message in self._custody.pop(link) if when >= failed]
        self.detected.pop(broker, None)
        return lost

    def view(self, broker: str, inner: LinkView) -> LinkView:
        """What ``broker`` sees: ``inner``'s loads, and its detected down links."""
        down = self.detected.get(broker)
        return _DetectedView(inner, down) if down else inner


class _DetectedView:
    __slots__ = ("_down", "_inner")

    def __init__(self, inner: LinkView, down: set[str]) -> None:
        self._inner = inner
        self._down = down

    def overloaded(self, link: str) -> bool:
        return self._inner.overloaded(link)

    def load(self, link: str) -> tuple[float, int]:
        return self._inner.load(link)

    def down(self, link: str) -> bool:
        return link in self._down or self._inner.down(link)
