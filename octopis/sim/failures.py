"""Failures in the simulator (DESIGN §7): dead brokers, down links, detection, custody.

The model is the transport's, in simulated time:

- A failure takes effect at once: copies in flight to or from a dead broker never arrive,
  and a dead broker loses its state. A cut link keeps what it carries, as TCP does, and
  delivers it, in order, when it heals; only a cut that lasts :data:`TCP_ABORT_AFTER`
  detection times aborts the connection and loses what it carried (the process's
  ``TCP_MAXRT``, :func:`octopis.transport.links.tcp_abort_ms`).
- Each end of a failed link *detects* it ``detection`` seconds later (the transport's
  ``links.down_after``), if it has heard nothing since (:meth:`Neighbour.silent_past`:
  a cut that heals sooner is seen by no one); only then does its core see the link as
  down and route around it.
- Custody is the broker process's own (:mod:`octopis.sim.custody`): a sender keeps each
  notification it sent on a link until the receiver's acknowledgement comes back, and
  ``retain`` seconds after that. At detection, what it kept goes back to its core
  (``reroute``); edge dedup absorbs those that had arrived. Another message put on a
  broken link waits on it, as in the process's output queue, until the link gives it
  back with the copies: at the detection, at a handshake with a new incarnation, or at
  a heal after the detection; the node holds it (:meth:`BrokerNode.link_down`). One
  that went is pending until acknowledged: lost in flight, it is sent again when the
  link heals (:mod:`octopis.sim.custody`), as the process's link does.
- A broker that dies takes with it the copies still in flight from it
  (``undeliverable.died_in_flight``) and those it had sent on an already failed link
  before it detected the failure (``undeliverable.died_in_custody``): only it could have
  routed them again. Both are counted, with the notification; they are the losses
  custody cannot prevent (the publisher's host dying right after accepting, say).
- A restarted broker comes back empty, with a new incarnation: it and each neighbour
  whose link carries meet (the process's handshake), and every decision that follows —
  what a neighbour hands it, when a share is owed or paid, when it serves, what happens
  to its local publications meanwhile, the withdrawal of its predecessor's
  subscriptions, the order of work when a link heals — is its
  :class:`~octopis.core.node.BrokerNode`'s, the broker process's own. The simulator only
  decides when things arrive: a neighbour's SYNCED arrives behind what it sent; a link
  that was cut before two brokers met carries their handshake when it heals.

- A one-way partition (``Failure(one_way=True)``: what ``A`` sends ``B`` is lost, ``B``'s
  frames still reach ``A``) is what a broker process lives through over TCP: ``B`` hears
  nothing from ``A`` and declares it down ``detection`` seconds later; it then stops
  sending on the link (the process pauses a link it declared down), so ``A`` hears
  nothing either and declares ``B`` down ``detection`` seconds after that. Until then
  ``A`` takes ``B``'s frames, but its acknowledgements are lost: what ``B`` sent
  since the failure stays in ``B``'s custody and is routed again at its detection (edge
  dedup absorbs what got through), and what ``A`` sent since the failure stays in
  ``A``'s custody until its own. The heal lets both directions carry again.
- A delay spike on a link (:meth:`FailureEvents.slow_link`) makes every frame sent on it
  meanwhile arrive that much later, in order (a TCP stream delays; it never reorders
  nor duplicates on a live connection, and loses nothing until the connection resets,
  which a partition models). A spike shorter than ``detection`` is seen by no one but
  in latency; a longer one is a silent link, that is a partition.

Failures are read by :mod:`octopis.failure_schedule` (times in seconds of simulated time
from the start of publishing).
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

from octopis.accounting import failure_report, host_split, replay_summary
from octopis.core import Notification
from octopis.core.neighbours import first_look, liveness_tick
from octopis.core.node import HandedShare
from octopis.defaults import DOWN_AFTER, HEARTBEAT, RETAIN, TCP_ABORT_AFTER
from octopis.failure_schedule import Failure
from octopis.sim.custody import CustodyEvents, LinkCustody, message_of, receipt_of
from octopis.sim.cuts import CutLinks


class FailureState:
    """Which brokers are dead and which directed links are cut; the custody of every
    directed link (:class:`~octopis.sim.custody.LinkCustody`, ``retain`` its retained
    window). Which links a broker routes through is its node's
    (:meth:`~octopis.core.neighbours.Neighbours.routable`), as in the broker process."""

    def __init__(self, detection: float = DOWN_AFTER, retain: float = RETAIN):
        if detection < 0 or retain < 0:
            raise ValueError("detection and retain must not be negative")
        self.detection = detection
        self.abort = TCP_ABORT_AFTER * detection
        """Seconds after which a cut link's connection is aborted, losing what it carries."""
        self.custody = LinkCustody(retain)
        self.dead: set[str] = set()
        self.crashes: Counter[str] = Counter()
        """How many crashes under way each broker is in: overlapping ones keep it dead
        from the first's start to the last's end (one death, one restart)."""
        self.cut: set[tuple[str, str]] = set()
        """Directed links failed as links (independent of dead brokers)."""
        self._cut_by: dict[Failure, set[tuple[str, str]]] = {}
        self._cuts: Counter[tuple[str, str]] = Counter()
        """How many failures under way cut each directed link: it carries again when the
        last of them heals."""
        self.cut_since: dict[tuple[str, str], float] = {}
        """Since when each cut directed link's connection has had data unacknowledged:
        its cut (a live sender heartbeats), or its paused sender's resume; none once an
        end died (that connection is gone, and no other is made until the heal)."""
        self.stuck: dict[tuple[str, str], list[Any]] = {}
        """What each cut directed link carries: it arrives at the heal, unless the cut
        lasts past :attr:`abort`."""
        self.failed_at: dict[tuple[str, str], float] = {}
        self.paused: dict[str, tuple[float, float]] = {}
        """Paused brokers: since when, and when they resume (:mod:`octopis.sim.pauses`)."""
        self.asleep: dict[str, list[tuple[float, Any, tuple]]] = {}
        """Per paused broker, what waits for its resume: (when, function, arguments)."""
        self.slow: dict[tuple[str, str], float] = {}
        """Directed links in a delay spike: the seconds each frame sent on it is late."""

    def broken(self, src: str, dst: str) -> bool:
        """Whether a copy on ``src → dst`` is lost (link cut or an end dead)."""
        return src in self.dead or dst in self.dead or (src, dst) in self.cut

    def cut_by(
        self, failure: Failure, links: list[tuple[str, str]], now: float
    ) -> list[tuple[str, str]]:
        """``failure`` cuts the directed ``links`` at ``now`` (until :meth:`heal`);
        returns those it cut that carried until now (a link with a dead end has no
        connection to keep anything: its end's next process makes none across the cut,
        as :meth:`~octopis.sim.cuts.CutLinks._connections_reset` says of one cut first)."""
        mine = self._cut_by.setdefault(failure, set())
        newly = []
        for link in links:
            if link not in mine:
                mine.add(link)
                self._cuts[link] += 1
                if link not in self.cut:
                    self.cut.add(link)
                    if link[0] not in self.dead and link[1] not in self.dead:
                        self.cut_since[link] = now  # else no connection: none carries
                        newly.append(link)
        return newly

    def cutting(self, failure: Failure) -> bool:
        """Whether ``failure`` cuts links now (it has not healed)."""
        return failure in self._cut_by

    def heal(self, failure: Failure) -> None:
        """``failure`` ends: each link it cut carries again unless another still cuts it."""
        for link in self._cut_by.pop(failure, ()):
            self._cuts[link] -= 1
            if not self._cuts[link]:
                del self._cuts[link]
                self.cut.discard(link)
                self.cut_since.pop(link, None)

    def holds(self, src: str, dst: str, now: float) -> bool:
        """Whether the link ``src → dst``, cut, keeps what it carries now (its connection
        not yet aborted, both ends alive): TCP delivers it at the heal."""
        since = self.cut_since.get((src, dst))
        live = src not in self.dead and dst not in self.dead
        return live and since is not None and since + self.abort > now

    def severed(self, a: str, b: str) -> bool:
        """Whether the link of ``a`` and ``b`` fails either way (no handshake goes over)."""
        return self.broken(a, b) or self.broken(b, a)


class FailureEvents(CutLinks, CustodyEvents):
    """The :class:`~octopis.sim.engine.Simulator`'s failures (a mixin beside its event
    loop): scheduling them, detection, custody taken back, restarts and handshakes. What
    a broker decides about them is its :class:`~octopis.core.node.BrokerNode`'s."""

    def fail(
        self,
        failure: Failure,
        start: float = 0.0,
        *,
        detection: float = DOWN_AFTER,
        retain: float = RETAIN,
    ) -> None:
        """Schedule ``failure`` (times from ``start``); the first call sets how long
        detection takes and how long senders keep copies (see :mod:`octopis.sim.failures`)."""
        for end in failure.ends:
            if end not in self.cores:
                raise KeyError(f"no broker {end!r} in topology {self.scot.name}")
        if len(failure.ends) == 2 and failure.ends[1] not in self.scot.graph[failure.ends[0]]:
            raise KeyError(f"{failure.ends[0]} and {failure.ends[1]} are not neighbours")
        if self.network.receiver_paced:  # as a service model always has
            raise ValueError(
                "failures are not simulated with a CPU service model or receiver-paced links"
            )
        if failure.one_way and len(failure.ends) != 2:
            raise ValueError("a one-way failure names a link A-B")
        self._failure_state(detection, retain)
        if failure.stall:  # a process stopped and resumed (:mod:`octopis.sim.pauses`)
            assert failure.until is not None  # a stall names when it resumes
            until = start + failure.until
            self.at(start + failure.at, self._pause, failure.ends[0], until)
            self.at(until, self._resume, failure.ends[0])
            return
        self.at(start + failure.at, self._fail, failure)
        if failure.until is not None:
            self.at(start + failure.until, self._recover, failure)
            self.restarts_pending += failure.is_broker

    def _failure_state(self, detection: float = DOWN_AFTER, retain: float = RETAIN) -> FailureState:
        """The run's failure state, made on the first failure scheduled."""
        if self.failures is None:
            self.failures = FailureState(detection, retain)
        return self.failures

    def _failure_report(self, stats: dict[str, Any]) -> dict[str, Any]:
        """The ``failures`` part of a run's report (:func:`~octopis.accounting.failure_report`)
        from the run's failure counts, the copies still held at the end, the hosts' split
        and the replays (``stats``: the cores' counts)."""
        counts = self.failure_totals()
        counts.update(self.failures.custody.counts())
        return failure_report(
            counts,
            sum(1 for node in self.nodes.values() for _ in node.held_notifications()),
            stats,
            host_split(self.ledger, {**self._home, **self.first_home}, self.hosts_failed),
            replay_summary(self.replay_counts, self.failed_over, self.replay_gaps, self.seam_gaps),
        )

    def failure_totals(self) -> Counter[str]:
        """What the run counted of failures: the simulator's counts and every node's (a
        dead node's were added to the simulator's at its death)."""
        return self.failure_counts + sum((node.counts() for node in self.nodes.values()), Counter())

    @staticmethod
    def _look(due: float) -> float:
        """When a broker judges a silence due at ``due``: at its first liveness look at or
        after it (:func:`~octopis.core.neighbours.first_look`, the process's tick)."""
        return first_look(due, liveness_tick(HEARTBEAT))

    def _dead(self, broker: str) -> bool:
        """Whether ``broker`` is dead now."""
        return self.failures is not None and broker in self.failures.dead

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
            state.crashes[broker] += 1
            if state.crashes[broker] > 1:
                return  # dead already
            state.dead.add(broker)
            self._paused_dies(broker)
            self._connections_reset(broker)
            for message in state.custody.forget(broker, state.failed_at):
                if type(message) is Notification:
                    self.failure_counts["undeliverable.died_in_custody"] += 1
                    self.brokers.given_up.add(message.key)
            self.hosts_failed.add(broker)
            self.brokers.died(broker)
            lost, counts = self.nodes[broker].died()  # what it held dies with it
            self.failure_counts["undeliverable.died_held"] += len(lost)
            self.brokers.given_up.update(n.key for n in lost)
            self.failure_counts.update(counts)
            self.failure_counts["brokers_killed"] += 1
            self._hosts_died(broker)
            self.publishers.died(broker)
        elif failure.one_way:
            talker, listener = failure.ends
            self._cut(failure, [(talker, listener)])
            self.failure_counts["links_cut_one_way"] += 1
            for link in ((talker, listener), (listener, talker)):  # lost, or unacknowledged
                if link[0] not in state.dead:
                    state.failed_at.setdefault(link, self.now)
            self.at(self._look(self.now + state.detection), self._one_way_silent, failure)
            return
        else:
            self._cut(failure, self._failed_links(failure))
            self.failure_counts["links_cut"] += 1
        for src, dst in self._failed_links(failure):
            if src not in state.dead and (src, dst) not in state.failed_at:
                self._silence(src, dst)

    def _silence(self, src: str, dst: str) -> None:
        """``src`` hears ``dst`` no more from now (a live link is heard to its failure):
        it declares it down a detection time later if it has heard nothing since
        (:meth:`_silent_past`)."""
        state = self.failures
        assert state is not None
        if self._asleep(src, self._silence, src, dst):
            return  # paused: what it heard last waits in its buffer, read at its resume
        state.failed_at[(src, dst)] = self.now
        if self.nodes[src].neighbours[dst].up:
            self.nodes[src].neighbours.heard(dst, self.now)
        self.at(self._look(self.now + state.detection), self._silent_past, src, dst)

    def _one_way_silent(self, failure: Failure) -> None:
        """The listener (``failure.ends[1]``) has heard nothing from the talker for the
        detection time: it declares it down and stops sending on the link, so the talker
        hears nothing either and declares the listener down a detection time later (see
        the module docstring). Nothing, if the link healed meanwhile."""
        state = self.failures
        assert state is not None
        if not state.cutting(failure) or self._asleep(
            failure.ends[1], self._one_way_silent, failure
        ):
            return
        talker, listener = failure.ends
        self._detect(listener, talker)
        self._cut(failure, [(listener, talker)])
        if listener not in state.dead:
            state.failed_at.setdefault((listener, talker), self.now)
        if self.nodes[talker].neighbours[listener].up:  # heard up to now
            self.nodes[talker].neighbours.heard(listener, self.now)
        self.at(self._look(self.now + state.detection), self._silent_past, talker, listener)

    def slow_link(self, src: str, dst: str, at: float, until: float, extra: float) -> None:
        """From ``at`` to ``until`` every frame ``src`` sends ``dst`` arrives ``extra``
        seconds late, in order (a delay spike; see the module docstring)."""
        if src not in self.scot.graph or dst not in self.scot.graph[src]:
            raise KeyError(f"{src} and {dst} are not neighbours")
        if not (extra > 0 and at < until):
            raise ValueError("a delay spike needs extra > 0 and at < until")
        self._failure_state()
        self.at(at, self._set_slow, src, dst, extra)
        self.at(until, self._set_slow, src, dst, -extra)

    def _set_slow(self, src: str, dst: str, extra: float) -> None:
        slow = self.failures.slow  # type: ignore[union-attr]
        late = round(slow.get((src, dst), 0.0) + extra, 9)
        if late > 0:
            slow[(src, dst)] = late
        else:
            slow.pop((src, dst), None)

    def _silent_past(self, src: str, dst: str) -> None:
        """A detection time after a silence began: ``src`` declares ``dst`` down
        (:meth:`_detect`) if the node's rule says so (:meth:`Neighbours.due_down`, the
        process's liveness tick's too): up, and not heard since (a handshake, a heal).
        One never heard (a restarted broker's neighbour behind a cut) is left to the
        node's wait before it serves (:meth:`BrokerNode.serve_if_ready`)."""
        detection = self.failures.detection  # type: ignore[union-attr]
        if self._asleep(src, self._silent_past, src, dst):
            return
        if self.nodes[src].neighbours.due_down(dst, self.now, detection):
            self._detect(src, dst)

    def _detect(self, src: str, dst: str) -> None:
        """``src`` declares ``dst`` down; its link gives back what it kept and what waited
        on it (:meth:`_give_back`). Subscription messages sent stay pending: one lost in
        flight is sent again at the heal (:meth:`_resend`)."""
        state = self.failures
        assert state is not None
        if src in state.dead or (src, dst) not in state.failed_at:
            return
        neighbours = self.nodes[src].neighbours
        if neighbours.declared_down(dst):
            return
        neighbours.silent(dst, self.now)
        self.failure_counts["detections"] += 1
        self._give_back(src, dst)
        self._check_serving(src)

    def _give_back(self, src: str, dst: str, met: bool = False) -> None:
        """``src``'s link to ``dst`` gives back its custody's copies and what waited on
        it, as the process's (:meth:`Broker.link_down`), and, ``met`` a new incarnation,
        what is pending (:meth:`LinkCustody.give_up`): the replay rounds stop waiting
        for ``dst``; the node keeps or drops each, the copies go again with the link down."""
        self._replay_link_down(src, dst)
        custody = self.failures.custody  # type: ignore[union-attr]
        given_back, sent = custody.take_back(src, dst), custody.give_up(src, dst) if met else []
        for actions, receipt in self.nodes[src].given_back(
            dst, given_back, sent, self._view(src), message_of, receipt_of
        ):
            self._dispatch(src, actions, receipt)

    def _recover(self, failure: Failure) -> None:
        """A link comes back (the brokers at its ends meet if they had not, else each
        hears the other's heartbeat and its node heals, :meth:`~BrokerNode.heard`), or a
        broker restarts empty
        (:meth:`_start`)."""
        state = self.failures
        assert state is not None
        if failure.is_broker:
            state.crashes[failure.ends[0]] -= 1
            if state.crashes[failure.ends[0]]:  # another crash of it is under way
                self.restarts_pending -= 1
                return
        links = self._failed_links(failure)
        for src, dst in links:
            if failure.is_broker:
                self._detect(src, dst)  # a restart is noticed at once by the new handshake
            else:  # a cut shorter than the detection time is noticed by no one
                self._silent_past(src, dst)
        if failure.is_broker:
            broker = failure.ends[0]
            state.dead.discard(broker)
            self.restarts_pending -= 1
            self.failure_counts["brokers_restarted"] += 1
            self._start(broker)
            self._greet(broker)
            self.clients.advertise_again(broker)
            return
        state.heal(failure)
        for src, dst in links:
            if not state.broken(src, dst):
                self._retransmit(src, dst)
        a, b = failure.ends
        if state.severed(a, b) or any(self._asleep(e, self._recover, failure) for e in (a, b)):
            return  # a paused end hears (and is heard) once it runs: then again
        if not self._met(a, b) or not self._met(b, a):
            self._meet(a, b)  # each hears the other's first heartbeat there, once
            for src, dst in links:
                self._undetect(src, dst)
            return
        for src, dst in links:  # each hears the other's heartbeat, the node's heal
            self._undetect(src, dst)
            self._heard(src, dst, self.nodes[dst].serving)

    def _start(self, broker: str) -> None:
        """``broker`` starts empty (a restart, or a broker added by a topology change):
        a new incarnation, not serving until its neighbours have resynced it
        (:meth:`_greet`); the neighbours its links do not reach are detected down, as
        any silence."""
        state = self.failures
        assert state is not None
        self.brokers.start(broker).start(self.now, state.detection)
        self.retention.restarted(broker)
        self.at(self.now + state.detection, self._check_serving, broker)
        for neighbour in sorted(self.scot.graph[broker]):
            if state.severed(broker, neighbour):  # never greeted: judged like any silence
                state.failed_at[(broker, neighbour)] = self.now
                due = self._look(self.now + state.detection)
                self.at(due, self._silent_past, broker, neighbour)
            else:
                state.failed_at.pop((broker, neighbour), None)
                state.failed_at.setdefault((neighbour, broker), self.now)

    def _greet(self, broker: str) -> None:
        """``broker``, just started, meets each neighbour its links reach."""
        state = self.failures
        assert state is not None
        for neighbour in sorted(self.scot.graph[broker]):
            if not state.severed(broker, neighbour):
                self._meet(neighbour, broker)

    def _meet(self, a: str, b: str) -> None:
        """The handshake of ``a`` and ``b`` over their link: each node meets the other's
        incarnation (:meth:`BrokerNode.meet`: a new one for a neighbour that knew an
        earlier is a restart; its link gives back first, :meth:`_give_back`); each that
        met a new one hears its HELLO (naming the incarnation it knows of us,
        :meth:`Neighbours.handshake`), then carries out the node's hand-over, its SYNCED
        behind; then each hears the other's first heartbeat (:meth:`_heard`). Both HELLOs
        go over before either hands anything: each starts its link's numbering again,
        which the messages handed after it take up (the process's HELLO leads its link's
        queue)."""
        incarnation, pairs = self.brokers.incarnation, ((a, b), (b, a))
        met = {
            src: self.nodes[src].meet(
                dst, incarnation[dst], partial(self._give_back, src, dst, True)
            )
            for src, dst in pairs
        }
        custody = self.failures.custody  # type: ignore[union-attr]
        for src, dst in pairs:
            if met[src] is not None:
                names = self.nodes[dst].neighbours[src].incarnation  # what dst's HELLO says
                self.nodes[src].neighbours.handshake(dst, names, incarnation[src])
                custody.greeted(dst, src)
        for src, dst in pairs:
            if (step := met[src]) is not None:
                self.nodes[src].neighbours.heard(dst, self.now)
                self._dispatch(src, step.actions)
        for src, dst in pairs:
            self._heard(src, dst, self.nodes[dst].serving)

    def _met(self, a: str, b: str) -> bool:
        """Whether ``a`` has met ``b``'s current incarnation (their handshake went over
        the link)."""
        return self.nodes[a].neighbours[b].incarnation == self.brokers.incarnation[b]

    def _heard(self, src: str, dst: str, serving: bool) -> None:
        """``src`` hears ``dst``'s heartbeat, which says whether ``dst`` serves (its
        node's word, as the process's heartbeat carries it): the node's steps, in its
        order (:meth:`BrokerNode.heard`, the process's too); if it heals, ``src``'s link
        gives back first what waited on it (:meth:`_give_back`), and the node's
        :class:`Resend` sends again what the cut may have lost (:meth:`_resend`)."""
        heard = self.nodes[src].heard(dst, self.now, serving, lambda: self._give_back(src, dst))
        self._dispatch(src, heard.actions)

    def _share_arrived(self, broker: str, src: str, handed: HandedShare) -> None:
        """``src``'s SYNCED reached ``broker``, behind the share it announces: the node's
        step (:meth:`BrokerNode.share_heard`); then ``broker`` may serve."""
        self._dispatch(broker, self.nodes[broker].share_heard(src, handed))
        self._check_serving(broker)

    def _check_serving(self, broker: str) -> None:
        """A starting ``broker`` serves once its node says so
        (:meth:`BrokerNode.serve_if_ready`): it publishes what it held, pays what it
        owes, and its neighbours learn it serves behind what it sent them."""
        if self._dead(broker) or self._asleep(broker, self._check_serving, broker):
            return
        served = self.nodes[broker].serve_if_ready(self.now, self._view(broker))
        if served is None:
            return
        for actions, receipt in served:
            self._dispatch(broker, actions, receipt)
        for n in self.scot.graph[broker]:
            self._beat(broker, n)

    def _beat(self, broker: str, neighbour: str) -> None:
        """``broker``'s heartbeat to ``neighbour``, with its word, behind what it sent it
        (the process's first heartbeat after a handshake or after it starts serving), if
        their link carries (:meth:`_beat_heard`)."""
        if self.failures.broken(broker, neighbour):  # type: ignore[union-attr]
            return
        incarnation, serving = self.brokers.incarnation[broker], self.nodes[broker].serving
        arrival = self.events.last_arrival(broker, neighbour)
        self.at(arrival, self._beat_heard, neighbour, broker, incarnation, serving)

    def _beat_heard(self, src: str, dst: str, incarnation: int, serving: bool) -> None:
        """``src`` hears ``dst``'s heartbeat (:meth:`_heard`), a sign of life: lost if
        their link broke meanwhile or ``dst`` runs as another process since."""
        state = self.failures
        assert state is not None
        if state.broken(dst, src) or self.brokers.incarnation.get(dst) != incarnation:
            return
        if self._asleep(src, self._beat_heard, src, dst, incarnation, serving):
            return
        self._undetect(src, dst)
        self._heard(src, dst, serving)

    def _undetect(self, src: str, dst: str) -> None:
        """``src`` hears ``dst`` again (:meth:`_heard`, or a handshake); what it sends
        ``dst`` stays unacknowledged (in custody, its failure time kept) while that
        direction is cut (one way)."""
        state = self.failures
        assert state is not None
        if not state.broken(src, dst):
            state.failed_at.pop((src, dst), None)
