"""Subscribers moving between brokers in the simulator (DESIGN §9): a mixin of the
:class:`~octopis.sim.engine.Simulator`, beside its event loop (it reads the clients,
cores and links the engine keeps). The balancer that orders moves on simulated load is
a part of its own (:class:`~octopis.sim.balancing.SimBalancer`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import assert_never

from octopis.client_policy.moves import (
    Linger,
    MoveStep,
    Resubscribe,
    WithdrawOld,
    move_across,
    release_wait,
)
from octopis.core.sessions import order_move
from octopis.defaults import LINGER


class SubscriberMoves:
    """Moves of subscribers (see the module docstring)."""

    def move(self, subscriber: str, broker: str, *, linger: float = LINGER) -> dict[str, str]:
        """Move every subscription of ``subscriber`` to ``broker`` now (DESIGN §9);
        returns old id → the id it has at ``broker``. One move of a subscriber at a time.

        Inside the subscriber's cluster (SNR, DNR without covering: the node's
        :func:`~octopis.core.sessions.order_move`) the new host adopts each
        subscription (:func:`~octopis.core.sessions.adopt`): same id, and the path turns
        without losing a copy. Otherwise (another cluster, covering, or BID) it takes the
        client policy's steps (:func:`~octopis.client_policy.moves.move_across`), as the
        SDK does: it subscribes afresh at ``broker``, keeps the old subscription
        ``linger`` seconds more, and then withdraws it (no client can tell when the new
        one has spread). Either way both hosts deliver for a while (a
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
        across: list[str] = []
        self.record_of(subscriber)
        sessions = self.nodes[old].sessions
        deadline = sessions.deadline(self.now)
        core, now = self.cores[old], self.now
        inside, ordered = order_move(core, sessions, [subscriber], now, same_cluster)
        if inside:  # what the order kept for a client gone meanwhile goes after it
            looks = self.nodes[old].client_liveness  # at the tick that finds it late
            self.at(looks.tick_after(deadline), self._moves_expired, old)
        adopted: set[tuple[str, str]] = set()
        for sub_id in ordered.get(subscriber, ()):  # what it holds at its host, as ordered
            self._moving[subscriber] += 1
            self._overlap[subscriber] += 1
            if inside:  # the old host lets it go when the move reaches it (Released)
                self.moves["inside"] += 1
                moved[sub_id] = sub_id
                adopted.add((old, sub_id))
                self._dispatch_local(broker, self.clients.session_adopt(subscriber, broker, sub_id))
                continue
            self.moves["across"] += 1
            across.append(sub_id)
        if adopted:
            self._awaiting_release[subscriber] = adopted
            self.at(self.now + release_wait(linger), self._release_overdue, subscriber, adopted)
        steps = iter(move_across(across, linger) if across else ())
        self._move_steps(subscriber, old, broker, steps, moved)
        return moved

    def _move_steps(
        self,
        subscriber: str,
        old: str,
        broker: str,
        steps: Iterator[MoveStep],
        moved: dict[str, str],
    ) -> None:
        """Take the steps of a move from ``old`` to ``broker`` in turn, as the SDK does
        (``MoveOrders._move``); ``moved`` gets the new id of each subscription made
        again."""
        for step in steps:
            if isinstance(step, Resubscribe):
                for sub_id in step.sub_ids:
                    subscription = self.cores[old].table.entries[sub_id].subscription
                    moved[sub_id] = self.subscribe(subscriber, broker, subscription)
                    self.subscriber_of.pop(sub_id)
            elif isinstance(step, Linger):
                args = (subscriber, old, broker, steps, moved)
                self.at(self.now + step.seconds, self._move_steps, *args)
                return
            elif isinstance(step, WithdrawOld):
                for sub_id in step.sub_ids:
                    self._withdraw_moved(subscriber, old, sub_id)
            else:
                assert_never(step)

    def _moves_expired(self, broker: str) -> None:
        """``broker``'s move orders past their deadline: its node withdraws what they
        kept for clients gone meanwhile (:meth:`BrokerNode.moves_expired`), as the
        process's tick does."""
        if not self._dead(broker):
            self._dispatch(broker, self.nodes[broker].moves_expired(self.now))

    def _released(self, subscriber: str, old: str, sub_id: str) -> None:
        """``old`` released ``subscriber``'s adopted ``sub_id`` (the move reached it): it
        delivers no more of it. One past the move's wait (:meth:`_release_overdue`) is
        the overlay's late news: the move ended without it."""
        awaiting = self._awaiting_release.get(subscriber, set())
        if (old, sub_id) in awaiting:
            awaiting.discard((old, sub_id))
            self._let_go(subscriber)

    def _release_overdue(self, subscriber: str, adopted: set[tuple[str, str]]) -> None:
        """The SDK's wait for the releases of a move inside a cluster ended
        (:func:`~octopis.client_policy.moves.release_wait`): the move ends without those
        still missing (its old host died or is cut off), and the subscriber goes on
        checking every delivery, as the SDK goes on reading both brokers."""
        awaiting = self._awaiting_release.get(subscriber)
        if awaiting is not adopted:
            return
        del self._awaiting_release[subscriber]
        for _ in awaiting:
            self.moves["release_overdue"] += 1
            self._moved(subscriber, self._moving)

    def moving(self, subscriber: str) -> bool:
        """Whether a move of ``subscriber`` has not finished yet."""
        return subscriber in self._moving

    def _withdraw_moved(self, subscriber: str, old: str, sub_id: str) -> None:
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
