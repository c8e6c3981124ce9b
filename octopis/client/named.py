"""Named clients (DESIGN §4): the base of :class:`~octopis.client.Publisher` and
:class:`~octopis.client.Subscriber`, each on a shared connection or one of its own, and
:func:`locate`, which turns a broker id or endpoints into the endpoints to fail over
along and the keys to use."""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from typing import Any, Self

from octopis.client.connection import Connection
from octopis.client.errors import NotAClientSocket
from octopis.overlay import KeysChoice, Overlay, is_endpoint


class NamedClient:
    """A named client on a :class:`Connection` (shared, or its own with :meth:`connect`)."""

    def __init__(self, name: str, connection: Connection) -> None:
        self.name = name
        self.connection = connection
        self._origin = connection
        """The connection given or opened first (a move's new ones are its siblings)."""
        self._owns_connection = False

    @classmethod
    async def connect(
        cls,
        target: str | Sequence[str],
        name: str | None = None,
        *,
        keys: KeysChoice = None,
        run_dir: str | os.PathLike | None = None,
        topology: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> Self:
        """Open a connection of its own as client ``name`` (default: a new unique name).

        ``target`` is a broker id such as ``"f:2"``: the broker of the overlay that
        ``octopis up`` started in ``run_dir`` (default ``.octopis``), or of the
        ``topology`` file. The connection goes to that broker's client endpoint and fails
        over along the overlay's other brokers, its own cluster first, with the run
        directory's keys (with ``topology``: ``$OCTOPIS_KEYS``, else none). Or ``target``
        is an endpoint or a list of them, tried in order, reached with ``keys`` (default
        ``$OCTOPIS_KEYS``); with ``run_dir`` or ``topology`` too, an endpoint is checked
        against the topology and its broker's fail-over list and keys are used.
        ``keys=False`` connects in the clear (brokers run ``--insecure``).

        A broker that does not answer raises a :class:`ConnectError` naming why
        (:meth:`Connection.open`); a broker id the overlay does not have, or no overlay
        where one was named, :class:`octopis.overlay.OverlayError`.
        """
        endpoints, keys = locate(target, keys=keys, run_dir=run_dir, topology=topology)
        connection = Connection(endpoints, keys=keys)
        await connection.open()
        if name is None:
            name = f"{cls.__name__.lower()}-{secrets.token_hex(6)}"
        client = cls(name, connection, **kwargs)
        client._owns_connection = True
        return client

    async def close(self) -> None:
        """Close the connection (and those it opened for moves) if this client opened it."""
        if self._owns_connection:
            await self._origin.close()


def locate(
    target: str | Sequence[str],
    *,
    keys: KeysChoice = None,
    run_dir: str | os.PathLike | None = None,
    topology: str | os.PathLike | None = None,
) -> tuple[list[str], KeysChoice]:
    """The endpoints (in fail-over order) and keys :meth:`NamedClient.connect` uses for
    ``target``: broker ids are looked up in the overlay of ``run_dir`` (default
    ``.octopis``) or ``topology``; endpoints are taken as they are unless an overlay is
    named, where a socket other than a client one is refused at once
    (:class:`NotAClientSocket`). One broker (by id or client endpoint) comes with its
    fail-over list."""
    targets = [target] if isinstance(target, str) else list(target)
    if not targets:
        raise ValueError("connect needs a broker id or at least one endpoint")
    if all(map(is_endpoint, targets)) and run_dir is None and topology is None:
        return targets, keys
    overlay = Overlay.find(run_dir, topology, keys)
    brokers = [_broker_at(overlay, t) for t in targets]
    if len(targets) == 1 and brokers[0] is not None:
        endpoints = overlay.client_endpoints(brokers[0])
    else:
        clients = overlay.scot.brokers
        endpoints = [
            t if b is None else clients[b].client_endpoint
            for t, b in zip(targets, brokers, strict=True)
        ]
    return endpoints, overlay.keys if overlay.keys is not None else False


def _broker_at(overlay: Overlay, target: str) -> str | None:
    """The broker ``target`` names: a broker id, or the client endpoint of one (None: an
    endpoint the topology does not place); :class:`NotAClientSocket` for an endpoint of
    one of its other sockets."""
    if not is_endpoint(target):
        return overlay.broker(target)
    found = overlay.socket_at(target)
    if found is None:
        return None
    broker, kind = found
    if kind != "client":
        right = overlay.scot.brokers[broker].client_endpoint
        raise NotAClientSocket(
            target,
            f"{target} is {broker}'s {kind} socket in topology {overlay.scot.name}, not its "
            f"client socket: connect to {right}, or by broker id ({broker!r})",
        )
    return broker
