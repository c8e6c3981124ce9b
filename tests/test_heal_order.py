"""The order of work when a link heals (DESIGN §7, issue 55): the broker process and the
simulator both hand a healed neighbour, in the node's order
(:meth:`~octopis.core.node.BrokerNode.heard`), what its link gave back, then RESENT,
then the held subscriptions, ``refresh_link``, the held copies and the shares, and only
then hear its word. The heal starts with a heartbeat, the usual first frame (a paused
link still beats): the process once heard its word first, released the held copies
onto the link, took them straight back with what waited and routed them again, and
only then handed the subscriptions over. Real ZeroMQ sockets on 127.0.0.1 for the
process's link and input."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from conditions import until
from test_links import (
    FIG2,
    _liveness,
    _name,
    _read,
    _recording_simulator,
    _routed,
    _with_link,
)

from octopis.core import Forward, Hold, make_broker
from octopis.core.codec import Heartbeat, encode_body
from octopis.core.lst import LinkStatusTable
from octopis.core.node import BrokerNode, Resend
from octopis.failure_schedule import Failure
from octopis.logs import RateLimitedLog
from octopis.transport.frames import message_of
from octopis.transport.links import OutputLink, SendPass
from octopis.transport.peer_input import PeerInput
from octopis.transport.zmqio import DATA, HANDSHAKE, KEPT

BROKER = "c:0"
PEER = FIG2.brokers[BROKER].neighbours[0].id
SCRIPT = [("send", "n0"), ("send", "s1"), ("down", None), ("send", "s2"), ("hold", "n3")]
"""A copy and a subscription sent (in custody), the neighbour declared down, then a
subscription put on its link and a copy held for it by the node (the core's
:class:`Hold`); then the heal."""


def _steps(actions: list) -> list[str]:
    """What ``actions`` do to the link to :data:`PEER`, in order."""
    return [
        "resend" if type(a) is Resend else _name(a.message)
        for a in actions
        if (type(a) is Resend or type(a) is Forward) and a.link == PEER
    ]


def _process() -> list:
    async def process(link: OutputLink, pull, lst: LinkStatusTable) -> list:
        loop = asyncio.get_running_loop()
        node = BrokerNode(make_broker(FIG2, BROKER, "snr", covering="off"), 100, serving=True)
        for neighbour in node.neighbours:
            node.neighbours.built(neighbour, 7, 0.0)
        seen: list = []

        class Events:  # what Broker.link_down and Broker.execute ask of the node
            def link_down(self, neighbour: str, queued: list[list], sent=()) -> None:
                copies = node.link_down(neighbour, queued, _read, sent)
                seen.append(["given back", [_name(message_of(c)) for c in copies]])

            def execute(self, actions: list) -> None:
                if actions:
                    seen.append(["heal", _steps(actions)])

        liveness = _liveness(node, PEER, link, lst, Events())
        counters: Counter[str] = Counter()
        peer_input = PeerInput(
            BROKER, "inproc://heal-order", 1 << 20, link.socket.context, node.neighbours,
            Events(), liveness, liveness.output, counters,  # type: ignore[arg-type]
            RateLimitedLog(logging.getLogger("test"), 1.0), SendPass(), lambda: None,
        )  # fmt: skip
        link.greet([BROKER.encode(), b"greeting", HANDSHAKE], loop.time())
        try:
            for step, arg in SCRIPT:
                if step == "send":
                    kind = KEPT if arg.startswith("n") else DATA
                    link.put([BROKER.encode(), encode_body(_routed(arg)), kind], loop.time())
                elif step == "down":
                    liveness._declare_down(PEER, loop.time(), 1.0)
                else:
                    node.hold(Hold(PEER, _routed(arg)))
                await until(lambda: not link.queue or link.held(), "the link sent", 10)
            # the heal: the peer's heartbeat (serving) is the first frame heard
            peer_input._on_body(PEER, Heartbeat(7, 1, 0, True), b"", loop.time())
        finally:
            peer_input.socket.close(0)
        return seen

    return asyncio.run(_with_link(process, custody_limit=2))


def _simulated() -> list:
    seen: list = []
    sim, _, node = _recording_simulator(BROKER, PEER, seen)
    dispatch = sim._dispatch

    def dispatched(broker: str, actions: list, receipt=None) -> None:
        if broker == BROKER and any(type(a) is Resend for a in actions):
            seen.append(["heal", _steps(actions)])
        dispatch(broker, actions, receipt)

    sim._dispatch = dispatched  # type: ignore[method-assign]
    cut = Failure((BROKER, PEER), 0.0, 1.0)
    for step, arg in SCRIPT:
        if step == "send":
            sim._put(BROKER, PEER, _routed(arg))
        elif step == "down":
            sim._fail(cut)
            sim._detect(BROKER, PEER)
        else:
            node.hold(Hold(PEER, _routed(arg)))
    sim._recover(cut)  # each end hears the other's heartbeat, which says it serves
    return seen


def test_a_heal_that_starts_with_a_heartbeat_goes_in_the_nodes_order_in_both_shells() -> None:
    """Both shells: the copy in custody given back at the detection; at the heal the
    link gives back what waited (nothing the node routes again: the subscription is
    held), then RESENT, the held subscription, the held copy; the heartbeat's word
    releases nothing more (the hand-over gave it the copy already)."""
    processed, simulated = _process(), _simulated()
    assert processed == simulated
    assert processed == [
        ["given back", ["n0"]],  # the detection
        ["given back", []],  # the heal: s2 waited on the link, the node holds it
        ["heal", ["resend", "s2", "n3"]],
    ]
