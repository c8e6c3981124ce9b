"""A subscriber's replay across a fail-over (DESIGN §11): what it knows, what it asks for,
and how the answer joins the live stream.

The SDK remembers the last sequence number it delivered of each (publisher, session)
(:class:`LastSeen`, bounded). After a fail-over the new host goes live first (the
subscriptions are made again there), then the subscriber asks the overlay for the gap.
While the answer comes, live deliveries wait beside it (:class:`Seam`); at the end both
are delivered together, each publication once (the connection group's record decides)
and in publisher order, and whatever the overlay could not answer is reported as a
:class:`ReplayGap`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from octopis.client.deliveries import Received
from octopis.client_policy import RecentDeliveries, each_once
from octopis.client_policy import Seam as PolicySeam
from octopis.client_policy import publisher_order as policy_order
from octopis.wire.client import ReplayDoneNotice, ReplayedNotice, delivery_fields


def replayed(name: str, bodies: Iterable[bytes], now: float) -> list[tuple[Received, int]]:
    """Replayed NOTIFY ``bodies`` as deliveries to client ``name`` taken at ``now``, with
    their sizes."""
    found = []
    for body in bodies:
        publisher, seq, published_at, publication, session, opaque = delivery_fields(body)
        received = Received(
            name,
            publisher,
            seq,
            published_at,
            now,
            publication,
            session=session,
            replayed=True,
            body=opaque,
        )
        found.append((received, len(body)))
    return found


def publisher_order(item: tuple[Received, int]) -> tuple[str, int, int]:
    """A delivery of ``(received, size)``'s place in publisher order
    (:func:`~octopis.client_policy.publisher_order`)."""
    return policy_order(item[0])


def join_replayed(
    name: str,
    group: RecentDeliveries,
    live: list[tuple[Received, int]],
    bodies: Iterable[bytes],
    also: Callable[[tuple[str, int, int]], bool] = lambda _: True,
) -> tuple[list[tuple[Received, int]], int]:
    """Client ``name``'s seam (:func:`~octopis.client_policy.join_at_seam`): the ``live``
    deliveries held, with the replayed ``bodies`` not delivered before (the group's
    record decides, and now records them; and ``also``, given publisher, session and
    sequence number), in publisher order; and how many replayed ones were repeats."""
    now = time.time()
    return group.join(name, live, replayed(name, bodies, now), publisher_order, now, also)


@dataclass(frozen=True)
class ReplayGap:
    """What a replay could not fill: publications that may have matched and were not
    delivered. ``silent`` brokers did not answer (down, or past the budget: their
    publishers' publications since the last delivered, or since ``after``, are unknown);
    ``unstored`` brokers keep no retention; ``trimmed`` are ``(publisher, session, first
    seq, last seq)`` ranges retention had dropped; ``error`` says why a request failed
    as a whole."""

    subscriber: str
    replay: str | None
    after: float
    silent: tuple[str, ...] = ()
    unstored: tuple[str, ...] = ()
    trimmed: tuple[tuple[str, int, int, int], ...] = ()
    error: str | None = None


class Seam(PolicySeam[tuple[Received, int], bytes, ReplayDoneNotice]):
    """One request for the past under way (:class:`~octopis.client_policy.Seam`) read
    from the broker's notices: the live deliveries held are ``(received, size)``, the
    answers NOTIFY bodies, the ends ``replay_done`` notices; :attr:`finished` is set once
    the end of :attr:`replay` is in."""

    def __init__(self, limit: int, *, hold_live: bool = True) -> None:
        super().__init__(limit, hold_live=hold_live)
        self.started = time.monotonic()
        self.finished = asyncio.Event()

    def notice(self, message: ReplayedNotice | ReplayDoneNotice) -> None:
        """Take a ``replayed`` or ``replay_done`` notice."""
        if type(message) is ReplayedNotice:
            self.part(message.id, message.bodies)
        else:
            self.end(message.id, message)

    def named(self, replay: str | None) -> bool:
        """The request's reply named it ``replay``: whether its answer is in."""
        if super().named(replay):
            self.finished.set()
            return True
        return False

    def next_request(self) -> ReplayDoneNotice | None:
        """The summary of the request this seam waited for (a claim), and wait for the
        next one (its replay) with the same live deliveries held."""
        self.finished = asyncio.Event()
        return super().next_request()

    def joined(self, name: str, group: RecentDeliveries) -> tuple[list[tuple[Received, int]], int]:
        """The replayed publications not delivered before, with the held live ones, in
        publisher order; and how many replayed ones were repeats."""
        return join_replayed(name, group, self.live, self.answer)

    def answered(self, name: str) -> list[Received]:
        """The answer alone (a historic subscription's), each (publisher, session, seq)
        once, in publisher order."""
        answer = (received for received, _ in replayed(name, self.answer, time.time()))
        return each_once(answer, policy_order)

    def replay_gap(self, name: str, after: float, error: str | None = None) -> ReplayGap | None:
        """The gap this replay leaves client ``name``, if any: what its ``replay_done``
        notice says is missing, and why it falls short as a whole (the client policy's
        :meth:`~octopis.client_policy.Seam.shortfall`)."""
        summary = self.summary
        if summary is None:
            error, silent, unstored, trimmed = self.shortfall(error), (), (), ()
        else:
            error = self.shortfall(error, tuple(summary.truncated))
            silent, unstored = tuple(summary.silent), tuple(summary.unstored)
            trimmed = tuple(summary.gaps)
        if error is None and not (silent or unstored or trimmed):
            return None
        return ReplayGap(name, self.replay, after, silent, unstored, trimmed, error)


@dataclass(frozen=True)
class History:
    """The end of a historic, hybrid or durable subscription's answer: ``complete`` when
    every broker's store answered in full; else ``silent`` (did not answer: down, or
    past the budget), ``unstored`` (keep no retention), ``trimmed`` (ranges retention had
    dropped), ``truncated`` (stores that cut their answer at its bounds) say what is
    missing. ``published``: publications the stores answered; ``delivered``: those
    delivered (the others were repeats)."""

    replay: str | None
    after: float
    until: float | None
    published: int
    delivered: int
    silent: tuple[str, ...] = ()
    unstored: tuple[str, ...] = ()
    trimmed: tuple[tuple[str, int, int, int], ...] = ()
    truncated: tuple[str, ...] = ()
    error: str | None = None

    @property
    def complete(self) -> bool:
        """Whether nothing is missing from the answer."""
        return not (self.silent or self.unstored or self.trimmed or self.truncated or self.error)


_AGO = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time(text: str | float | datetime, now: float | None = None) -> float:
    """A point in time as seconds since the epoch: a number (already one), a
    :class:`~datetime.datetime` (naive ones are UTC), ``"all"`` (the oldest retained:
    0), ``"now"``, a duration ago (``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``) or an ISO 8601 time
    (``"2026-11-27T10:00Z"``; without a zone, UTC). Raises ``ValueError`` naming the
    accepted forms."""
    if isinstance(text, datetime):
        moment = text if text.tzinfo is not None else text.replace(tzinfo=UTC)
        return moment.timestamp()
    if isinstance(text, int | float):
        return float(text)
    value = text.strip()
    if value == "all":
        return 0.0
    if value == "now":
        return time.time() if now is None else now
    ago = _AGO.match(value)
    if ago is not None:
        return (time.time() if now is None else now) - float(ago[1]) * _UNITS[ago[2]]
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"cannot read {text!r} as a time: give 'all', 'now', a duration ago such as 90s, 10m, "
            "2h or 1d, or an ISO 8601 time such as 2026-11-27T10:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
