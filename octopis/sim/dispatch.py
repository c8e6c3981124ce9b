"""A broker's loop in the simulator (DESIGN §2): what reaches a broker, what its loop
takes, the step it runs on its core with its view of the links, and what the core's
actions do: a forwarded copy goes on the link (FIFO, after a latency draw), a held one
waits at the node, a delivery goes to the subscriber's side (its seam, when checked)
and the ledger. The messages of replay rounds and handed shares go to their handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from octopis.core import (
    Action,
    BrokerCore,
    Forward,
    Hold,
    Released,
    Subscribe,
)
from octopis.core.custody import PublishReceipt
from octopis.core.lst import LinkView
from octopis.core.node import HandedShare, Resend
from octopis.core.replay import REPLAY_MESSAGES
from octopis.sim.custody import LINK_FRAMES


class ActionDispatch:
    """The :class:`~octopis.sim.engine.Simulator`'s brokers' loops (a mixin: the
    simulator's parts are its state).

    It keeps no state; of its host it reads the parts ``cores``, ``nodes``, ``events``,
    ``network``, ``cpus``, ``failures``, ``composites`` and ``ledger``, the measures
    ``subscription_delay`` and ``subscription_depth``, the counters ``moves`` and
    ``failure_counts``, ``_on_forward``; it hands on to the failure mixins (``_put``,
    ``_resend``, ``_carried``, ``_lose``, ``_asleep``, ``_link_frame``, ``_takes``,
    ``_share_arrived``), the replay rounds (``_replay_message``), the subscriber's side
    (``cut_clients``, ``checked``, ``take``, ``saw``) and the moves (``_let_go``,
    ``_durables``, ``_durable_write``)."""

    def _watch(self, core: BrokerCore, message: object, step: Callable, *args: Any) -> list:
        """Run ``step(*args, view)`` on ``core``; with failures, through its node, which
        tells the ledger of a copy given up (:meth:`BrokerNode.watched`)."""
        view = self._view(core.id)
        if self.failures is None:
            return step(*args, view)
        return self.nodes[core.id].watched(message, step, *args, view)

    def _view(self, broker: str) -> LinkView:
        view = self.network.view(broker, self.events.now)
        return view if self.failures is None else self.nodes[broker].neighbours.view(view)

    def _dispatch(
        self, broker: str, actions: list[Action], receipt: PublishReceipt | None = None
    ) -> None:
        """Carry out a core's actions now: a forwarded copy arrives after its departure
        from the link's queue plus a latency draw, never before the copy sent ahead of it
        (FIFO links); held copies wait; deliveries go to the ledger. A local
        publication's copies kept in custody carry its ``receipt`` and count in it."""
        if not actions:
            return
        now = self.events.now
        failures = self.failures
        on_forward = self._on_forward
        arrival_of, send = self.network.arrival, self.events.send
        for action in actions:
            kind = type(action)
            if kind is Forward:
                dst, message = action
                if on_forward is not None:
                    on_forward(broker, dst, message)
                if failures is not None:
                    self._put(broker, dst, message, receipt)  # custody's: goes, lost or waits
                    continue
                send(broker, dst, arrival_of(broker, dst, now, message), message)
            elif kind is Hold:
                self.nodes[broker].hold(action)
            elif kind is HandedShare:
                self._dispatch(broker, [Forward(action.link, action)])
            elif kind is Resend:  # a heal's (:meth:`BrokerNode.heard`)
                self._resend(broker, action.link)
            elif kind is Released:  # the move reached here: the node lets it go
                release = self.nodes[broker].released(*action, self._durables(broker))
                if release.save:
                    self._durable_write(broker)
                self.moves["released"] += 1
                if release.tell:  # else an orphan's: its client is gone, nobody is told
                    self._released(action.subscriber, broker, action.sub_id)
            else:
                subscriber, notification = action
                if self.composites.hosts and self.composites.deliver(
                    broker, subscriber, notification
                ):
                    continue
                if self.cut_clients and (subscriber, broker) in self.cut_clients:
                    self.failure_counts["deliveries_to_cut_clients"] += 1
                    continue
                if self.checked and subscriber in self.checked:
                    self.take(subscriber, notification)
                    continue
                self.ledger.delivered(
                    subscriber,
                    notification.publisher,
                    notification.seq,
                    now - notification.published_at,
                )
                if failures is not None:
                    self.saw(subscriber, notification)

    def _arrive(self, broker: str, src: str, message: Any) -> None:
        failures = self.failures
        if failures is not None:
            if failures.broken(src, broker):  # kept by a cut link until it heals, or lost
                if not self._carried(src, broker, message):
                    self._lose(broker, src, message)
                return
            if failures.paused and self._asleep(broker, self._arrive, broker, src, message):
                return  # in its socket's buffer until it runs again
            if type(message) in LINK_FRAMES:  # an acknowledgement, or what a heal resends
                self._link_frame(broker, src, message)
                return
            if type(message) is not HandedShare and not self._takes(broker, src, message):
                return  # stale: sent before its sender's handshake named this broker
        if self.cpus is not None:
            self.cpus.queue(broker, src, message)
            return
        actions = self._take(broker, src, message)
        if actions:
            self._dispatch(broker, actions)

    def _take(self, broker: str, src: str | None, message: Any) -> list[Action]:
        """``broker``'s loop takes ``message``: a local publication (``src`` None), or
        one from neighbour ``src`` (which leaves ``src``'s output queue now)."""
        if src is None:
            core = self.cores[broker]
            return self._watch(core, message, core.publish, message)
        self.network.taken(src, broker, self.events.now)
        return self._receive(broker, src, message)

    def _receive(self, broker: str, src: str, message: Any) -> list[Action]:
        """``broker``'s core takes ``message`` from neighbour ``src`` now; a subscription
        that stored an entry updates its delay and depth."""
        core = self.cores[broker]
        if type(message) is not Subscribe:
            if type(message) in REPLAY_MESSAGES:
                self._replay_message(broker, src, message)
                return []
            if type(message) is HandedShare:
                self._share_arrived(broker, src, message)
                return []
            self.nodes[broker].routed()
            return self._watch(core, message, core.receive, src, message)
        entries = core.table.entries
        stored = len(entries)
        actions = core.receive(src, message, self._view(broker))
        if len(entries) > stored:
            sub_id = message.sub_id
            delay = self.events.now - message.issued_at
            if delay > self.subscription_delay.get(sub_id, 0.0):
                self.subscription_delay[sub_id] = delay
            if message.hops > self.subscription_depth.get(sub_id, 0):
                self.subscription_depth[sub_id] = message.hops
        return actions

    def _dispatch_local(self, broker: str, actions: list[Action]) -> None:
        """Actions of a client's operation at ``broker`` (subscribe, move, ...): with a
        service model they go out behind what its loop holds (:meth:`BrokerCpus.behind`);
        else now."""
        if self.cpus is None or not self.cpus.behind(broker, actions):
            self._dispatch(broker, actions)
