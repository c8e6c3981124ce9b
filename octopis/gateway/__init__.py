"""Other client protocols mapped onto a broker's client sessions (DESIGN §13): STOMP 1.2
(1.0/1.1 negotiated) over TCP and WebSocket, with JMS selectors translated exactly into
PADRES subscriptions. No routing of its own."""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from octopis.topology import BrokerInfo, TopologyError

if TYPE_CHECKING:
    from octopis.transport.broker import Broker, Gateway


def _host_port(endpoint: str) -> tuple[str, int]:
    url = urlsplit(endpoint)
    assert url.hostname is not None and url.port is not None  # checked when loaded
    return url.hostname, url.port


def stomp_gateway(info: BrokerInfo, keys_dir: Path | None) -> Gateway:
    """The STOMP listener's task for the broker of ``info`` (its topology entry), with
    the logins and TLS files of ``keys_dir`` (None: an insecure overlay, any CONNECT
    accepted, no TLS).
    TopologyError when the entry names no STOMP endpoint."""
    from octopis.gateway.credentials import Credentials, tls_context
    from octopis.gateway.listener import Listener

    if info.stomp_endpoint is None and info.stomp_ws_endpoint is None:
        raise TopologyError(
            f"broker {info.id} has no STOMP endpoints: build the topology with "
            "`octopis-topology build --stomp-base-port P`"
        )
    credentials = Credentials.load(keys_dir) if keys_dir is not None else None
    tls = tls_context(keys_dir) if keys_dir is not None else None
    tcp = _host_port(info.stomp_endpoint) if info.stomp_endpoint else None
    ws = _host_port(info.stomp_ws_endpoint) if info.stomp_ws_endpoint else None

    def tasks(broker: Broker) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        settings = broker.settings
        listener = Listener(
            broker.clients, settings.stomp, settings.clients, credentials, settings.logs.interval
        )
        return [("stomp", listener.serve(tcp, ws, tls))]

    return tasks
