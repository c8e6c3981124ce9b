"""Authentication and encryption of a broker's sockets: CurveZMQ with ZAP (DESIGN §8).

Three ZAP domains, one per server socket: ``peer`` (the peer input: the topology's
brokers), ``client`` (the client socket: the allowed client keys) and ``control`` (the
control RPC: the admin key). A refused key is counted (``auth_refused.<domain>``) and
logged, rate-limited, with the peer's address; every failed handshake of a server socket
(a refused key, no CURVE at all, a wrong server key) is counted as
``handshakes_failed.<socket>`` from the socket's monitor.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils.monitor import parse_monitor_message

from octopis.keys import KeyPair, Keys, connect_securely
from octopis.logs import RateLimitedLog

log = logging.getLogger("octopis.auth")

HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_monitors = itertools.count()


class Gatekeeper(AsyncioAuthenticator):
    """The ZAP handler of one ZeroMQ context: a CURVE key is let in on a domain only if
    ``allowed[domain]`` holds it (Z85)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        allowed: Mapping[str, set[bytes]],
        counters: Counter[str],
        warn: RateLimitedLog,
    ) -> None:
        super().__init__(ctx, log=log)
        self.allowed = allowed
        self.counters = counters
        self._warn = warn
        self._address = "?"
        for domain in allowed:
            self.configure_curve_callback(domain, self)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """Note the caller's address (ZAP's fourth frame) for the refusal's log line."""
        self._address = msg[3].decode(errors="replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)

    def callback(self, domain: str, key: bytes) -> bool:
        """Whether ``key`` (Z85) may connect on ``domain``; a refusal is counted."""
        if key in self.allowed[domain]:
            return True
        self.counters[f"auth_refused.{domain}"] += 1
        self._warn.warning(
            f"auth {domain}",
            "refused a %s connection from %s: key %s is not allowed",
            domain,
            self._address,
            key.decode(errors="replace"),
        )
        return False


@dataclass(frozen=True)
class Curve:
    """A broker's key pair and its neighbours' public keys, as its sockets use them. The
    pair is fixed; ``neighbours`` changes in place when a relink adds or removes one."""

    pair: KeyPair
    neighbours: dict[str, bytes]

    def serve(self, sock: zmq.Socket, domain: str) -> None:
        """Make ``sock`` (not yet bound) a CURVE server; ZAP checks callers on ``domain``."""
        sock.curve_secretkey = self.pair.secret
        sock.curve_publickey = self.pair.public
        sock.curve_server = True
        sock.zap_domain = domain.encode()

    def connect(self, sock: zmq.Socket, neighbour: str) -> None:
        """Make ``sock`` (not yet connected) a CURVE client of ``neighbour``."""
        connect_securely(sock, self.pair, self.neighbours[neighbour])


async def count_failed_handshakes(
    sock: zmq.Socket,
    ctx: zmq.asyncio.Context,
    name: str,
    counters: Counter[str],
    warn: RateLimitedLog,
) -> None:
    """Count (and log, rate-limited) every failed handshake on server socket ``sock``,
    until cancelled; ``ctx`` is an asyncio context sharing ``sock``'s ZeroMQ context."""
    address = f"inproc://octopis-monitor-{name}-{next(_monitors)}"
    sock.monitor(address, HANDSHAKE_FAILURES)
    events = ctx.socket(zmq.PAIR)
    events.connect(address)
    try:
        while True:
            event = parse_monitor_message(await events.recv_multipart())
            counters[f"handshakes_failed.{name}"] += 1
            warn.warning(
                f"handshake {name}",
                "a handshake on the %s socket failed (%s, %s)",
                name,
                zmq.Event(event["event"]).name,
                event["value"],
            )
    finally:
        sock.disable_monitor()
        events.close(0)


def start_guards(
    broker_id: str,
    keys: Keys | None,
    neighbours: list[str],
    warn: RateLimitedLog,
    counters: Counter[str],
    ctx: zmq.asyncio.Context,
) -> tuple[Curve | None, list[Gatekeeper]]:
    """Start a broker's ZAP handlers (one in ``ctx``, one in aiozmq's context, where the
    control socket lives) and return its CURVE keys; without ``keys``, say loudly that
    anyone may connect."""
    if keys is None:
        logging.getLogger("octopis.broker").warning(
            "%s runs INSECURE (--insecure): no authentication, no encryption; anyone who "
            "reaches its ports can publish, subscribe and shut it down",
            broker_id,
        )
        return None, []
    publics = {n: keys.broker_public(n) for n in neighbours}
    guards = [
        Gatekeeper(
            ctx,
            {"peer": set(publics.values()), "client": keys.allowed_clients()},
            counters,
            warn,
        ),
        Gatekeeper(
            zmq.asyncio.Context.shadow(zmq.Context.instance()),
            {"control": {keys.admin_public()}},
            counters,
            warn,
        ),
    ]
    for guard in guards:
        guard.start()
    return Curve(keys.broker(broker_id), publics), guards
