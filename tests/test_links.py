"""The output side of a peer link (``octopis.transport.links``, DESIGN §7): routing frames
wait for the handshake that names the receiver, and custody hands back what a receiver
may not have passed on. Real ZeroMQ sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import zmq
import zmq.asyncio
from conditions import until

from octopis.core import Forward, Notification, Subscribe, SubState, Unsubscribe, make_broker
from octopis.core.codec import Hello, Synced, encode_body
from octopis.core.custody import Custody, PublishReceipt
from octopis.core.lst import LinkStatusTable
from octopis.core.neighbours import Neighbours
from octopis.core.node import BrokerNode, HandedShare
from octopis.failure_schedule import Failure
from octopis.filters.language import Predicate, Subscription
from octopis.logs import RateLimitedLog
from octopis.settings import Links
from octopis.sim import Simulator
from octopis.sim.custody import GOES, WAITS, LinkCustody
from octopis.sim.failures import FailureState
from octopis.topology import build_preset
from octopis.transport.frames import KIND, message_of
from octopis.transport.links import (
    BATCH_FRAMES,
    Activity,
    OutputLink,
    SendPass,
)
from octopis.transport.peer_liveness import PeerLiveness
from octopis.transport.peer_output import PeerOutput
from octopis.transport.pressure import PressureGauge
from octopis.transport.zmqio import DATA, HANDSHAKE, KEPT, LINK


async def _with_link(
    scenario,
    *,
    custody_limit: int = 100,
    retain: float = 0.0,
    retain_limit: int = 1000,
    send_pass: SendPass | None = None,
):
    ctx = zmq.asyncio.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    lst = LinkStatusTable(["peer"])
    link = OutputLink(
        "peer",
        f"tcp://127.0.0.1:{port}",
        ctx,
        lst,
        1000,
        (),
        Activity(),
        custody_limit,
        retain,
        retain_limit,
        send_pass=send_pass,
    )
    sender = asyncio.create_task(link.run())
    try:
        return await scenario(link, pull, lst)
    finally:
        sender.cancel()
        link.socket.close(0)
        pull.close(0)
        ctx.term()


async def _drain(pull: zmq.asyncio.Socket, wait: float = 0.3) -> list[bytes]:
    """The bodies (every part after the sender's) of every message that arrives within
    ``wait`` seconds."""
    bodies = []
    while await pull.poll(wait * 1000):
        bodies += (await pull.recv_multipart())[1:]
    return bodies


def test_routing_frames_wait_for_the_greeting_and_follow_it() -> None:
    """A restarted broker's first forwards (held subscriptions it passes on) must not
    reach a neighbour before the handshake naming that neighbour's incarnation: they
    wait, then go right behind it, and a handshake still queued is void."""

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> None:
        loop = asyncio.get_running_loop()
        link.put([b"me", b"first hello", HANDSHAKE], loop.time())
        link.put([b"me", b"subscription", DATA], loop.time())
        link.put([b"me", b"notification", KEPT], loop.time())
        link.put_link([b"me", b"heartbeat", LINK], loop.time())
        early = await _drain(pull)
        assert b"subscription" not in early and b"notification" not in early
        assert b"heartbeat" in early
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        late = await _drain(pull)
        assert late == [b"greeting", b"subscription", b"notification"]
        assert lst.rows["peer"].queue_length == 0

    asyncio.run(_with_link(scenario))


async def _messages(pull: zmq.asyncio.Socket, wait: float = 0.3) -> list[list[bytes]]:
    """Every message (its bodies) that arrives within ``wait`` seconds."""
    messages = []
    while await pull.poll(wait * 1000):
        messages.append((await pull.recv_multipart())[1:])
    return messages


def test_what_a_send_pass_puts_leaves_as_one_message_when_it_ends() -> None:
    """DESIGN §5: frames put while a pass is open wait for its end and then leave as one
    message, in order, a heartbeat put meanwhile at its head; outside a pass a frame
    leaves at once, alone; every frame counts in the LST as sent."""
    send_pass = SendPass()

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> None:
        loop = asyncio.get_running_loop()
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        assert await _messages(pull) == [[b"greeting"]]
        send_pass.open = True
        for n in range(5):
            link.put([b"me", b"n%d" % n, KEPT], loop.time())
        link.put_link([b"me", b"beat", LINK], loop.time())
        assert len(link.queue) == 6 and link.messages == 1  # the pass is open: all wait
        send_pass.end(loop.time())
        assert await _messages(pull) == [[b"beat", b"n0", b"n1", b"n2", b"n3", b"n4"]]
        link.put([b"me", b"alone", KEPT], loop.time())
        assert await _messages(pull) == [[b"alone"]]
        assert (link.messages, link.sent) == (3, 8)
        assert lst.rows["peer"].queue_length == 0

    asyncio.run(_with_link(scenario, send_pass=send_pass))


def test_an_acknowledgement_put_now_leaves_during_a_send_pass() -> None:
    """An acknowledgement put with ``put_now`` leaves at once, alone, while the pass is
    open and the link's queue is empty; behind a queue it goes to the head and leaves
    with the pass's frames."""
    send_pass = SendPass()

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> None:
        loop = asyncio.get_running_loop()
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        assert await _messages(pull) == [[b"greeting"]]
        send_pass.open = True
        link.put_now([b"me", b"ack1", LINK], loop.time())
        assert await _messages(pull) == [[b"ack1"]]
        link.put([b"me", b"n0", KEPT], loop.time())
        link.put_now([b"me", b"ack2", LINK], loop.time())
        assert len(link.queue) == 2
        send_pass.end(loop.time())
        assert await _messages(pull) == [[b"ack2", b"n0"]]
        assert lst.rows["peer"].queue_length == 0

    asyncio.run(_with_link(scenario, send_pass=send_pass))


def test_a_batch_stops_where_custody_is_full_and_at_its_size() -> None:
    """A batch takes routing frames only while custody has room (the rest wait for an
    acknowledgement) and at most BATCH_FRAMES frames a message."""
    send_pass = SendPass()
    total = BATCH_FRAMES + 10

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> None:
        loop = asyncio.get_running_loop()
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        await _messages(pull)
        send_pass.open = True
        for n in range(3):
            link.put([b"me", b"n%d" % n, KEPT], loop.time())
        send_pass.end(loop.time())
        assert await _messages(pull) == [[b"n0", b"n1"]]  # custody holds 2
        link.acknowledge(2, loop.time())
        assert await _messages(pull) == [[b"n2"]]
        link.custody.limit = 1000
        link.acknowledge(3, loop.time())
        send_pass.open = True
        for n in range(total):
            link.put([b"me", b"m%d" % n, KEPT], loop.time())
        send_pass.end(loop.time())
        sizes = [len(m) for m in await _messages(pull)]
        assert sizes == [BATCH_FRAMES, total - BATCH_FRAMES]

    asyncio.run(_with_link(scenario, custody_limit=2, send_pass=send_pass))


def test_take_back_returns_retained_then_unacknowledged_then_queued() -> None:
    """Acknowledged notifications stay retained for ``retain`` seconds; taking the link
    back returns them, then the unacknowledged ones, then what was never sent."""

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> list[list]:
        loop = asyncio.get_running_loop()
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        for n in range(4):
            link.put([b"me", b"n%d" % n, KEPT], loop.time())
        received = await _drain(pull)
        assert received == [b"greeting", b"n0", b"n1", b"n2", b"n3"]
        link.acknowledge(2, loop.time())
        assert [f[1] for _, _, f in link.custody.retained] == [b"n0", b"n1"]
        assert [f[1] for _, _, f in link.custody.unacked] == [b"n2", b"n3"]
        return link.take_back(loop.time())

    frames = asyncio.run(_with_link(scenario, retain=60.0))
    assert [f[1] for f in frames] == [b"n0", b"n1", b"n2", b"n3"]


def test_the_retained_window_keeps_its_limit_and_its_horizon() -> None:
    """Acknowledgements move notifications from custody to the retained window in order:
    beyond ``retain_limit`` the oldest are evicted and counted; those older than
    ``retain`` seconds leave uncounted; an acknowledgement of what is already settled
    changes nothing."""

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> None:
        loop = asyncio.get_running_loop()
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        for n in range(6):
            link.put([b"me", b"n%d" % n, KEPT], loop.time())
        assert len(await _drain(pull)) == 7
        link.acknowledge(4, loop.time())
        assert [f[1] for _, _, f in link.custody.retained] == [b"n1", b"n2", b"n3"]
        assert [f[1] for _, _, f in link.custody.unacked] == [b"n4", b"n5"]
        assert link.custody.evicted == 1
        link.acknowledge(4, loop.time())
        assert len(link.custody.retained) == 3 and len(link.custody) == 2
        assert link.custody.evicted == 1
        link.acknowledge(6, loop.time() + 120.0)  # all of them sent long before
        assert not link.custody.retained and not link.custody.unacked
        assert link.custody.evicted == 1

    asyncio.run(_with_link(scenario, retain=60.0, retain_limit=3))


def test_a_publication_is_answered_once_the_neighbour_acknowledges_its_copy() -> None:
    """A local publication's frame carries its receipt: the publisher is answered when
    the receiver acknowledges the copy, not when it is sent; the retained copy no longer
    carries it, and a copy taken back unacknowledged still does (its broker reroutes it
    and counts the new copies in the same receipt)."""
    answered: list[bytes] = []

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> list[list]:
        loop = asyncio.get_running_loop()
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        for name in (b"p1", b"p2"):
            receipt = PublishReceipt(lambda name=name: answered.append(name))
            receipt.keep()
            link.put([b"me", name, KEPT, receipt], loop.time())
        assert await _drain(pull) == [b"greeting", b"p1", b"p2"]
        assert answered == []  # sent is not held
        link.acknowledge(1, loop.time())
        assert answered == [b"p1"]
        assert [len(f) for _, _, f in link.custody.retained] == [3]
        return link.take_back(loop.time())

    frames = asyncio.run(_with_link(scenario, retain=60.0))
    assert [(f[1], len(f)) for f in frames] == [(b"p1", 3), (b"p2", 4)]
    assert answered == [b"p1"]


def test_a_full_custody_buffer_stops_the_link_and_counts_it() -> None:
    """With ``custody_limit`` unacknowledged notifications out, the next ones queue (the
    LST sees them) until an acknowledgement makes room."""

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> None:
        loop = asyncio.get_running_loop()
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        for n in range(5):
            link.put([b"me", b"n%d" % n, KEPT], loop.time())
        assert await _drain(pull) == [b"greeting", b"n0", b"n1"]
        link.put([b"me", b"n5", KEPT], loop.time())  # wakes the sender: the same stop
        for _ in range(3):  # loop turns, not time: the woken sender runs in the next one
            await asyncio.sleep(0)
        assert len(link.queue) == 4 and link.custody.stops == 1
        link.acknowledge(2, loop.time())
        assert await _drain(pull) == [b"n2", b"n3"]

    asyncio.run(_with_link(scenario, custody_limit=2))


def test_a_stop_after_a_handshake_is_counted_at_the_same_number_too() -> None:
    """A handshake starts the numbering again, and the stop count with it: a link that
    stops at number 2, is taken back and greeted again, and stops at number 2 once more
    counts two stops (as :meth:`Custody.greeted` does in the simulator)."""

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> None:
        loop = asyncio.get_running_loop()
        for session in (1, 2):
            link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
            for n in range(3):
                link.put([b"me", b"n%d" % n, KEPT], loop.time())
            assert await _drain(pull) == [b"greeting", b"n0", b"n1"]
            await until(lambda s=session: link.custody.stops == s, f"stop {session}", 5.0)
            assert link.custody.numbered == 2
            link.take_back(loop.time())

    asyncio.run(_with_link(scenario, custody_limit=2))


def test_activity_wakes_the_lst_tick_on_the_first_put_after_it_looked() -> None:
    """The LST's tick sleeps until a frame is put on some link; it wakes at once for a
    put made while it was busy, and not again until the next put after it looked."""

    async def scenario(link: OutputLink, pull, lst: LinkStatusTable) -> None:
        loop = asyncio.get_running_loop()
        activity = link._activity
        tick = asyncio.create_task(activity.wait())
        await asyncio.sleep(0.05)
        assert not tick.done() and not activity.seen
        link.put([b"me", b"heartbeat", LINK], loop.time())
        link.put([b"me", b"heartbeat", LINK], loop.time())
        assert activity.seen
        await asyncio.wait_for(tick, 1.0)
        assert not activity.seen
        again = asyncio.create_task(activity.wait())
        await asyncio.sleep(0.05)
        assert not again.done()
        link.put([b"me", b"heartbeat", LINK], loop.time())
        await asyncio.wait_for(again, 1.0)

    asyncio.run(_with_link(scenario))


def test_a_link_holding_routing_frames_still_beats_once_a_heartbeat() -> None:
    """A link whose queue is held (its neighbour declared down and not heard since, so
    routing frames wait) still sends a heartbeat each interval, ahead of them, and never
    queues a second while one waits: else a neighbour that hears us once after a heal
    hears nothing more and declares us down again."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ctx = zmq.asyncio.Context()
        pull = ctx.socket(zmq.PULL)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        counters: Counter[str] = Counter()
        warn = RateLimitedLog(logging.getLogger("test"), 1.0)
        output = PeerOutput(
            "me",
            1,
            Links(),
            ctx,
            LinkStatusTable(["peer"]),
            Neighbours(["peer"], loop.time()),
            PressureGauge("me", 1000, 1000, 64, counters, warn),
            lambda: True,
            lambda: 0,
            counters,
            Activity(),
            SendPass(),
        )
        link = output.open("peer", f"tcp://127.0.0.1:{port}")
        sender = asyncio.create_task(link.run())
        try:
            link.put([b"me", b"notification", KEPT], loop.time())  # never greeted: held
            assert link.held()
            output.beat_due(loop.time() + 1.0, 0.2)
            assert not link.held()  # a heartbeat at the head
            output.beat_due(loop.time() + 1.0, 0.2)
            assert [f[KIND] for f in link.queue] == [LINK, KEPT]
            assert len(await _drain(pull)) == 1  # the heartbeat left, the notification not
            output.beat_due(loop.time() + 1.0, 0.2)
            assert len(await _drain(pull)) == 1
            assert [f[KIND] for f in link.queue] == [KEPT]
        finally:
            sender.cancel()
            link.socket.close(0)
            pull.close(0)
            ctx.term()

    asyncio.run(scenario())


CUSTODY_SCRIPT = [
    *(("send", name) for name in ("n0", "s1", "n2", "n3", "n4", "n5", "n6")),
    ("ack", 3),
    ("send", "n7"),
    ("ack", 5),
    ("ack", 5),
    ("send", "s8"),
    ("down", None),
]
"""Sends (``n…`` a notification, ``s…`` a subscription message), acknowledgements of a
count, and the link going down, in this order."""


def test_the_process_and_the_simulator_keep_and_take_back_the_same_copies() -> None:
    """One script of sends, acknowledgements and a link down, played on a broker process's
    output link (real ZeroMQ) and on the simulator's links: after every step both keep
    the same copies unacknowledged, the same retained and the same waiting for room
    (custody full at 3, 2 retained at most), and the link down gives back the same
    copies in the same order (retained, unacknowledged, then what waited)."""

    async def process(link: OutputLink, pull, lst: LinkStatusTable) -> list:
        loop = asyncio.get_running_loop()
        link.greet([b"me", b"greeting", HANDSHAKE], loop.time())
        seen = []
        for step, arg in CUSTODY_SCRIPT:
            if step == "send":
                kind = KEPT if arg.startswith("n") else DATA
                link.put([b"me", arg.encode(), kind], loop.time())
            elif step == "ack":
                link.acknowledge(arg, loop.time())
            else:
                seen.append([f[1].decode() for f in link.take_back(loop.time())])
                return seen
            await until(lambda: not link.queue or link.held(), "the link sent what it may", 10)
            seen.append(_state(link.custody, [f[1].decode() for f in link.queue]))
        return seen

    processed = asyncio.run(_with_link(process, custody_limit=3, retain=60.0, retain_limit=2))

    links = LinkCustody(retain=60.0, custody_limit=3, retain_limit=2)
    simulated = []

    def put(message: object, now: float) -> None:
        assert links.departs("me", "peer", now, message, broken=False) in (GOES, WAITS)

    for now, (step, arg) in enumerate(CUSTODY_SCRIPT):
        if step == "send":
            put(_message(arg), float(now))
        elif step == "ack":
            for message in links.acknowledge("me", "peer", arg, float(now)):
                put(message, float(now))
        else:
            simulated.append([_name(m) for m in links.take_back("me", "peer")])
            break
        waiting = [_name(m) for m in links.waiting.get(("me", "peer"), ())]
        simulated.append(_state(links.of("me", "peer"), waiting))

    assert processed == simulated
    assert processed[-1] == ["n3", "n4", "n5", "n6", "n7", "s8"]
    assert processed[-2] == ([(6, "n5"), (7, "n6"), (8, "n7")], [(4, "n3"), (5, "n4")], ["s8"])


def _message(name: str) -> Notification | Unsubscribe:
    if name.startswith("n"):
        return Notification("pub", int(name[1:]), 0.0, {})
    return Unsubscribe(name, SubState.PRIMARY)


def _name(message: object) -> str:
    if type(message) is Notification:
        return f"n{message.seq}"
    return message.sub_id  # type: ignore[attr-defined]


def _copy(copy: object) -> str:
    """A kept copy's name: a process frame's body, a simulator message's."""
    return copy[1].decode() if type(copy) is list else _name(copy)  # type: ignore[index]


def _state(custody: Custody, waiting: list[str]) -> tuple[list, list, list[str]]:
    """The entries unacknowledged and retained (number, name), and what waits for room."""
    unacked = [(number, _copy(copy)) for number, _, copy in custody.unacked]
    retained = [(number, _copy(copy)) for number, _, copy in custody.retained]
    return unacked, retained, waiting


HOLDS_SCRIPT = [
    *(("send", name) for name in ("n0", "s1", "n2", "s3")),
    ("cut", None),
    ("down", None),
    ("send", "s4"),
    ("send", "n5"),
    ("send", "s6"),
    ("back", None),
]
"""Sends (``n…`` a notification, ``s…`` a subscription), the link cut (the process
cannot tell), its sender declaring the neighbour down, and the neighbour heard again,
in this order; custody is full at 2 copies."""


def test_the_process_and_the_simulator_hold_and_hand_back_the_same_subscriptions() -> None:
    """One script played on a broker process's peer link (real ZeroMQ, its liveness's own
    detection and return) and on the simulator's link (its failure events): after every
    step both nodes hold the same subscription messages for the neighbour and the same
    wait on the link; what waited is given back at the detection and at the return (not
    when it was put), the copies come back in the same order, and the healed link hands
    the same subscriptions in the order they were sent (DESIGN §7)."""
    broker, peer = "c:0", FIG2.brokers["c:0"].neighbours[0].id

    async def process(link: OutputLink, pull, lst: LinkStatusTable) -> list:
        loop = asyncio.get_running_loop()
        node = BrokerNode(make_broker(FIG2, broker, "snr", covering="off"), 100, serving=True)
        for neighbour in node.neighbours:
            node.neighbours.built(neighbour, 7, 0.0)
        seen: list = []

        class Events:  # what Broker.link_down and execute ask of the node
            def link_down(self, neighbour: str, queued: list[list], sent=()) -> None:
                copies = node.link_down(neighbour, queued, _read, sent)
                seen.append(["given back", [_name(message_of(c)) for c in copies]])

            def execute(self, actions: list) -> None:  # a heal's (BrokerNode.heard)
                handed = _handed(actions, peer)
                seen.append(["healed", handed])
                liveness.output.resend(peer, loop.time())  # its Resend, first
                for name in handed:  # on the link, as Broker.execute puts them
                    link.put([broker.encode(), encode_body(_routed(name)), DATA], loop.time())

        liveness = _liveness(node, peer, link, lst, Events())
        link.greet([b"c:0", b"greeting", HANDSHAKE], loop.time())
        for step, arg in HOLDS_SCRIPT:
            if step == "send":
                kind = KEPT if arg.startswith("n") else DATA
                link.put([broker.encode(), encode_body(_routed(arg)), kind], loop.time())
            elif step == "down":
                liveness._declare_down(peer, loop.time(), 1.0)
            elif step == "back":  # a data frame heard: no word
                liveness.heard(peer, node.neighbours[peer], None, loop.time())
            await until(lambda: not link.queue or link.held(), "the link sent what it may", 10)
            waiting = [_name(message_of(f)) for f in link.queue if f[KIND] >= DATA]
            seen.append([step, _held(node, peer), waiting])
        return seen

    processed = asyncio.run(_with_link(process, custody_limit=2))

    simulated: list = []
    sim, state, node = _recording_simulator(broker, peer, simulated)
    link_back = node.link_back

    def healed(neighbour: str) -> list:
        actions = link_back(neighbour)
        if neighbour == peer:
            simulated.append(["healed", _handed(actions, neighbour)])
        return actions

    node.link_back = healed  # type: ignore[method-assign]
    cut = Failure((broker, peer), 0.0, 1.0)
    for step, arg in HOLDS_SCRIPT:
        if step == "send":
            sim._put(broker, peer, _routed(arg))
        elif step == "cut":
            sim._fail(cut)
        elif step == "down":
            sim._detect(broker, peer)
        elif step == "back":
            sim._recover(cut)
        waiting = [_name(m) for m in state.custody.waiting.get((broker, peer), ())]
        simulated.append([step, _held(node, peer), waiting])

    assert processed == simulated
    assert ["given back", ["n0", "n2"]] in processed  # the copies in custody, at the detection
    assert ["healed", ["s3", "s4", "s6"]] in processed


def _recording_simulator(
    broker: str, peer: str, seen: list
) -> tuple[Simulator, FailureState, BrokerNode]:
    """A simulator of fig2 (SNR), custody full at 2 copies, whose node of ``broker``
    records in ``seen`` what each link to ``peer`` gives back (the copies' names)."""
    sim = Simulator(FIG2, "snr", covering="off")
    state = sim._failure_state()
    state.custody = LinkCustody(retain=0.0, custody_limit=2)
    node = sim.nodes[broker]
    link_down = node.link_down

    def given_back(neighbour: str, items: list, read=None, sent=()) -> list:
        copies = link_down(neighbour, items, read, sent)
        if neighbour == peer:
            seen.append(["given back", [_name(c) for c in copies]])
        return copies

    node.link_down = given_back  # type: ignore[method-assign]
    return sim, state, node


_LOG = logging.getLogger("test")
FIG2 = build_preset("fig2")


def _liveness(
    node: BrokerNode, peer: str, link: OutputLink, lst: LinkStatusTable, events: object
) -> PeerLiveness:
    """The liveness of ``node``'s broker process, its link to ``peer`` being ``link``."""
    broker, counters = node.core.id, Counter[str]()
    output = PeerOutput(
        broker,
        1,
        Links(),
        link.socket.context,
        lst,
        node.neighbours,
        PressureGauge(broker, 1000, 1000, 64, counters, RateLimitedLog(_LOG, 1.0)),
        lambda: True,
        lambda: 0,
        counters,
        Activity(),
        SendPass(),
    )
    output.links[peer] = link
    return PeerLiveness(
        broker, 1, node, lst, output, events, counters,  # type: ignore[arg-type]
        heartbeat=0.2, down_after=1.0, ack_interval=0.05,
    )  # fmt: skip


def _routed(name: str) -> Notification | Subscribe:
    """A routing message by name: ``n…`` a notification, ``s…`` a subscription."""
    if name.startswith("n"):
        return Notification("pub", int(name[1:]), 0.0, {"x": 1})
    subscription = Subscription((Predicate("x", "<", 5),))
    return Subscribe(name, "c:0", subscription, SubState.PRIMARY, None, 0.0)


def _read(frame: list) -> object:
    return message_of(frame)


def _held(node: BrokerNode, neighbour: str) -> list[str]:
    """The names of the subscription messages ``node`` holds for ``neighbour``."""
    return [_name(m) for m in node.recovery.subscriptions.get(neighbour, ())]


def _handed(actions: list, neighbour: str) -> list[str]:
    """The names of the subscriptions ``actions`` send ``neighbour``."""
    return [_name(a.message) for a in actions if type(a) is Forward and a.link == neighbour]


def test_a_neighbour_met_first_gets_what_waited_for_it_in_the_order_it_was_sent() -> None:
    """A neighbour never met is declared down (the subscription waiting for its handshake
    is held), then a withdrawal of that subscription and another subscription wait on
    its link; at its first handshake the link gives them back and the node hands them on
    as a new process gets them (DESIGN §7): only the subscription no later message
    withdraws. Sent as they waited, the withdrawal would reach it ahead of the held
    subscription and leave that alive there."""
    broker, peer = "c:0", FIG2.brokers["c:0"].neighbours[0].id

    async def process(link: OutputLink, pull, lst: LinkStatusTable) -> list[str]:
        loop = asyncio.get_running_loop()
        node = BrokerNode(make_broker(FIG2, broker, "snr", covering="off"), 100, serving=True)

        def put(message: object) -> None:
            link.put([broker.encode(), encode_body(message), DATA], loop.time())

        class Events:  # what Broker.link_down and execute ask of the node
            def link_down(self, neighbour: str, queued: list[list], sent=()) -> None:
                assert node.link_down(neighbour, queued, _read, sent) == []

            def execute(self, actions: list) -> None:  # the hand-over (BrokerNode.meet)
                for action in actions:
                    if type(action) is HandedShare:
                        synced = Synced(action.entries, action.complete, False, False)
                        liveness.output.send_synced(action.link, synced, loop.time())
                    else:
                        put(action.message)

        liveness = _liveness(node, peer, link, lst, Events())
        put(_routed("s1"))  # waits for the handshake
        liveness._declare_down(peer, loop.time(), 1.0)
        put(Unsubscribe("s1", SubState.PRIMARY))
        put(_routed("s2"))
        state = node.neighbours[peer]
        node.neighbours.heard(peer, loop.time())
        liveness.link_message(peer, state, Hello(9, 0), loop.time())
        bodies = await _drain(pull)
        messages = [message_of([broker.encode(), body]) for body in bodies]
        return [_name(m) for m in messages if type(m) in (Subscribe, Unsubscribe)]

    assert asyncio.run(_with_link(process)) == ["s2"]


def test_a_link_s_tcp_connection_is_aborted_only_after_the_detection() -> None:
    """A peer link's TCP connection with data unacknowledged is aborted (``TCP_MAXRT``)
    three times ``links.down_after`` after, whatever that is set to: the neighbour is
    declared down, and custody's notifications given back, before frames die with a
    connection (DESIGN §7), a one-way cut's talker too (it is declared down by its
    listener first, ~2 ``down_after`` after the cut); the rest are sent again at the heal."""

    async def maxrt(down_after: float) -> int:
        ctx = zmq.asyncio.Context()
        lst = LinkStatusTable(["peer"])
        link = OutputLink(
            "peer", "tcp://127.0.0.1:1", ctx, lst, 8, (), Activity(), 100, down_after=down_after
        )
        try:
            return link.socket.getsockopt(zmq.TCP_MAXRT)
        finally:
            link.socket.close(0)
            ctx.term()

    for down_after in (Links().down_after, 3.0, 0.25):
        assert asyncio.run(maxrt(down_after)) == round(3000 * down_after)
