"""The composite subscriptions a broker hosts (DESIGN §12), sans-IO: their parts installed
as ordinary local subscriptions, the publications delivered for them joined
(:class:`~octopis.core.composite.CompositeJoin`), and what each client is told.

The parts of one composite share one local subscriber key (``composite:<n>``, never a
client's: those hold a ``/``), so the routing core delivers a publication once per
composite however many of its parts it matches. The client sees one subscription id
(the first part's, with ``&``). Each match becomes one ``composite`` notice; a
``composite_dropped`` notice tells the client when its composite's join let publications
go to stay within ``max_held`` (or cut an arrival's matches), at most once every
:data:`REPORT_INTERVAL` seconds, with the totals (each ``composite`` notice carries them
too). A composite does not move between brokers: its client subscribes afresh.

The process shell and the simulator both host composites through this class, with their
own clock (``now``) and their own way of reaching the client; which of a client's
subscriptions it hosts and which the routing core takes is its rule
(:meth:`HostedComposites.local_subscribe`), not theirs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from octopis.core.composite import CompositeJoin, Match
from octopis.core.messages import Action, Notification
from octopis.filters.composite import Composite
from octopis.filters.language import Subscription
from octopis.wire.client import CompositeDroppedNotice, CompositeNotice, Notice

REPORT_INTERVAL = 1.0
"""Seconds between two ``composite_dropped`` notices of one composite."""


@dataclass
class Hosted:
    """One composite subscription hosted here."""

    client: str
    """The subscribing client's key."""
    sub_id: str
    """Its id as the client knows it."""
    key: str
    """The local subscriber key its parts are installed under."""
    part_ids: list[str]
    join: CompositeJoin
    reported: tuple[int, int] = (0, 0)
    """(dropped, cut) as last told to the client."""
    reported_at: float = float("-inf")


class HostedComposites:
    """The composite subscriptions of one broker: ``subscribe`` and ``unsubscribe`` are
    the routing core's local ones (key, subscription, time → id, actions; key, id →
    actions), ``notify`` reaches a client (client key, notice → whether the client got
    it), ``counters`` gets ``composite.*`` counts."""

    def __init__(
        self,
        subscribe: Callable[[str, Subscription, float], tuple[str, list[Action]]],
        unsubscribe: Callable[[str, str], list[Action]],
        notify: Callable[[str, Notice], bool],
        max_held: int,
        lateness: float,
        counters: Counter[str],
    ) -> None:
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self._notify = notify
        self.max_held = max_held
        self.lateness = lateness
        self.counters = counters
        self.by_key: dict[str, Hosted] = {}
        """Local subscriber key of the parts → the composite."""
        self.by_id: dict[str, Hosted] = {}
        self._made = 0

    def subscribe(self, client: str, composite: Composite, now: float) -> tuple[str, list[Action]]:
        """Install ``composite`` for client key ``client``: each part as a local
        subscription (SBP spreads it); returns the composite's id and the actions."""
        self._made += 1
        key = f"composite:{self._made}"
        part_ids: list[str] = []
        actions: list[Action] = []
        for part in composite.parts:
            part_id, more = self._subscribe(key, part.routing, now)
            part_ids.append(part_id)
            actions += more
        sub_id = f"{part_ids[0]}&"
        hosted = Hosted(
            client, sub_id, key, part_ids, CompositeJoin(composite, self.max_held, self.lateness)
        )
        self.by_key[key] = hosted
        self.by_id[sub_id] = hosted
        self.counters["composite.subscriptions"] += 1
        return sub_id, actions

    def local_subscribe(
        self, client: str, subscription: Subscription | Composite, now: float
    ) -> tuple[str, list[Action]]:
        """Client ``client`` subscribes ``subscription`` here: a composite is hosted here
        (:meth:`subscribe`), any other goes to the routing core as it is (DESIGN §12);
        returns its id and the actions."""
        if isinstance(subscription, Composite):
            return self.subscribe(client, subscription, now)
        return self._subscribe(client, subscription, now)

    def local_unsubscribe(self, client: str, sub_id: str) -> list[Action]:
        """Client ``client`` withdraws ``sub_id``: its composite hosted here
        (:meth:`unsubscribe`), else the routing core's subscription; the actions."""
        if self.holds(client, sub_id):
            return self.unsubscribe(client, sub_id)
        return self._unsubscribe(client, sub_id)

    def holds(self, client: str, sub_id: str) -> bool:
        """Whether ``sub_id`` is a composite of ``client`` hosted here."""
        hosted = self.by_id.get(sub_id)
        return hosted is not None and hosted.client == client

    def movable_problem(self, sub_id: str) -> str | None:
        """Why subscription ``sub_id`` cannot move to another broker (None: it can)."""
        if sub_id in self.by_id:
            return f"{sub_id} is a composite subscription: move by subscribing afresh"
        return None

    def unsubscribe(self, client: str, sub_id: str) -> list[Action]:
        """Withdraw composite ``sub_id`` of ``client``: every part (SBP withdraws them)."""
        hosted = self.by_id.pop(sub_id)
        del self.by_key[hosted.key]
        actions: list[Action] = []
        for part_id in hosted.part_ids:
            actions += self._unsubscribe(hosted.key, part_id)
        return actions

    def deliver(self, key: str, n: Notification, now: float) -> bool:
        """A publication delivered at time ``now`` to local subscriber ``key``: if that is
        a composite's, join it and notify its client of each match it completes (one
        ``composite`` notice each), then of what was dropped when a ``composite_dropped``
        notice is due; True. False: ``key`` is no composite's."""
        hosted = self.by_key.get(key)
        if hosted is None:
            return False
        join = hosted.join
        counts = (join.dropped, join.late, join.cut)
        matches = join.offer((n.publisher, n.session, n.seq), n.published_at, n.publication, now)
        counters, notify = self.counters, self._notify
        counters["composite.parts"] += 1
        counters["composite.dropped"] += join.dropped - counts[0]
        counters["composite.late"] += join.late - counts[1]
        counters["composite.cut"] += join.cut - counts[2]
        for match in matches:
            got = notify(hosted.client, self._notice(hosted, match))
            counters["composite.matches" if got else "undeliverable.client_gone"] += 1
        if (join.dropped, join.cut) != hosted.reported and (
            now - hosted.reported_at >= REPORT_INTERVAL
        ):
            hosted.reported, hosted.reported_at = (join.dropped, join.cut), now
            notify(
                hosted.client,
                CompositeDroppedNotice(
                    sub_id=hosted.sub_id, dropped=join.dropped, late=join.late, cut=join.cut
                ),
            )
        return True

    @staticmethod
    def _notice(hosted: Hosted, match: Match) -> CompositeNotice:
        join = hosted.join
        parts = [
            (*held.key, held.published_at, held.publication, list(parts))
            for held, parts in match.parts
        ]
        return CompositeNotice(
            sub_id=hosted.sub_id, parts=parts, dropped=join.dropped, late=join.late, cut=join.cut
        )
