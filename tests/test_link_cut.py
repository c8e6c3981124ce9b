"""A peer link whose TCP connection dies with frames in it (DESIGN §7, custody): a cut
that outlasts the sender's TCP timeout (``TCP_MAXRT``) aborts the connection, and what
the link had handed to it — ZeroMQ's pipe (``ZMQ_IMMEDIATE`` drops it at the
reconnect), the kernel's send buffer — dies there, while ZeroMQ reconnects on its own
and the link, the same incarnation on both sides, sends on without a handshake. Real
ZeroMQ sockets on 127.0.0.1, joined by a relay that plays the cut."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio
from conditions import until
from test_links import FIG2, _routed

from octopis.core.lst import LinkStatusTable
from octopis.transport.codec import encode_body
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


def test_frames_in_a_connection_the_cut_aborts_die_there_and_the_link_sends_on() -> None:
    """The link sends a subscription and a notification into a connection that the cut
    then aborts: neither reaches the neighbour, ZeroMQ reconnects by itself and what the
    link sends after the cut arrives. At the detection custody gives back the
    notifications not acknowledged (the lost one, and the one that arrived, for edge
    dedup); a subscription message is not kept in custody, so nothing gives it back."""
    broker, peer = "c:0", FIG2.brokers["c:0"].neighbours[0].id
    bodies = {name: encode_body(_routed(name)) for name in ("n0", "s1", "s2", "n3", "n4")}

    async def scenario() -> tuple[list[bytes], list[list]]:
        loop = asyncio.get_running_loop()
        ctx = zmq.asyncio.Context()
        pull = ctx.socket(zmq.PULL)
        relay = Relay(pull.bind_to_random_port("tcp://127.0.0.1"))
        relayed = await relay.start()
        lst = LinkStatusTable([peer])
        link = OutputLink(peer, f"tcp://127.0.0.1:{relayed}", ctx, lst, 1000, (), Activity(), 100)
        sender = asyncio.create_task(link.run())
        arrived: list[bytes] = []

        async def took(name: str) -> bool:
            while await pull.poll(0):
                arrived.extend((await pull.recv_multipart())[1:])
            return bodies[name] in arrived

        def send(name: str) -> None:
            kind = KEPT if name.startswith("n") else DATA
            link.put([broker.encode(), bodies[name], kind], loop.time())

        try:
            link.greet([broker.encode(), b"greeting", HANDSHAKE], loop.time())
            send("n0")
            send("s1")
            await until(lambda: took("s1"), "the link carries", 10)
            link.acknowledge(2, loop.time())  # the neighbour took n0 and s1
            relay.cut = True
            send("s2")
            send("n3")
            await until(
                lambda: bodies["s2"] in relay.swallowed and bodies["n3"] in relay.swallowed,
                "the link sent into the cut",
                10,
            )
            relay.abort()
            await until(lambda: relay.accepted == 2, "ZeroMQ reconnects", 10)
            send("n4")
            await until(lambda: took("n4"), "the link sends on", 10)
            return arrived, link.take_back(loop.time())  # the detection (PeerLiveness)
        finally:
            sender.cancel()
            link.socket.close(0)
            pull.close(0)
            await relay.close()
            ctx.term()

    arrived, given_back = asyncio.run(scenario())
    assert bodies["s2"] not in arrived and bodies["n3"] not in arrived  # died in the cut
    assert bodies["n4"] in arrived  # the reconnected link carries
    assert [frame[1] for frame in given_back] == [bodies["n3"], bodies["n4"]]
