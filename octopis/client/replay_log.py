"""The records of a subscriber's replays (DESIGN §11): what each replayed and the gap it
left, kept while some of the brokers it asked were silent, so that their late answers
are delivered without repeats and narrow the gap."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from octopis.client.deliveries import Received
from octopis.client.replay import ReplayGap, Seam, join_replayed
from octopis.client_policy import LateAnswers, RecentDeliveries
from octopis.wire.client import ReplayDoneNotice, ReplayedNotice

log = logging.getLogger("octopis.client")


class ReplayLog:
    """The replays of client ``name``: ``recent`` is its connection group's record of
    deliveries, ``deliver`` hands a late answer's publication to the client; a gap goes
    to ``on_gap``, and ``on_gap_filled`` is told ``(gap, left)`` when brokers a gap named
    silent answered later and their publications were delivered (``left``: what is still
    missing, None: nothing)."""

    def __init__(
        self,
        name: str,
        recent: RecentDeliveries,
        deliver: Callable[[Received, int], None],
        on_gap: Callable[[ReplayGap], None] | None = None,
        on_gap_filled: Callable[[ReplayGap, ReplayGap | None], None] | None = None,
    ) -> None:
        self.name = name
        self.recent = recent
        self.deliver = deliver
        self.on_gap = on_gap
        self.on_gap_filled = on_gap_filled
        self.gaps: deque[ReplayGap] = deque(maxlen=1000)
        """What replays could not fill and is still missing (the last 1,000): a gap
        whose silent brokers answer later is narrowed, or withdrawn once filled."""
        self.replays: deque[dict[str, Any]] = deque(maxlen=1000)
        """One record per replay (the last 1,000): id, replayed, repeats, seconds, gap."""
        self.late = LateAnswers()
        """Per replay of :attr:`_records`, the silent brokers not yet answered late, and
        what was delivered since (a late answer repeats none of it)."""
        self._records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """The records of :attr:`replays` by request id: late answers are added to them."""

    def add(
        self,
        seam: Seam,
        items: list[tuple[Received, int]],
        repeats: int,
        gap: ReplayGap | None,
    ) -> int:
        """A replay through ``seam`` delivered ``items`` (``repeats`` dropped) and left
        ``gap``: record it (and report the gap); returns how many items were replayed."""
        replayed = sum(1 for received, _ in items if received.replayed)
        record = {
            "id": seam.replay,
            "replayed": replayed,
            "repeats": repeats,
            "seconds": time.monotonic() - seam.started,
            "gap": gap,
            "late_replayed": 0,
            "late_parts": [],
        }
        self.replays.append(record)
        if seam.replay is not None:
            delivered = [(r.publisher, r.session, r.seq) for r, _ in items]
            self.late.ended(seam.replay, delivered, gap.silent if gap is not None else ())
            self._records[seam.replay] = record
            while len(self._records) > self.replays.maxlen:  # type: ignore[operator]
                self.late.forget(self._records.popitem(last=False)[0])
        log.info("%s replayed %d publications (%d repeats)", self.name, replayed, repeats)
        if gap is not None:
            self.report(gap)
        return replayed

    def answer(self, message: ReplayedNotice | ReplayDoneNotice) -> bool:
        """A ``replayed`` or ``replay_done`` notice: False unless it answers a replay
        already finished (:meth:`late_answer`)."""
        record = self._records.get(message.id)
        if record is None:
            return False
        self.late_answer(record, message)
        return True

    def late_answer(
        self, record: dict[str, Any], message: ReplayedNotice | ReplayDoneNotice
    ) -> None:
        """An answer to a finished replay from a part that was silent then (a broker
        that restarted and took the request with the subscriptions held for it): its
        publications not delivered before are delivered now (after the live ones that
        came meanwhile), and the part is noted in the replay's record."""
        if type(message) is ReplayedNotice:
            fresh, repeats = join_replayed(
                self.name,
                self.recent,
                [],
                message.bodies,
                also=self.late.fresh(record["id"]),
            )
            for received, size in fresh:
                self.deliver(received, size)
            record["late_replayed"] += len(fresh)
            record["repeats"] += repeats
            return
        record["late_parts"].append(
            {
                k: getattr(message, k)
                for k in ("answered", "silent", "unstored", "gaps", "published")
            }
        )
        self.late.answered(record["id"], message.answered, message.silent)
        self._narrow(record)
        log.info(
            "%s: replay %s answered late by %s (%d publications)",
            self.name,
            record["id"],
            message.answered,
            message.published,
        )

    def _narrow(self, record: dict[str, Any]) -> None:
        """A replay's silent brokers answered late (their publications are delivered):
        its gap shrinks to the brokers still silent, and goes once nothing is missing;
        :attr:`gaps` and ``on_gap_filled`` are told."""
        gap = record["gap"]
        if gap is None:
            return
        outstanding = self.late.outstanding.get(record["id"], ())
        silent = tuple(b for b in gap.silent if b in outstanding)
        if silent == gap.silent:
            return
        left = replace(gap, silent=silent)
        if not (silent or left.unstored or left.trimmed or left.error):
            left = None
        record["gap"] = left
        kept = [left if g is gap else g for g in self.gaps]
        self.gaps = deque((g for g in kept if g is not None), maxlen=self.gaps.maxlen)
        log.info("%s: a replay's gap was filled late: %s, left %s", self.name, gap, left)
        if self.on_gap_filled is not None:
            self.on_gap_filled(gap, left)

    def report(self, gap: ReplayGap) -> None:
        """A replay (or a claim) left ``gap``: logged, kept, and told to ``on_gap``."""
        log.warning("%s: a replay left a gap: %s", self.name, gap)
        self.gaps.append(gap)
        if self.on_gap is not None:
            self.on_gap(gap)
