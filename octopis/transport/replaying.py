"""A broker's part in retention and replay (DESIGN §11): its store and its replay rounds.

The rules are :mod:`octopis.core.replay`'s; this shell keeps the store
(:mod:`octopis.transport.retention`), carries the rounds' actions out over the peer
links, and answers the requesting client: ``replayed`` notices with the publications,
then ``replay_done`` with the summary of the whole overlay.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from octopis.core.messages import Forward, Notification
from octopis.core.replay import (
    QueryStore,
    Replay,
    ReplayAction,
    ReplayDeliver,
    ReplayDone,
    ReplayMessage,
    ReplayRounds,
    Targets,
)
from octopis.transport.codec import decode_body, encode_body
from octopis.transport.links import PublishReceipt
from octopis.transport.retention import RetentionError, RetentionStore
from octopis.transport.settings import BrokerSettings

log = logging.getLogger("octopis.broker")

COMMIT_ROWS = 256
"""Publications kept before the store commits at once, however busy the input."""
COMMIT_DELAY = 0.002
"""Seconds a busy broker waits at most to commit what it kept (its confirms wait too)."""


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
        settings: BrokerSettings,
        data_dir: Path | None,
        send: Callable[[str, ReplayMessage], None],
        targets: Targets,
        notify: Callable[[str, dict], bool],
    ) -> None:
        self.id = broker_id
        self.settings = settings
        self.rounds = ReplayRounds(broker_id, targets, settings.replay_rounds)
        self.store: RetentionStore | None = None
        if data_dir is not None and settings.retention_age > 0:
            self.store = RetentionStore(
                data_dir / f"{broker_id}.retention.sqlite",
                settings.retention_bytes,
                settings.retention_age,
                _decode_kept,
            )
        self._send, self._notify = send, notify
        self._receipts: list[PublishReceipt] = []
        """Confirms that wait for the next commit."""
        self._commit_timer: asyncio.TimerHandle | None = None
        self.requesters: OrderedDict[str, str] = OrderedDict()
        """Requests started here → the client key that asked (as many as rounds)."""

    def kept(self, n: Notification, body: bytes, receipt: PublishReceipt | None) -> None:
        """A local publication (encoded as ``body``) was accepted: keep it. The store
        holds it like one more neighbour: its publisher's confirm (``receipt``) waits
        for the commit that writes it, as it waits for the neighbours' custody."""
        if self.store is not None:
            self.store.add(n, body, time.time())
            if receipt is not None:
                receipt.copies += 1
                self._receipts.append(receipt)

    def pass_ended(self, idle: bool) -> None:
        """A client input pass ended (``idle``: the input ran dry). The store commits
        when the input is idle or :data:`COMMIT_ROWS` wait, else within
        :data:`COMMIT_DELAY`: under load one transaction covers many passes, and an
        awaited publish on an idle broker is written at once."""
        store = self.store
        if store is None or not store.pending:
            return
        if idle or len(store.pending) >= COMMIT_ROWS:
            self.commit()
        elif self._commit_timer is None:
            loop = asyncio.get_running_loop()
            self._commit_timer = loop.call_later(COMMIT_DELAY, self.commit)

    def commit(self) -> None:
        """Write what was kept in one transaction, then confirm what waited for it."""
        if self._commit_timer is not None:
            self._commit_timer.cancel()
            self._commit_timer = None
        if self.store is None or not self.store.pending:
            return
        self.store.commit(time.time())
        receipts, self._receipts = self._receipts, []
        for receipt in receipts:
            receipt.held()

    def start(
        self, key: str, filters: list[str], since: list[tuple[str, int, int]], after: float
    ) -> str:
        """Client ``key`` asks for what it may have missed; returns the request's id."""
        req_id = f"{self.id}/{secrets.token_hex(6)}"
        self.requesters[req_id] = key
        while len(self.requesters) > self.settings.replay_rounds:
            self.requesters.popitem(last=False)
        request = Replay(
            req_id, self.id, tuple(filters), tuple(since), after, self.settings.replay_budget
        )
        log.info("%s: replay %s for %s (%d filters)", self.id, req_id, key, len(filters))
        self._carry_out(self.rounds.start(request, time.monotonic()))
        return req_id

    def receive(self, sender: str, message: ReplayMessage) -> None:
        """A replay message from neighbour ``sender``."""
        self._carry_out(self.rounds.receive(sender, message, time.monotonic()))

    def link_down(self, neighbour: str) -> None:
        """Rounds stop waiting for ``neighbour``'s echo."""
        self._carry_out(self.rounds.link_down(neighbour))

    def expire(self) -> None:
        """Rounds past their budget echo without the silent neighbours."""
        if self.rounds.rounds:
            self._carry_out(self.rounds.expire(time.monotonic()))

    def close(self) -> None:
        """Write what is queued and close the store."""
        if self.store is not None:
            self.store.close()

    @property
    def stats(self) -> dict[str, int]:
        """Counters of the rounds and of the store (rows and bytes kept among them)."""
        out = dict(self.rounds.stats)
        if self.store is not None:
            out.update(self.store.stats)
            out["retention.rows"], out["retention.bytes"] = self.store.rows, self.store.bytes
        return out

    def _carry_out(self, actions: list[ReplayAction]) -> None:
        for action in actions:
            if type(action) is Forward:
                self._send(action.link, action.message)
            elif type(action) is QueryStore:
                asyncio.get_running_loop().call_later(action.request.budget, self.expire)
                self._query(action.request)
            elif type(action) is ReplayDeliver:
                key = self.requesters.get(action.req_id)
                bodies = [encode_body(n) for n in action.notifications]
                if key is not None:
                    self._notify(key, {"op": "replayed", "id": action.req_id, "bodies": bodies})
            elif type(action) is ReplayDone:
                key = self.requesters.get(action.req_id)
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
                if key is not None:
                    self._notify(
                        key,
                        {
                            "op": "replay_done",
                            "id": action.req_id,
                            "answered": list(echo.answered),
                            "unstored": list(echo.unstored),
                            "silent": list(echo.silent),
                            "gaps": [list(g) for g in echo.gaps],
                            "published": echo.published,
                            "late": action.late,
                        },
                    )

    def _query(self, request: Replay) -> None:
        if self.store is None:
            found, gaps = [], []
        else:
            self.commit()
            found, gaps = self.store.answer(request)
        self._carry_out(
            self.rounds.stored(request.req_id, found, gaps, has_store=self.store is not None)
        )
