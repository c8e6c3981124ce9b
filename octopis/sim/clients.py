"""The clients' side of a simulated run: where each client is attached, what it subscribed
or advertised, and the operations that do so at its broker (by its core's and its client
sessions' rules, :class:`~octopis.core.sessions.ClientTable`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from octopis.accounting import DeliveryLedger
from octopis.core import Action
from octopis.core import client_requests as rules
from octopis.core.client_requests import DurableRequest
from octopis.core.clustered import ClusteredBroker
from octopis.filters.language import Subscription
from octopis.sim.brokers import Brokers
from octopis.sim.events import EventQueue


class Clients:
    """The clients of the ``brokers``: subscriptions go to ``ledger``; the actions of an
    operation at a broker go to ``submit(broker, actions)``."""

    def __init__(
        self,
        brokers: Brokers,
        ledger: DeliveryLedger,
        events: EventQueue,
        submit: Callable[[str, list[Action]], None],
    ) -> None:
        self._brokers = brokers
        self._ledger = ledger
        self._events = events
        self._submit = submit
        self.home: dict[str, str] = {}
        """The broker each client is attached to."""
        self.subscriber_of: dict[str, str] = {}
        """Each live subscription's subscriber (by sub_id)."""
        self.subscriptions_of: dict[str, list[Subscription]] = {}
        self.first_subscribed: dict[str, float] = {}
        self.advertised: dict[str, dict[str, Subscription]] = {}
        """Each publisher's advertisements by id (made again where its broker restarts)."""
        self.clocks: dict[str, float] = {}
        """Each publisher's clock: how far its stamps (``published_at``) run ahead of the
        simulated time (behind, if negative)."""
        self._next_seq: Counter[str] = Counter()

    def attach(self, client: str, broker: str) -> None:
        """``client`` is attached to ``broker`` (KeyError: no such broker; ValueError:
        attached to another)."""
        if broker not in self._brokers.cores:
            raise KeyError(f"no broker {broker!r} in topology {self._brokers.scot.name}")
        home = self.home.setdefault(client, broker)
        if home != broker:
            raise ValueError(f"client {client} is attached to {home}, not {broker}")

    def publishers_at(self, brokers: set[str]) -> list[tuple[str, str]]:
        """The publishers (clients that published or advertised) attached to one of
        ``brokers``, each with its broker."""
        published = self._next_seq
        return [
            (c, b)
            for c, b in self.home.items()
            if b in brokers and (c in published or c in self.advertised)
        ]

    def subscribe(self, subscriber: str, broker: str, subscription: Subscription) -> str:
        """``subscriber`` (attached to ``broker``) subscribes now; returns the sub_id."""
        self.attach(subscriber, broker)
        sub_id, actions = self.session_subscribe(subscriber, broker, subscription)
        self._ledger.subscribed(subscriber, sub_id, subscription)
        self.subscriptions_of.setdefault(subscriber, []).append(subscription)
        self.first_subscribed.setdefault(subscriber, self._events.now)
        self._submit(broker, actions)
        return sub_id

    def session_subscribe(
        self,
        subscriber: str,
        broker: str,
        subscription: Subscription,
        durable: DurableRequest | None = None,
    ) -> tuple[str, list[Action]]:
        """``broker`` takes a subscription of ``subscriber`` (``durable``, if it is) as a
        broker's client session does (a first one, or one made again at a fail-over), by
        the node's rules (:func:`~octopis.core.client_requests.subscribe`: refused past
        the client's limit or ``durable.max``, else made by the core, held for the client,
        a durable one's record attached); returns its sub_id and the actions."""
        sessions, hosted = self._brokers.nodes[broker].sessions, self._brokers.composites[broker]
        sub_id, actions = rules.subscribe(
            sessions,
            subscriber,
            subscriber,
            subscription,
            hosted.local_subscribe,
            self._events.now,
            durable,
        )
        self.subscriber_of[sub_id] = subscriber
        return sub_id, actions

    def session_adopt(self, subscriber: str, broker: str, sub_id: str) -> list[Action]:
        """``broker`` adopts ``subscriber``'s ``sub_id``, moving here inside its cluster,
        as a broker's client session does (within the client's limit, as
        :meth:`session_subscribe`); returns the actions."""
        sessions, hosted = self._brokers.nodes[broker].sessions, self._brokers.composites[broker]
        core = self._brokers.cores[broker]
        return rules.adopt(core, sessions, subscriber, subscriber, sub_id, hosted)

    def unsubscribe(self, sub_id: str) -> None:
        """Withdraw ``sub_id`` now (from its subscriber's broker)."""
        subscriber = self.subscriber_of.pop(sub_id)
        broker = self.home[subscriber]
        actions = self.session_unsubscribe(subscriber, broker, sub_id)
        self.subscriptions_of[subscriber].remove(self._ledger.subscription_of(sub_id))
        self._ledger.unsubscribed(sub_id)
        self._submit(broker, actions)

    def session_unsubscribe(self, subscriber: str, broker: str, sub_id: str) -> list[Action]:
        """``subscriber`` withdraws ``sub_id`` at ``broker`` as a broker's client session
        takes it (:func:`~octopis.core.client_requests.unsubscribe`, through the node's
        withdraw; no durable records: the simulated durable subscribers leave, they do
        not unsubscribe); returns the actions."""
        node = self._brokers.nodes[broker]
        return rules.unsubscribe(node.sessions, subscriber, subscriber, sub_id, node.withdraw)[0]

    def advertise(self, publisher: str, broker: str, advertisement: Subscription) -> str:
        """``publisher`` (attached to ``broker``) advertises now; returns the adv_id."""
        self.attach(publisher, broker)
        adv_id, actions = rules.advertise(self._brokers.cores[broker], publisher, advertisement)
        self.advertised.setdefault(publisher, {})[adv_id] = advertisement
        self._submit(broker, actions)
        return adv_id

    def advertise_again(self, broker: str) -> None:
        """``broker`` restarted empty: its publishers advertise again there, as the SDK
        does when its connection comes back."""
        for publisher, adverts in list(self.advertised.items()):
            if self.home.get(publisher) == broker:
                self.advertised[publisher] = {}
                for advertisement in adverts.values():
                    self.advertise(publisher, broker, advertisement)

    def unadvertise(self, publisher: str, adv_id: str) -> None:
        """``publisher`` withdraws its advertisement ``adv_id`` now (at its broker)."""
        broker = self.home[publisher]
        core = self._brokers.cores[broker]
        assert isinstance(core, ClusteredBroker)
        self.advertised.get(publisher, {}).pop(adv_id, None)
        self._submit(broker, core.unadvertise(publisher, adv_id))

    def sequence(self, publisher: str, seq: int | None) -> int:
        """The sequence number of ``publisher``'s next publication: ``seq``, or the one
        after the highest so far."""
        if seq is None:
            seq = self._next_seq[publisher] + 1
        self._next_seq[publisher] = max(seq, self._next_seq[publisher])
        return seq

    def stamp(self, publisher: str) -> float:
        """The time ``publisher``'s clock reads now (its ``published_at``)."""
        return self._events.now + self.clocks.get(publisher, 0)
