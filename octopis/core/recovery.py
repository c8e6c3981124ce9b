"""Recovery after a failure (DESIGN §7), once for the broker process and the simulator.

What one broker keeps for its neighbours while they are down or restarting, and what it
owes them when they are back. Sans-IO: the shell (``transport/broker.py``,
``sim/engine.py``) reports events and carries out what comes back; an *item* is whatever
the shell puts on a link (an encoded frame in the process, a message in the simulator).

- Subscription messages that did not reach a neighbour (down, or restarted) are held for
  it, in order, and handed to it first when it is back: the same process sends them on
  as it would have; a new incarnation broadcasts them on, so a subscription made while
  it was dead still crosses it.
- Notification copies the core holds for a neighbour that is down (:class:`Hold`) wait
  for it: sent if it comes back as the same process, or once its new incarnation is
  serving; those held for a predecessor when a restart is noticed are undeliverable
  (its subscribers are gone).
- A restarted neighbour's predecessor's subscriptions are withdrawn once it is serving,
  not at the handshake, so that what its failed-over clients subscribed elsewhere has
  crossed it first and no notification falls between the two.
- A neighbour is handed its resync share (:func:`resync_messages`) when it is up and our
  own table is whole for it; until then the share is owed.

Every hold is bounded by ``limit`` items per neighbour; what does not fit is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from octopis.core.clustered import ClusteredBroker
from octopis.core.messages import Action, Advertise, Subscribe
from octopis.core.resync import advertisement_share, resync_messages, withdraw_predecessor

Item = TypeVar("Item")


class Recovery(Generic[Item]):
    """One broker's recovery bookkeeping (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Items held per neighbour at most, subscription messages and copies each."""
        self.subscriptions: dict[str, list[Item]] = {}
        """Subscription messages for a neighbour that went down, in order."""
        self.copies: dict[str, list[Item]] = {}
        """Notification copies held for a neighbour that is down."""
        self.withdraw_when_serving: dict[str, str] = {}
        """Restarted neighbour → the sub-id epoch of its new incarnation."""
        self.owed_shares: set[str] = set()
        """Neighbours told our share was not whole; each gets it once it is."""
        self.paid_late: set[str] = set()
        """Neighbours handed our share after their handshake (a share owed, paid): the
        word that it was handed goes on the link as a link frame, which a link that
        fails before it is taken loses while the share's entries wait for the heal, so
        a heal says it again (:meth:`BrokerNode.link_back`)."""
        self.asked_after_heal: set[str] = set()
        """Neighbours whose link healed since we last heard their word: our share handed
        them at their handshake (or late) may have been lost in flight, so a word from
        one that still wants it gets it again (:meth:`BrokerNode.synced`); one that holds
        an entry already ignores it."""
        self.unshared: set[str] = set()
        """Restarted neighbours not yet handed our share: what is held for one is
        handed as at its restart (:meth:`restarted`), since a withdrawal or a move can
        only name an entry it would have had from the share, which will not hold it."""
        self.counters: Counter[str] = Counter()

    # -- holding -------------------------------------------------------------------------

    def hold_subscriptions(
        self, neighbour: str, items: Iterable[Item], ahead: Iterable[Item] = ()
    ) -> None:
        """Subscription messages that never reached ``neighbour``: kept for it, in order,
        and ``ahead`` (sent before those held already) before what it holds."""
        items, ahead = list(items), list(ahead)
        if not items and not ahead:
            return
        held = self.subscriptions.setdefault(neighbour, [])
        held[:0] = ahead
        held += items
        self.counters["sbp_dropped.hold_full"] += max(len(held) - self.limit, 0)
        del held[self.limit :]

    def hold_copy(self, neighbour: str, item: Item) -> None:
        """A notification copy the core holds for ``neighbour`` (down)."""
        held = self.copies.setdefault(neighbour, [])
        if len(held) < self.limit:
            held.append(item)
        else:
            self.counters["undeliverable.hold_full"] += 1

    def held_copies(self) -> int:
        """Copies held for all neighbours."""
        return sum(map(len, self.copies.values()))

    # -- a neighbour back ----------------------------------------------------------------

    def take_subscriptions(
        self, neighbour: str, read: Callable[[Item], tuple[str, bool]]
    ) -> tuple[list[Item], set[str]]:
        """The subscription messages held for ``neighbour``, to go out first, and the sub
        ids of the subscriptions among them (``read`` gives an item's sub id and whether
        it subscribes): its share need not repeat those."""
        if neighbour in self.unshared:
            self.keep_for_new_process(neighbour, read)
        held = self.subscriptions.pop(neighbour, [])
        self.counters["sbp_handed_late"] += len(held)
        return held, {sub_id for sub_id, subscribes in map(read, held) if subscribes}

    def release_copies(self, neighbour: str) -> list[Item]:
        """The copies held for ``neighbour``, now that it is back as the same process (or
        a new one is serving)."""
        held = self.copies.pop(neighbour, [])
        self.counters["held.released"] += len(held)
        return held

    def restarted(
        self, neighbour: str, epoch: str | None, read: Callable[[Item], tuple[str, bool]]
    ) -> list[Item]:
        """``neighbour`` came back as a new process: the copies held for its predecessor
        are undeliverable (returned, counted); with ``epoch`` (resyncing modes), its
        predecessor's subscriptions are withdrawn once it is serving.

        The new process has no entry to withdraw or move: of the subscription messages
        held for its predecessor (``read`` gives an item's sub id and whether it
        subscribes) it is handed only the subscriptions that no later held message
        names, to broadcast on; the rest reach it as they stand now, in the resync share
        (counted ``sbp_left_to_share``)."""
        dropped = self.copies.pop(neighbour, [])
        self.counters["undeliverable.held_for_restarted"] += len(dropped)
        self.keep_for_new_process(neighbour, read)
        if epoch is not None:
            self.withdraw_when_serving[neighbour] = epoch
            self.unshared.add(neighbour)
        return dropped

    def keep_for_new_process(
        self, neighbour: str, read: Callable[[Item], tuple[str, bool]]
    ) -> None:
        """Of the subscription messages held for ``neighbour``, a process this one has
        not sent to before (restarted, or met first), keep the subscriptions that no later
        held message names (see :meth:`restarted`)."""
        held = self.subscriptions.get(neighbour)
        if held:
            facts = [read(item) for item in held]
            last = {sub_id: i for i, (sub_id, _) in enumerate(facts)}
            kept = [
                item
                for i, (item, (sub_id, subscribes)) in enumerate(zip(held, facts, strict=True))
                if subscribes and last[sub_id] == i
            ]
            self.counters["sbp_left_to_share"] += len(held) - len(kept)
            self.subscriptions[neighbour] = kept

    def serving(self, core: object, neighbour: str) -> tuple[list[Item], list[Action]]:
        """``neighbour`` is serving: the copies held for it, and the withdrawal of its
        predecessor's subscriptions if it restarted (:meth:`withdraw_predecessor`)."""
        return self.release_copies(neighbour), self.withdraw_predecessor(core, neighbour)

    def withdraw_predecessor(self, core: object, neighbour: str) -> list[Action]:
        """The withdrawal of restarted ``neighbour``'s predecessor's subscriptions, once
        it serves. With covering it waits while our table misses another primary
        neighbour's share (counted ``predecessor_withdrawal_deferred``): a withdrawal
        sends in its place what it covered, and some of that may be in the share; the
        node asks again when a share comes in (:meth:`BrokerNode.synced`)."""
        epoch = self.withdraw_when_serving.get(neighbour)
        if epoch is None or not isinstance(core, ClusteredBroker):
            self.withdraw_when_serving.pop(neighbour, None)
            return []
        if core.travel.covering is not None and not core.share_complete(neighbour):
            self.counters["predecessor_withdrawal_deferred"] += 1
            return []
        del self.withdraw_when_serving[neighbour]
        stored = len(core.table)
        actions = withdraw_predecessor(core, neighbour, epoch)
        self.counters["predecessor_entries_withdrawn"] += stored - len(core.table)
        return actions

    def forget(self, neighbour: str) -> int:
        """``neighbour`` left the overlay (a topology change): everything held for or
        owed to it is dropped; returns how many items were held."""
        dropped = len(self.copies.pop(neighbour, ())) + len(self.subscriptions.pop(neighbour, ()))
        self.withdraw_when_serving.pop(neighbour, None)
        self.owed_shares.discard(neighbour)
        self.paid_late.discard(neighbour)
        self.asked_after_heal.discard(neighbour)
        self.unshared.discard(neighbour)
        return dropped

    # -- shares --------------------------------------------------------------------------

    def share(
        self, core: ClusteredBroker, neighbour: str, carried: set[str]
    ) -> list[Advertise | Subscribe]:
        """Our resync share for ``neighbour`` less the subscriptions in ``carried``
        (already on its link), our advertisements first; no longer owed."""
        self.owed_shares.discard(neighbour)
        self.unshared.discard(neighbour)
        adverts = advertisement_share(core, neighbour)
        messages = resync_messages(core, neighbour, carried, handed=True)
        self.counters["resync_entries_sent"] += len(messages)
        self.counters["resync_advertisements_sent"] += len(adverts)
        return [*adverts, *messages]

    def payable(self, core: ClusteredBroker, up: Callable[[str], bool]) -> list[str]:
        """The owed neighbours that can be paid now: up, and our share for them whole."""
        return [n for n in sorted(self.owed_shares) if up(n) and core.share_complete(n)]
