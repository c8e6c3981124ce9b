"""A durable STOMP subscription (DESIGN §11, §13), sans-IO: the broker requests the SDK's
durable subscriptions make, driven for one ``SUBSCRIBE`` that names
``activemq.subscriptionName`` on a connection whose CONNECT named a ``client-id``.

Its PADRES subscriptions (one per disjunct of the selector) are durable under the
client name ``stomp:<client-id>/<subscription name>`` and the durable names ``0``, ``1``,
..., so the records are the SDK's: kept at the host while the client is away, claimed
at whichever broker it comes back to. The steps, in order:

1. subscribed: every disjunct is in place here (live deliveries wait from now on);
2. claimed: each disjunct's record was looked for across the overlay; the copies found
   say what the client took of each publisher and since when others' publications are
   owed, as the SDK's claim decides
   (:meth:`~octopis.client_policy.DurableProgress.claim_answered`), acknowledged to the
   records here;
3. replayed: the retained publications owed since then are delivered with the live
   ones that waited, each once, in publisher order; then live traffic.

What is acknowledged to the record: for ``ack:auto`` a message as it is sent; for
``client`` and ``client-individual`` a message once the client ACKs it. The record keeps,
per publisher, the last message before the first one still unacknowledged, so every
message not acknowledged when the client went away is delivered again when it comes
back (one acknowledged after an unacknowledged one of the same publisher comes again
too).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from octopis.client_policy import DurableProgress, Key, LastSeen
from octopis.wire import pack
from octopis.wire.client import (
    AckRequest,
    ClaimRequest,
    ReplayDoneNotice,
    ReplayRequest,
    read_notify,
)


class DurableRefusal(ValueError):
    """What a durable subscription cannot do (its connection gets an ERROR)."""


def key_of(body: bytes) -> Key:
    """The publication a NOTIFY ``body`` carries."""
    n = read_notify(body)
    return n.publisher, n.session, n.seq


@dataclass(eq=False)
class DurableSubscription:
    """The durable state of one STOMP subscription of client ``client`` over ``filters``
    (PADRES text, one per durable name ``0``, ``1``, ...). ``limit`` bounds the live
    deliveries held while the past is replayed and the publications remembered to
    deliver each once across that seam."""

    client: str
    filters: list[str]
    limit: int
    step: str = "subscribing"
    """``subscribing``, ``claiming``, ``replaying`` or ``live``."""
    held: list[bytes] = field(default_factory=list)
    """Live deliveries waiting for the replay."""
    replayed: list[bytes] = field(default_factory=list)
    """Replayed NOTIFY bodies."""
    waiting: set[str] = field(default_factory=set)
    """Claims or the replay (by id) not answered yet."""
    claims_left: int = 0
    found: list[Any] = field(default_factory=list)
    """Records found by the claims."""
    silent: list[str] = field(default_factory=list)
    """Brokers silent to the claims."""
    progress: DurableProgress = field(default_factory=DurableProgress)
    """The client policy's progress: acknowledged to the record (its ``taken``: the last
    publication before the first unacknowledged one, per (publisher, session)) and the
    claimed record's start for other publishers (its ``owed_after``, carried to the
    records here)."""
    outstanding: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    """Delivered and not acknowledged yet, per (publisher, session)."""
    delivered: LastSeen = field(default_factory=LastSeen)
    """The last publication delivered, per (publisher, session)."""
    by_message: dict[str, Key] = field(default_factory=dict)
    """Message id → the publication it carried (until acknowledged)."""
    recent: deque[Key] = field(default_factory=deque)
    recent_set: set[Key] = field(default_factory=set)
    gap: str | None = None
    """Why its claims left a gap (the client policy's
    :meth:`~octopis.client_policy.DurableProgress.claim_answered`; None: none), for the
    listener's rate-limited log."""

    @property
    def names(self) -> list[str]:
        """The durable names of the disjuncts."""
        return [str(i) for i in range(len(self.filters))]

    @property
    def holding(self) -> bool:
        """Live deliveries wait (the past is not delivered yet)."""
        return self.step != "live"

    def hold(self, body: bytes) -> None:
        """Keep a live delivery until the replay is done; DurableRefusal past ``limit``."""
        if len(self.held) >= self.limit:
            raise DurableRefusal(
                f"{len(self.held)} live messages wait for the durable subscription's replay "
                "(stomp.unacked)"
            )
        self.held.append(body)

    def claims(self, next_req: Iterable[int]) -> list[tuple[int, bytes]]:
        """Every disjunct is in place: the claims of its records, as (req, request)."""
        self.step = "claiming"
        self.claims_left = len(self.filters)
        return [
            (req, pack(ClaimRequest(client=self.client, req=req, durable=name)))
            for req, name in zip(next_req, self.names, strict=False)
        ]

    def claim_done(self, notice: ReplayDoneNotice, req: int) -> list[bytes]:
        """One claim answered (its ``replay_done`` notice); once all are, the requests
        that follow: acknowledgements and the replay (numbered ``req``), or none (a new
        durable subscription goes live at once)."""
        self.found += notice.claimed
        self.silent += notice.silent
        self.claims_left -= 1
        if self.claims_left > 0:
            return []
        answer = self.progress.claim_answered(self.found, self.silent)
        self.gap = answer.gap
        if answer.resumed is None:
            self.step = "live"
            return []
        self.step = "replaying"
        message = ReplayRequest(
            client=self.client,
            req=req,
            filters=self.filters,
            since=[list(s) for s in answer.since],
            after=answer.after,
            historic=True,
        )
        return [*self.acks(), pack(message)]

    def acks(self) -> list[bytes]:
        """What was taken, acknowledged to each disjunct's record here."""
        since = [list(s) for s in self.progress.taken.since()]
        after = self.progress.owed_after
        return [
            pack(AckRequest(client=self.client, durable=name, since=since, after=after))
            for name in self.names
        ]

    def replay_done(self) -> list[bytes]:
        """The replay is answered: the replayed publications not delivered before, in
        publisher order, then the live ones that waited (each once); live from now on."""
        self.step = "live"
        replayed = sorted(self.replayed, key=key_of)
        out = [b for b in replayed + self.held if self.first_time(key_of(b))]
        self.replayed, self.held = [], []
        return out

    def first_time(self, key: Key) -> bool:
        """Whether ``key`` comes for the first time (the last ``limit`` are remembered)."""
        if key in self.recent_set:
            return False
        self.recent.append(key)
        self.recent_set.add(key)
        if len(self.recent) > self.limit:
            self.recent_set.discard(self.recent.popleft())
        return True

    def sent(self, body: bytes, message_id: str, acked: bool) -> Key:
        """``body`` went to the client as ``message_id``; ``acked``: it needs no ACK."""
        key = self.delivered_key(body)
        if not acked:
            self.by_message[message_id] = key
            self.outstanding.setdefault(key[:2], set()).add(key[2])
        return key

    def delivered_key(self, body: bytes) -> Key:
        """Note ``body`` as delivered; its key."""
        key = key_of(body)
        self.delivered.saw(*key)
        return key

    def settled(self, message_ids: Iterable[str]) -> list[bytes]:
        """The client acknowledged ``message_ids``: the record's acknowledgements."""
        for message_id in message_ids:
            key = self.by_message.pop(message_id, None)
            if key is not None:
                self.outstanding.get(key[:2], set()).discard(key[2])
        return self.advance()

    def advance(self) -> list[bytes]:
        """Acknowledge, per (publisher, session), up to the first unacknowledged message."""
        changed = False
        for (publisher, session), last in list(self.delivered.items()):
            open_ = self.outstanding.get((publisher, session))
            upto = min(open_) - 1 if open_ else last
            if upto > self.progress.taken.get((publisher, session), 0):
                self.progress.took(publisher, session, upto)
                changed = True
            if not open_:
                self.outstanding.pop((publisher, session), None)
        return self.acks() if changed else []
