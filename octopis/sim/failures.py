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

from octopis.core import (
    Advertise,
    ClusteredBroker,
    Forward,
    LinkView,
    Notification,
    Subscribe,
    Unadvertise,
    make_broker,
)
from octopis.core.messages import Message
from octopis.core.recovery import HOLD_LIMIT, Recovery
from octopis.core.replay import Replay
from octopis.failure_schedule import Failure
from octopis.sim.replaying import REPLAY_TYPES

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
        would have routed again at a detection it did not live to make: those sent on a
        link that had failed, or up to ``retain`` before (the neighbour may have died
        before passing them on), as :meth:`take_back` gives them."""
        lost: list[object] = []
        for link in [link for link in self._custody if link[0] == broker]:
            since = self.failed_at.get(link, math.inf) - self.retain
            lost += [message for when, message in self._custody.pop(link) if when >= since]
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


class FailureEvents:
    """The :class:`~octopis.sim.engine.Simulator`'s failures (a mixin beside its event
    loop): scheduling them, detection, custody taken back, restarts and their resync.
    What a broker holds for a neighbour and owes it is :mod:`octopis.core.recovery`'s."""

    def fail(
        self,
        failure: Failure,
        start: float = 0.0,
        *,
        detection: float = DEFAULT_DETECTION,
        retain: float = DEFAULT_RETAIN,
    ) -> None:
        """Schedule ``failure`` (times from ``start``); the first call sets how long
        detection takes and how long senders keep copies (see :mod:`octopis.sim.failures`)."""
        for end in failure.ends:
            if end not in self.cores:
                raise KeyError(f"no broker {end!r} in topology {self.scot.name}")
        if failure.stall:  # the neighbours' view of a stopped process: every link silent
            broker = failure.ends[0]
            for neighbour in sorted(self.scot.graph[broker]):
                link = Failure((broker, neighbour), failure.at, failure.until)
                self.fail(link, start, detection=detection, retain=retain)
            return
        if len(failure.ends) == 2 and failure.ends[1] not in self.scot.graph[failure.ends[0]]:
            raise KeyError(f"{failure.ends[0]} and {failure.ends[1]} are not neighbours")
        if self._taken is not None:  # a service model always has receiver-paced links
            raise ValueError(
                "failures are not simulated with a CPU service model or receiver-paced links"
            )
        self._failure_state(detection, retain)
        self.at(start + failure.at, self._fail, failure)
        if failure.until is not None:
            self.at(start + failure.until, self._recover, failure)
            self.restarts_pending += failure.is_broker

    def _failure_state(
        self, detection: float = DEFAULT_DETECTION, retain: float = DEFAULT_RETAIN
    ) -> FailureState:
        """The run's failure state, made on the first failure scheduled."""
        if self.failures is None:
            self.failures = FailureState(detection, retain)
        return self.failures

    def _failed_links(self, failure: Failure) -> list[tuple[str, str]]:
        if failure.is_broker:
            broker = failure.ends[0]
            return [(broker, n) for n in self.scot.graph[broker]] + [
                (n, broker) for n in self.scot.graph[broker]
            ]
        a, b = failure.ends
        return [(a, b), (b, a)]

    def _fail(self, failure: Failure) -> None:
        state = self.failures
        assert state is not None
        if failure.is_broker:
            broker = failure.ends[0]
            state.dead.add(broker)
            for message in state.forget(broker):
                if type(message) is Notification:
                    self.failure_counts["undeliverable.died_in_custody"] += 1
                    self._undeliverable_keys.add(message.key)
            self.hosts_failed.add(broker)
            self._retired.update(self.cores[broker].counts())
            recovery = self.recovery[broker]  # what it held dies with it
            for copies in recovery.copies.values():
                self.failure_counts["undeliverable.died_held"] += len(copies)
                self._undeliverable_keys.update(m.key for m in copies)
            self.failure_counts.update(recovery.counters)
            self.recovery[broker] = Recovery(HOLD_LIMIT)
            self.failure_counts["brokers_killed"] += 1
            self._hosts_died(broker)
        else:
            state.cut.update(self._failed_links(failure))
            self.failure_counts["links_cut"] += 1
        for src, dst in self._failed_links(failure):
            state.shares_in_flight.pop((src, dst), None)
            if src not in state.dead and (src, dst) not in state.failed_at:
                state.failed_at[(src, dst)] = self.now
                self.at(self.now + state.detection, self._detect, src, dst)

    def _detect(self, src: str, dst: str) -> None:
        """``src`` declares ``dst`` down and re-routes the notifications it kept in
        custody for it. Subscription messages are not in the process's custody: those
        sent are delivered or lost in flight; those sent on a link already broken wait
        for ``dst``'s return (:meth:`_dispatch`, :class:`Recovery`)."""
        state = self.failures
        assert state is not None
        if src in state.dead or (src, dst) not in state.failed_at:
            return
        down = state.detected.setdefault(src, set())
        if dst in down:
            return
        down.add(dst)
        self.failure_counts["detections"] += 1
        core = self.cores[src]
        for message in state.take_back(src, dst):
            if type(message) in REPLAY_TYPES:
                continue  # not in custody: the round hears dst is down
            self._dispatch(src, self._watch(core, message, core.reroute, dst, message))
        self._replay_link_down(src, dst)

    def _recover(self, failure: Failure) -> None:
        """A link comes back, or a broker restarts empty and is resynced by its live
        neighbours; they keep treating it as down (detours) until its resync has
        arrived, and it refuses publications until then (DESIGN §7)."""
        state = self.failures
        assert state is not None
        links = self._failed_links(failure)
        for src, dst in links:
            self._detect(src, dst)  # a restart is noticed at once by the new handshake
        if not failure.is_broker:
            state.cut.difference_update(links)
            self._links_up(links)
            for src, dst in links:  # with covering, what went over the link, again
                if not state.broken(src, dst):
                    self._dispatch(src, self.cores[src].refresh_link(dst))
            return
        broker = failure.ends[0]
        state.dead.discard(broker)
        self.restarts_pending -= 1
        self.failure_counts["brokers_restarted"] += 1
        core = make_broker(
            self.scot,
            broker,
            self.mode,
            self._matcher_factory,
            covering=self.covering,
            advertisements=self.advertisements,
        )
        core.epoch = f"r{self.failure_counts['brokers_restarted']}."
        resyncs = isinstance(core, ClusteredBroker)
        for neighbour in self.scot.graph[broker]:
            epoch = core.epoch if resyncs else None
            dropped = self.recovery[neighbour].restarted(broker, epoch, _read_sbp)
            self._undeliverable_keys.update(m.key for m in dropped)
        neighbours = set(self.scot.graph[broker])
        if isinstance(core, ClusteredBroker):
            core.expect_shares(neighbours)
        self.cores[broker] = core
        self._links_up([(broker, n) for n in neighbours])
        for neighbour in neighbours:
            if state.broken(broker, neighbour):  # never greeted: detected like any silence
                state.failed_at[(broker, neighbour)] = self.now
                self.at(self.now + state.detection, self._detect, broker, neighbour)
        if isinstance(core, ClusteredBroker):
            carried = {
                n: self._hand_held_subscriptions(n, broker)
                for n in neighbours
                if not state.broken(n, broker)
            }
            state.syncing[broker] = {
                n for n in neighbours if self._hand_share(n, broker, carried.get(n, set()))
            }
        else:  # BID has no resync: its neighbours only wait for the handshake
            core.table_lost = True
            state.syncing[broker] = {n for n in neighbours if not state.broken(n, broker)}
            for neighbour in state.syncing[broker]:
                self.at(self.now, self._synced, broker, neighbour)
        if not state.syncing[broker]:
            self._synced(broker, None)
        for neighbour in neighbours:
            self._hand_share(broker, neighbour)

    def _hand_held_subscriptions(self, src: str, dst: str) -> set[str]:
        """``src`` sends ``dst`` the subscription messages it held for it, in order (a new
        incarnation broadcasts them on); returns the sub ids of the subscriptions."""
        held, carried = self.recovery[src].take_subscriptions(dst, _read_sbp)
        if held:
            self._dispatch(src, [Forward(dst, m) for m in held])
        return carried

    def _hand_share(self, src: str, dst: str, carried: set[str] = frozenset()) -> bool:
        """``src`` hands ``dst`` its resync share if ``dst`` lacks it, both are up, the
        link carries, no share is on its way and ``src``'s own share is whole (a broker
        restarted next to a dead or unsynced one gets that share later). Returns whether
        it did. What ``dst``'s predecessor had subscribed is withdrawn once ``dst`` is
        serving (:meth:`_links_up`)."""
        state = self.failures
        assert state is not None
        peer, core = self.cores[src], self.cores[dst]
        if (
            not isinstance(peer, ClusteredBroker)
            or not isinstance(core, ClusteredBroker)
            or src not in core.missing_shares
            or (src, dst) in state.shares_in_flight
            or state.broken(src, dst)
            or not peer.share_complete(dst)
        ):
            return False
        share = self.recovery[src].share(peer, dst, carried)
        self._dispatch(src, [Forward(dst, m) for m in share])
        token = state.shares_in_flight[(src, dst)] = object()
        queue = self._in_flight[src].get(dst)
        arrival = max(queue[-1][0], self.now) if queue else self.now
        self.at(arrival, self._share_arrived, src, dst, token)
        return True

    def _share_arrived(self, src: str, dst: str, token: object) -> None:
        """The last message of ``src``'s share reached ``dst`` (unless a failure on the
        link spoiled it meanwhile: then it is handed again when the link is back)."""
        state = self.failures
        assert state is not None
        if state.shares_in_flight.get((src, dst)) is not token:
            return
        del state.shares_in_flight[(src, dst)]
        self.cores[dst].share_received(src)  # type: ignore[union-attr]
        self._synced(dst, src)
        for neighbour in self.scot.graph[dst]:
            self._hand_share(dst, neighbour)

    def _synced(self, broker: str, neighbour: str | None) -> None:
        state = self.failures
        assert state is not None
        waiting = state.syncing.get(broker)
        if waiting is None:
            return
        waiting.discard(neighbour)  # type: ignore[arg-type]
        if not waiting:
            del state.syncing[broker]
            for n in self.scot.graph[broker]:
                # n learns that broker serves over their link, behind what broker sent it
                # (with covering, the share entries it passes on)
                queue = self._in_flight[broker].get(n)
                if queue:
                    self.at(queue[-1][0], self._links_up, [(n, broker)])
                else:
                    self._links_up([(n, broker)])

    def _links_up(self, links: list[tuple[str, str]]) -> None:
        state = self.failures
        assert state is not None
        for src, dst in links:
            if not state.broken(src, dst):
                state.failed_at.pop((src, dst), None)
                state.detected.get(src, set()).discard(dst)
                carried = self._hand_held_subscriptions(src, dst)
                self._hand_share(src, dst, carried)
                held, withdrawals = self.recovery[src].serving(self.cores[src], dst)
                self._dispatch(src, [Forward(dst, m) for m in held] + withdrawals)


def _read_sbp(message: Message | Replay) -> tuple[str, bool]:
    """As the process's: a replay request held behind subscriptions goes with them."""
    if type(message) is Replay:
        return f"replay {message.req_id}", True
    if type(message) is Advertise or type(message) is Unadvertise:
        return f"advertisement {message.adv_id}", type(message) is Advertise
    return message.sub_id, type(message) is Subscribe
