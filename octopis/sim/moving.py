"""Subscribers moving between brokers in the simulator (DESIGN §9): a mixin of the
:class:`~octopis.sim.engine.Simulator`, beside its event loop (it reads the clients,
cores and links the engine keeps). The balancer that orders moves on simulated load is
a part of its own (:class:`~octopis.sim.balancing.SimBalancer`)."""

from __future__ import annotations

import math
from collections import Counter

from octopis.core import Subscribe
from octopis.core.sessions import order_move
from octopis.defaults import LINGER
from octopis.sim.reshaping import MOVE_POLL


class SubscriberMoves:
    """Moves of subscribers (see the module docstring)."""

    def move(
        self, subscriber: str, broker: str, *, poll: float = MOVE_POLL, linger: float = LINGER
    ) -> dict[str, str]:
        """Move every subscription of ``subscriber`` to ``broker`` now (DESIGN §9);
        returns old id → the id it has at ``broker``. One move of a subscriber at a time.

        Inside the subscriber's cluster (SNR, DNR without covering: the node's
        :func:`~octopis.core.sessions.order_move`) the new host adopts each
        subscription (:func:`~octopis.core.sessions.adopt`): same id, and the path turns
        without losing a copy. Otherwise (another cluster, covering, or BID) it subscribes
        afresh at ``broker``; once every live broker stores the new subscription, or with
        covering once no message of its broadcast is on its way or held (checked every
        ``poll`` seconds), the old one stays ``linger`` seconds more, for copies routed by
        it before, and is then withdrawn. Either way both hosts deliver for a while (a
        copy that reaches the new host for another subscriber's sake is delivered there
        too), so the subscriber drops a delivery it has had already from the start until
        ``linger`` seconds after the old host let go (``moves.absorbed``), as the SDK
        does: exactly once as long as no copy is in flight longer than ``linger``."""
        old = self._home.get(subscriber)
        if old is None:
            raise KeyError(f"{subscriber} is attached to no broker")
        if broker not in self.cores:
            raise KeyError(f"no broker {broker!r} in topology {self.scot.name}")
        if broker == old:
            raise ValueError(f"{subscriber} is attached to {broker} already")
        if self.moving(subscriber):
            raise ValueError(f"a move of {subscriber} is under way; one at a time")
        self._home[subscriber] = broker
        moved: dict[str, str] = {}
        same_cluster = self.scot.brokers[broker].cluster == self.scot.brokers[old].cluster
        self._linger = linger
        self.record_of(subscriber)
        sessions = self.nodes[old].sessions
        deadline = sessions.deadline(self.now)
        core, now = self.cores[old], self.now
        inside, ordered = order_move(core, sessions, [subscriber], now, same_cluster)
        if inside:  # what the order kept for a client gone meanwhile goes after it
            self.at(math.nextafter(deadline, math.inf), self._moves_expired, old)
        for sub_id in ordered.get(subscriber, ()):  # what it holds at its host, as ordered
            self._moving[subscriber] += 1
            self._overlap[subscriber] += 1
            if inside:  # the old host lets it go when the move reaches it (Released)
                self.moves["inside"] += 1
                moved[sub_id] = sub_id
                self._dispatch_local(broker, self.clients.session_adopt(subscriber, broker, sub_id))
                continue
            self.moves["across"] += 1
            subscription = self.cores[old].table.entries[sub_id].subscription
            moved[sub_id] = new_id = self.subscribe(subscriber, broker, subscription)
            self.subscriber_of.pop(sub_id)
            self.at(self.now + poll, self._spread, subscriber, old, sub_id, new_id, poll, linger)
        return moved

    def _moves_expired(self, broker: str) -> None:
        """``broker``'s move orders past their deadline: its node withdraws what they
        kept for clients gone meanwhile (:meth:`BrokerNode.moves_expired`), as the
        process's tick does."""
        if not self._dead(broker):
            self._dispatch(broker, self.nodes[broker].moves_expired(self.now))

    def moving(self, subscriber: str) -> bool:
        """Whether a move of ``subscriber`` has not finished yet."""
        return subscriber in self._moving

    def _spread(
        self, subscriber: str, old: str, sub_id: str, new_id: str, poll: float, linger: float
    ) -> None:
        """Once every live broker stores ``new_id`` (with covering: once its broadcast is
        over), withdraw ``sub_id`` ``linger`` later."""
        dead = self.failures.dead if self.failures is not None else ()
        if (
            self._broadcasting(new_id)
            if self.covering == "active"
            else any(new_id not in c.table for b, c in self.cores.items() if b not in dead)
        ):
            args = (subscriber, old, sub_id, new_id, poll, linger)
            self.at(self.now + poll, self._spread, *args)
            return
        self.at(self.now + linger, self._withdraw_moved, subscriber, old, sub_id, linger)

    def _broadcasting(self, sub_id: str) -> bool:
        """Whether a subscription message of ``sub_id`` is on its way or held for a
        neighbour (with covering, the broadcast is over once none is)."""

        def names(message: object) -> bool:
            return type(message) is Subscribe and message.sub_id == sub_id  # type: ignore[attr-defined]

        return any(map(names, self.events.messages())) or any(
            names(m) for node in self.nodes.values() for m in node.held_messages()
        )

    def _withdraw_moved(self, subscriber: str, old: str, sub_id: str, linger: float) -> None:
        actions = self.clients.session_unsubscribe(subscriber, old, sub_id)
        self.ledger.unsubscribed(sub_id)
        self._dispatch_local(old, actions)
        self.moves["withdrawn"] += 1
        self._let_go(subscriber)

    def _let_go(self, subscriber: str) -> None:
        """The old host of a subscription of ``subscriber`` delivers no more."""
        self._moved(subscriber, self._moving)
        self.at(self.now + self._linger, self._lingered, subscriber)

    def _lingered(self, subscriber: str) -> None:
        """``linger`` after a host of ``subscriber`` let go: once no move of it overlaps,
        a subscriber that never failed over stops checking its deliveries (a repeat after
        that is the overlay's, counted by the ledger)."""
        self._moved(subscriber, self._overlap)
        if subscriber not in self._overlap and subscriber not in self.failed_over:
            self.checked.discard(subscriber)
            if self.failures is None:  # no longer kept: the next move begins it again
                del self.records[subscriber]

    @staticmethod
    def _moved(subscriber: str, moving: Counter[str]) -> None:
        moving[subscriber] -= 1
        if not moving[subscriber]:
            del moving[subscriber]
