"""A peer link whose TCP connection dies with frames in it (DESIGN §7, custody): a cut
that outlasts the sender's TCP timeout (``TCP_MAXRT``) aborts the connection, and what
the link had handed to it — ZeroMQ's pipe (``ZMQ_IMMEDIATE`` drops it at the
reconnect), the kernel's send buffer — dies there, while ZeroMQ reconnects on its own
and the link, the same incarnation on both sides, sends on without a handshake. The
notifications among them were given back at the detection; the other routing messages
are pending in custody and sent again when the link heals (RESENT), or handed to a new
incarnation of the neighbour. Real ZeroMQ sockets on 127.0.0.1, joined by a relay that
plays the cut, and the same script on the simulator's links."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio
from conditions import until
from test_links import FIG2, _liveness, _name, _read, _routed

from octopis.core import Forward, Notification, Subscribe, make_broker
from octopis.core.codec import Hello, Resent, Synced, decode_body, encode_body
from octopis.core.custody import resent, took
from octopis.core.lst import LinkStatusTable
from octopis.core.neighbours import Neighbour
from octopis.core.node import BrokerNode, HandedShare, Resend
from octopis.failure_schedule import Failure
from octopis.sim import Simulator
from octopis.sim.custody import LinkCustody
from octopis.transport.links import Activity, OutputLink
from octopis.transport.zmqio import DATA, HANDSHAKE, KEPT


class Relay:
    """A TCP relay from the link to the receiver: while :attr:`cut`, what the link sends
    is swallowed (kept in :attr:`swallowed`), as a partition strands it in the sender's
    kernel; :meth:`abort` then drops every connection, as TCP does once the cut outlasts
    its timeout, and the link's next connection is relayed again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cut = False
        self.swallowed = b""
        self.accepted = 0
        """Connections the link made."""
        self.writers: list[asyncio.StreamWriter] = []
        self.relaying: list[asyncio.Task] = []

    async def start(self) -> int:
        """Listen; returns the port the link connects to."""
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.relaying.append(asyncio.current_task())  # type: ignore[arg-type]
        peer_reader, peer_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers += [writer, peer_writer]
        await asyncio.gather(self._pump(reader, peer_writer, True), self._pump(peer_reader, writer))

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, outgoing: bool = False
    ) -> None:
        while data := await reader.read(65536):
            if outgoing and self.cut:
                self.swallowed += data
            else:
                writer.write(data)

    def abort(self) -> None:
        """Drop every connection; the cut heals."""
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()
        self.cut = False

    async def close(self) -> None:
        """Drop every connection and stop listening, once each relaying task ended."""
        self.abort()
        self.server.close()
        await asyncio.gather(*self.relaying, return_exceptions=True)


BROKER, PEER = "c:0", FIG2.brokers["c:0"].neighbours[0].id
SCRIPT = [
    *(("send", name) for name in ("n0", "s1")),
    ("taken", None),
    *(("send", name) for name in ("s2", "n3", "s4")),
    ("cut", None),
    ("down", None),
    ("send", "s5"),
]
"""Sends (``n…`` a notification, ``s…`` a subscription), the neighbour's acknowledgement
of what it took, more sends, still in flight when the link is cut (they die with the
connection), the detection, a send while the neighbour is down; then the end: the link
heals, or the neighbour restarts."""


class Receiver:
    """The neighbour's side of the rule, as its peer input applies it
    (:meth:`~octopis.transport.peer_input.PeerInput._on_body`): the routing messages it
    takes from the link, in order, and its count of them."""

    def __init__(self) -> None:
        self.record = Neighbour()
        self.taken: list[str] = []
        self.dropped = 0

    def body(self, body: bytes) -> None:
        message = decode_body(BROKER, body)
        kind = type(message)
        if kind is Hello:  # a handshake starts the count again (Neighbours.hello)
            self.record.received = self.record.acked = 0
        elif kind is Resent:
            takes = resent(self.record, message.numbered, [n for n, _ in message.messages])
            self.dropped += takes.count(False)
            self.taken += [
                _name(decode_body(BROKER, b))
                for (_, b), take in zip(message.messages, takes, strict=True)
                if take
            ]
        elif kind is not Synced:
            took(self.record, 1)
            self.taken.append(_name(message))


def _process(end: str, acknowledged: int) -> tuple[list[str], int, int, int]:
    """:data:`SCRIPT` on a broker process's link, through a relay that plays the cut,
    its liveness detecting and ending it (``end``: "back", the same incarnation is heard
    again; "restart", a new one's HELLO); the neighbour acknowledges ``acknowledged`` at
    "taken". Returns what the neighbour took, its count, the link's count and how many
    resent messages it dropped."""

    async def scenario() -> tuple[list[str], int, int, int]:
        loop = asyncio.get_running_loop()
        ctx = zmq.asyncio.Context()
        pull = ctx.socket(zmq.PULL)
        relay = Relay(pull.bind_to_random_port("tcp://127.0.0.1"))
        relayed = await relay.start()
        lst = LinkStatusTable([PEER])
        link = OutputLink(PEER, f"tcp://127.0.0.1:{relayed}", ctx, lst, 1000, (), Activity(), 100)
        sender = asyncio.create_task(link.run())
        node = BrokerNode(make_broker(FIG2, BROKER, "snr", covering="off"), 100, serving=True)
        for neighbour in node.neighbours:
            node.neighbours.built(neighbour, 7, 0.0)
        receiver = Receiver()

        def put(message: object) -> None:
            kind = KEPT if type(message) is Notification else DATA
            link.put([BROKER.encode(), encode_body(message), kind], loop.time())

        class Events:  # what the broker asks of its node (Broker.link_down, ...)
            def link_down(self, neighbour: str, queued: list[list], sent=()) -> None:
                node.link_down(neighbour, queued, _read, sent)  # n3: routed again

            def execute(self, actions: list) -> None:  # a heal's (BrokerNode.heard)
                for action in actions:
                    if type(action) is Resend:
                        liveness.output.resend(action.link, loop.time())
                    elif type(action) is Forward:
                        put(action.message)
                    elif type(action) is HandedShare:  # a neighbour met (BrokerNode.meet)
                        synced = Synced(action.entries, action.complete, False, False)
                        liveness.output.send_synced(action.link, synced, loop.time())

        async def took(count: int) -> bool:
            while await pull.poll(0):
                for body in (await pull.recv_multipart())[1:]:
                    receiver.body(body)
            return len(receiver.taken) == count

        async def came(name: str) -> bool:
            await took(-1)
            return name in receiver.taken

        liveness = _liveness(node, PEER, link, lst, Events())
        try:
            link.greet(liveness.output.frame(Hello(1, 7), HANDSHAKE), loop.time())
            for step, name in SCRIPT:
                if step == "send":
                    put(_routed(name))
                elif step == "taken":
                    await until(lambda: took(2), "the link carries", 10)
                    link.acknowledge(acknowledged, loop.time())
                    relay.cut = True  # what is sent from here is in flight at the cut
                elif step == "cut":
                    await until(lambda: b"s4" in relay.swallowed, "the link sent into the cut", 10)
                elif step == "down":
                    liveness._declare_down(PEER, loop.time(), 1.0)
                    relay.abort()  # the cut outlasts TCP's timeout
                    await until(lambda: relay.accepted == 2, "ZeroMQ reconnects", 10)
            state = node.neighbours[PEER]
            if end == "back":  # a data frame heard: no word
                liveness.heard(PEER, state, None, loop.time())
            else:
                node.neighbours.heard(PEER, loop.time())
                liveness.link_message(PEER, state, Hello(9, 1), loop.time())
            await until(lambda: took(5 + (end == "restart") * (acknowledged < 2)), "all came", 10)
            put(_routed("n99"))  # a marker: once it has come, so has all the link sent before
            await until(lambda: came("n99"), "the marker came", 10)
            taken = receiver.taken[: receiver.taken.index("n99")]
            return taken, receiver.record.received - 1, link.custody.numbered - 1, receiver.dropped
        finally:
            sender.cancel()
            link.socket.close(0)
            pull.close(0)
            await relay.close()
            ctx.term()

    return asyncio.run(scenario())


def _simulated(end: str) -> tuple[list[str], int, int, int]:
    """:data:`SCRIPT` on the simulator's link ``c:0 → PEER``: the cut is a failure of the
    link (``end`` "back") or of the neighbour (a crash, "restart"), what is in flight
    then is lost, the detection is the simulator's own; returns as :func:`_process`."""
    sim = Simulator(FIG2, "snr", covering="off")
    state = sim._failure_state()
    state.custody = LinkCustody(retain=0.0)
    taken: list[str] = []
    receive = sim._receive

    def received(broker: str, src: str, message: object) -> list:
        if (broker, src) != (PEER, BROKER) or type(message) not in (Notification, Subscribe):
            return receive(broker, src, message)
        taken.append(_name(message))  # the script's own: taken, not routed
        return []

    sim._receive = received  # type: ignore[method-assign]
    cut = Failure((BROKER, PEER) if end == "back" else (PEER,), 0.0, 1.0)
    for step, name in SCRIPT:
        if step == "send":
            sim._put(BROKER, PEER, _routed(name))
        elif step == "taken":
            sim.run()
        elif step == "cut":
            sim._fail(cut)
        elif step == "down":
            sim.run()  # in flight: lost; the detection
    sim._recover(cut)
    sim.run()
    numbered = state.custody.of(BROKER, PEER).numbered
    received_count = sim.nodes[PEER].neighbours[BROKER].received
    return taken, received_count, numbered, sim.failure_counts["links.resent_dropped"]


@pytest.mark.parametrize("end", ["back", "restart"])
def test_what_a_cut_aborts_reaches_the_neighbour_once_in_order(end: str) -> None:
    """:data:`SCRIPT` on a broker process's link (real ZeroMQ, a relay aborting the
    connection the cut stranded frames in) and on the simulator's link. The subscriptions
    sent into the cut reach the neighbour once, in the order sent, ahead of the one sent
    while it was down: healed, the link sends them again (RESENT) and the neighbour takes
    those it had not, dropping the one it had taken and not acknowledged; restarted, the
    node hands them to the new process ahead of what it held. The notification sent into
    the cut went back at the detection. The link's count and the neighbour's agree."""
    acknowledged = 1 if end == "back" else 2  # "back": s1 arrived, unacknowledged
    taken, received, numbered, dropped = _process(end, acknowledged)
    assert taken == ["n0", "s1", "s2", "s4", "s5"]
    assert received == numbered
    assert dropped == (end == "back")  # s1, resent
    sim_taken, sim_received, sim_numbered, _ = _simulated(end)
    assert sim_taken == taken
    assert sim_received == sim_numbered
