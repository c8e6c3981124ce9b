"""Finding a running overlay, for the SDK and the command line: its topology file and the
keys that reach it, from the run directory ``octopis up`` wrote or from a topology file;
a broker id's client endpoint and fail-over list from there.

A run directory holds :data:`STATE_FILE` (written by ``octopis up``: the topology file,
whether the brokers run with keys and which keys directory, the processes) and, unless
the overlay was started with a deployment's keys (``--keys``), the keys in ``keys/``.
Reading one imports nothing heavy: the topology is read when a broker is looked up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from octopis.topology import Scot

STATE_FILE = "cluster.json"
"""The file in a run directory that records the overlay ``octopis up`` started there."""
DEFAULT_RUN_DIR = Path(".octopis")
"""The run directory ``octopis up`` writes, and every command and the SDK read, by default."""
SOCKET_KINDS = ("client", "peer", "control", "metrics")
"""The sockets a broker serves, in the order of its four ports."""

KeysChoice = str | os.PathLike | Literal[False] | None
"""A keys directory; ``False``: none, in the clear (the brokers run ``--insecure``);
``None``: the default (the run directory's keys, else ``$OCTOPIS_KEYS``, else none)."""


class OverlayError(ValueError):
    """No overlay where one was named, or no such broker in it; the message says what to
    do next."""


def start_hint(run_dir: Path) -> str:
    """How to start an overlay in ``run_dir``, for error messages."""
    where = "" if run_dir == DEFAULT_RUN_DIR else f" --run-dir {run_dir}"
    return f"start one with `octopis up TOPOLOGY.json{where}`"


def read_state(run_dir: str | os.PathLike) -> dict[str, Any]:
    """What ``octopis up`` recorded in ``run_dir``; :class:`OverlayError` if nothing."""
    run_dir = Path(run_dir)
    path = run_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise OverlayError(f"no overlay in {run_dir}: {start_hint(run_dir)}") from None
    except (OSError, ValueError) as exc:
        raise OverlayError(f"cannot read {path}: {exc}") from None
    if not isinstance(state, dict) or "topology" not in state:
        raise OverlayError(f"{path} is not a record of `octopis up`")
    return state


@dataclass(frozen=True)
class Overlay:
    """A running overlay as a client finds it: its topology file and the keys directory
    to reach it with (None: in the clear)."""

    topology: Path
    keys: Path | None
    run_dir: Path | None = None
    """The run directory it was found in, if it was."""

    @classmethod
    def find(
        cls,
        run_dir: str | os.PathLike | None = None,
        topology: str | os.PathLike | None = None,
        keys: KeysChoice = None,
    ) -> Overlay:
        """The overlay of ``topology`` (a file), else the one ``octopis up`` started in
        ``run_dir`` (default :data:`DEFAULT_RUN_DIR`), to be reached with ``keys``
        (:data:`KeysChoice`; with a topology file the default is ``$OCTOPIS_KEYS``, else
        none)."""
        if topology is not None and run_dir is not None:
            raise OverlayError("name the overlay by its run directory or its topology, not both")
        chosen = None if keys is None or keys is False else Path(keys)
        if topology is not None:
            path = Path(topology)
            if not path.is_file():
                raise OverlayError(f"no topology file {path}")
            if keys is None:
                from octopis.keys import KEYS_ENV

                chosen = Path(os.environ[KEYS_ENV]) if os.environ.get(KEYS_ENV) else None
            return cls(path, chosen)
        where = Path(run_dir) if run_dir is not None else DEFAULT_RUN_DIR
        state = read_state(where)
        if keys is None and state.get("secure", True):
            chosen = Path(state["keys"]) if state.get("keys") else where / "keys"
        return cls(Path(state["topology"]), chosen, where)

    @cached_property
    def scot(self) -> Scot:
        """The topology, read once."""
        from octopis.topology import load_topology

        return load_topology(self.topology)

    def broker(self, broker_id: str) -> str:
        """``broker_id`` if the topology has it; :class:`OverlayError` naming its brokers
        otherwise."""
        scot = self.scot
        if broker_id not in scot.brokers:
            ids = list(scot.brokers)
            shown = ", ".join(ids[:8]) + (f", … ({len(ids)} in all)" if len(ids) > 8 else "")
            raise OverlayError(f"topology {scot.name} has no broker {broker_id!r}; it has {shown}")
        return broker_id

    def client_endpoints(self, broker_id: str) -> list[str]:
        """The client endpoint of ``broker_id``, then those its connection fails over to,
        its own cluster first (:meth:`octopis.topology.Scot.client_endpoints`)."""
        return self.scot.client_endpoints(self.broker(broker_id))

    def socket_at(self, endpoint: str) -> tuple[str, str] | None:
        """``(broker id, kind)`` of the socket the topology places at ``endpoint`` (kind
        one of :data:`SOCKET_KINDS`); None if it places none there."""
        address = _address(endpoint)
        for b in self.scot.brokers.values():
            ends = (b.client_endpoint, b.endpoint, b.control_endpoint, b.metrics_endpoint)
            for kind, at in zip(SOCKET_KINDS, ends, strict=True):
                if at is not None and _address(at) == address:
                    return b.id, kind
        return None


def _address(endpoint: str) -> str:
    """The host and port (or path) of an endpoint: ``tcp://H:P`` and ``http://H:P/metrics``
    name the same port."""
    rest = endpoint.split("://", 1)[-1]
    return rest.split("/", 1)[0] if endpoint.startswith(("http://", "https://")) else rest


def is_endpoint(target: str) -> bool:
    """Whether ``target`` is an endpoint (``tcp://…``, ``ipc://…``) rather than a broker id."""
    return "://" in target
