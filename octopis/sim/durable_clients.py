"""Durable subscribers in the simulator (DESIGN §11): the SDK's part in simulated time,
the brokers' part by each broker's own records (:class:`~octopis.core.durable.Durables`),
called as the broker process's shell calls them.

- A durable client connects to a broker and subscribes under its durable name: the
  broker attaches a record (:meth:`Durables.attach`) and the client claims its record
  across the overlay (a replay round with ``claim`` set, :mod:`octopis.core.replay`),
  holding its live deliveries meanwhile. Each broker the claim reaches hands over what
  it keeps (:meth:`Durables.claim`); if a record came, the client acknowledges it to
  its new host and replays from it (of each known publisher what follows the last it
  took, of any other what was published since the record began), joining the answer
  and the live deliveries at the seam, each once, in publisher order.
- Every delivery it takes is acknowledged to its host at once (:meth:`Durables.ack`).
- It leaves (says bye): its host withdraws its subscription and its record waits
  (:meth:`Durables.detached`). It comes back later at a broker, as a new process.
- Its host dies under it: it fails over as the SDK does (subscribes again, durable, at
  the next live broker of its list, acknowledges its whole record there, owing from
  the start of its replay, and replays what it may have missed).
- A broker writes its records at once when one is made, claimed or handed over, and when
  one is left or moved away (as its node's answer says: ``save``), and what
  acknowledgements changed within a second (``maintain``): a broker that dies
  comes back with the records of its last write. As ``maintain`` does every
  :data:`~octopis.core.durable.SAVE_EVERY` seconds, a live broker abandons the records
  whose client has been away past ``keep`` (:meth:`Durables.expire`), at the first such
  tick (of the simulated clock) after it is due.

The history each durable client leaves is a :class:`DurableClient`:
:func:`octopis.nemesis.checks.check_durables` holds it to its contract.
"""

from __future__ import annotations

import copy
import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from octopis.client_policy import (
    DurableProgress,
    RecentDeliveries,
    Seam,
    SubscriberReplays,
    publisher_order,
)
from octopis.client_policy.failover import connect_tries
from octopis.core import Notification
from octopis.core.client_requests import DurableRequest, RequestRefused, acknowledge
from octopis.core.durable import SAVE_EVERY, DurableRecord, Durables, WriteRefused, claim_of
from octopis.core.replay import (
    ClaimRecord,
    Gap,
    Replay,
    ReplayAction,
    ReplayDeliver,
    ReplayDone,
    replay_request,
)
from octopis.defaults import (
    DURABLE_KEEP,
    DURABLE_MAX,
)
from octopis.filters.language import Subscription
from octopis.sim.engine import Simulator

NAME = "d"
"""The durable name every simulated durable client subscribes under."""
WRITES_KEPT = 10.0
"""Seconds of a broker's durable writes kept for a power failure to roll back: more
than the unsynced tail any power failure loses (the nemesis draws up to 2 s)."""


@dataclass
class DurableClient:
    """A durable subscriber's history: where it is, and what it took."""

    name: str
    subscription: Subscription
    started: float = 0.0
    """When its record began (its first subscribe)."""
    host: str | None = None
    """The broker it is connected to (None: away)."""
    run: int = 0
    """Its process's run (a new one each time it comes back), and its connection."""
    connection: int = 0
    key: str = ""
    claiming: bool = False
    """The seam's request is a claim (not yet a replay)."""
    record: RecentDeliveries = field(default_factory=RecentDeliveries)
    progress: DurableProgress = field(default_factory=DurableProgress)
    """What the application took in this run (acknowledged), what the record it claimed
    says was taken (a live delivery it covers is dropped), from when its host's record
    owes the rest: the SDK's."""
    replaying: SubscriberReplays = field(default_factory=SubscriberReplays)
    """The SDK's side of its replays: when this run first subscribed (a fail-over's
    replay starts no earlier), where its next replay asks from, and its replays' silent
    brokers not heard from since (those of every run: its gaps)."""
    first: str = ""
    """The broker this run's list begins at (the one it was started at)."""
    away: list[tuple[float, float]] = field(default_factory=list)
    """(left or its host died, subscribed again): what was published in between only a
    claim's or a fail-over's replay can give it."""
    left: float | None = None
    gaps: set[str] = field(default_factory=set)
    """Brokers its claims reported silent, and why a claim failed."""

    store_gaps: set[Gap] = field(default_factory=set)
    """Ranges its claims' and replays' stores reported they no longer hold."""

    def told_gap(self) -> bool:
        """Whether a gap is still reported to it."""
        return bool(self.gaps) or bool(self.replaying.late.outstanding)

    received: Counter[tuple[str, int]] = field(default_factory=Counter)
    taken_at: dict[tuple[str, int], tuple[str, float]] = field(default_factory=dict)
    """Each delivery taken: the host that was told, and when."""
    unwritten: set[tuple[str, int]] = field(default_factory=set)
    """Deliveries whose acknowledgement died with its host before the host wrote it
    (the client did not fail over to acknowledge them again elsewhere)."""
    replayed: set[tuple[str, int]] = field(default_factory=set)
    """Deliveries that came from a claimed record's replay."""
    counts: Counter[str] = field(default_factory=Counter)


class DurableSimulator(Simulator):
    """A :class:`Simulator` with durable clients (see the module docstring)."""

    def __init__(self, *args: Any, durable_keep: float = DURABLE_KEEP, **kwargs: Any) -> None:
        """``durable_keep``: seconds a record waits for its client (``[durable] keep``)."""
        super().__init__(*args, **kwargs)
        self.durable_clients: dict[str, DurableClient] = {}
        self.durable_records: dict[str, Durables] = {
            b: Durables(b, durable_keep, DURABLE_MAX) for b in self.scot.brokers
        }
        self._written: dict[str, dict[tuple[str, str], DurableRecord]] = {
            b: {} for b in self.scot.brokers
        }
        """Each broker's records as written (what a restart reads back)."""
        self._writes: dict[str, deque[tuple[float, dict[tuple[str, str], DurableRecord]]]] = {
            b: deque() for b in self.scot.brokers
        }
        """Each broker's writes of the last :data:`WRITES_KEPT` seconds (and the one before
        them): when, and its records as then written, for a power failure to roll back
        what was not on disk yet (:meth:`power_loss`)."""
        self._writing: set[str] = set()
        self._written_time: dict[str, float] = {}
        self._expiring: dict[str, float] = {}
        """The tick each broker's records are next checked for expiry at."""
        self._connections: dict[str, DurableClient] = {}
        """Each connection a durable client made, by its key (the requester the nodes
        name in their answers, as a broker's client sessions know their connections)."""
        self._died_at: dict[str, float] = {}
        """When each broker last died."""

    # -- the client's side -----------------------------------------------------------------

    def durable_subscribe(self, client: str, broker: str, subscription: Subscription) -> None:
        """``client`` starts now at ``broker`` with a durable subscription to
        ``subscription`` (made, or claimed if its record is kept somewhere)."""
        c = self.durable_clients.get(client)
        if c is None:
            c = self.durable_clients[client] = DurableClient(client, subscription, self.now)
        self._durable_run(c, broker, broker)

    def durable_leave(self, client: str) -> None:
        """``client`` closes its connection now (its record waits), if connected."""
        c = self.durable_clients[client]
        if c.host is None:
            return
        host, c.host = c.host, None
        self.seams.pop(c.name, None)
        c.left = self.now
        self.checked.discard(c.name)
        self._sessions_abandoned(c.name)
        if self._dead(host):
            c.left = self._died_at[host]  # its host died under it: nobody to tell
            return
        self._client_gone(host, c.name, self.now)

    def durable_return(self, client: str, broker: str) -> None:
        """``client`` comes back now as a new process with ``broker``'s list (``broker``,
        then its fail-over list): it tries them in turn as a connection does
        (:func:`~octopis.client_policy.failover.connect_tries`, :meth:`_connect`: a dead
        one known by its silence, :data:`CLIENT_LIVENESS` later) and starts at the first
        that answers."""
        c = self.durable_clients[client]
        if c.host is not None:
            return
        run = c.run
        self._connect(
            connect_tries([broker, *self.scot.failover_order(broker)], self._gone_for_good),
            lambda: c.host is None and c.run == run,
            lambda live: self._durable_run(c, live, broker),
        )

    def _durable_run(self, c: DurableClient, broker: str, first: str) -> None:
        """A new process of ``c`` at ``broker``, its list beginning at ``first``: it
        subscribes and claims its record."""
        c.run, c.first = c.run + 1, first
        c.record, c.progress = RecentDeliveries(), DurableProgress()
        c.replaying = SubscriberReplays(self.now, c.replaying.late)
        if c.left is not None:
            c.away.append((c.left, self.now))
            c.left = None
        self._attach_durable(c, broker)
        self.seams[c.name], c.claiming = Seam(self.seam_limit), True
        self._durable_request(c, (), (), 0.0, claim=claim_of(c.name, NAME))

    def _attach_durable(self, c: DurableClient, broker: str) -> None:
        c.host = broker
        c.connection += 1
        c.key = f"{c.name}#{c.run}.{c.connection}"
        self._connections[c.key] = c
        self._home[c.name] = broker
        self.records[c.name] = c.record
        self.replaying[c.name] = c.replaying
        self.checked.add(c.name)
        durable = DurableRequest(self.durable_records[broker], NAME, c.key)
        actions = self.clients.session_subscribe(c.name, broker, c.subscription, durable)[1]
        self._durable_write(broker)
        self._dispatch(broker, actions)

    def _durable_request(
        self,
        c: DurableClient,
        filters: tuple[str, ...],
        since: Iterable[tuple[str, int, int]],
        after: float,
        **kind: Any,
    ) -> None:
        """``c`` asks its host for a claim or a replay (``kind``: as
        :func:`~octopis.core.replay.replay_request` takes it)."""
        assert c.host is not None
        self._replays += 1
        req_id = f"{c.host}/{self._replays}"
        request = replay_request(req_id, c.host, filters, since, after, **kind)
        self.seams[c.name].named(req_id)
        c.counts["claims" if request.claim else "replays"] += 1
        self._carry_out_replay(c.host, self._rounds(c.host).start(request, self.now, c.key))

    def _durable_ack(self, c: DurableClient, since: list[tuple[str, int, int]] | None) -> None:
        """``c`` acknowledges ``since`` to its host (at the loop's next pass: now; None:
        nothing to tell)."""
        host, owed = c.host, c.progress.owed_after
        if since is None or host is None or self._dead(host):
            return
        try:
            acknowledge(self.durable_records[host], c.name, NAME, since, self.now, owed)
        except RequestRefused:
            c.counts["acks_refused"] += 1
            return
        if host not in self._writing:
            self._writing.add(host)
            self.at(self.now + SAVE_EVERY, self._durable_write, host)

    def _repeated(self, subscriber: str, count: int, *, live: bool) -> None:
        """A durable client counts its repeats its own; any other subscriber's as
        :class:`Simulator` counts them."""
        c = self.durable_clients.get(subscriber)
        if c is None:
            super()._repeated(subscriber, count, live=live)
        else:
            c.counts["repeats"] += count

    def _taken(self, subscriber: str, n: Notification, *, replayed: bool) -> None:
        """A durable client takes ``n`` its own way (:meth:`_durable_took`); any other
        subscriber as :class:`Simulator` takes it."""
        c = self.durable_clients.get(subscriber)
        if c is None:
            super()._taken(subscriber, n, replayed=replayed)
            return
        if replayed:
            c.replayed.add(n.key)
        self._durable_took(c, n)

    def _durable_took(self, c: DurableClient, n: Notification) -> None:
        """``n`` is delivered: its from-point noted (as the SDK's ``deliver`` does), and
        the application takes it, recorded and acknowledged; unless the record ``c``
        claimed says an earlier run took it (the SDK's stream drops it)."""
        c.replaying.delivered(n.publisher, n.session, n.seq, self.now)
        if c.progress.covers(n.publisher, n.session, n.seq):
            c.counts["covered"] += 1
            return
        c.received[n.key] += 1
        if c.host is not None:
            c.taken_at.setdefault(n.key, (c.host, self.now))
        self._durable_ack(c, [(n.publisher, n.session, c.progress.took(*publisher_order(n)))])

    # -- a host dies ----------------------------------------------------------------------

    def _hosts_died(self, broker: str) -> None:
        """``broker`` died: its records come back as last written when it restarts; its
        durable clients notice by their heartbeat watch (:meth:`_noticed`) and fail over."""
        super()._hosts_died(broker)
        self._died_at[broker] = self.now
        self._restore_written(broker)
        self._writing.discard(broker)
        for c in self.durable_clients.values():
            if c.host == broker:
                noticed = self._noticed(c.key, broker, self.now)
                self.at(noticed, self._durable_fail_over, c, broker, c.run, self.now)

    def _restore_written(self, broker: str) -> None:
        """``broker`` starts again with its records as last written; what its durable
        clients took there since is not in them (``unwritten``: a repeat is allowed)."""
        records = self.durable_records[broker]
        restored = Durables(broker, records.keep, records.limit)
        restored.stats = records.stats
        for record in copy.deepcopy(list(self._written[broker].values())):
            restored.restore(record)
        self.durable_records[broker] = restored
        self._durable_expiry(broker)
        written = self._written_time.get(broker, -1.0)
        for c in self.durable_clients.values():
            c.unwritten.update(
                key for key, (host, at) in c.taken_at.items() if host == broker and at > written
            )

    def power_loss(self, broker: str, sync: str, unsynced: float) -> None:
        """``broker``'s machine loses power now (it died at this instant): with ``sync``
        ``normal`` what its store wrote in the last ``unsynced`` seconds is gone, its
        durable records' writes too, as the process's SQLite file rolls back both; they
        come back as written before then."""
        super().power_loss(broker, sync, unsynced)
        if sync == "full":
            return
        before, snapshot, at = self.now - unsynced, {}, -1.0
        for when, written in self._writes[broker]:
            if when <= before:
                snapshot, at = written, when
        self._written[broker], self._written_time[broker] = dict(snapshot), at
        self._restore_written(broker)

    def _clients_hear_nothing(self, broker: str) -> None:
        """``broker`` stopped now (paused): its durable clients notice its silence by
        their heartbeat watch too, and fail over if it has not run since."""
        super()._clients_hear_nothing(broker)
        for c in self.durable_clients.values():
            if c.host == broker:
                noticed = self._noticed(c.key, broker, self.now)
                self.at(noticed, self._durable_unheard, c, broker, c.run, self.now)

    def _durable_unheard(self, c: DurableClient, broker: str, run: int, since: float) -> None:
        if self._paused_since(broker, since):
            self._durable_fail_over(c, broker, run, since)

    def _durable_fail_over(self, c: DurableClient, old: str, run: int, died: float) -> None:
        """``c`` leaves ``old``, silent since ``died``, along its run's list as the SDK
        does (the list it was started with, :meth:`_connect`)."""
        if c.host != old or c.run != run or self.failures is None:
            return
        self._connect(
            self._failover_tries(c.first, old),
            lambda: c.host == old and c.run == run,
            lambda new: self._durable_failed_over(c, old, new, died),
        )

    def _durable_failed_over(self, c: DurableClient, old: str, new: str, died: float) -> None:
        """``c``, which left silent ``old``, is connected at ``new``: a claim under way
        failed (a gap it is told of), its subscription is made again, durable, its whole
        record acknowledged there as owing from the replay's start
        (:meth:`~octopis.client_policy.SubscriberReplays.failed_over`), and it replays
        what it missed. A session at ``old``, which lives (it was paused), is kept for
        the SDK's linger after that replay, then left with a bye, as a plain
        subscriber's is (:meth:`~octopis.sim.pauses.PausedBrokers._left`)."""
        if c.name in self.seams and c.claiming:
            c.gaps.add(f"claim failed: {old} died")
        self._end_seam(c.name, None if c.claiming else self.scot.brokers)
        c.away.append((died, self.now))
        c.counts["failed_over"] += 1
        since, after = c.replaying.failed_over(died, [c.progress])
        self._attach_durable(c, new)
        self._durable_ack(c, c.progress.whole())
        self.seams[c.name], c.claiming = Seam(self.seam_limit), False
        self.left_at_replay[c.name] = old
        self._durable_request(c, (c.subscription.to_text(),), since, after)

    # -- the brokers' side ----------------------------------------------------------------

    def _durables(self, broker: str) -> Durables:
        return self.durable_records[broker]

    def _carry_out_replay(self, broker: str, actions: list[ReplayAction]) -> None:
        """Claims are answered from ``broker``'s records, a durable client's answers go to
        it; the rest as :class:`Simulator` carries them out."""
        if not self.durable_clients:
            super()._carry_out_replay(broker, actions)
            return
        for action in actions:
            if type(action) is ClaimRecord:
                self._durable_claim(broker, action.request)
            elif (
                type(action) in (ReplayDeliver, ReplayDone)
                and action.requester in self._connections
            ):
                self._durable_answer(self._connections[action.requester], action)
            else:
                super()._carry_out_replay(broker, [action])

    def _durable_claim(self, broker: str, request: Replay) -> None:
        """The shell's ``_claim``: the node's answer
        (:meth:`~octopis.core.durable.Durables.answer_claim`) carried out."""
        answer = self.durable_records[broker].answer_claim(self._rounds(broker), request, self.now)
        if answer.withdraw is not None:
            self._withdraw_held(broker, answer.withdraw.client, answer.withdraw.sub_id)
        if answer.save:
            self._durable_write(broker)
        self._carry_out_replay(broker, answer.actions)

    def _withdraw_held(self, broker: str, client: str, sub_id: str) -> None:
        """The shell's ``withdraw``: end ``client``'s subscription ``sub_id`` here (its
        record was claimed by the host its client came back at)."""
        node = self.nodes[broker]
        actions = node.sessions.withdraw(client, sub_id, node.withdraw)
        if actions is not None:
            self.subscriber_of.pop(sub_id, None)
            self._dispatch(broker, actions)

    def _durable_answer(self, c: DurableClient, action: ReplayDeliver | ReplayDone) -> None:
        """An answer to ``c``'s connection that asked (``action.claim``: a claim's):
        read only if that connection is ``c``'s current one (one left behind, or of a
        process gone, is read by nobody)."""
        if action.requester != c.key or c.host is None:
            return
        seam = self.seams.get(c.name)
        current = seam is not None and seam.replay == action.req_id
        if type(action) is ReplayDeliver:
            c.counts["replayed"] += len(action.notifications)
            self._replayed(c.name, action.req_id, list(action.notifications))
            return
        echo = action.echo
        c.store_gaps.update(echo.gaps)
        if action.claim:  # a claim's gap stays: a late answer is not read
            c.counts["records_lost"] += 0 if current else len(echo.claimed)
        elif not current:  # a replay's gap shrinks as its own silent parts answer late
            c.replaying.late.answered(action.req_id, echo.answered, echo.silent)
        if not current:
            return
        if not c.claiming:
            self._end_seam(c.name, echo.silent)
            return
        c.claiming = False
        answer = c.progress.claim_answered(echo.claimed, echo.silent)
        if answer.gap is not None:
            c.gaps.add(f"claim: {', '.join(sorted(echo.silent))} silent: {answer.gap}")
        if answer.resumed is None:  # a new record
            self._end_seam(c.name, None)
            return
        c.counts["claimed"] += 1
        self._durable_ack(c, c.progress.whole())
        # as the SDK: its own subscription from what the record says was taken
        filters = (c.subscription.to_text(),)
        self._durable_request(c, filters, answer.since, answer.after, historic=True)

    def _durable_write(self, broker: str) -> None:
        """``broker`` writes its records changed since its last write, as the process
        writes them (:meth:`Durables.written`; what a restart reads back), and their next
        expiry check is set (:meth:`_durable_expiry`). Its disk full, the store refuses
        the write (:meth:`Durables.write`: counted, the records kept as changed) and it
        is tried again a :data:`~octopis.core.durable.SAVE_EVERY` later, as the
        process's ``maintain`` tries."""
        self._writing.discard(broker)
        if self._dead(broker):
            return
        written = self._written[broker]

        def save(changed: dict[tuple[str, str], DurableRecord | None]) -> None:
            if self.retention.full(broker):
                raise WriteRefused(f"{broker}'s retention store: its disk is full")
            for ident, record in changed.items():
                if record is None:
                    written.pop(ident, None)
                else:
                    written[ident] = copy.deepcopy(record)

        if self.durable_records[broker].write(save) is not None:
            self._writing.add(broker)
            self.at(self.now + SAVE_EVERY, self._durable_write, broker)
            self._durable_expiry(broker)
            return
        self._written_time[broker] = self.now
        writes = self._writes[broker]
        writes.append((self.now, dict(written)))
        while len(writes) > 1 and writes[1][0] <= self.now - WRITES_KEPT:
            writes.popleft()
        self._durable_expiry(broker)

    def _durable_expiry(self, broker: str) -> None:
        """Have ``broker``'s records checked for expiry at the first
        :data:`~octopis.core.durable.SAVE_EVERY` tick after one is due
        (:meth:`Durables.expiry_due`), unless a check comes first."""
        due = self.durable_records[broker].expiry_due()
        if due is None:
            return
        tick = (math.floor(due / SAVE_EVERY) + 1) * SAVE_EVERY
        if self._expiring.get(broker, math.inf) <= tick:
            return
        self._expiring[broker] = tick
        self.events.background(tick, self._durable_expire, broker, tick)

    def _durable_expire(self, broker: str, tick: float) -> None:
        """``broker``'s tick of ``maintain``: the records whose client has been away past
        ``keep`` are abandoned and the change written; a dead broker's records are checked
        again at the next tick (as it restarts, if it does)."""
        if self._expiring.get(broker) != tick:
            return  # an earlier check took its place
        del self._expiring[broker]
        if self._dead(broker):
            if self.restarts_pending:
                self._expiring[broker] = tick + SAVE_EVERY
                self.events.background(
                    tick + SAVE_EVERY, self._durable_expire, broker, tick + SAVE_EVERY
                )
            return
        if self.durable_records[broker].expire(self.now):
            self._durable_write(broker)  # schedules the next check
        else:
            self._durable_expiry(broker)
