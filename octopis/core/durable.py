"""Durable subscriptions (DESIGN §11): sans-IO rules of the records brokers keep for them.

A durable subscription outlives its client's connection. The broker hosting it keeps a
record: its filters and the last sequence number of each (publisher, session) its client
acknowledged having taken. While the client is away the record waits, for ``keep``
seconds; what was published meanwhile waits in the publishers' retention stores. When
the client comes back, at any broker, under the same client name and durable name, its
new host claims the record across the overlay (a replay request with ``claim`` set,
:mod:`octopis.core.replay`): the holder hands it over and forgets it, and the client
replays from it. An ``unsubscribe`` ends it (the host claims any copy left elsewhere and
drops it); a record left past ``keep`` is abandoned and counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from octopis.client_policy import LastSeen, replay_after
from octopis.core.replay import Claimed, Replay, ReplayAction, ReplayRounds
from octopis.filters.composite import Composite
from octopis.filters.language import Subscription

SAVE_EVERY = 1.0
"""Seconds within which a broker writes the records acknowledgements changed (a record
made, left, claimed, moved or ended is written at once); every so often it also abandons
the records whose client has been away past ``keep`` (:meth:`Durables.expire`)."""


def claim_of(client: str, name: str) -> str:
    """The ``claim`` of a replay request that finds durable ``name`` of ``client``."""
    return f"{client}\x1f{name}"


def claimed_ident(claim: str) -> tuple[str, str]:
    """(client, durable name) of a replay request's ``claim``."""
    client, _, name = claim.partition("\x1f")
    return client, name


class Withdraw(NamedTuple):
    """End the subscription ``sub_id`` that client ``client`` (its connection ``key``)
    holds here: its durable record was claimed by another connection."""

    key: str
    client: str
    sub_id: str


class ClaimAnswer(NamedTuple):
    """What a broker does with a claim that reached it (:meth:`Durables.answer_claim`):
    ``withdraw`` a subscription held here for another connection, ``save`` its records
    at once (one was handed over), and carry out ``actions`` (its part of the round)."""

    withdraw: Withdraw | None
    save: bool
    actions: list[ReplayAction]


class DurableError(ValueError):
    """A durable subscription that cannot be made (the message names the limit)."""


Written = dict[tuple[str, str], "DurableRecord | None"]
"""Durable records to write, by (client, durable name); None: one gone, to delete."""


class WriteRefused(RuntimeError):
    """A store refused to write durable records (:meth:`Durables.write`): its disk is
    full or failing (the message names the store and why)."""


@dataclass(slots=True)
class DurableRecord:
    """One durable subscription: ``client`` and ``name`` identify it; ``key`` and
    ``sub_id`` are its attachment here (None while its client is away since ``away``)."""

    client: str
    name: str
    filters: tuple[str, ...]
    after: float
    updated: float
    since: LastSeen = field(default_factory=LastSeen)
    key: str | None = None
    sub_id: str | None = None
    away: float | None = None
    new: bool = True
    """Made by the attachment that is claiming: a claim passing here skips it."""

    def claimed(self, broker: str, now: float) -> Claimed:
        """What this record owes, as handed over to a new host at wall time ``now``."""
        away = self.away if self.away is not None else now
        since = tuple(self.since.since())
        return Claimed(
            broker, self.filters, since, replay_after(self.after, away, skew=0.0), self.updated
        )


class Durables:
    """The durable records one broker keeps (at most ``limit``), abandoned ``keep``
    seconds after their client went away. Every change is noted in :attr:`dirty` for
    the shell to write; the counters are in :attr:`stats`."""

    def __init__(self, broker_id: str, keep: float, limit: int) -> None:
        if keep <= 0 or limit < 1:
            raise ValueError("durable subscriptions need a positive keep and limit")
        self.id = broker_id
        self.keep = keep
        self.limit = limit
        self.records: dict[tuple[str, str], DurableRecord] = {}
        self.by_sub: dict[str, tuple[str, str]] = {}
        self.dirty: set[tuple[str, str]] = set()
        """Records changed (or gone) since the shell last wrote them."""
        self.stats: dict[str, int] = {
            "durable.made": 0,
            "durable.claimed": 0,
            "durable.ended": 0,
            "durable.abandoned": 0,
            "durable.refused": 0,
            "durable.writes_refused": 0,
        }

    def room(
        self, client: str, name: str, subscription: Subscription | Composite | None = None
    ) -> None:
        """Raise :class:`DurableError` if durable ``name`` of ``client`` (for
        ``subscription``) could not be attached here: a composite subscription (its
        joins are not replayed), or a new record past ``limit``."""
        if isinstance(subscription, Composite):
            raise DurableError("a composite subscription cannot be durable")
        if (client, name) not in self.records and len(self.records) >= self.limit:
            self.stats["durable.refused"] += 1
            raise DurableError(
                f"{self.id} keeps {self.limit} durable subscriptions already (durable.max)"
            )

    def attach(
        self, client: str, name: str, key: str, sub_id: str, filters: tuple[str, ...], now: float
    ) -> DurableRecord:
        """Client ``client`` (``key`` here) holds durable ``name`` as ``sub_id``: its
        record here is made, or taken up again if it was kept here."""
        ident = (client, name)
        record = self.records.get(ident)
        if record is None:
            self.room(client, name)
            record = self.records[ident] = DurableRecord(client, name, filters, now, now)
            self.stats["durable.made"] += 1
        else:
            record.new = False
            if record.sub_id is not None:
                self.by_sub.pop(record.sub_id, None)
        record.filters = filters or record.filters
        record.key, record.sub_id = key, sub_id
        self.by_sub[sub_id] = ident
        self.dirty.add(ident)
        return record

    def ack(
        self,
        client: str,
        name: str,
        since: list[tuple[str, int, int]],
        now: float,
        after: float | None = None,
    ) -> bool:
        """The client took deliveries up to ``since`` (publisher, session, seq), and owes
        itself any other publisher's publications since ``after`` (a claimed record's);
        False if no record of that durable is kept here."""
        record = self.records.get((client, name))
        if record is None:
            return False
        if after is not None:
            record.after = min(record.after, after)
        record.since.saw_all(since)
        record.updated, record.new = now, False
        self.dirty.add((client, name))
        return True

    def detached(self, sub_id: str, heard: float) -> bool:
        """``sub_id``'s client went away (its connection was dropped or left), last heard
        at wall time ``heard``: its record waits; False if ``sub_id`` is not durable."""
        ident = self.by_sub.pop(sub_id, None)
        if ident is None:
            return False
        record = self.records[ident]
        record.key = record.sub_id = None
        record.away = heard
        self.dirty.add(ident)
        return True

    def moved(self, sub_id: str) -> bool:
        """``sub_id`` moved to another broker (the balancer): its record goes with it (the
        new host made its own), so this one is forgotten uncounted; False if ``sub_id`` is
        not durable."""
        ident = self.by_sub.pop(sub_id, None)
        if ident is None:
            return False
        del self.records[ident]
        self.dirty.add(ident)
        return True

    def end(self, sub_id: str) -> tuple[str, str] | None:
        """The client unsubscribed ``sub_id``: if durable, its record ends; returns its
        (client, name) so that the shell claims any copy elsewhere."""
        ident = self.by_sub.pop(sub_id, None)
        if ident is None:
            return None
        del self.records[ident]
        self.dirty.add(ident)
        self.stats["durable.ended"] += 1
        return ident

    def unsubscribed(self, sub_id: str, moved: bool) -> str | None:
        """Its client withdrew ``sub_id``: ``moved`` to another broker, a durable one's
        record went with it (:meth:`moved`); else a durable one ends (:meth:`end`) here
        and, by the claim returned (its answer dropped), wherever a copy of its record
        is left. None: nothing to claim."""
        if moved:
            self.moved(sub_id)
            return None
        ident = self.end(sub_id)
        return claim_of(*ident) if ident is not None else None

    def claim(self, client: str, name: str, key: str | None, now: float) -> DurableRecord | None:
        """A claim of (``client``, ``name``) by its client at ``key`` on the host (None:
        passing through): the record kept here, handed over and forgotten — unless the
        claimer holds it here itself (then kept, attached again, and returned as it was
        while its client was away, if it is not the one its attachment has just made:
        what it owes runs from when its client was last heard, not from this claim)."""
        ident = (client, name)
        record = self.records.get(ident)
        if record is None:
            return None
        if key is not None and record.key == key:
            if record.new:
                record.new = False
                return None
            owed = replace(record)
            record.away = None
            self.dirty.add(ident)  # written attached: a restart reads it away since updated
            return owed
        del self.records[ident]
        if record.sub_id is not None:
            self.by_sub.pop(record.sub_id, None)
        self.dirty.add(ident)
        self.stats["durable.claimed"] += 1
        return record

    def answer_claim(self, rounds: ReplayRounds, request: Replay, now: float) -> ClaimAnswer:
        """This broker's answer to a claim (a :class:`~octopis.core.replay.ClaimRecord`
        of ``rounds``) at wall time ``now``: the record kept here is handed over in the
        round's echo (:meth:`claim`; the connection key of the client that asked,
        :meth:`ReplayRounds.requester`, counts only at the host); a subscription of it
        still held here by another connection is withdrawn, and the records are written
        at once."""
        key = rounds.requester(request.req_id) if request.host == self.id else None
        record = self.claim(*claimed_ident(request.claim), key, now)
        if record is None:
            return ClaimAnswer(None, False, rounds.stored(request.req_id, [], []))
        withdraw = None
        if record.key is not None and record.key != key and record.sub_id is not None:
            withdraw = Withdraw(record.key, record.client, record.sub_id)
        claimed = (record.claimed(self.id, now),)
        return ClaimAnswer(withdraw, True, rounds.stored(request.req_id, [], [], claimed=claimed))

    def written(self) -> Written:
        """What the shell writes now: each record changed since the last call (one gone:
        None), in the order of their identities; from then on they count as written
        (:attr:`dirty` is emptied)."""
        dirty, self.dirty = self.dirty, set()
        return {ident: self.records.get(ident) for ident in sorted(dirty)}

    def write(
        self, save: Callable[[dict[tuple[str, str], DurableRecord | None]], None]
    ) -> str | None:
        """Hand what changed since the last write (:meth:`written`) to ``save``, the
        shell's store (both shells write this way). If the store refuses (``save`` raises
        :class:`WriteRefused`: its disk full or failing), those records count as changed
        again, to be written at the next write, the refusal is counted
        (``durable.writes_refused``) and returned; None: written, or nothing to write."""
        changed = self.written()
        if not changed:
            return None
        try:
            save(changed)
        except WriteRefused as exc:
            self.dirty.update(changed)
            self.stats["durable.writes_refused"] += len(changed)
            return str(exc)
        return None

    def expire(self, now: float) -> list[DurableRecord]:
        """Records whose client has been away past ``keep`` at ``now``: abandoned,
        forgotten (run every :data:`SAVE_EVERY` seconds)."""
        gone = [r for r in self.records.values() if r.away is not None and now - r.away > self.keep]
        for record in gone:
            ident = (record.client, record.name)
            del self.records[ident]
            self.dirty.add(ident)
        self.stats["durable.abandoned"] += len(gone)
        return gone

    def expiry_due(self) -> float | None:
        """From when :meth:`expire` abandons a record kept now (the first whose client
        has been away longest, ``keep`` after it went; it goes at the first run after
        that time); None: no client is away."""
        away = [r.away for r in self.records.values() if r.away is not None]
        return min(away) + self.keep if away else None

    def counts(self) -> dict[str, int]:
        """Its counters (:attr:`stats`), the records kept, and how many of their clients
        are away."""
        away = sum(r.away is not None for r in self.records.values())
        return {**self.stats, "durable.kept": len(self.records), "durable.away": away}

    def listed(self, limit: int) -> list[dict[str, object]]:
        """The first ``limit`` records, as an operator sees them: client, name, whether
        attached, since when the client is away (wall time), publishers it acknowledged,
        and from when any other publisher's publications are owed (wall time)."""
        return [
            {
                "client": r.client,
                "name": r.name,
                "attached": r.key is not None,
                "away_since": r.away,
                "publishers": len(r.since),
                "owed_since": r.after,
            }
            for r in itertools.islice(self.records.values(), limit)
        ]

    def restore(self, record: DurableRecord) -> None:
        """A record read back from disk at start: its client is away (since it was last
        heard, or, if it was attached when written, since the record was last updated)."""
        if record.away is None:
            record.away = record.updated
        record.key = record.sub_id = None
        record.new = False
        self.records[(record.client, record.name)] = record
