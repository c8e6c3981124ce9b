"""The simulator's custody (DESIGN §7): every directed link keeps what it sends in the
brokers' own :class:`~octopis.core.custody.Custody`, as the broker process's output link
does, and the receiver's acknowledgements travel back on the reverse link.

- Routing messages a broker sends on a link are numbered; notifications are kept until
  an acknowledgement settles them, then retained ``retain`` seconds (``[links] retain``).
- The receiver acknowledges the count it has taken as the node's rule says
  (:func:`~octopis.core.custody.take`, which drops one from a neighbour whose handshake
  has not named it as stale; each arrival is its own input pass here): at once when the
  sender asked (an :class:`~octopis.core.codec.Ask` ahead of a copy its publisher's confirm
  waits for, the :data:`ASKS` fate), when ``[links] ack_every`` are owed or for a
  message other than a notification, else when the broker's timer fires, ``[links]
  ack_delay`` after a first since a neighbour's last acknowledgement: one timer per
  broker, which acknowledges every neighbour owed then, as the process's does
  (:func:`~octopis.core.custody.owed_neighbours`). The acknowledgement
  (:class:`Acknowledged`, the process's heartbeat count) goes back on the reverse link,
  ahead of its output queue, after one latency draw; a cut link carries it to the heal
  while its connection holds, as TCP carries the process's heartbeat (lost once the
  connection aborts), and a sender of another incarnation than the one it names
  ignores it.
- A link that has sent nothing for ``[links] heartbeat`` seconds carries a heartbeat,
  with the count again (:func:`~octopis.core.custody.heartbeat_due`): each one that
  arrives prunes the sender's retained window, which thus keeps the last ``retain``
  seconds even while the link is idle. Only those heartbeats are simulated (sign of life
  is the failure model's): a receiver beats while its sender keeps something for it
  that a heartbeat would settle or prune (retained, or unacknowledged and taken: a
  heartbeat repeats the count, as the process's does).
- With ``custody_limit`` notifications unacknowledged, a link stops: what its broker
  sends on it meanwhile waits, in order, until an acknowledgement makes room (the
  process's output queue), and each stop is counted (``custody.full``).
- A message other than a notification put on a broken link waits on it, in order, as in
  the process's output queue.
- Backpressure (DESIGN §8) is the node's rule (:class:`~octopis.core.pressure.Backpressure`),
  looked at before each acknowledgement as the process's is, fed each link's waiting
  frames: what waits on it here, and the copies in its output queue where links measure
  queues (:meth:`~octopis.sim.network.Network.waiting`). While a link holds
  ``queue_limit`` frames the broker's other neighbours are held back: what they send
  is not acknowledged at once nor by the timer (:meth:`Backpressure.acknowledging`,
  :meth:`Backpressure.released`, as on the process), and the broker looks again every
  ``[links] ack_interval`` (the process's tick), acknowledging each neighbour owed with
  the last count while it is held back, counted withheld, so their custody fills and
  they stop. No delivery waits for a
  client's capacity and no memory is measured here (neither is simulated): the rule is
  fed 0 of each.
- The sender takes back its retained and unacknowledged copies, then what waited
  (:meth:`LinkCustody.take_back`), when the process's link gives them back: at a
  detection, at a handshake with a new incarnation, at a heal after a detection; its
  node decides what becomes of each (:meth:`~octopis.core.node.BrokerNode.link_down`).
- The other routing messages are pending until acknowledged: a cut keeps what is in
  flight until it heals, as TCP does, or loses it once the connection is aborted
  (:mod:`octopis.sim.failures`), and at a heal after a detection the link
  sends them again first (:class:`Resent`, :meth:`LinkCustody.resend`); the receiver
  takes those it had not (:func:`~octopis.core.custody.resent`). A new incarnation of
  the receiver gets them from the node, ahead of what it held
  (:meth:`LinkCustody.give_up`).
- A local publication's copy kept in custody carries its publisher's
  :class:`~octopis.core.custody.PublishReceipt` (:class:`Receipted`, the process's frame
  with the receipt appended), counted in it as :meth:`PublishReceipt.goes` says; the
  acknowledgement that settles the copy holds it (the entry keeps the bare
  notification), and a copy taken back still carries it, to be routed again in the same
  receipt. The publisher's confirm is the receipt's answer, as on the process.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from functools import partial
from typing import NamedTuple

from octopis.core import Notification
from octopis.core.acknowledging import ARM, HELD, SEND, Acknowledgements
from octopis.core.codec import Ask
from octopis.core.custody import (
    Custody,
    PublishReceipt,
    acknowledge_every,
    ask,
    counts_for,
    heartbeat_due,
    owed_neighbours,
    resent_taken,
    settle_receipts,
)
from octopis.core.neighbours import Neighbour
from octopis.core.node import HandedShare
from octopis.core.pressure import Backpressure
from octopis.defaults import (
    ACK_DELAY,
    ACK_EVERY,
    ACK_INTERVAL,
    CUSTODY_LIMIT,
    DELIVERIES_LIMIT,
    HEARTBEAT,
    MEMORY_BUDGET_MB,
    QUEUE_LIMIT,
    RETAIN,
    RETAIN_LIMIT,
)

Link = tuple[str, str]

GOES, LOST, WAITS, ASKS = range(4)
"""What becomes of a message a broker puts on a link (:meth:`LinkCustody.departs`): it
goes; it is lost in transit (a notification on a broken link, kept in custody); it
waits on the link, in order (for custody to have room, or, another message on a broken
link, until the link gives it back, :meth:`LinkCustody.take_back`); it goes behind an
:data:`ASK` (a copy its publisher's confirm waits for)."""
ASK = Ask()
"""The process's ASK frame: the receiver acknowledges what follows at once."""


class Receipted(NamedTuple):
    """A local publication's copy that a link keeps in custody, with its publisher's
    receipt (until the acknowledgement that settles it, :func:`settle_receipts`)."""

    notification: Notification
    receipt: PublishReceipt


def message_of(copy: object) -> object:
    """The message a copy on a link carries (a :class:`Receipted` one's notification)."""
    return copy.notification if type(copy) is Receipted else copy  # type: ignore[attr-defined]


def receipt_of(copy: object) -> PublishReceipt | None:
    """The publisher's receipt a copy on a link carries (a :class:`Receipted` one's)."""
    return copy.receipt if type(copy) is Receipted else None  # type: ignore[attr-defined]


class Acknowledged(NamedTuple):
    """A receiver's acknowledgement on its way back: the count of routing messages it took
    from the sender (:func:`~octopis.core.custody.acknowledgement`), for the sender's
    ``incarnation`` it knows."""

    count: int
    incarnation: int


class Resent(NamedTuple):
    """What a healed link sends again ahead of anything else (the process's RESENT
    frame, :meth:`~octopis.core.custody.Custody.resend`): the count of routing messages
    the sender numbered, and the pending ones as ``(number, message)``."""

    numbered: int
    messages: list[tuple[int, object]]


LINK_FRAMES = (Acknowledged, Resent, Ask)
"""What a link carries besides routing messages (the failure events take them)."""


class LinkCustody:
    """The custody of every directed link of a run, what waits for room on each, and each
    broker's backpressure. ``custody_limit``, ``retain``, ``retain_limit`` and
    ``queue_limit`` are the ``[links]`` settings."""

    def __init__(
        self,
        retain: float = RETAIN,
        custody_limit: int = CUSTODY_LIMIT,
        retain_limit: int = RETAIN_LIMIT,
        queue_limit: int = QUEUE_LIMIT,
    ) -> None:
        if custody_limit < 0 or retain < 0 or retain_limit < 0:
            raise ValueError("custody limit, retain and retain limit must not be negative")
        self.retain = retain
        self.custody_limit = custody_limit
        self.every = acknowledge_every(ACK_EVERY, custody_limit)
        """Messages owed past which a receiver acknowledges at once."""
        self.retain_limit = retain_limit
        self.queue_limit = queue_limit
        self.pressure: dict[str, Backpressure] = {}
        """Each broker's backpressure rule (made on first use, :meth:`pressure_of`)."""
        self.pressure_counts: Counter[str] = Counter()
        """The rules' counts (episodes, acknowledgements withheld), all brokers'."""
        self.acks: dict[str, Acknowledgements] = {}
        """Each broker's acknowledgements (made on first use, :meth:`acks_of`), whose
        timer is ``[links] ack_delay``."""
        self.looking: set[str] = set()
        """Brokers that will look again at the acknowledgements they withhold."""
        self.links: dict[Link, Custody] = {}
        self.waiting: dict[Link, deque[object]] = {}
        """Messages that wait for custody to have room, per link, in sending order."""
        self.last_sent: dict[Link, float] = {}
        """When each link last put a frame on the wire (a heartbeat is due after
        ``[links] heartbeat`` seconds of silence)."""
        self.beating: set[Link] = set()
        """Links whose heartbeat timer runs."""
        self._gone: Counter[str] = Counter()
        """:meth:`counts` of the custody of links gone (a dead broker's, a link dropped)."""

    def of(self, src: str, dst: str) -> Custody:
        """The custody of ``src → dst`` (made on first use)."""
        custody = self.links.get((src, dst))
        if custody is None:
            settle = partial(settle_receipts, receipt_of=receipt_of, bare=message_of)
            custody = Custody(self.custody_limit, self.retain, self.retain_limit, settle)
            self.links[(src, dst)] = custody
        return custody

    def departs(
        self,
        src: str,
        dst: str,
        now: float,
        message: object,
        broken: bool,
        receipt: PublishReceipt | None = None,
    ) -> int:
        """What becomes of ``message`` put on ``src → dst`` at ``now`` (``broken``: the
        link loses it): :data:`WAITS` behind what waits, or when custody is full (a
        stop, counted); a notification is numbered and kept, and :data:`GOES` (a
        :class:`Receipted` one :data:`ASKS`) or is :data:`LOST`; another message
        :data:`WAITS` on a ``broken`` link (the process's output queue, which does not
        drain while its neighbour is away or declared down), else it is numbered (a
        share is one message here: unnumbered) and goes. A local publication's copy
        that the link keeps carries ``receipt`` from here on, waiting or kept
        (:class:`Receipted`, :meth:`PublishReceipt.goes`)."""
        link = (src, dst)
        custody = self.of(src, dst)
        if receipt is not None and receipt.goes(custody, type(message) is Notification):
            message = Receipted(message, receipt)  # type: ignore[arg-type]
        waiting = self.waiting.get(link)
        if waiting:
            waiting.append(message)
            return WAITS
        if custody.full:
            custody.stopped()
            self.waiting[link] = deque((message,))
            return WAITS
        kind = type(message)
        if kind is Notification or kind is Receipted:
            custody.sent(message, now, True)
            self.last_sent[link] = now
            return LOST if broken else ASKS if kind is Receipted else GOES
        if broken:
            self.waiting[link] = deque((message,))
            return WAITS
        self.last_sent[link] = now
        if kind is not HandedShare:
            custody.sent(message, now, False)
        return GOES

    def acknowledge(self, src: str, dst: str, count: int, now: float) -> list[object]:
        """``dst`` acknowledged ``count`` to ``src`` (heard at ``now``); returns what
        waited on the link if custody has room now, to be put on it again in order."""
        custody = self.of(src, dst)
        custody.acknowledge(count, now)
        waiting = self.waiting.get((src, dst))
        if not waiting or custody.full:
            return []
        del self.waiting[(src, dst)]
        return list(waiting)

    def pressure_of(self, broker: str) -> Backpressure:
        """``broker``'s backpressure rule (made on first use, a new one after its death,
        as a new process has)."""
        rule = self.pressure.get(broker)
        if rule is None:
            rule = Backpressure(
                self.queue_limit, DELIVERIES_LIMIT, MEMORY_BUDGET_MB, self.pressure_counts
            )
            self.pressure[broker] = rule
        return rule

    def acks_of(self, broker: str, counts: Counter[str]) -> Acknowledgements:
        """``broker``'s acknowledgements, by its backpressure rule (:meth:`pressure_of`;
        made on first use, new after its death), stale messages counted in ``counts``."""
        acks = self.acks.get(broker)
        if acks is None:
            acks = Acknowledgements(self.pressure_of(broker), self.every, counts)
            self.acks[broker] = acks
        return acks

    def greeted(self, src: str, dst: str) -> None:
        """``src``'s handshake went to ``dst``: the link's numbering starts again."""
        self.of(src, dst).greeted()

    def take_back(self, src: str, dst: str) -> list[object]:
        """``src`` detected ``dst`` down: its retained and unacknowledged copies, oldest
        first, then what waited; custody emptied (its numbering goes on: the session
        does, unless a handshake starts another)."""
        custody = self.links.get((src, dst))
        copies = custody.take_back() if custody is not None else []
        return copies + list(self.waiting.pop((src, dst), ()))

    def resend(self, src: str, dst: str) -> Resent:
        """What ``src → dst`` sends again after a heal (:meth:`Custody.resend`)."""
        return Resent(*self.of(src, dst).resend())

    def give_up(self, src: str, dst: str) -> list[object]:
        """``dst`` restarted: what ``src`` sent it and is pending
        (:meth:`Custody.give_up`)."""
        custody = self.links.get((src, dst))
        return custody.give_up() if custody is not None else []

    def forget(self, broker: str, failed: set[Link] | dict[Link, float]) -> list[object]:
        """A dead broker's custody dies with it; returns the copies only it could have
        routed again: what it kept for a link that had ``failed`` (it did not live to
        detect it), and what waited on any of its links (their messages: the receipts
        they carried die unanswered, as the process's do)."""
        lost: list[object] = []
        self.pressure.pop(broker, None)
        self.acks.pop(broker, None)
        for link in [link for link in self.links if link[0] == broker]:
            custody = self._pop(link)
            if link in failed:
                lost += custody.take_back()
        for link in [link for link in self.waiting if link[0] == broker]:
            lost += self.waiting.pop(link)
        for link in [link for link in self.last_sent if link[0] == broker]:
            del self.last_sent[link]
        return [message_of(copy) for copy in lost]

    def drop(self, src: str, dst: str) -> None:
        """The link ``src → dst`` left the overlay (it no longer counts for ``src``'s
        backpressure)."""
        if src in self.pressure:
            self.pressure[src].forget(dst)
        if (src, dst) in self.links:
            self._pop((src, dst))
        self.waiting.pop((src, dst), None)
        self.last_sent.pop((src, dst), None)

    def _pop(self, link: Link) -> Custody:
        custody = self.links.pop(link)
        self._gone["custody.full"] += custody.stops
        self._gone["custody.retain_evicted"] += custody.evicted
        return custody

    def counts(self) -> dict[str, int]:
        """Times links stopped for full custody (``custody.full``), retained copies
        evicted early (``custody.retain_evicted``) and the backpressure counts, those
        that happened."""
        counts = self._gone + self.pressure_counts
        for custody in self.links.values():
            counts["custody.full"] += custody.stops
            counts["custody.retain_evicted"] += custody.evicted
        return {key: n for key, n in counts.items() if n}


class CustodyEvents:
    """The :class:`~octopis.sim.engine.Simulator`'s links under custody (a mixin of its
    failure events, :class:`~octopis.sim.failures.FailureEvents`): sends, what a
    receiver acknowledges and when, heartbeats, and what a healed link sends again."""

    def _link_frame(self, broker: str, src: str, message: Acknowledged | Resent | Ask) -> None:
        """A link-level frame from ``src`` reaches ``broker`` over a link that is not
        broken (:meth:`_arrive` keeps one that reaches a cut link until the heal while
        its connection holds, else loses it: a lost RESENT is sent again at the next
        heal)."""
        kind = type(message)
        if kind is Acknowledged:
            self._acknowledged(broker, src, message)
        elif kind is Ask:
            ask(self.nodes[broker].neighbours[src])
        else:
            self._resent(broker, src, message)

    def _resend(self, src: str, dst: str) -> None:
        """``src``'s link to ``dst`` healed after its detection: ahead of anything else it
        sends again what it has no acknowledgement for (:meth:`LinkCustody.resend`), a
        link-level frame, so it takes one latency draw of link frames."""
        state = self.failures
        late = self.network.link_frame_latency(src, dst) + state.slow.get((src, dst), 0.0)
        self.events.send(src, dst, self.events.now + late, state.custody.resend(src, dst))

    def _resent(self, broker: str, src: str, message: Resent) -> None:
        """``src``'s link sent again what it had no acknowledgement for: ``broker`` takes
        what the node's rule takes (:func:`~octopis.core.custody.resent_taken`; the
        others are counted, taken before or stale) and acknowledges."""
        record = self.nodes[broker].neighbours[src]
        taken, at_once = resent_taken(
            record, message.numbered, message.messages, self.failure_counts
        )
        for copy in taken:
            self._dispatch(broker, self._take(broker, src, copy))
        if at_once:
            acks = self._acks(broker)
            refresh = partial(self._pressure, broker, self.events.now)
            self._acknowledgement(broker, src, record, acks, acks.at_once(src, refresh))

    def _put(
        self, src: str, dst: str, message: object, receipt: PublishReceipt | None = None
    ) -> None:
        """``src`` puts ``message`` (a local publication's copy: with its ``receipt``) on
        its link to ``dst`` now: custody decides whether it goes, is lost in transit or
        waits on the link (:meth:`LinkCustody.departs`); what goes arrives after its
        departure from the link's queue, a latency draw and any delay spike."""
        state = self.failures
        assert state is not None
        now = self.events.now
        fate = state.custody.departs(src, dst, now, message, self._loses(src, dst), receipt)
        if fate in (GOES, ASKS):
            message = message_of(message)
            arrival = self.network.arrival(src, dst, now, message)
            arrival += state.slow.get((src, dst), 0.0)
            if fate == ASKS:
                self.events.send(src, dst, arrival, ASK)
            self.events.send(src, dst, arrival, message)
        elif fate == LOST:
            self.failure_counts["lost_in_transit"] += 1

    def _takes(self, broker: str, src: str, message: object) -> bool:
        """Whether ``broker`` takes the routing ``message`` from ``src``, as the node's
        rule says (:meth:`Acknowledgements.taken`, which counts a stale one), and its
        acknowledgement as the rule says (:meth:`_acknowledgement`)."""
        record = self.nodes[broker].neighbours[src]
        acks = self._acks(broker)
        notification = type(message) is Notification
        refresh = partial(self._pressure, broker, self.events.now)
        fate = acks.taken(src, record, 1, refresh, notifications=notification)
        if fate is None:
            return False
        self._acknowledgement(broker, src, record, acks, fate)
        return True

    def _acks(self, broker: str) -> Acknowledgements:
        """``broker``'s acknowledgements (:meth:`LinkCustody.acks_of`)."""
        return self.failures.custody.acks_of(broker, self.failure_counts)  # type: ignore[union-attr]

    def _acknowledgement(
        self, broker: str, src: str, record: Neighbour, acks: Acknowledgements, fate: int
    ) -> None:
        """Carry out what becomes of ``broker``'s acknowledgement to ``src``: sent now,
        the timer armed (``ack_delay``, one per broker, as the process's), or left to the
        look again while backpressure holds ``src`` back (:meth:`_look_again_later`)."""
        if fate == SEND:
            self._acknowledge(broker, src, record, acks.pressure)
        elif fate == ARM:
            self.events.at(self.events.now + ACK_DELAY, self._acknowledge_owed, broker, acks)
        elif fate == HELD:
            self._look_again_later(broker)

    def _acknowledge_owed(self, broker: str, acks: Acknowledgements) -> None:
        """``broker``'s acknowledgement timer (:meth:`Acknowledgements.timer_fired`): the
        neighbours it releases are acknowledged, the others left to the look again. A
        timer of a process that died dies with it."""
        if self._asleep(broker, self._acknowledge_owed, broker, acks):
            return
        custody = self.failures.custody  # type: ignore[union-attr]
        node = self.nodes.get(broker)
        if custody.acks.get(broker) is not acks or node is None:
            return
        refresh = partial(self._pressure, broker, self.events.now)
        released, held = acks.timer_fired(node.neighbours.items(), refresh)
        for src, record in released:
            self._acknowledge(broker, src, record, acks.pressure)
        if held:
            self._look_again_later(broker)

    def _acknowledge(
        self, broker: str, src: str, record: Neighbour, pressure: Backpressure
    ) -> None:
        """``broker`` acknowledges to ``src`` what it took from it, or the count last
        acknowledged while ``pressure`` holds ``src`` back (:meth:`Backpressure.acknowledge`):
        on the link back, ahead of its queue (a cut link carries it to the heal, as any
        frame, :meth:`_arrive`); its heartbeat timer runs. An acknowledgement that would
        change nothing in ``src``'s custody when it arrives (:meth:`Custody.settles`,
        :meth:`Custody.prunes`) is not simulated: only the time it was sent counts."""
        state = self.failures
        assert state is not None
        custody, events = state.custody, self.events
        link = (broker, src)
        now = events.now
        count = pressure.acknowledge(src, record)
        custody.last_sent[link] = now
        kept = custody.links.get((src, broker))
        if kept is not None:
            settles = kept.settles(count)
            if settles or kept.retained:
                late = self.network.link_frame_latency(broker, src) + state.slow.get(link, 0.0)
                if settles or kept.prunes(now + late):  # a cut link carries it to the heal
                    events.send(broker, src, now + late, Acknowledged(count, record.incarnation))
        if link not in custody.beating:
            custody.beating.add(link)
            events.at(now + HEARTBEAT, self._heartbeat, broker, src)

    def _pressure(self, broker: str, now: float) -> Backpressure:
        """``broker``'s backpressure rule looked at afresh (:meth:`Backpressure.check`)
        with the frames waiting on each of its links now (see the module docstring; a
        link missing from what it is fed has none waiting)."""
        custody = self.failures.custody  # type: ignore[union-attr]
        queues = self.network.waiting(broker, now)
        for (src, dst), waiting in custody.waiting.items():
            if src == broker:
                queues[dst] = queues.get(dst, 0) + len(waiting)
        pressure = custody.pressure_of(broker)
        pressure.check(queues, 0, 0)
        return pressure

    def _look_again_later(self, broker: str) -> None:
        """``broker`` holds a neighbour back: it looks again an ack interval later (the
        process's tick while backpressure holds), unless it already will."""
        looking = self.failures.custody.looking  # type: ignore[union-attr]
        if broker not in looking:
            looking.add(broker)
            self.at(self.events.now + ACK_INTERVAL, self._look_again, broker)

    def _look_again(self, broker: str) -> None:
        """``broker`` looks again at backpressure (the process's tick while it holds a
        neighbour back): every neighbour still owed is acknowledged, withheld and counted
        while held back (:meth:`Backpressure.acknowledge`); again later while one is."""
        state = self.failures
        assert state is not None
        if self._asleep(broker, self._look_again, broker):
            return
        state.custody.looking.discard(broker)
        node = self.nodes.get(broker)
        if broker in state.dead or node is None:
            return
        pressure = self._pressure(broker, self.events.now)
        taken = owed_neighbours(node.neighbours.items())
        for src, record in taken:
            self._acknowledge(broker, src, record, pressure)
        if any(pressure.holds(src) for src, _ in taken):
            self._look_again_later(broker)

    def _heartbeat(self, broker: str, src: str) -> None:
        """``broker``'s heartbeat timer on its link to ``src``: a heartbeat, with the
        count, when one is due (:func:`~octopis.core.custody.heartbeat_due`; copies in
        the link's output queue, where links measure queues, are about to leave, as the
        process's queue not held back is). The timer
        skips the ticks whose heartbeat would change nothing (the oldest copy ``src``
        retains for ``broker`` is not yet ``retain`` seconds old) and stops once ``src``
        keeps nothing for it that a heartbeat would settle or prune, or either is gone, or
        the link to ``src`` is cut and its connection aborted: no heartbeat reaches
        ``src`` then, and what a heal (after the detection the abort implies) sends again
        is acknowledged anew (:meth:`_resent`), which starts the timer again. (Without
        that stop a link cut for good kept a run going for ever; a link only declared
        down still beats, as the process's does: a paused neighbour reads the heartbeats
        when it runs again.)"""
        state = self.failures
        assert state is not None
        if state.paused and self._asleep(broker, self._heartbeat, broker, src):
            return
        custody = state.custody
        kept = custody.links.get((src, broker))
        node = self.nodes.get(broker)
        record = node.neighbours.get(src) if node is not None else None
        now = self.events.now
        if (
            broker in state.dead
            or record is None
            or kept is None
            or not (kept.retained or kept.settles(record.received))
            or (state.broken(broker, src) and not state.holds(broker, src, now))
        ):
            custody.beating.discard((broker, src))
            return
        idle = now - custody.last_sent.get((broker, src), -math.inf)
        sending = self.network.waiting(broker, now).get(src, 0) > 0  # its output queue
        if heartbeat_due(record, idle, HEARTBEAT, sending):
            self._acknowledge(broker, src, record, self._pressure(broker, now))
        last = custody.last_sent[(broker, src)]
        expires = kept.retained[0][1] + kept.retain if kept.retained else now
        beats = max(1, math.ceil((expires - last) / HEARTBEAT))  # heartbeats from the last
        tick = max(last + beats * HEARTBEAT, now + HEARTBEAT / 2)
        self.events.at(tick, self._heartbeat, broker, src)

    def _acknowledged(self, broker: str, src: str, ack: Acknowledged) -> None:
        """``src``'s acknowledgement reaches ``broker``: for this incarnation of
        ``broker``, custody settles it, and what waited for room goes on the link again,
        in order."""
        state = self.failures
        assert state is not None
        if not counts_for(ack.incarnation, self.brokers.incarnation[broker]):
            return
        for message in state.custody.acknowledge(broker, src, ack.count, self.events.now):
            self._put(broker, src, message)
