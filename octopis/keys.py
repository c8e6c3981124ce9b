"""CurveZMQ keys of a deployment (DESIGN §8): a key pair per broker, client key pairs and
the admin key pair of the control RPC.

A keys directory (``octopis up`` writes ``<run-dir>/keys``; ``octopis-topology keys``
writes one to hand out to several hosts) holds ZeroMQ certificates (``zmq.auth``)::

    brokers/<id>.key, brokers/<id>.key_secret   one pair per broker
    clients/<name>.key, clients/<name>.key_secret
                                                every public key here is an allowed client
    admin/admin.key, admin/admin.key_secret     the only key the control RPC accepts
    endpoints.json                              each broker endpoint -> its broker's public key

Secret files are written with mode 0600 (the directory 0700). A broker host needs its own
broker secret, every ``*.key`` (public) file and ``endpoints.json``; a client host needs
its client secret and ``endpoints.json``; whoever runs ``octopis status``/``down`` needs
the admin secret.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

KEYS_ENV = "OCTOPIS_KEYS"
"""Environment variable naming the keys directory the SDK uses when given none."""
DEFAULT_CLIENT = "client"
ADMIN = "admin"
ENDPOINTS_FILE = "endpoints.json"


class KeysError(ValueError):
    """A keys directory or key file that cannot be used; the message names it."""


@dataclass(frozen=True)
class KeyPair:
    """A Curve25519 key pair, Z85-encoded (40 bytes each)."""

    public: bytes
    secret: bytes


def connect_securely(sock: zmq.Socket, pair: KeyPair, server_key: bytes) -> None:
    """Make ``sock`` (not yet connected) a CURVE client of the server with ``server_key``."""
    sock.curve_secretkey = pair.secret
    sock.curve_publickey = pair.public
    sock.curve_serverkey = server_key


def make_keys(
    directory: str | os.PathLike,
    brokers: Mapping[str, Iterable[str]],
    clients: Iterable[str] = (DEFAULT_CLIENT,),
) -> Path:
    """Write a key pair for each broker of ``brokers`` (id -> its endpoints), for each
    client name, and the admin pair, into ``directory``; pairs already there are kept,
    so a run directory's keys survive a second ``octopis up``. Returns the directory."""
    root = Path(directory)
    for part, names in (("brokers", brokers), ("clients", clients), ("admin", (ADMIN,))):
        folder = root / part
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            if not (folder / f"{name}.key_secret").exists():
                _, secret = zmq.auth.create_certificates(folder, name)
                os.chmod(secret, 0o600)
    for folder in (root, *(root / p for p in ("brokers", "clients", "admin"))):
        os.chmod(folder, 0o700)
    keys = Keys(root)
    table = {
        endpoint: keys.broker_public(broker).decode()
        for broker, endpoints in brokers.items()
        for endpoint in endpoints
    }
    (root / ENDPOINTS_FILE).write_text(json.dumps(table, indent=1, sort_keys=True))
    return root


class Keys:
    """A keys directory, read on demand; every missing or unreadable file raises
    :class:`KeysError` naming it."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise KeysError(f"no keys directory {self.directory}")
        self._endpoints: dict[str, str] | None = None

    @classmethod
    def find(cls, keys: str | os.PathLike | None) -> Keys | None:
        """``keys`` if given, else the directory ``$OCTOPIS_KEYS`` names, else None."""
        chosen = keys if keys is not None else os.environ.get(KEYS_ENV) or None
        return None if chosen is None else cls(chosen)

    def _load(self, path: Path, *, secret: bool) -> KeyPair:
        try:
            public, secret_key = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise KeysError(f"cannot read key file {path}: {exc}") from None
        if secret and secret_key is None:
            raise KeysError(f"key file {path} holds no secret key")
        return KeyPair(public, secret_key or b"")

    def broker(self, broker_id: str) -> KeyPair:
        """The key pair of broker ``broker_id``."""
        return self._load(self.directory / "brokers" / f"{broker_id}.key_secret", secret=True)

    def broker_public(self, broker_id: str) -> bytes:
        """The public key of broker ``broker_id``."""
        return self._load(self.directory / "brokers" / f"{broker_id}.key", secret=False).public

    def client(self, name: str = DEFAULT_CLIENT) -> KeyPair:
        """The key pair of client ``name``."""
        return self._load(self.directory / "clients" / f"{name}.key_secret", secret=True)

    def admin(self) -> KeyPair:
        """The admin key pair (control RPC)."""
        return self._load(self.directory / "admin" / f"{ADMIN}.key_secret", secret=True)

    def admin_public(self) -> bytes:
        """The admin public key, all a broker needs of it."""
        return self._load(self.directory / "admin" / f"{ADMIN}.key", secret=False).public

    def allowed_clients(self) -> set[bytes]:
        """The public keys of every client pair in ``clients/``."""
        folder = self.directory / "clients"
        if not folder.is_dir():
            raise KeysError(f"no client keys folder {folder}")
        return {self._load(p, secret=False).public for p in sorted(folder.glob("*.key"))}

    def server_key(self, endpoint: str) -> bytes:
        """The public key of the broker serving ``endpoint`` (from ``endpoints.json``,
        read again when it names no such broker: the overlay may have grown since)."""
        if self._endpoints is None or endpoint not in self._endpoints:
            path = self.directory / ENDPOINTS_FILE
            try:
                self._endpoints = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise KeysError(f"cannot read {path}: {exc}") from None
        try:
            return self._endpoints[endpoint].encode()
        except KeyError:
            raise KeysError(
                f"{self.directory / ENDPOINTS_FILE} names no broker at {endpoint}"
            ) from None
