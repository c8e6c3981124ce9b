"""What a broker knows of each neighbour: one explicit state machine (DESIGN §7).

A neighbour's *session* with this broker moves through :class:`Phase` by the events of
:class:`Event`, as :data:`TRANSITIONS` says and nothing else does:

- ``new``: not heard since this broker started;
- ``handshaking``: its incarnation is known, but its handshake does not name this
  incarnation of ours (frames it sent an earlier process of ours are stale);
- ``syncing``: its handshake named us: its frames are for us; its share is to come;
- ``synced``: it handed its share (whole or not) since that handshake.

Two facts lie across the session: *liveness* (``up``: heard within the liveness
timeout; a cut link that heals resumes the session where it was) and its *word*, what
its latest heartbeat since we met it said of itself (serving, starting, or nothing yet).
:meth:`Neighbour.describe` folds the three into the one word an operator reads: down,
new, handshaking, syncing, starting, serving.

The broker process feeds the table from HELLO, heartbeat and SYNCED frames and its
liveness timer; the simulator from its handshakes, arrivals and detections. Both ask it
the same questions: may this broker serve (:meth:`Neighbours.ready`), may it route
through a neighbour (:meth:`Neighbours.routable`), may it hand a share to one
(:meth:`Neighbours.reachable`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from octopis.core.lst import LinkView


class Phase(Enum):
    """A neighbour's session with this broker (see the module docstring)."""

    NEW = "new"
    HANDSHAKING = "handshaking"
    SYNCING = "syncing"
    SYNCED = "synced"


class Event(Enum):
    """What moves a session: a new incarnation of the neighbour heard (its first, or a
    restart), its handshake naming this incarnation of ours or another, its share."""

    MET = "met"
    HELLO_FOR_US = "hello for us"
    HELLO_NOT_FOR_US = "hello not for us"
    SHARE = "share"


TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    **{(phase, Event.MET): Phase.HANDSHAKING for phase in Phase},
    **{(phase, Event.HELLO_FOR_US): Phase.SYNCING for phase in Phase},
    **{(phase, Event.HELLO_NOT_FOR_US): Phase.HANDSHAKING for phase in Phase},
    (Phase.NEW, Event.SHARE): Phase.NEW,
    (Phase.HANDSHAKING, Event.SHARE): Phase.HANDSHAKING,
    (Phase.SYNCING, Event.SHARE): Phase.SYNCED,
    (Phase.SYNCED, Event.SHARE): Phase.SYNCED,
}
"""Every (phase, event) pair and the phase it leads to. A new incarnation or a handshake
restarts the session from any phase; a share counts only once the neighbour's handshake
named us (before that it was meant for an earlier process of ours, and changes nothing)."""


@dataclass(slots=True)
class Neighbour:
    """One neighbour's session, liveness and word (see the module docstring), with the
    process's acknowledgement counts of its data frames."""

    phase: Phase = Phase.NEW
    up: bool = False
    """Heard within the liveness timeout."""
    word: bool | None = None
    """Serving, as its latest heartbeat since we met it (or since it was last down) said;
    None: it has said nothing yet."""
    incarnation: int = 0
    """Its incarnation as last heard (0: never)."""
    down_since: float | None = None
    """When it was declared down (None: never, or heard again since)."""
    was_down: float = 0.0
    """Seconds it was down before it was last heard again (0: never declared down)."""
    last_heard: float = 0.0
    restarts: int = 0
    interrupted: bool = False
    """Declared down in a session a heal may resume: its incarnation was known, and no
    new one has been met since (:meth:`Neighbours.resumed`)."""
    received: int = 0
    """Data frames taken from it since its handshake (what the process acknowledges)."""
    acked: int = 0
    """The count last acknowledged."""
    asked: bool = False
    """It asked for an acknowledgement at once (an ASK frame: a copy its publisher
    awaits follows); :func:`~octopis.core.custody.take` answers it."""

    def silent_past(self, now: float, down_after: float) -> bool:
        """Whether it has been silent for the liveness timeout ``down_after`` at ``now``
        (DESIGN §7: a neighbour silent for T is down): from ``last_heard + down_after``
        on, that moment included, so a timer set for it (the simulator's) sees it. The
        sum is compared, not the silence: a timer set at ``t + down_after`` for a
        neighbour last heard at ``t`` or before sees it past, in floating point too."""
        return self.last_heard + down_after <= now

    @property
    def reachable(self) -> bool:
        """Up, and its handshake named us: its data frames are taken, a share may go."""
        return self.up and (self.phase is Phase.SYNCING or self.phase is Phase.SYNCED)

    @property
    def serving(self) -> bool:
        """Up, synced, and says it is serving: routing through it is safe, and what was
        held for it may go (its share is in, so its restart's stale entries may go too)."""
        return self.up and self.word is True and self.phase is Phase.SYNCED

    def describe(self) -> str:
        """The one word an operator reads: down, new, handshaking, syncing, starting
        (synced, and says it is resyncing itself or has not said), serving."""
        if not self.up and self.phase is not Phase.NEW:
            return "down"
        if self.phase is not Phase.SYNCED:
            return self.phase.value
        return "serving" if self.word else "starting"


class ShareHeard(NamedTuple):
    """A share announced: whether it is for us, and whether the neighbour now serves
    (:attr:`Neighbour.serving`; it had said so before its share came in)."""

    for_us: bool
    now_serving: bool


class Neighbours:
    """Every neighbour's :class:`Neighbour`, moved only by the methods below."""

    def __init__(self, names: Iterable[str] = (), now: float = 0.0) -> None:
        self.table = {name: Neighbour(last_heard=now) for name in names}
        self._view: _RoutableView | None = None
        """The last :meth:`view` made (the shell asks for one at every step)."""

    def __getitem__(self, name: str) -> Neighbour:
        return self.table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)

    def get(self, name: str) -> Neighbour | None:
        """The record of ``name`` (None: not a neighbour)."""
        return self.table.get(name)

    def items(self) -> Iterable[tuple[str, Neighbour]]:
        """(name, record) of every neighbour."""
        return self.table.items()

    def add(self, name: str, now: float) -> Neighbour:
        """A neighbour that joined the overlay: new, last heard ``now``."""
        self.table[name] = record = Neighbour(last_heard=now)
        return record

    def remove(self, name: str) -> None:
        """A neighbour that left the overlay."""
        del self.table[name]

    def built(self, name: str, incarnation: int, now: float) -> None:
        """The overlay starts built (the simulator's start): ``name``, at
        ``incarnation``, is met, synced, up and serving."""
        self.met(name, incarnation)
        self.hello(name, True)
        self.share(name)
        self.heard(name, now)
        self.said(name, True)

    def event(self, name: str, event: Event) -> Phase:
        """Move ``name``'s session by ``event`` (:data:`TRANSITIONS`); its new phase."""
        record = self.table[name]
        record.phase = TRANSITIONS[(record.phase, event)]
        return record.phase

    def met(self, name: str, incarnation: int) -> bool | None:
        """A frame from ``name`` carrying ``incarnation``: None if that is the one known;
        else its session starts again (handshaking, nothing said), and whether it
        restarted (an earlier incarnation was known)."""
        record = self.table[name]
        if incarnation == record.incarnation:
            return None
        restarted = bool(record.incarnation)
        record.incarnation = incarnation
        record.restarts += restarted
        record.word = None
        record.interrupted = False
        self.event(name, Event.MET)
        return restarted

    def hello(self, name: str, names_us: bool) -> None:
        """``name``'s handshake, naming this incarnation of ours or not: its share (and
        the count of its frames taken) starts again."""
        self.event(name, Event.HELLO_FOR_US if names_us else Event.HELLO_NOT_FOR_US)
        record = self.table[name]
        record.received = record.acked = 0
        record.asked = False

    def handshake(self, name: str, names: int, incarnation: int) -> None:
        """``name``'s HELLO, naming ``names`` as our incarnation (0: none yet), heard by
        this broker running as ``incarnation``: :meth:`hello`, for us if it names this
        one (both shells ask this; a HELLO's facts, never a verdict, come from them)."""
        self.hello(name, names == incarnation)

    def share(self, name: str) -> ShareHeard:
        """``name`` says it handed its share: whether that share is for us (its handshake
        named us; one that is not changes nothing), and whether ``name`` serves now."""
        record = self.table[name]
        before = record.serving
        for_us = self.event(name, Event.SHARE) is Phase.SYNCED
        return ShareHeard(for_us, record.serving and not before)

    def said(self, name: str, serving: bool) -> bool:
        """``name``'s heartbeat says whether it serves: True when :attr:`Neighbour.serving`
        became true (the moment to hand it what was held for it, DESIGN §7)."""
        record = self.table[name]
        before = record.serving
        record.word = serving
        return record.serving and not before

    def heard(self, name: str, now: float) -> bool:
        """A sign of life from ``name`` at ``now``: True when it was down (it is back;
        its session goes on where it was)."""
        record = self.table[name]
        record.last_heard = now
        if record.up:
            return False
        record.up = True
        if record.down_since is not None:
            record.was_down = now - record.down_since
        record.down_since = None
        return True

    def silent(self, name: str, now: float) -> None:
        """``name`` is declared down at ``now``: what it said of itself no longer holds."""
        record = self.table[name]
        record.up = False
        record.word = None
        record.down_since = now
        record.interrupted = bool(record.incarnation)

    def resumed(self, name: str) -> bool:
        """Whether ``name``, heard again, resumes the session its silence interrupted (the
        incarnation it had, none met since): its link then gives back what it held,
        sends again what it has no acknowledgement for, and the node hands it what it
        held (:meth:`~octopis.core.node.BrokerNode.heard`). True once per silence;
        a new incarnation met instead starts a session with a handshake, and a
        neighbour never met has none to resume."""
        record = self.table[name]
        resumes, record.interrupted = record.interrupted, False
        return resumes

    def declared_down(self, name: str) -> bool:
        """Whether ``name`` was declared down (:meth:`silent`) and not heard since."""
        record = self.table[name]
        return not record.up and record.down_since is not None

    def stalled(self, late: float) -> None:
        """This process did not run for ``late`` seconds (:func:`stall`): that is no
        neighbour's silence."""
        for record in self.table.values():
            record.last_heard += late

    def due_down(self, name: str, now: float, down_after: float) -> bool:
        """Whether ``name`` is to be declared down at ``now``: up (heard since it was
        met or last declared down; one never heard is no one to lose) and silent for
        ``down_after`` seconds (:meth:`Neighbour.silent_past`)."""
        record = self.table[name]
        return record.up and record.silent_past(now, down_after)

    def overdue(
        self, now: float, down_after: float, caught_up: Callable[[], bool]
    ) -> list[tuple[str, float]]:
        """The neighbours up and silent for ``down_after`` seconds at ``now``
        (:meth:`Neighbour.silent_past`; to declare down, :meth:`silent`), with their
        silence; none unless the broker has read every frame that reached it
        (``caught_up``, asked only when one is silent that long): a backlog of its own,
        or a starved event loop, is no neighbour's silence (DESIGN §7), as a client's is
        judged (:meth:`~octopis.core.sessions.Liveness.silent`)."""
        silent = [
            (name, now - r.last_heard)
            for name, r in self.table.items()
            if self.due_down(name, now, down_after)
        ]
        return silent if silent and caught_up() else []

    def routable(self, name: str) -> bool:
        """Whether routing may go through ``name`` (its LST row up): it serves."""
        return self.table[name].serving

    def view(self, inner: LinkView) -> LinkView:
        """What this broker sees of its links: ``inner``'s loads, and each link down
        unless :meth:`routable` (what the broker process writes into its LST's rows).
        The view of the last ``inner`` is kept: it reads the table as it is when asked."""
        view = self._view
        if view is None or view._inner is not inner:
            view = self._view = _RoutableView(inner, self.table)
        return view

    def reachable(self, name: str) -> bool:
        """Whether a share may be handed to ``name``: up, and its handshake named us."""
        record = self.table.get(name)
        return record is not None and record.reachable

    def ready(self, waited: bool) -> bool:
        """Whether a broker that started (or restarted) may serve: every neighbour that
        is up has named us, handed its share and said whether it serves; every other one
        is declared down, or was never heard though we ``waited`` past the liveness
        timeout (DESIGN §7)."""
        return all(
            (r.phase is Phase.SYNCED and r.word is not None)
            if r.up
            else (r.down_since is not None or waited)
            for r in self.table.values()
        )

    def settled(self) -> bool:
        """Every neighbour up, synced and serving (what ``ready`` reports to operators)."""
        return all(r.serving for r in self.table.values())


def liveness_tick(heartbeat: float) -> float:
    """Seconds between a broker's looks at its neighbours' liveness when no backpressure
    holds (:meth:`~octopis.core.pressure.Backpressure.tick` shortens them): half a
    ``heartbeat``, so a silence is judged within half a heartbeat of its due time; what a
    pause is measured against (:func:`stall`), on processes and in the simulator."""
    return heartbeat / 2


def first_look(due: float, tick: float) -> float:
    """When a silence due at ``due`` is judged: at the first of the broker's looks (every
    ``tick`` seconds, :func:`liveness_tick`) at or after it, as a process's tick finds it
    (the simulator's brokers look at multiples of ``tick`` from time 0)."""
    return math.ceil(round(due / tick, 9)) * tick


def stall(now: float, woke: float, tick: float) -> float:
    """Seconds a timer of ``tick`` seconds, set at ``woke``, fired late at ``now`` beyond
    one more tick (0: on time, or late by less than a tick): time this process spent not
    running, which is nobody's silence (the broker's neighbours' and clients' alike)."""
    late = now - woke - tick
    return late if late > tick else 0.0


class _RoutableView:
    """``inner`` with each link down unless its record in ``table`` serves
    (:meth:`Neighbours.routable`; the table, not the :class:`Neighbours` that keeps this
    view, so that the two make no reference cycle)."""

    __slots__ = ("_inner", "_table")

    def __init__(self, inner: LinkView, table: dict[str, Neighbour]) -> None:
        self._inner = inner
        self._table = table

    def overloaded(self, link: str) -> bool:
        return self._inner.overloaded(link)

    def load(self, link: str) -> tuple[float, int]:
        return self._inner.load(link)

    def down(self, link: str) -> bool:
        return not self._table[link].serving or self._inner.down(link)
