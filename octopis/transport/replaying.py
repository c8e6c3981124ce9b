"""A broker's part in retention and replay (DESIGN §11): its store, its replay rounds and
its durable subscriptions' records.

The rules are :mod:`octopis.core.replay`'s and :mod:`octopis.core.durable`'s; this shell
keeps the store (:mod:`octopis.transport.retention`, durable records in the same file),
carries the rounds' actions out over the peer links, and answers the requesting client:
``replayed`` notices with the publications, then ``replay_done`` with the summary of the
whole overlay. A store answers page by page (:data:`~octopis.defaults.PAGE_ROWS` rows
read at a time), yielding to live traffic between pages and sending a page only while the
link toward the requester has room (:data:`PAGE_ROOM`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from math import inf
from pathlib import Path

import msgspec

from octopis.client_policy import LastSeen
from octopis.core.answer import CommitWaits
from octopis.core.codec import decode_body, encode_body
from octopis.core.custody import PublishReceipt
from octopis.core.durable import SAVE_EVERY, DurableRecord, Durables
from octopis.core.messages import Forward, Notification
from octopis.core.replay import (
    Budgets,
    ClaimRecord,
    ExpireAt,
    QueryStore,
    Replay,
    ReplayAction,
    ReplayDeliver,
    ReplayDone,
    ReplayMessage,
    ReplayRounds,
    Targets,
    replay_request,
)
from octopis.defaults import PAGE_ROWS
from octopis.logs import RateLimitedLog
from octopis.settings import Durable, Retention
from octopis.transport.retention import RetentionError, RetentionStore, StoreAnswer
from octopis.wire import ClaimedRecord
from octopis.wire.client import ReplayDoneNotice, ReplayedNotice

log = logging.getLogger("octopis.broker")

PAGE_ROOM = 64
"""Frames queued toward the requester above which a store waits before its next page."""
PAGE_WAIT = 0.005
"""Seconds a store waits for that room before it looks again."""


class _Record(msgspec.Struct, array_like=True):
    """A durable record as written to the store."""

    filters: list[str]
    since: list[tuple[str, int, int]]
    after: float
    updated: float
    away: float | None


_encode_record = msgspec.msgpack.Encoder().encode
_decode_record = msgspec.msgpack.Decoder(_Record).decode


def _encoded(r: DurableRecord | None) -> bytes | None:
    """Durable record ``r`` as written to the store (None: deleted)."""
    if r is None:
        return None
    return _encode_record(_Record(list(r.filters), r.since.since(), r.after, r.updated, r.away))


def _decode_kept(body: bytes) -> Notification:
    message = decode_body("store", body)
    if type(message) is not Notification:
        raise RetentionError("the retention store holds a body that is not a notification")
    return message


class Replaying:
    """Retention and replay at broker ``broker_id``: ``send(neighbour, message)`` puts a
    replay message on a peer link, ``targets`` says where a request goes on (SBP's next
    hops, live and down) and ``notify(client key, message)`` tells a local client."""

    def __init__(
        self,
        broker_id: str,
        retention: Retention,
        durable: Durable,
        log_interval: float,
        data_dir: Path | None,
        send: Callable[[str, ReplayMessage], None],
        targets: Targets,
        notify: Callable[[str, dict], bool],
        queued: Callable[[str | None], int] = lambda link: 0,
        withdraw: Callable[[str, str], None] = lambda key, sub_id: None,
    ) -> None:
        self.id = broker_id
        self.retention, self.durable = retention, durable
        self._budgets = Budgets(retention.replay_budget, retention.historic_budget)
        """``[retention]`` and ``[durable]``."""
        self._warn = RateLimitedLog(log, log_interval)
        self.durables = Durables(broker_id, durable.keep, durable.max)
        self._queued, self._withdraw = queued, withdraw
        """``queued(neighbour)``: frames waiting on the link toward it (None: the
        requesting client's connection); ``withdraw(key, sub_id)``: end a local
        subscription whose durable record was claimed by another host."""
        self._answers: set[asyncio.Task] = set()
        self._expiry: asyncio.TimerHandle | None = None
        self.store: RetentionStore | None = None
        if data_dir is not None and retention.max_age > 0:
            self.store = RetentionStore(
                data_dir / f"{broker_id}.retention.sqlite", retention, _decode_kept
            )
            for client, name, data in self.store.durables():
                r = _decode_record(data)
                self.durables.restore(
                    DurableRecord(
                        client,
                        name,
                        tuple(r.filters),
                        r.after,
                        r.updated,
                        LastSeen(((p, s), q) for p, s, q in r.since),
                        away=r.away,
                    )
                )
        self.rounds = ReplayRounds(
            broker_id, targets, retention.replay_rounds, has_store=self.store is not None
        )
        self._send, self._notify = send, notify
        self._waits = CommitWaits()
        """Confirms that wait for the next commit, and when it goes."""
        self._commit_timer: asyncio.TimerHandle | None = None

    def kept(self, n: Notification, body: bytes, receipt: PublishReceipt | None) -> None:
        """A local publication (encoded as ``body``) was accepted: keep it. The store
        holds it like one more neighbour: its publisher's confirm (``receipt``) waits
        for the commit that writes it, as it waits for the neighbours' custody."""
        if self.store is not None:
            self.store.add(n, body, time.time())
            if receipt is not None:
                self._waits.kept(receipt)

    def pass_ended(self, idle: bool) -> None:
        """A client input pass ended (``idle``: the input ran dry): the store commits
        now or within the delay the node's rule says (:meth:`CommitWaits.delay`)."""
        store = self.store
        if store is None or not store.pending:
            return
        delay = self._waits.delay(store.pending, idle)
        if not delay:
            self.commit()
            return
        loop = asyncio.get_running_loop()
        due, timer = loop.time() + delay, self._commit_timer
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            self._commit_timer = loop.call_at(due, self.commit)

    def commit(self) -> None:
        """Write what was kept in one transaction, then confirm what waited for it."""
        if self._commit_timer is not None:
            self._commit_timer.cancel()
            self._commit_timer = None
        if self.store is None or not self.store.pending:
            return
        refusal = None
        try:
            self.store.commit(time.time())
        except RetentionError as exc:
            self._warn.warning("retention", "%s: %s", self.id, exc)
            refusal = str(exc)
        self._waits.committed(refusal)

    def refusal(self) -> str | None:
        """Why a local publication is refused now (the store's disk refused a commit
        moments ago), or None."""
        return self.store.refusal(time.time()) if self.store is not None else None

    def start(
        self,
        key: str | None,
        filters: list[str],
        since: list[tuple[str, int, int]],
        after: float,
        *,
        until: float = inf,
        historic: bool = False,
        answer_max: int = 0,
        answer_bytes: int = 0,
        claim: str = "",
    ) -> str:
        """Client ``key`` asks for what it may have missed (a fail-over), for a window of
        the past (``historic``: a historic, hybrid or durable subscription, waited for
        ``[retention] historic_budget``), or for a durable record (``claim``); returns
        the request's id. With ``key`` None nobody is answered (a claim that only
        ends copies of a record)."""
        req_id = f"{self.id}/{secrets.token_hex(6)}"
        request = replay_request(
            req_id,
            self.id,
            filters,
            since,
            after,
            self._budgets,
            historic=historic,
            claim=claim,
            until=until,
            answer_max=answer_max,
            answer_bytes=answer_bytes,
        )
        log.info(
            "%s: %s %s for %s (%d filters)",
            self.id,
            f"claim of {claim}" if claim else "replay",
            req_id,
            key,
            len(filters),
        )
        self._carry_out(self.rounds.start(request, time.monotonic(), key))
        return req_id

    def receive(self, sender: str, message: ReplayMessage) -> None:
        """A replay message from neighbour ``sender``."""
        self._carry_out(self.rounds.receive(sender, message, time.monotonic()))

    def link_down(self, neighbour: str) -> None:
        """Rounds stop waiting for ``neighbour``'s echo."""
        self._carry_out(self.rounds.link_down(neighbour))

    def expire(self) -> None:
        """Rounds past their budget echo without the silent neighbours (the rounds ask
        for the next deadline)."""
        self._expiry = None
        self._carry_out(self.rounds.expire(time.monotonic()))

    def _expire_at(self, deadline: float) -> None:
        """Have :meth:`expire` run at monotonic time ``deadline`` (or earlier)."""
        if self._expiry is not None:
            if self._expiry.when() <= deadline:
                return
            self._expiry.cancel()
        loop = asyncio.get_running_loop()
        delay = max(deadline - time.monotonic(), 0.0) + 0.01
        self._expiry = loop.call_at(loop.time() + delay, self.expire)

    def close(self) -> None:
        """Stop the answers under way, write what is queued and close the store."""
        for task in self._answers:
            task.cancel()
        if self._expiry is not None:
            self._expiry.cancel()
        if self.store is not None:
            self.save_durables()
            self.store.close()

    # -- durable subscriptions (DESIGN §11) ---------------------------------------------

    async def maintain(self) -> None:
        """Every :data:`~octopis.core.durable.SAVE_EVERY` seconds: write the durable
        records acknowledgements changed, and abandon those whose client has been away
        past ``[durable] keep``."""
        while True:
            await asyncio.sleep(SAVE_EVERY)
            for record in self.durables.expire(time.time()):
                log.warning(
                    "%s: durable subscription %s of %s abandoned: its client has been away "
                    "for more than %g s",
                    self.id,
                    record.name,
                    record.client,
                    self.durable.keep,
                )
            self.save_durables()

    def save_durables(self) -> None:
        """Write the durable records changed since the last write
        (:meth:`~octopis.core.durable.Durables.write`; a record gone is deleted). A
        write the disk refuses is logged (the node counts it and keeps the records
        changed), and written at the next try (:meth:`maintain`'s, every
        :data:`~octopis.core.durable.SAVE_EVERY` seconds): the broker serves on."""
        store = self.store

        def save(changed: dict[tuple[str, str], DurableRecord | None]) -> None:
            if store is not None:
                store.save_durables({ident: _encoded(r) for ident, r in changed.items()})

        refused = self.durables.write(save)
        if refused is not None:
            self._warn.warning(
                "durable", "%s: %s; tried again within %g s", self.id, refused, SAVE_EVERY
            )

    @property
    def stats(self) -> dict[str, float]:
        """Counters of the rounds, the store (rows and bytes kept, when the oldest was
        published) and the durable records (kept, how many of their clients are away)."""
        out: dict[str, float] = dict(self.rounds.stats)
        out.update(self.durables.counts())
        out["replay.answering"] = len(self._answers)
        if self.store is not None:
            out.update(self.store.stats)
            out["retention.rows"], out["retention.bytes"] = self.store.rows, self.store.bytes
            oldest = self.store.oldest()
            if oldest is not None:
                out["retention.oldest"] = oldest
        return out

    def _carry_out(self, actions: list[ReplayAction]) -> None:
        for action in actions:
            if type(action) is Forward:
                self._send(action.link, action.message)
            elif type(action) is ExpireAt:
                self._expire_at(action.deadline)
            elif type(action) is QueryStore:
                self._query(action.request)
            elif type(action) is ClaimRecord:
                self._claim(action.request)
            elif type(action) is ReplayDeliver:
                bodies = [encode_body(n) for n in action.notifications]
                message = ReplayedNotice(id=action.req_id, bodies=bodies)
                self._notify(action.requester, message)
            elif type(action) is ReplayDone:
                echo = action.echo
                log.info(
                    "%s: replay %s %s: %d publications from %d stores, %d without a "
                    "store, silent %s, %d gaps",
                    self.id,
                    "answered late" if action.late else "done",
                    action.req_id,
                    echo.published,
                    len(echo.answered),
                    len(echo.unstored),
                    list(echo.silent),
                    len(echo.gaps),
                )
                done = ReplayDoneNotice(
                    id=action.req_id,
                    answered=list(echo.answered),
                    unstored=list(echo.unstored),
                    silent=list(echo.silent),
                    gaps=list(echo.gaps),
                    published=echo.published,
                    late=action.late,
                    truncated=list(echo.truncated),
                    claimed=[ClaimedRecord(*c) for c in echo.claimed],
                )
                self._notify(action.requester, done)

    def _query(self, request: Replay) -> None:
        assert self.store is not None  # the rounds ask only a broker that has one
        self.commit()
        retention = self.retention
        answer = StoreAnswer(self.store, request, retention.answer_max, retention.answer_bytes)
        if not self._page(answer):
            task = asyncio.get_running_loop().create_task(self._answer(answer))
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)

    async def _answer(self, answer: StoreAnswer) -> None:
        """The rest of a large answer, page by page: between pages the loop serves live
        traffic, and a page waits while the link toward the requester is full."""
        req_id = answer.request.req_id
        link = self.rounds.toward(req_id)
        while True:
            await asyncio.sleep(0)
            while self._queued(link) > PAGE_ROOM:
                await asyncio.sleep(PAGE_WAIT)
            if not self.rounds.answering(req_id) or self._page(answer):
                return

    def _page(self, answer: StoreAnswer) -> bool:
        """The next page of ``answer`` read and handed to the rounds: a part, or the
        last (True) with the gaps and the cut."""
        request = answer.request
        page = answer.page(PAGE_ROWS)
        if not answer.done:
            self._carry_out(self.rounds.part(request.req_id, page))
            return False
        if answer.truncated:
            log.info(
                "%s: answer to %s cut at %d publications, %d bytes",
                self.id,
                request.req_id,
                answer.selection.count,
                answer.selection.bytes,
            )
        self._carry_out(
            self.rounds.stored(request.req_id, page, answer.gaps, truncated=answer.truncated)
        )
        return True

    def _claim(self, request: Replay) -> None:
        """A claim of a durable record: the node's answer
        (:meth:`~octopis.core.durable.Durables.answer_claim`) carried out."""
        answer = self.durables.answer_claim(self.rounds, request, time.time())
        if answer.withdraw is not None:
            self._withdraw(answer.withdraw.key, answer.withdraw.sub_id)
        if answer.save:
            self.save_durables()
        self._carry_out(answer.actions)
