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
from octopis.transport.retention import RetentionError, RetentionStore
from octopis.transport.settings import BrokerSettings

log = logging.getLogger("octopis.broker")


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
        self.requesters: OrderedDict[str, str] = OrderedDict()
        """Requests started here → the client key that asked (as many as rounds)."""

    def kept(self, n: Notification) -> None:
        """A local publication was accepted: keep it (written at :meth:`commit`)."""
        if self.store is not None:
            self.store.add(n, encode_body(n), time.time())

    def commit(self) -> None:
        """End of a client input pass: what it accepted is on disk before any of its
        confirms can leave."""
        if self.store is not None and self.store.pending:
            self.store.commit(time.time())

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
