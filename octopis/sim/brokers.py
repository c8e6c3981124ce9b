"""The brokers of a simulated run: each one's routing core, node, client sessions, hosted
composites and incarnation, made as a broker process makes its own (DESIGN §2, §7, §12)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from octopis.core import BrokerCore, Notification, make_broker
from octopis.core.composite_hosting import HostedComposites
from octopis.core.custody import PublishReceipt
from octopis.core.node import BrokerNode
from octopis.core.resync import epoch_of
from octopis.core.table import MatcherFactory
from octopis.defaults import COMPOSITE_HELD, COMPOSITE_LATENESS, CUSTODY_LIMIT
from octopis.topology import Scot

Receipt = PublishReceipt | None
"""A node's publication token: the publisher's receipt (with failures, when the stores
keep and confirm; else none, nothing is confirmed)."""


class Brokers:
    """Every broker of ``scot``, started in an overlay whose tables are built (serving,
    each neighbour met and synced); :meth:`start` makes one anew (a restart, or a broker
    a topology change added), :meth:`remove` takes one out. A broker's composites'
    ``composite`` notices go to ``notify`` (client, notice → whether it got it)."""

    def __init__(
        self,
        scot: Scot,
        mode: str,
        matcher_factory: MatcherFactory | None,
        *,
        covering: str,
        advertisements: bool,
        notify: Callable[[str, dict], bool] = lambda client, notice: True,
    ) -> None:
        self.scot = scot
        """The overlay's topology (its current version)."""
        self.mode = mode
        self.matcher_factory = matcher_factory
        self.covering = covering
        self.advertisements = advertisements
        self._notify = notify
        self.composite_counts: Counter[str] = Counter()
        """The ``composite.*`` counts of every broker's hosted composites."""
        self.composites: dict[str, HostedComposites] = {}
        """Each broker's composite subscriptions (:class:`HostedComposites`, the process's,
        at its default bounds), made with its node: they die with it, and its node
        withdraws a client's subscriptions through them."""
        self.cores: dict[str, BrokerCore] = {b: self._core(scot, b) for b in scot.brokers}
        self.nodes: dict[str, BrokerNode[Receipt]] = {}
        """Each broker's node (:class:`~octopis.core.node.BrokerNode`, the broker process's
        failure decisions: holds, shares, serving; its client sessions), around its core
        in :attr:`cores`."""
        self.incarnation: dict[str, int] = {b: i for i, b in enumerate(scot.brokers, 1)}
        """Each broker's incarnation (a restart draws the next)."""
        self._incarnations = len(self.incarnation)
        self.retired: Counter[str] = Counter()
        """The counts of cores that died or left."""
        self.given_up: set[tuple[str, int]] = set()
        """Notifications some copy of which a node gave up (counted undeliverable)."""
        for bid, core in self.cores.items():
            node = self.nodes[bid] = self._node(core, serving=True)
            for neighbour in scot.graph[bid]:
                node.neighbours.built(neighbour, self.incarnation[neighbour], 0.0)

    def start(self, broker: str) -> BrokerNode[Receipt]:
        """``broker`` starts empty, a new incarnation, not serving until its neighbours
        have resynced it; its sessions died with its predecessor."""
        core = self._core(self.scot, broker)
        self._incarnations += 1
        self.incarnation[broker] = self._incarnations
        core.epoch = epoch_of(self._incarnations)
        self.cores[broker] = core
        node = self.nodes[broker] = self._node(core)
        return node

    def died(self, broker: str) -> None:
        """``broker``'s process died: its core's counts are kept."""
        self.retired.update(self.cores[broker].counts())

    def remove(self, broker: str) -> BrokerNode[Receipt]:
        """``broker`` leaves the overlay: its core's counts are kept; returns its node."""
        self.retired.update(self.cores.pop(broker).counts())
        del self.composites[broker]
        return self.nodes.pop(broker)

    def counts(self) -> Counter[str]:
        """The routing counts of every core, living, dead or gone."""
        stats: Counter[str] = Counter(self.retired)
        for core in self.cores.values():
            stats.update(core.counts())
        return stats

    def undeliverable_keys(self) -> set[tuple[str, int]]:
        """:attr:`given_up`, and what the nodes still hold (for a neighbour that has not
        come back, or while not serving yet)."""
        held = {n.key for node in self.nodes.values() for n in node.held_notifications()}
        return self.given_up | held

    def _core(self, scot: Scot, broker: str) -> BrokerCore:
        return make_broker(
            scot,
            broker,
            self.mode,
            self.matcher_factory,
            covering=self.covering,
            advertisements=self.advertisements,
        )

    def _node(self, core: BrokerCore, *, serving: bool = False) -> BrokerNode[Receipt]:
        """A node around ``core`` that tells :attr:`given_up` of each copy it gives up:
        serving already (the overlay starts built), or a restart (resynced by its
        neighbours; its store, which survives it, says it had a predecessor); its
        composites hosted anew (:attr:`composites`), through which it withdraws."""
        hosted = self.composites[core.id] = HostedComposites(
            core.subscribe,
            core.unsubscribe,
            self._notify,
            COMPOSITE_HELD,
            COMPOSITE_LATENESS,
            self.composite_counts,
        )
        return BrokerNode(
            core,
            CUSTODY_LIMIT,
            on_undeliverable=self._given_up,
            serving=serving,
            predecessor=not serving,
            withdraw=hosted.local_unsubscribe,
        )

    def _given_up(self, notification: Notification) -> None:
        self.given_up.add(notification.key)
