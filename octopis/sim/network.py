"""The simulator's links (DESIGN §2): when a copy leaves its sender and arrives, and what
each broker sees of its links.

Every directed link is a FIFO channel whose per-message latency is drawn from a seeded
:class:`LatencyModel`, so that BID's first-arrival trees differ from shortest ones
(paper §2). Each directed link draws from a stream of its own, seeded from the run's seed
and the link's name: the latency of the k-th copy on a link does not depend on the order
in which one pass sends copies to different links (a node may list its forwards in a
set's order, which varies with ``PYTHONHASHSEED``), so a seed replays the same run in any
process. A :class:`~octopis.sim.congestion.LinkModel` decides what brokers see of
their links and when copies leave their output queues.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from octopis.core import LinkView, Notification
from octopis.sim.congestion import FreeLinks, LinkModel


@dataclass(frozen=True)
class LatencyModel:
    """Per-message link latency: ``base`` seconds plus exponential jitter of mean ``jitter``."""

    base: float = 0.001
    jitter: float = 0.001

    def sample(self, uniform: float) -> float:
        """The latency at the uniform draw ``uniform`` in [0, 1)."""
        if self.jitter <= 0:
            return self.base
        return self.base - math.log(1.0 - uniform) * self.jitter


class _LinkStreams:
    """One pseudo-random stream per directed link, seeded by the run's seed and the
    link's name (a Mersenne Twister each, ~2.5 KB: 40 MB for a 1,000-broker SCOT's
    links), and the latencies ``latency`` draws from them (none with a fixed latency)."""

    def __init__(self, seed: int, latency: LatencyModel) -> None:
        self._seed = seed
        self._sample = latency.sample
        self._fixed = latency.base if latency.jitter <= 0 else None
        self._draws: dict[str, dict[str, Callable[[], float]]] = {}

    def latency(self, src: str, dst: str) -> float:
        """The next latency draw of the link ``src → dst``."""
        if self._fixed is not None:
            return self._fixed
        draws = self._draws.get(src)
        if draws is None:
            draws = self._draws[src] = {}
        draw = draws.get(dst)
        if draw is None:
            draw = draws[dst] = random.Random(f"{self._seed}:{src}>{dst}").random
        return self._sample(draw())


class Network:
    """The links of one run: ``model`` (queues and what brokers see) and latencies drawn
    from ``latency`` with ``rng``."""

    def __init__(self, model: LinkModel, latency: LatencyModel, rng: random.Random) -> None:
        self.model = model
        self.latency = latency
        self._latency = _LinkStreams(rng.getrandbits(64), latency).latency
        """The next latency draw of a copy on a link."""
        self._link_frames = _LinkStreams(rng.getrandbits(64), latency)
        """The streams of link-level frames (acknowledgements): drawing them leaves the
        latencies of the copies on each link as they were."""
        self._instant = type(model).transmit is FreeLinks.transmit and not model.measures_queues
        """Whether copies leave at once (no output queue to ask)."""
        self._fixed_view = model.view("", 0.0) if type(model) is FreeLinks else None
        """What every broker sees of free links at any time (None: ask the link model)."""
        self.receiver_paced = bool(getattr(model, "receiver_paced", False))
        """Whether a copy stays in its sender's output queue until the receiver takes it
        (:meth:`taken`)."""
        self.target_queue: list[int] = []
        """The queue ahead of each notification copy sent (links that measure queues)."""

    def arrival(self, src: str, dst: str, now: float, message: Any) -> float:
        """When a copy ``src`` sends ``dst`` at ``now`` arrives: its departure from the
        link's output queue plus a latency draw (FIFO order is the event queue's)."""
        if self._instant:
            return now + self._latency(src, dst)
        model = self.model
        departure, ahead = model.transmit(src, dst, now)
        if model.measures_queues and type(message) is Notification:
            self.target_queue.append(ahead)
        return departure + self._latency(src, dst)

    def link_frame_latency(self, src: str, dst: str) -> float:
        """The latency of a link-level frame (an acknowledgement) on ``src → dst``: it
        leaves ahead of the output queue and takes just a draw, from a stream of its own."""
        return self._link_frames.latency(src, dst)

    def taken(self, src: str, dst: str, now: float) -> None:
        """``dst``'s loop took a copy from ``src``: with receiver-paced links it leaves
        ``src``'s output queue now (what ``src``'s LST sees)."""
        if self.receiver_paced:
            self.model.taken(src, dst, now)  # type: ignore[attr-defined]

    def waiting(self, broker: str, now: float) -> dict[str, int]:
        """Copies in each of ``broker``'s output queues at ``now`` (none where queues are
        not real: every copy leaves at once)."""
        model = self.model
        return model.waiting(broker, now) if model.measures_queues else {}  # type: ignore[attr-defined]

    def view(self, broker: str, now: float) -> LinkView:
        """What ``broker`` sees of its links at ``now``."""
        return self._fixed_view or self.model.view(broker, now)

    def queued(self, now: float) -> int:
        """Copies waiting on the links' output queues now (0 where queues are not real)."""
        lst = getattr(self.model, "lst", None)
        if lst is None:
            return 0
        waiting = 0
        for broker, table in lst.items():
            self.model.view(broker, now)
            waiting += sum(row.queue_length for row in table.rows.values())
        return waiting
