"""Covering on the SCOT (DESIGN §12): which subscriptions a broker passes on, per link.

SBP's two steps send a subscription held by B(x, c) over links: the host cluster's tree
edges (PRIMARY) and the iCOLs (SECONDARY). With covering, a broker sends a subscription
S over a link only if no subscription it sent over that link and still holds covers S
(:func:`octopis.filters.covering.covers`); otherwise S is stored here, for delivery and for
later, and *quenched* on that link. A neighbour then lacks S, but holds the covering
subscription with the same last hop (this broker), so it routes every notification S
wants the way S's own entry would: covering changes message counts and table sizes,
never who receives what.

A subscription from a neighbour is never quenched by a subscription of the broker's own
subscribers: if the broker restarts, its neighbours withdraw those themselves (DESIGN
§7), and only the broker could have sent in their place what they covered.

Withdrawing S takes it off every link it went over; on each, the subscriptions it
covered there, still held and covered by nothing else sent over it, are sent in its
place *before* the withdrawal (links are FIFO: no gap in which the neighbour holds
neither). Of those, the ones no other covers go first, so the rest are covered again.

Per subscription the broker keeps the links it went over (a bit mask) and where it came
from; a :class:`~octopis.matching.CoverIndex` of the subscriptions it holds finds those
a withdrawal uncovers, and one of those it sent somewhere finds what covers a new one.

A restarted broker's neighbours hand it their share (DESIGN §7) as covering would have:
the subscriptions no other in the share covers, and each remembers the share as what it
sent over that link. The restarted broker passes what it is handed on, by the same rule
(:meth:`ClusteredBroker.broadcast_subscription`), so its neighbours end up with what
covering gives them now, whatever its predecessor had sent them: a duplicate is ignored
there, and what it does not send it notes as *maybe* held over the link, so that its
withdrawal still goes there. Only subscriptions of the broker's own cluster (local, or
from a tree neighbour) are ever passed on, so only they are kept here.

With advertisements too (:mod:`octopis.core.advertising`), a subscription S goes over an
SBP target link L only if (a) advertisements *draw* it there (L is always open, or an
advertisement that opened L may match what S wants) and (b) no subscription this broker
sent over L covers S, with the restrictions above. The links that draw S are kept with
it (a bit mask, :attr:`Covering.drawn`; an advertisement's withdrawal takes none away),
and covering's rule works within them: S is quenched on L only if drawn there. If C
covers S, every publication S wants C wants, so an advertisement that may match S may
match C: wherever S is drawn, C is drawn too, and the neighbour holding C in S's place
passes it on toward every publisher S needs. When an advertisement opens L, the
subscriptions it draws there for the first time go over L as a withdrawal's uncovered
ones do (:meth:`Covering.draw`: those covered by what went over L stay quenched, the
rest in :meth:`Covering._choose` order, broadest first); a withdrawal sends in its place
only what is drawn over the link; a share hands only what is drawn over it. This record
is the only one of where the broker's cluster's subscriptions went:
:class:`~octopis.core.advertising.Advertising` then keeps the advertisements alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from octopis.filters.covering import CoverForm
from octopis.filters.language import Subscription
from octopis.matching import CoverIndex


class Covering:
    """One broker's covering state (see the module docstring)."""

    __slots__ = ("_bit", "_next_bit", "drawn", "forwarded", "live", "maybe", "origin", "sent")

    def __init__(self, links: Iterable[str], *, advertisements: bool = False) -> None:
        self._bit: dict[str, int] = {}
        self._next_bit = 1
        self.live = CoverIndex()
        """Every subscription this broker may pass on (its cluster's, local or primary)."""
        self.forwarded = CoverIndex()
        """Those of :attr:`live` sent over at least one link."""
        self.sent: dict[str, int] = {}
        """sub_id → links (a bit each) it was sent over, for those in :attr:`forwarded`."""
        self.maybe: dict[str, int] = {}
        """sub_id → links over which a restarted broker's predecessor may have sent it."""
        self.origin: dict[str, int] = {}
        """sub_id → the link it came over (0: a local subscriber)."""
        self.drawn: dict[str, int] | None = {} if advertisements else None
        """With advertisements, sub_id → the links advertisements drew it over (the SBP
        targets it may go over); None without: every SBP target, every link but the one
        it came over."""
        self.set_links(links)

    # -- links ---------------------------------------------------------------------------

    def set_links(self, links: Iterable[str]) -> None:
        """The broker's links from now on; a link gone is forgotten in every mask."""
        links = set(links)
        for gone in [link for link in self._bit if link not in links]:
            self._forget_bit(self._bit.pop(gone))
        for link in sorted(links):
            if link not in self._bit:
                self._bit[link] = self._next_bit
                self._next_bit <<= 1

    def _forget_bit(self, bit: int) -> None:
        for sub_id in [k for k, mask in self.sent.items() if mask & bit]:
            self._unmark(sub_id, bit)
        for sub_id in [k for k, mask in self.maybe.items() if mask & bit]:
            self.maybe[sub_id] &= ~bit
            if not self.maybe[sub_id]:
                del self.maybe[sub_id]
        if self.drawn is not None:
            for sub_id, mask in self.drawn.items():
                if mask & bit:
                    self.drawn[sub_id] = mask & ~bit

    def _mask(self, links: Iterable[str]) -> int:
        bit = self._bit
        mask = 0
        for link in links:
            mask |= bit[link]
        return mask

    def _links(self, mask: int) -> list[str]:
        return [link for link, bit in self._bit.items() if bit & mask]

    # -- the rule ------------------------------------------------------------------------

    def add(
        self,
        sub_id: str,
        subscription: Subscription,
        origin: str | None,
        targets: Sequence[str],
        *,
        drawn: Sequence[str] | None = None,
        restored: bool = False,
    ) -> list[str]:
        """Keep ``sub_id``, come over link ``origin`` (None: from a local subscriber), and
        return those of its SBP ``targets`` it goes over: of those advertisements draw it
        over (``drawn``, with advertisements; every target without), the links no
        subscription sent over them covers it on. ``restored``: a restarted broker's
        share entry, which its predecessor may have sent over the others (:attr:`maybe`)."""
        form = self.live.add(sub_id, subscription)
        came = self.origin[sub_id] = self._bit[origin] if origin is not None else 0
        every = self._mask(targets)
        want = every if drawn is None else self._mask(drawn)
        if self.drawn is not None:
            self.drawn[sub_id] = want
        send = want & ~self._covered(form, want, bool(came)) if want else 0
        if send:
            self._mark(sub_id, form, send)
        if restored and every & ~send:
            self.maybe[sub_id] = every & ~send
        return [link for link in targets if self._bit[link] & send]

    def undrawn(self, link: str) -> list[str]:
        """With advertisements, the sub_ids not yet drawn over ``link`` (nor come over
        it): those an advertisement that opens it may draw."""
        bit = self._bit[link]
        drawn, origin = self.drawn or {}, self.origin
        return [k for k, came in origin.items() if not (came | drawn.get(k, 0)) & bit]

    def draw(self, link: str, sub_ids: list[str]) -> list[str]:
        """An advertisement that opened ``link`` draws ``sub_ids`` there (of
        :meth:`undrawn`): each is drawn over it from now on; returns those that go over
        it, in order (:meth:`_choose`, recorded as sent), the others being covered there
        by what went over it, or by one of those (quenched)."""
        if self.drawn is None:
            raise ValueError("covering without advertisements draws every subscription already")
        bit = self._bit[link]
        drawn = self.drawn
        for sub_id in sub_ids:
            drawn[sub_id] |= bit
        return self._choose([k for k in sub_ids if self._uncovered(k, bit)], bit)

    def withdraw(self, sub_id: str, unquench: bool = True) -> tuple[list[str], dict[str, list]]:
        """Forget ``sub_id``. Returns the links its withdrawal goes over (those it went
        or may have gone over) and, per link it went over, the sub_ids of the
        subscriptions it covered there that go over it in its place, in order
        (:meth:`_choose`). ``unquench`` False leaves them out (what the law shows is
        needed, tests/test_covering_laws.py)."""
        form = self.live.form(sub_id)
        self.live.remove(sub_id)
        sent = self.sent.pop(sub_id, 0)
        if sent:
            self.forwarded.remove(sub_id)
        maybe = self.maybe.pop(sub_id, 0)
        del self.origin[sub_id]
        if self.drawn is not None:
            del self.drawn[sub_id]
        links = self._links(sent | maybe)
        if not sent or not unquench:
            return links, {}
        covered = list(self.live.covered(form))
        instead: dict[str, list[str]] = {}
        for link in self._links(sent):
            bit = self._bit[link]
            orphans = [k for k in covered if self._uncovered(k, bit)]
            if orphans:
                instead[link] = self._choose(orphans, bit)
        return links, instead

    def share(self, link: str, carried: set[str], *, commit: bool = True) -> list[str]:
        """What a restarted (or new) neighbour over ``link`` is handed as this broker's
        share: of the subscriptions that go over ``link`` in SBP (with advertisements,
        those drawn over it), those in ``carried`` (on the link already) and those no
        other among them covers; returns the sub_ids to hand, in order. With ``commit``
        the link's record starts again from them; without, nothing changes (what a
        restart would be handed, for inspection)."""
        bit = self._bit[link]
        eligible = [k for k in self.origin if self._reaches(k, bit)]
        kept = [k for k in eligible if k in carried]
        chosen = self._choose([k for k in eligible if k not in carried], bit, kept)
        if commit:
            for sub_id in [k for k, mask in self.sent.items() if mask & bit]:
                self._unmark(sub_id, bit)
            for sub_id in [k for k, mask in self.maybe.items() if mask & bit]:
                self.maybe[sub_id] &= ~bit
                if not self.maybe[sub_id]:
                    del self.maybe[sub_id]
            for sub_id in (*kept, *chosen):
                self._mark(sub_id, self.live.form(sub_id), bit)
        return chosen

    def on_link(self, link: str) -> list[str]:
        """The sub_ids sent over ``link`` (as its neighbour should hold them)."""
        bit = self._bit[link]
        return [k for k, mask in self.sent.items() if mask & bit]

    # -- helpers -------------------------------------------------------------------------

    def _covered(self, form: CoverForm, want: int, foreign: bool) -> int:
        """The links of ``want`` over which a subscription that covers ``form`` went;
        ``foreign``: counting only subscriptions from neighbours (see :meth:`_may_cover`)."""
        covered = 0
        sent, origin = self.sent, self.origin
        for key in self.forwarded.covering(form):
            if foreign and not origin[key]:
                continue
            covered |= sent[key] & want
            if covered == want:
                break
        return covered

    def _may_cover(self, coverer: str, sub_id: str) -> bool:
        """Whether ``coverer`` may stand for ``sub_id`` on a link: not if it is of a local
        subscriber and ``sub_id`` came from a neighbour. When this broker restarts, its
        neighbours withdraw its subscribers' subscriptions themselves (DESIGN §7); what
        those covered from elsewhere only this broker could send in their place."""
        return bool(self.origin[coverer]) or not self.origin[sub_id]

    def _reaches(self, sub_id: str, bit: int) -> bool:
        """Whether ``sub_id`` may go over the link of ``bit``: an SBP target of it (and,
        with advertisements, drawn over it)."""
        if self.drawn is not None:
            return bool(self.drawn[sub_id] & bit)
        return not self.origin[sub_id] & bit

    def _uncovered(self, sub_id: str, bit: int) -> bool:
        """Whether ``sub_id`` may go over the link of ``bit`` (:meth:`_reaches`) but
        neither went over it nor is covered there."""
        if not self._reaches(sub_id, bit) or self.sent.get(sub_id, 0) & bit:
            return False
        return not self._covered(self.live.form(sub_id), bit, bool(self.origin[sub_id]))

    def _choose(self, orphans: list[str], bit: int, base: list[str] | None = None) -> list[str]:
        """Which of ``orphans`` (none covered by what went over the link of ``bit``, or by
        ``base``) go over it, in order: first those no other orphan covers (of equal
        ones, the first), then any of the others that none of those covers after all
        (``covers`` is conservative, so not always transitive). Without ``base`` the
        chosen are marked sent over the link; with it (a share) the caller commits."""
        if not orphans:
            return []
        forms = {k: self.live.form(k) for k in orphans}
        order = {k: i for i, k in enumerate(orphans)}
        pool = CoverIndex()
        for k in orphans:
            pool.add(k, forms[k])
        top, rest = [], []
        for k in orphans:
            form = forms[k]
            dominated = any(
                j != k
                and self._may_cover(j, k)
                and (order[j] < order[k] or not form.covers(forms[j]) or not self._may_cover(k, j))
                for j in pool.covering(form)
            )
            (rest if dominated else top).append(k)
        chosen = CoverIndex()
        for k in (*(base or ()), *top):
            chosen.add(k, self.live.form(k))
        picked = list(top)
        for k in rest:
            coverers = (j for j in chosen.covering(forms[k]) if self._may_cover(j, k))
            if next(coverers, None) is None:
                chosen.add(k, forms[k])
                picked.append(k)
        if base is None:
            for k in picked:
                self._mark(k, forms[k], bit)
        return picked

    def _mark(self, sub_id: str, form: CoverForm, mask: int) -> None:
        old = self.sent.get(sub_id, 0)
        if not old:
            self.forwarded.add(sub_id, form)
        self.sent[sub_id] = old | mask

    def _unmark(self, sub_id: str, bit: int) -> None:
        mask = self.sent[sub_id] & ~bit
        if mask:
            self.sent[sub_id] = mask
        else:
            del self.sent[sub_id]
            self.forwarded.remove(sub_id)
