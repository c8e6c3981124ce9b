"""A TCP proxy that delays, stalls or cuts what it carries, on command (as toxiproxy does):
the fault tests and ``bench.faults`` put one link between two brokers through it.

    python -m bench.toxic --control PORT LISTEN_HOST:PORT=TARGET_HOST:PORT ...

Each route accepts connections on its listening address and opens one to its target per
connection; bytes go both ways in the order they came. The control port (on 127.0.0.1)
takes one command per line and answers ``ok`` (or ``error: …``):

- ``pass``: forward at once (and accept connections again after a cut);
- ``delay SECONDS``: forward each chunk that many seconds after it was read;
- ``stall``: forward nothing, keep the connections open (reading goes on until
  :data:`BUFFER` bytes wait per direction, then TCP's own flow control holds the sender);
- ``cut``: reset every connection now and every new one until ``pass``: what was in
  flight is lost, as when a link's TCP connection breaks.

ZeroMQ over TCP never sees a frame lost or reordered inside a live connection, so these
are the link faults it can meet: delay, silence, and a broken connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import time

BUFFER = 1 << 20
"""Bytes read and not yet forwarded, per direction of a connection, before reading stops."""
TCP_RTO_MAX_MS = 44
"""Linux's socket option (6.15 on) bounding a TCP connection's retransmission timeout."""
RTO_MAX_MS = 1000
"""The proxy's connections retransmit (and retry a SYN) at least this often, the least
Linux allows: left at the kernel's backoff (0.2, 0.4, ... 3.2 s), a connection the
proxy holds across a cut sends again only seconds after the cut heals, and the link
through it heals that much later than a direct one, whose brokers bound their own."""


class Toxic:
    """The proxy's state: what it does to the bytes now, and its open connections."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.cutting = False
        self.writers: set[asyncio.StreamWriter] = set()

    def command(self, line: str) -> str:
        """Apply one control command; the answer line."""
        word, _, arg = line.strip().partition(" ")
        if word == "pass":
            self.delay, self.cutting = 0.0, False
            self.flowing.set()
        elif word == "delay":
            try:
                delay = float(arg)
            except ValueError:
                return f"error: delay needs seconds, got {arg!r}"
            if not 0 <= delay <= 60:
                return f"error: delay {delay} s is outside 0..60"
            self.delay = delay
            self.flowing.set()
        elif word == "stall":
            self.flowing.clear()
        elif word == "cut":
            self.cutting = True
            self.flowing.set()
            for writer in list(self.writers):
                _reset(writer)
        else:
            return f"error: unknown command {word!r} (pass, delay SECONDS, stall, cut)"
        return "ok"

    async def serve(
        self, target: tuple[str, int], client: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        """One accepted connection: a connection to ``target`` and a pump each way."""
        reader, writer = client
        if self.cutting:
            _reset(writer)
            return
        _bound_retransmission(writer.get_extra_info("socket"))
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _bound_retransmission(upstream)
        upstream.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(upstream, target)
            up_reader, up_writer = await asyncio.open_connection(sock=upstream)
        except OSError:
            upstream.close()
            _reset(writer)
            return
        self.writers.update((writer, up_writer))
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        ]
        try:  # one side closed or broke: so does the other, as a broken TCP link would
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for w in (writer, up_writer):
                self.writers.discard(w)
                _reset(w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        room = asyncio.Semaphore(BUFFER // 65536)

        async def read() -> None:
            try:
                while chunk := await reader.read(65536):
                    await room.acquire()
                    chunks.put_nowait((time.monotonic(), chunk))
            except (ConnectionError, OSError):
                pass
            finally:
                chunks.put_nowait((0.0, b""))

        reading = asyncio.ensure_future(read())
        try:
            while True:
                at, chunk = await chunks.get()
                room.release()
                if not chunk:
                    return
                await self.flowing.wait()
                if (wait := at + self.delay - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                await self.flowing.wait()
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            return
        finally:
            reading.cancel()


def _bound_retransmission(sock: socket.socket) -> None:
    """Retransmit on ``sock`` at least every :data:`RTO_MAX_MS` (a kernel without the
    option keeps its backoff)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, RTO_MAX_MS)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (what was in flight is lost)."""
    transport = writer.transport
    if not transport.is_closing():
        transport.abort()


def parse_route(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``LISTEN_HOST:PORT=TARGET_HOST:PORT`` as two (host, port) pairs."""
    listen, sep, target = text.partition("=")
    pairs = []
    for part in (listen, target):
        host, _, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise argparse.ArgumentTypeError(f"route {text!r}: expected HOST:PORT=HOST:PORT")
        pairs.append((host, int(port)))
    return pairs[0], pairs[1]


async def run(control_port: int, routes: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    """Serve ``routes`` and the control port until killed; prints ``ready`` once listening."""
    toxic = Toxic()

    async def control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write((toxic.command(line.decode()) + "\n").encode())
            await writer.drain()
        writer.close()

    servers = [await asyncio.start_server(control, "127.0.0.1", control_port)]
    for listen, target in routes:
        servers.append(
            await asyncio.start_server(lambda r, w, t=target: toxic.serve(t, (r, w)), *listen)
        )
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


async def tell(control_port: int, command: str) -> None:
    """Send ``command`` to the proxy whose control port is ``control_port`` (on this host);
    ``RuntimeError`` with the proxy's answer if it refuses."""
    reader, writer = await asyncio.open_connection("127.0.0.1", control_port)
    try:
        writer.write(command.encode() + b"\n")
        await writer.drain()
        answer = (await reader.readline()).decode().strip()
    finally:
        writer.close()
    if answer != "ok":
        raise RuntimeError(f"proxy refused {command!r}: {answer or 'no answer'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--control",
        type=int,
        required=True,
        metavar="PORT",
        help="the port on 127.0.0.1 that takes the commands",
    )
    parser.add_argument(
        "routes",
        nargs="+",
        type=parse_route,
        metavar="LISTEN=TARGET",
        help="HOST:PORT to accept on, = the HOST:PORT to connect each connection to",
    )
    args = parser.parse_args(argv)
    asyncio.run(run(args.control, args.routes))


if __name__ == "__main__":
    main()
