"""The client connections a broker serves (DESIGN §4, §7, §9): who is connected, which
clients each carries, their liveness, and what their going or moving withdraws.

A connection (one DEALER) may carry several named clients; a client's key in the routing
core is ``<connection identity hex>/<name>``, so one connection cannot act for another's
clients. Every request refreshes its connection's liveness; a connection silent for
``clients.timeout`` seconds is dropped and its subscriptions are withdrawn by the
ordinary two-step unsubscribe; one that says ``bye`` is dropped so at once. When a
client is silent, and which subscriptions a going or moving client withdraws, are the
node's rules (:mod:`octopis.core.sessions`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from msgspec.structs import replace

from octopis.core import Action, Notification
from octopis.core.client_requests import RequestRefused
from octopis.core.composite_hosting import HostedComposites
from octopis.core.custody import PublishReceipt, Unanswered
from octopis.core.node import BrokerNode
from octopis.core.sessions import Liveness, interests, order_move
from octopis.transport.links import InputWaiter
from octopis.wire.client import MoveNotice, Notice, ReleasedNotice, WithdrawnNotice

if TYPE_CHECKING:
    from octopis.transport.replaying import Replaying

log = logging.getLogger("octopis.broker.clients")


class ClientError(RequestRefused):
    """A client request the broker process cannot serve (a publication its disk or its
    resync hold refuses, a move order for no client here); answered with an error reply
    as the node's refusals are (:func:`~octopis.core.client_requests.refusal`)."""


class Router(Protocol):
    """What client sessions ask of the broker: the routing core behind them."""

    welcome: dict[str, object]
    node: BrokerNode[PublishReceipt]
    """The broker's node: its core and its client sessions' rules
    (:attr:`BrokerNode.sessions`; :mod:`octopis.core.sessions`)."""
    composites: HostedComposites
    """The composite subscriptions hosted here (DESIGN §12), and which of a client's
    subscriptions they take and which the core (local subscribe and unsubscribe)."""

    def publish(self, notification: Notification, receipt: PublishReceipt) -> None:
        """Route a local publication, its copies counting in ``receipt``."""

    def execute(self, actions: list[Action], received: object = None, body: bytes = b"") -> None:
        """Carry out routing actions."""

    def pass_ended(self, idle: bool) -> None:
        """An input pass ended and what it sent has left; ``idle``: the input ran dry."""

    def replay(
        self,
        key: str,
        filters: list[str],
        since: list[tuple[str, int, int]],
        after: float,
        **window: Any,
    ) -> str:
        """Start a replay for client ``key`` (``window``: ``until``, ``historic``,
        ``answer_max``, ``answer_bytes``, ``claim``); returns its id."""

    @property
    def replaying(self) -> Replaying:
        """The retention store, replay rounds and durable records (DESIGN §11)."""


class ClientSession:
    """One client session (a DEALER connection as the broker sees it): its clients and
    their subscriptions, backlog."""

    __slots__ = ("backlog", "delivered", "keys", "overflowed", "unanswered")

    def __init__(self) -> None:
        self.keys: set[str] = set()
        """Its clients' keys (their subscriptions: :class:`ClientTable`)."""
        self.backlog: deque[list[bytes]] | None = None
        self.overflowed = 0
        """Deliveries dropped (drop-oldest policy) and not yet reported to the client."""
        self.unanswered = Unanswered()
        """Publications accepted and not yet answered (their copies not yet held)."""
        self.delivered: Counter[str] = Counter()
        """Client name → notifications delivered to it (its share of the load)."""


class ClientConnections:
    """The connections of one broker's client socket and the clients they carry (see the
    module docstring). ``notify`` sends a notice to a connection behind its deliveries."""

    def __init__(
        self,
        broker_id: str,
        router: Router,
        notify: Callable[[bytes, dict], None],
        counters: Counter[str],
    ) -> None:
        self.id = broker_id
        self.router = router
        self.table = router.node.sessions
        """Each client's subscriptions here and the session rules: limits, withdrawal
        when gone, moves and their orphans (DESIGN §7-§9)."""
        self.notify = notify
        self.counters = counters
        self.connections: dict[bytes, ClientSession] = {}
        self.liveness: Liveness[bytes] = router.node.client_liveness
        """When each connection was last heard; which are silent (the node's rule)."""
        self.names: dict[str, tuple[bytes, str]] = {}
        """Client key → (connection identity, client name): where deliveries go."""
        self.publishers: set[str] = set()
        """Keys of the clients that have published here (as many as :attr:`names`)."""

    def heard(self, identity: bytes, now: float) -> ClientSession:
        """A request from connection ``identity`` at ``now``: its session (new if it is
        not known), alive."""
        connection = self.connections.get(identity)
        if connection is None:
            connection = self.connections[identity] = ClientSession()
        self.liveness.heard(identity, now)
        return connection

    def key(self, identity: bytes, connection: ClientSession, client: str) -> str:
        """The key of client ``client`` of connection ``identity`` (known from now on)."""
        key = f"{identity.hex()}/{client}"
        if key not in connection.keys:
            connection.keys.add(key)
            self.names[key] = (identity, client)
        return key

    # -- liveness ------------------------------------------------------------------------

    async def expire(self, waiter: Callable[[], InputWaiter | None]) -> None:
        """Drop connections silent past the timeout, withdrawing their subscriptions, at
        the ticks of :class:`~octopis.core.sessions.Liveness`, as it judges them: with
        every request that reached us read (``waiter``: the socket's, once its input
        started), the time this process spent not running (a tick that comes late)
        excused."""
        loop, liveness = asyncio.get_running_loop(), self.liveness
        liveness.start(loop.time())
        while True:
            await asyncio.sleep(liveness.tick)
            now = loop.time()
            self._expire_moves(now)
            reading = waiter()
            read = reading is not None and not reading.poke()  # no request waits unread
            for identity in liveness.ticked(now, caught_up=read):
                self.drop(identity, f"silent for more than {liveness.timeout:g} s")

    def drop(self, identity: bytes, reason: str, *, left: bool = False) -> ClientSession | None:
        """Forget a connection: withdraw every subscription of its clients. ``left``: it
        said bye (counted in ``clients_left``, logged at INFO), else ``clients_dropped``."""
        connection = self.connections.pop(identity, None)
        if connection is None:
            return None
        heard = time.time() - (time.monotonic() - self.liveness.forget(identity))
        withdrawn, save, router = 0, False, self.router
        for key in sorted(connection.keys):  # the node decides what goes (DESIGN §7)
            gone = router.node.client_gone(key, heard, router.replaying.durables)
            router.execute(gone.actions)
            withdrawn, save = withdrawn + len(gone.withdrawn), save or gone.save
            self.names.pop(key, None)
            self.publishers.discard(key)
        if save:  # the records of its durable ones wait
            router.replaying.save_durables()
        self.counters["clients_left" if left else "clients_dropped"] += 1
        log.log(
            logging.INFO if left else logging.WARNING,
            "%s dropped client connection %s (%s): %d clients, %d subscriptions withdrawn",
            self.id,
            identity.hex(),
            reason,
            len(connection.keys),
            withdrawn,
        )
        return connection

    # -- moves (DESIGN §9) and withdrawals ---------------------------------------------------

    def order_move(self, client: str, to: str, inside: bool) -> list[str]:
        """Tell every connection holding a client named ``client`` (or ``name@conn``, as
        the load analysis names one: ``conn`` starts its connection's identity in hex)
        to move its subscriptions to the broker at client endpoint ``to``, ``inside`` this
        cluster or not: by adoption or afresh, as the node says
        (:func:`~octopis.core.sessions.order_move`); returns the sub ids."""
        client, _, conn = client.partition("@")
        keys = [
            key
            for key, (identity, name) in self.names.items()
            if name == client and identity.hex().startswith(conn)
        ]
        if not keys:
            raise ClientError(f"{self.id} serves no client named {client!r}")
        now = asyncio.get_running_loop().time()
        moved: list[str] = []
        adopt, ordered = order_move(self.router.node.core, self.table, keys, now, inside)
        for key, sub_ids in ordered.items():
            identity, _ = self.names[key]
            self.notify(
                identity,
                MoveNotice(client=client, to=to, inside=adopt, sub_ids=sub_ids),
            )
            moved += sub_ids
        return moved

    def released(self, key: str, sub_id: str) -> None:
        """``sub_id`` moved on from this broker: tell its client, after everything this
        broker delivered to it before (its last delivery from here)."""
        replaying = self.router.replaying
        release = self.router.node.released(key, sub_id, replaying.durables)
        if release.save:  # its record went with it
            replaying.save_durables()
        if release.tell:
            identity, name = self.names[key]
            self.notify(identity, ReleasedNotice(client=name, sub_id=sub_id))

    def _expire_moves(self, now: float) -> None:
        """Withdraw what orphaned move orders kept past their deadline
        (:meth:`BrokerNode.moves_expired`)."""
        router = self.router
        router.execute(router.node.moves_expired(now))

    def withdraw(self, key: str, sub_id: str) -> None:
        """End local subscription ``sub_id`` of client ``key``: its durable record was
        claimed by the host its client came back at (the old connection is not dropped
        yet). The client, if still there, is told ``withdrawn``."""
        client = self.names.get(key)
        if client is None:
            return
        actions = self.table.withdraw(key, sub_id, self.router.node.withdraw)
        if actions is None:
            return
        self.router.execute(actions)
        self.notify(client[0], WithdrawnNotice(client=client[1], sub_id=sub_id))

    def notify_client(self, key: str, message: Notice) -> bool:
        """Send a notice to local client ``key`` (behind its deliveries); False if it has
        gone."""
        client = self.names.get(key)
        if client is None or client[0] not in self.connections:
            return False
        self.notify(client[0], replace(message, client=client[1]))
        return True

    # -- status --------------------------------------------------------------------------

    def delivered(self) -> Counter[str]:
        """Notifications delivered to each client of a live connection, as
        ``name@connection`` (the connection's identity, 8 hex digits)."""
        return Counter(
            {
                f"{name}@{identity.hex()[:8]}": n
                for identity, connection in self.connections.items()
                for name, n in connection.delivered.items()
            }
        )

    def attached(self) -> dict[str, dict[str, int | bool | list[str]]]:
        """Every named client of a live connection, as ``name@connection`` (as
        :meth:`delivered` names it): the number of its subscriptions here, whether it
        has published here, and their interests (:func:`~octopis.core.sessions.interests`)."""
        attached: dict[str, dict[str, int | bool | list[str]]] = {}
        core = self.router.node.core
        for key, (identity, name) in self.names.items():
            if name == "-" or identity not in self.connections:
                continue
            attached[f"{name}@{identity.hex()[:8]}"] = {
                "subscriptions": len(self.table.subscriptions(key)),
                "publisher": key in self.publishers,
                "interests": sorted(interests(core, self.table, key)),
            }
        return attached
