"""Advertisements on the SCOT (DESIGN §12): subscriptions travel only toward publishers.

A publisher at B(y, k) advertises a filter; the advertisement spreads by SBP's two steps
(PRIMARY over cluster k's tree, SECONDARY over each iCOL), so every broker holds it once.
Each broker notes which of its links *opens* toward the advertisement's host for the
subscriptions of its own cluster, as SNR routes a notification from B(y, k) to a
subscriber at B(x, c): over the iCOL B(y, k) → B(y, c), then along cluster c's tree
from region y to region x. So at B(z, c):

- the tree neighbour toward region y opens (an advertisement that came PRIMARY from a
  tree neighbour came from it; one that came SECONDARY carries the region of the
  sender's tree neighbour it came from, and regions are shared by all clusters);
- in region y itself, the iCOL to B(y, k) opens (the advertisement came SECONDARY
  straight from its host).

A subscription of cluster c goes over a link only if an advertisement that opened it
may match what the subscription wants (:func:`octopis.filters.covering.intersects`), and over the
links that an advertisement opens later when that one arrives. Under DNR a copy may
enter cluster c at any region (a CBV copy, paper §6.3), so there subscriptions still go
over every tree edge and only the iCOLs are chosen by advertisements: secondary entries
are read only at a publisher's host.

A subscription's withdrawal goes where the subscription went; an advertisement's
withdrawal removes it everywhere and leaves the subscriptions it drew where they are
(an entry no publisher feeds costs memory, never a delivery).

With covering too, advertisements decide only where a subscription is *drawn*
(:meth:`Advertising.draws`), and :class:`~octopis.core.covering.Covering` keeps where it
went and sends it over a link it is drawn over only if nothing sent there covers it (see
that module); :attr:`Advertising.sent` and :attr:`Advertising.maybe` then stay empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from octopis.filters.covering import intersects
from octopis.filters.language import Subscription


@dataclass(frozen=True, slots=True)
class AdvertEntry:
    """An advertisement as one broker holds it: from ``last_hop`` (a local publisher, or
    a neighbour), hosted at ``host``; ``opens`` is the link it opens for this broker's
    subscriptions (None: its publisher is here, nothing to open)."""

    adv_id: str
    advertisement: Subscription
    host: str
    last_hop: str
    opens: str | None
    local: bool


class Advertising:
    """One broker's advertisements and where its cluster's subscriptions went."""

    __slots__ = ("by_link", "entries", "maybe", "publishers", "sent")

    def __init__(self) -> None:
        self.entries: dict[str, AdvertEntry] = {}
        """adv_id → the advertisement held here."""
        self.by_link: dict[str, dict[str, Subscription]] = {}
        """Link → the advertisements (adv_id → filter) that opened it."""
        self.publishers: dict[str, dict[str, Subscription]] = {}
        """Local publisher → its advertisements (adv_id → filter)."""
        self.sent: dict[str, set[str]] = {}
        """sub_id → the links it went over, for this cluster's subscriptions held here."""
        self.maybe: dict[str, set[str]] = {}
        """sub_id → links over which a restarted broker's predecessor may have sent it
        (a resync share entry): its withdrawal goes there too."""

    def add(self, entry: AdvertEntry) -> None:
        """Hold ``entry`` (one already held under its id is replaced)."""
        self.remove(entry.adv_id)
        self.entries[entry.adv_id] = entry
        if entry.opens is not None:
            self.by_link.setdefault(entry.opens, {})[entry.adv_id] = entry.advertisement
        if entry.local:
            self.publishers.setdefault(entry.last_hop, {})[entry.adv_id] = entry.advertisement

    def remove(self, adv_id: str) -> AdvertEntry | None:
        """Forget ``adv_id``; returns its entry, None if it was not held."""
        entry = self.entries.pop(adv_id, None)
        if entry is None:
            return None
        if entry.opens is not None:
            opened = self.by_link[entry.opens]
            del opened[adv_id]
            if not opened:
                del self.by_link[entry.opens]
        if entry.local:
            own = self.publishers[entry.last_hop]
            del own[adv_id]
            if not own:
                del self.publishers[entry.last_hop]
        return entry

    def opened(self, link: str, subscription: Subscription) -> bool:
        """Whether an advertisement that opened ``link`` may match what ``subscription``
        wants."""
        return any(intersects(a, subscription) for a in self.by_link.get(link, {}).values())

    def draws(
        self, subscription: Subscription, targets: Iterable[str], always: frozenset
    ) -> list[str]:
        """Of a subscription's SBP ``targets``, the links advertisements draw it over now:
        those in ``always``, and those an intersecting advertisement opened."""
        return [t for t in targets if t in always or self.opened(t, subscription)]

    def choose(
        self,
        sub_id: str,
        subscription: Subscription,
        targets: Iterable[str],
        always: frozenset,
        *,
        restored: bool = False,
    ) -> list[str]:
        """Without covering, of a subscription's SBP ``targets``, the links it goes over
        now (:meth:`draws`); recorded as sent.
        ``restored``: a restarted broker's share entry, which its predecessor may have
        sent over the others (:attr:`maybe`)."""
        targets = list(targets)
        links = self.draws(subscription, targets, always)
        self.sent[sub_id] = set(links)
        if restored and len(links) < len(targets):
            self.maybe[sub_id] = set(targets) - self.sent[sub_id]
        return links

    def forget(self, sub_id: str) -> set[str]:
        """Forget this cluster's ``sub_id``; returns the links its withdrawal goes over."""
        return self.sent.pop(sub_id, set()) | self.maybe.pop(sub_id, set())

    def advertised(self, publisher: str, publication: dict) -> bool:
        """Whether local ``publisher`` advertised a filter ``publication`` matches."""
        return any(a.matches(publication) for a in self.publishers.get(publisher, {}).values())
