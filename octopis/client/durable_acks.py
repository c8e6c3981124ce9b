"""A subscriber's acknowledgements of its durable subscriptions (DESIGN §11): what the
application took of each, per (publisher, session), sent to the broker that keeps the
subscription's record at the event loop's next pass, and sent whole again to a new host
after a fail-over, a move or a claim."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from octopis.client.deliveries import Received
from octopis.client_policy import C, ClaimAnswer, DurableProgress
from octopis.wire.client import AckRequest


class DurableStream(Protocol):
    """What :meth:`DurableAcks.offer` needs of a stream."""

    durable: str | None

    def offer(self, received: Received, size: int) -> None:
        """Queue ``received`` for the application."""


class DurableAcks:
    """The acknowledgements of client ``name``, sent with ``send`` (a message to its
    current broker, not awaited)."""

    def __init__(self, name: str, send: Callable[[dict[str, Any]], None]) -> None:
        self.name = name
        self.send = send
        self._progress: dict[str, DurableProgress] = {}
        """Per durable name: what the application took (acknowledged to the broker), what
        a claimed record says was taken, from when other publishers' publications are
        owed (sent with the acknowledgements to the new record)."""
        self._unacked: dict[str, dict[tuple[str, int], int]] = {}
        """Per durable name: what was taken and not acknowledged yet."""
        self.covered = 0
        """Live deliveries dropped because a claimed record said they were taken."""
        self._soon: asyncio.Handle | None = None

    def took(self, durable: str, received: Received) -> None:
        """The application took ``received`` of durable subscription ``durable``: it is
        acknowledged at the loop's next pass (with what else was taken)."""
        progress = self._progress.setdefault(durable, DurableProgress())
        key = (received.publisher, received.session)
        self._unacked.setdefault(durable, {})[key] = progress.took(*key, received.seq)
        self._send_soon()

    def claim_answered(
        self, durable: str, claimed: Sequence[C], silent: Sequence[str], error: str | None
    ) -> ClaimAnswer[C]:
        """``durable``'s claim ended with the copies ``claimed``, the brokers ``silent``
        and ``error``: what the client policy decides
        (:meth:`~octopis.client_policy.DurableProgress.claim_answered`)."""
        progress = self._progress.setdefault(durable, DurableProgress())
        return progress.claim_answered(claimed, silent, error)

    def progress(self, durables: Iterable[str]) -> list[DurableProgress]:
        """The progress of each of ``durables`` (a fail-over moves where their records
        owe from: :meth:`~octopis.client_policy.SubscriberReplays.failed_over`)."""
        return [self._progress.setdefault(d, DurableProgress()) for d in durables]

    def offer(self, stream: DurableStream, received: Received, size: int) -> None:
        """Hand ``received`` to ``stream``, unless ``stream`` is durable and the record it
        claimed says a process before this one took it: a copy that came late (held for
        a link that was down) to the subscription made anew (counted in
        :attr:`covered`)."""
        progress = self._progress.get(stream.durable) if stream.durable is not None else None
        if progress is not None and progress.covers(
            received.publisher, received.session, received.seq
        ):
            self.covered += 1
            return
        stream.offer(received, size)

    def ack_all(self, durables: Iterable[str]) -> None:
        """Acknowledge each of ``durables``' whole record again (its new host keeps a
        record of its own after a fail-over or a move)."""
        for durable in set(durables):
            progress = self._progress.get(durable)
            whole = progress.whole() if progress is not None else None
            if whole is not None:
                self._unacked.setdefault(durable, {}).update(((p, s), q) for p, s, q in whole)
        if self._unacked:
            self._send_soon()

    def _send_soon(self) -> None:
        if self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self._send)

    def _send(self) -> None:
        self._soon = None
        unacked, self._unacked = self._unacked, {}
        for durable, taken in unacked.items():
            since = [(p, s, q) for (p, s), q in taken.items()]
            after = self._progress[durable].owed_after
            self.send(AckRequest(client=self.name, durable=durable, since=since, after=after))
