"""STOMP logins of a secure deployment (DESIGN §13): ``stomp-credentials.json`` in the
keys directory, beside the CurveZMQ keys, mode 0600. Each user's passcode is kept as a
salted scrypt hash, never in clear; ``octopis-topology stomp-user KEYS NAME`` adds one.

A broker run with ``--keys`` refuses a STOMP CONNECT whose ``login``/``passcode`` is not
in the file (and every CONNECT when there is no file); one run ``--insecure`` accepts any.

TLS: when the keys directory also holds ``stomp-tls.crt`` (a PEM certificate chain) and
``stomp-tls.key`` (its private key, mode 0600), the listeners speak TLS only, on TCP and
on WebSocket (``wss://``) alike (:func:`tls_context`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import ssl
from collections import OrderedDict
from pathlib import Path

CREDENTIALS_FILE = "stomp-credentials.json"
FORMAT = "octopis-stomp-credentials/1"
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
TLS_CERT, TLS_KEY = "stomp-tls.crt", "stomp-tls.key"
VERIFIED_KEPT = 1024
"""Logins whose passcode checked out, remembered so a reconnect costs no scrypt run."""


class CredentialsError(ValueError):
    """A credentials file or entry that cannot be used; the message names it."""


def _hash(passcode: str, salt: bytes) -> bytes:
    return hashlib.scrypt(passcode.encode("utf-8"), salt=salt, dklen=32, **_SCRYPT)


def add_user(keys_dir: str | os.PathLike, user: str, passcode: str) -> Path:
    """Add (or replace) ``user`` in ``keys_dir``'s credentials file; returns its path."""
    if not user or any(c in user for c in ":\n\r\0") or len(user) > 256:
        raise CredentialsError(f"user name {user[:40]!r}: 1 to 256 characters, no ':' or newline")
    if len(passcode) < 8:
        raise CredentialsError("a passcode needs at least 8 characters")
    directory = Path(keys_dir)
    if not directory.is_dir():
        raise CredentialsError(f"keys directory {directory} does not exist")
    path = directory / CREDENTIALS_FILE
    users = _read(path) if path.exists() else {}
    salt = secrets.token_bytes(16)
    users[user] = f"scrypt${salt.hex()}${_hash(passcode, salt).hex()}"
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "users": users}, f, indent=1)
    os.replace(tmp, path)
    return path


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CredentialsError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CredentialsError(f"{path} is not a {FORMAT} file")
    users = data.get("users")
    if not isinstance(users, dict) or not all(
        isinstance(v, str) and v.count("$") == 2 for v in users.values()
    ):
        raise CredentialsError(f"{path}: 'users' must map names to scrypt hashes")
    if path.stat().st_mode & 0o077:
        raise CredentialsError(f"{path} is readable by others: chmod 600 it")
    return users


class Credentials:
    """The logins a broker accepts (read once at start)."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self._verified: OrderedDict[bytes, None] = OrderedDict()

    @classmethod
    def load(cls, keys_dir: str | os.PathLike) -> Credentials:
        """The credentials of a keys directory (none when it has no file)."""
        path = Path(keys_dir) / CREDENTIALS_FILE
        return cls(_read(path) if path.exists() else {})

    def check(self, login: str | None, passcode: str | None) -> str | None:
        """None when ``login``/``passcode`` is a user's, else the reason to refuse."""
        if login is None or passcode is None:
            return "this broker needs login and passcode headers on CONNECT"
        stored = self.users.get(login)
        token = hashlib.sha256(f"{login}\0{passcode}".encode()).digest()
        if stored is not None and token in self._verified:
            return None
        if stored is not None:
            _, salt, digest = stored.split("$")
            if hmac.compare_digest(_hash(passcode, bytes.fromhex(salt)).hex(), digest):
                self._verified[token] = None
                while len(self._verified) > VERIFIED_KEPT:
                    self._verified.popitem(last=False)
                return None
        return "login refused: unknown login or wrong passcode"


def tls_context(keys_dir: str | os.PathLike) -> ssl.SSLContext | None:
    """The server TLS context of ``keys_dir``'s ``stomp-tls.crt`` and ``stomp-tls.key``;
    None when it has neither. CredentialsError when one is missing, the key is readable
    by others, or they do not load."""
    directory = Path(keys_dir)
    cert, key = directory / TLS_CERT, directory / TLS_KEY
    if not cert.exists() and not key.exists():
        return None
    if not (cert.exists() and key.exists()):
        raise CredentialsError(f"{directory}: TLS needs both {TLS_CERT} and {TLS_KEY}")
    if key.stat().st_mode & 0o077:
        raise CredentialsError(f"{key} is readable by others: chmod 600 it")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise CredentialsError(f"cannot load {cert} and {key}: {exc}") from None
    return context
