"""One broker process: the routing core wired to its peer links, client sessions and
control plane (DESIGN §2, §4, §7).

- peer links (:mod:`octopis.transport.peers`): a PULL for every neighbour's frames, a
  paced output queue per neighbour, handshakes with incarnations, heartbeats, detection;
- client sessions (:mod:`~octopis.transport.clients`, :mod:`~octopis.transport.outbox`),
  control (:mod:`~octopis.transport.control`, the aiozmq RPC).

It carries out what the node decides (every routing and failure rule is in
:mod:`octopis.core`). A bad frame from a peer or a client is counted, logged (rate-limited)
and answered with an error where there is someone to answer; the broker goes on serving.
:func:`~octopis.transport.serving.serve` runs it; :func:`~octopis.transport.relink.relink`
gives it a new topology version.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from octopis.core import (
    Action,
    Counts,
    Deliver,
    EdgeDedup,
    Forward,
    Hold,
    Message,
    Notification,
    Released,
    Subscribe,
    make_broker,
)
from octopis.core.codec import Synced, encode_body
from octopis.core.composite_hosting import HostedComposites
from octopis.core.custody import PublishReceipt
from octopis.core.load import LoadMeter
from octopis.core.node import BrokerNode, HandedShare, Refused, Resend, Step
from octopis.core.replay import REPLAY_MESSAGES, ReplayMessage
from octopis.core.resync import epoch_of
from octopis.filters.language import Subscription
from octopis.filters.limits import set_limits
from octopis.keys import Keys
from octopis.matching import MatchClock, Matcher
from octopis.settings import BrokerSettings
from octopis.topology import Scot
from octopis.transport.collector import IdleCollector
from octopis.transport.connections import ClientError
from octopis.transport.frames import (
    BODY,
    DATA,
    KEPT,
    frame_of,
    message_of,
    receipt_of,
)
from octopis.transport.inspection import BrokerInspection
from octopis.transport.process_mark import mark_running
from octopis.transport.replaying import Replaying

log = logging.getLogger("octopis.broker")
Gateway = Callable[["Broker"], list[tuple[str, Coroutine[Any, Any, None]]]]
"""Other client protocols' tasks for a broker (DESIGN §13), started with its own."""


class Broker:
    """A running broker: core, peer links, client sessions, LST and control RPC. Of the
    topology read at its start it keeps only its own labels and its neighbours (with
    their endpoints); a relink changes those (DESIGN §9)."""

    def __init__(
        self,
        scot: Scot,
        broker_id: str,
        mode: str,
        settings: BrokerSettings,
        keys: Keys | None,
        data_dir: Path | None = None,
    ) -> None:
        self.keys = keys
        """CurveZMQ keys (DESIGN §8); None runs insecure (``--insecure``)."""
        self.info = scot.brokers[broker_id]
        self.neighbour_endpoints = {n.id: scot.brokers[n.id].endpoint for n in self.info.neighbours}
        """Each neighbour's peer endpoint (the topology file's at the start, then as
        relinks tell)."""
        self.id = broker_id
        self.mode = mode
        self.settings = settings
        self.clock = MatchClock()
        set_limits(settings.limits)
        self.core = make_broker(
            scot,
            broker_id,
            mode,
            lambda: Matcher(clock=self.clock),
            EdgeDedup(settings.dedup.window, settings.dedup.publishers),
            covering=settings.routing.covering,
            advertisements=settings.routing.advertisements == "on",
        )
        self.incarnation = secrets.randbits(63) | 1
        """Random per process start (DESIGN §7): neighbours tell a restart by it."""
        self.core.epoch = epoch_of(self.incarnation)
        self.core.id_token = partial(secrets.token_hex, 6)
        self.data_dir = data_dir  # its process mark (and the retention store's file)
        self.node: BrokerNode[PublishReceipt] = BrokerNode(
            self.core,
            settings.links.custody_limit,
            settings.clients.hold_limit,
            predecessor=mark_running(data_dir, broker_id),
            client_limit=settings.limits.subscriptions_per_client,
            move_timeout=settings.clients.move_timeout,
            client_timeout=settings.clients.timeout,
        )
        """The core with its failure decisions (DESIGN §7): holds, shares, serving."""
        self.counters: Counter[str] = Counter()
        self.received: Counts = Counts()
        self._sender = broker_id.encode()
        self.subscription_delay: dict[str, float] = {}
        self.stopping = asyncio.Event()
        self.failure: str | None = None
        self._relayed: tuple[ReplayMessage, bytes] | None = None
        """The replay message being handled, with its bytes (a relay sends them as such)."""
        self.tasks: dict[str, asyncio.Task] = {}
        """The serving loops by name (a peer link's: ``link <neighbour>``)."""
        self.started = time.time()
        self.process = psutil.Process()
        self.inspection = BrokerInspection(self)
        """Status, stats, table and resync view (control RPC, metrics)."""
        self.replaying = Replaying(
            broker_id,
            settings.retention,
            settings.durable,
            settings.logs.interval,
            data_dir,
            self._send_replay,
            lambda src, state: self.node.replay_targets(src, state, self.lst.down),
            lambda key, message: self.clients.sessions.notify_client(key, message),
            self._queued_toward,
            lambda key, sub_id: self.clients.sessions.withdraw(key, sub_id),
        )
        """The retention store and the replay rounds (DESIGN §11)."""
        self.composites = HostedComposites(
            self._core_subscribe,
            self._core_unsubscribe,
            lambda key, message: self.clients.sessions.notify_client(key, message),
            settings.composite.max_held,
            settings.composite.lateness,
            self.counters,
        )
        """The composite subscriptions hosted here and their joins (DESIGN §12)."""
        self.node.withdraw = self.composites.local_unsubscribe
        self.load_meter = LoadMeter(settings.load.window, settings.load.capacity)
        self.collector = IdleCollector(settings.memory.gc_idle)
        self.welcome: dict[str, object] = {
            "broker": self.id,
            "mode": mode,
            "cluster": self.info.cluster,
            "region": self.info.region,
            "timeout": settings.clients.timeout,
        }

    # -- lifecycle -----------------------------------------------------------------------

    def start_task(self, name: str, work: Coroutine[None, None, None]) -> None:
        task = self.tasks[name] = asyncio.create_task(work, name=name)
        task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task) -> None:
        """A serving loop never ends on its own: if one does, log why and shut down, so the
        broker exits non-zero instead of serving with, say, no peer input."""
        if task.cancelled():
            return
        exc = task.exception()
        self.failure = f"{self.id}: task {task.get_name()!r} ended: {exc!r}"
        log.error("%s", self.failure, exc_info=exc)
        self.stop()

    def stop(self) -> None:
        """Begin a clean shutdown."""
        self.stopping.set()

    @property
    def ready(self) -> bool:
        """Every neighbour is up, has completed its handshake with this incarnation and
        has handed over its whole share."""
        return self.node.ready

    # -- what the peer links hand over ---------------------------------------------------

    def peer_message(self, sender: str, message: Message, body: bytes, now: float) -> None:
        """Route one message from neighbour ``sender`` (arrived at loop time ``now``)."""
        kind = type(message)
        if kind is Notification:
            self.peer_notifications(sender, iter(((message, body),)), now)
            return
        self.received[kind] += 1
        if kind in REPLAY_MESSAGES:
            self._relayed = (message, body)  # passed on unchanged: its bytes, not re-encoded
            self.replaying.receive(sender, message)
            self._relayed = None
            return
        if kind is Subscribe:
            stored = len(self.core.table)
            actions = self.core.receive(sender, message, self.lst)
            if len(self.core.table) > stored:
                self.subscription_delay[message.sub_id] = time.time() - message.issued_at
            self.execute(actions, message, body, None, now)
            return
        self.node.routed()
        self.execute(self.core.receive(sender, message, self.lst), message, body, None, now)

    def peer_notifications(
        self, sender: str, run: Iterator[tuple[Notification, bytes]], now: float
    ) -> None:
        """Route each notification of ``run`` from neighbour ``sender``, in order,
        stopping at one that raises (:meth:`PeerEvents.peer_notifications`). Straight to
        the core's routing: the peer links only hand over frames from current neighbours,
        the set the core routes between (relink changes both)."""
        route, lst, execute = self.core.route, self.lst, self.execute
        count = 0
        try:
            for message, body in run:
                count += 1
                execute(route(message, sender, lst), message, body, None, now)
        finally:
            self.received[Notification] += count
            self.node.routed(count)

    def link_down(self, neighbour: str, queued: list[list], sent: Sequence[list] = ()) -> None:
        """The routing frames the link to ``neighbour`` gave back (custody's, then those
        that never left; ``sent``: those pending for a predecessor of it): the node holds
        or drops each, and the notifications it returns are routed again with the link
        down (:meth:`BrokerNode.given_back`, DESIGN §7)."""
        self.replaying.link_down(neighbour)
        routed = 0
        given_back = self.node.given_back(neighbour, queued, sent, self.lst, message_of, receipt_of)
        for actions, receipt in given_back:
            self.execute(actions, receipt=receipt)
            routed += 1
        if routed:
            log.warning(
                "%s: routed %d notifications meant for %s again (link down)",
                self.id,
                routed,
                neighbour,
            )

    def now_serving(self, steps: Iterator[Step]) -> None:
        """Route the local publications held while this broker was resyncing; hand the
        shares we owe that are whole now (the node's steps,
        :meth:`BrokerNode.serve_if_ready`)."""
        for actions, receipt in steps:
            self.execute(actions, receipt=receipt)

    def synced(self, neighbour: str, synced: Synced) -> None:
        """``neighbour`` handed its share (:meth:`BrokerNode.share_heard`)."""
        handed = HandedShare(
            neighbour, synced.entries, synced.complete, synced.wants_share, synced.predecessor
        )
        self.execute(self.node.share_heard(neighbour, handed))

    # -- what client sessions ask ----------------------------------------------------------

    def _core_subscribe(
        self, key: str, subscription: Subscription, now: float
    ) -> tuple[str, list[Action]]:
        """A local subscription the core takes (client sessions reach it through
        :meth:`HostedComposites.local_subscribe`): SBP starts, its delay is 0."""
        sub_id, actions = self.core.subscribe(key, subscription, now)
        self.subscription_delay[sub_id] = 0.0
        return sub_id, actions

    def _core_unsubscribe(self, key: str, sub_id: str) -> list[Action]:
        """A local withdrawal the core takes: the two-step unsubscribe starts."""
        self.subscription_delay.pop(sub_id, None)
        return self.core.unsubscribe(key, sub_id)

    def publish(self, notification: Notification, receipt: PublishReceipt) -> None:
        """A local publication: the node takes it (routes it, its copies carrying
        ``receipt``, or holds it while resyncing), then it is kept for replay (committed
        before its confirm can leave); a full hold raises :class:`ClientError` (the
        client keeps the publication, neither kept nor routed here)."""
        try:
            actions = self.node.publish(notification, receipt, self.lst, self.replaying.refusal())
        except Refused as exc:  # neither kept nor routed
            raise ClientError(str(exc)) from None
        body = encode_body(notification)
        self.replaying.kept(notification, body, receipt)
        if actions is not None:  # else held: answered once routed (:meth:`now_serving`)
            self.execute(actions, notification, body, receipt)

    def pass_ended(self, idle: bool) -> None:
        """A client input pass ends (``idle``: its input ran dry): the retention store
        commits now or soon (:meth:`Replaying.pass_ended`)."""
        self.replaying.pass_ended(idle)

    def replay(
        self,
        key: str,
        filters: list[str],
        since: list[tuple[str, int, int]],
        after: float,
        **window: Any,
    ) -> str:
        """Client ``key`` asks the overlay for what it may have missed, for a window of
        the past, or for a durable record (DESIGN §11; ``window`` as
        :meth:`Replaying.start` takes it)."""
        return self.replaying.start(key, filters, since, after, **window)

    def _queued_toward(self, neighbour: str | None) -> int:
        """Frames waiting on the link to ``neighbour`` (None: the client side's
        deliveries waiting for ``clients.capacity``)."""
        if neighbour is None:
            return self.clients.outbox.flow.paced_deliveries
        link = self.links.get(neighbour)
        return len(link.queue) if link is not None else 0

    def _send_replay(self, neighbour: str, message: ReplayMessage) -> None:
        relayed = self._relayed
        body = relayed[1] if relayed is not None and relayed[0] is message else encode_body(message)
        frame = frame_of(self._sender, body, DATA)
        self.peers.output.put(neighbour, [frame], self.loop.time())

    def execute(
        self,
        actions: list[Action],
        received: object = None,
        body: bytes = b"",
        receipt: PublishReceipt | None = None,
        now: float | None = None,
    ) -> None:
        """Carry out the core's actions (at loop time ``now``, default the loop's clock).
        A forwarded or delivered message that is the ``received`` one goes out with the
        ``body`` it arrived in; others are encoded once each, and a delivery reuses the
        notification's encoded body. A local publication's copies kept in custody carry
        its ``receipt`` and count in it."""
        if now is None:
            now = self.loop.time()
        incoming = None
        if received is not None:
            incoming = [self._sender, body, KEPT if type(received) is Notification else DATA]
        encoded: dict[int, list] | None = None
        deliveries: dict[bytes, list[str]] | None = None
        delivered = None
        forward = self.peers.output.forward
        for action in actions:
            if type(action) is Forward:
                name, message = action
                if message is received:
                    frame = incoming
                else:
                    if encoded is None:
                        encoded = {}
                    frame = encoded.get(id(message))
                    if frame is None:
                        kind = KEPT if type(message) is Notification else DATA
                        frame = encoded[id(message)] = [self._sender, encode_body(message), kind]
                forward(name, frame, now, receipt)
            elif type(action) is Hold:
                self.node.hold(action)
            elif type(action) is Deliver:
                client = self.clients.names.get(action.subscriber)
                if client is None and self.composites.deliver(
                    action.subscriber, action.notification, time.time()
                ):
                    continue
                if client is None:  # gone, its subscription kept for a move (orphans)
                    self.counters["undeliverable.client_gone"] += 1
                    continue
                if deliveries is None:
                    deliveries = {}
                deliveries.setdefault(client[0], []).append(client[1])
                delivered = action.notification
            elif type(action) is Released:
                self.clients.sessions.released(action.subscriber, action.sub_id)
            elif type(action) is Resend:
                self.peers.output.resend(action.link, now)
            elif type(action) is HandedShare:
                synced = Synced(
                    action.entries, action.complete, action.wants_share, action.predecessor
                )
                self.peers.output.send_synced(action.link, synced, now)
        if deliveries:
            if type(received) is Notification:
                payload = body
            else:
                frame = encoded.get(id(delivered)) if encoded else None
                payload = frame[BODY] if frame is not None else encode_body(delivered)
            self.clients.outbox.deliver(deliveries, payload)

    # -- control -------------------------------------------------------------------------

    def move_client(self, client: str, to: str, inside: bool) -> list[str]:
        """Order client ``client`` to move its subscriptions (``ClientConnections.order_move``)."""
        return self.clients.sessions.order_move(client, to, inside)
