"""Why a connection did not open (DESIGN §4, §8): the first socket's monitor read while
:meth:`octopis.client.Connection.open` waits for the broker's welcome, and probes with
other socket types and keys, turned into a :class:`~octopis.client.errors.ConnectError`
that names the cause."""

from __future__ import annotations

import asyncio
import contextlib
import time

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from octopis.client.errors import (
    ConnectError,
    HandshakeFailed,
    NoReply,
    NotAClientSocket,
    NothingListening,
)
from octopis.keys import KeyPair, Keys, connect_securely
from octopis.wire.client import WelcomeReply

DIAGNOSIS_WAIT = 2.0
"""Seconds :meth:`octopis.client.Connection.open` waits for a first TCP connection before it reports
that nothing listens (a broker starting up may take a moment to bind)."""
PROBE_WAIT = 1.0
"""Seconds a diagnostic probe waits for its handshake."""
WATCHED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
"""The socket monitor's events that tell how far opening a connection got."""


class OpeningDiagnosis:
    """Watches a socket being opened to ``endpoint`` (its monitor events) and says why no
    welcome came. ``curve`` is this client's key pair and the broker's key (None: in the
    clear), ``keys`` the keys directory they come from, ``key_name`` the client's key."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        socket: zmq.asyncio.Socket,
        endpoint: str,
        curve: tuple[KeyPair, bytes] | None,
        keys: Keys | None,
        key_name: str,
    ) -> None:
        self.ctx = ctx
        self.socket = socket
        self.endpoint = endpoint
        self.curve = curve
        self.keys = keys
        self.key_name = key_name
        self.monitor: zmq.asyncio.Socket | None = socket.get_monitor_socket(WATCHED)
        """The socket's monitor (call before the socket connects), until :meth:`stop`."""

    async def welcome(self, reply: asyncio.Future, timeout: float) -> WelcomeReply:
        """The broker's welcome, ``reply``, awaited up to ``timeout`` seconds while the
        socket's monitor is read: a failure it shows is raised as soon as it is known,
        :class:`NoReply` at the timeout (``reply`` is then cancelled)."""
        started = time.monotonic()
        progress: set[int] = set()
        diagnosis = asyncio.ensure_future(self.diagnose(progress))
        try:
            done, _ = await asyncio.wait(
                {reply, diagnosis}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if reply in done:
                return reply.result()
            if diagnosis in done and (error := diagnosis.result()) is not None:
                raise error
            left = max(0.0, timeout - (time.monotonic() - started))
            done, _ = await asyncio.wait({reply}, timeout=left)
            if reply in done:
                return reply.result()
            raise NoReply(self.endpoint, self.silence(progress, timeout))
        finally:
            for task in (reply, diagnosis):
                task.cancel()
            await asyncio.gather(reply, diagnosis, return_exceptions=True)

    async def diagnose(self, progress: set[int]) -> ConnectError | None:
        """Read the first socket's monitor until it tells how opening goes: None once the
        handshake succeeded (whatever comes next is the broker's answer), else the error
        that says why no answer can come. ``progress`` collects the events seen."""
        if self.monitor is None:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DIAGNOSIS_WAIT
        patient = False
        while True:
            connected = zmq.EVENT_CONNECTED in progress
            wait = None if patient or connected else max(0.0, deadline - loop.time())
            try:
                frames = await asyncio.wait_for(self.monitor.recv_multipart(), wait)
            except TimeoutError:
                if progress & {zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CLOSED}:
                    return NothingListening(
                        self.endpoint,
                        f"nothing listens at {self.endpoint} (connection refused for "
                        f"{DIAGNOSIS_WAIT:g} s): is the overlay up (`octopis status`), and is "
                        "this a broker's client endpoint?",
                    )
                patient = True  # the TCP connection is still pending: a slow or far host
                continue
            kind = parse_monitor_message(frames)["event"]
            progress.add(kind)
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return None
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                return self._refused()
            if kind in (
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                zmq.EVENT_DISCONNECTED,
            ):
                return await self._why_not()

    def _refused(self) -> HandshakeFailed:
        """The broker's key check refused this client's key."""
        at = self.endpoint
        key = f"{self.keys.directory}/clients/{self.key_name}.key" if self.keys else ""
        where = f" ({key})" if key else ""
        return HandshakeFailed(
            at,
            f"{at} refused this client's key{where}: the keys directory is not this "
            f"overlay's (use its own: keys=DIR, or run_dir= for one `octopis up` started), "
            "or the endpoint is not a broker's client socket (a control socket lets only "
            "the admin key in)",
        )

    async def _why_not(self) -> ConnectError:
        """The handshake failed with no reason given: probes with another socket type
        and without keys tell a peer socket, a broker in the clear and keys that do not
        fit apart."""
        at, curve = self.endpoint, self.curve
        if await _gets_through(self.ctx, at, zmq.PUSH, curve):
            return NotAClientSocket(
                at,
                f"{at} is not a broker's client socket: it takes pushed messages, as a "
                "broker's peer socket does. Connect to the broker's client endpoint, or by "
                "broker id (run_dir= or topology=), which finds it",
            )
        if curve is None:
            return HandshakeFailed(
                at,
                f"{at} refused a connection in the clear: the broker wants CurveZMQ keys. "
                "Give the overlay's keys directory (keys=DIR, $OCTOPIS_KEYS, or run_dir= "
                "for an overlay `octopis up` started), or check that the endpoint is a "
                "broker's client socket",
            )
        if await _gets_through(self.ctx, at, zmq.DEALER, None):
            return HandshakeFailed(
                at,
                f"{at} runs without CurveZMQ (its overlay was started --insecure): connect "
                "without keys (keys=False)",
            )
        return HandshakeFailed(
            at,
            f"the CurveZMQ handshake with {at} failed: the broker's key in "
            f"{self.keys.directory if self.keys else '?'}/endpoints.json is not the one it "
            "serves with (keys of another overlay, or of an earlier one on these ports?), "
            "or the endpoint is not a broker's client socket",
        )

    def silence(self, progress: set[int], timeout: float) -> str:
        """Why the broker at the endpoint did not answer in ``timeout`` seconds, as far
        as the socket's monitor tells."""
        at = self.endpoint
        if zmq.EVENT_HANDSHAKE_SUCCEEDED in progress:
            return (
                f"{at} accepted the connection but did not answer hello within {timeout:g} "
                "s: it is not an OctopiS broker's client socket (a control socket?), or the "
                "broker is overloaded or stopped"
            )
        if zmq.EVENT_CONNECTED in progress:
            return (
                f"{at} accepted a TCP connection but no ZeroMQ handshake followed within "
                f"{timeout:g} s: something else listens there (a broker's metrics port?), "
                "or the broker is stopped"
            )
        return (
            f"no connection to {at} within {timeout:g} s: the host does not answer (down, "
            "or a firewall drops the connection)"
        )

    def stop(self) -> None:
        """Stop the socket's monitor (once the connection is open, or given up)."""
        if self.monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.socket.disable_monitor()
            self.monitor.close(0)
            self.monitor = None


async def _gets_through(
    ctx: zmq.asyncio.Context, endpoint: str, kind: int, curve: tuple[KeyPair, bytes] | None
) -> bool:
    """Whether a socket of type ``kind`` (with ``curve``: this key pair and the server's
    key) gets past the socket-type check of a handshake with ``endpoint``: the handshake
    completes, or only the server's key check refuses it."""
    probe = ctx.socket(kind)
    probe.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        connect_securely(probe, *curve)
    events = probe.get_monitor_socket(WATCHED)
    probe.connect(endpoint)
    try:
        async with asyncio.timeout(PROBE_WAIT):
            while True:
                event = parse_monitor_message(await events.recv_multipart())["event"]
                if event in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_AUTH):
                    return True
                if event in (
                    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                    zmq.EVENT_DISCONNECTED,
                ):
                    return False
    except TimeoutError:
        return False
    finally:
        probe.disable_monitor()
        events.close(0)
        probe.close(0)
