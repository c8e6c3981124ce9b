"""Receiving and sending on the forwarding path without pyzmq's per-part Python
(DESIGN §5, issue 16): :mod:`octopis.transport._zmqio`, bound at import to the libzmq that
pyzmq loaded.

:class:`FastSocket` wraps one pyzmq socket: :meth:`~FastSocket.receive` drains the
messages waiting, :meth:`~FastSocket.send_batch` and :meth:`~FastSocket.send_parts` send
one message, :meth:`~FastSocket.events` reads ``ZMQ_EVENTS``; :func:`book_sent` takes a
sent batch off a link's queue. None of them
blocks, none raises ``zmq.Again`` (pyzmq's exception costs ~7 µs to construct): an empty
drain is ``[]`` and a full pipe is ``False`` or -1. The socket stays pyzmq's: options,
polling and closing go through it as before.
"""

from __future__ import annotations

import ctypes
import os
from collections import deque
from pathlib import Path

import zmq

from octopis.transport import _zmqio
from octopis.transport._zmqio import DATA, HANDSHAKE, KEPT, LINK, book_sent

__all__ = ["DATA", "HANDSHAKE", "KEPT", "LINK", "FastSocket", "LibzmqNotFound", "book_sent"]


class LibzmqNotFound(ImportError):
    """The libzmq pyzmq runs on could not be found or does not match pyzmq's."""


def _loaded_libzmq() -> ctypes.CDLL:
    """The libzmq this process runs on: the one mapped into it once pyzmq is imported
    (Linux: /proc/self/maps; a wheel's bundled copy first), else one shipped beside
    pyzmq; checked against pyzmq's version of it."""
    candidates: list[str] = []
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.rsplit(" ", 1)[-1]
            if "/libzmq" in path and path not in candidates:
                candidates.append(path)
    site = Path(zmq.__file__).resolve().parent
    for folder in (site.parent / "pyzmq.libs", site / ".dylibs", site):
        if folder.is_dir():
            candidates += sorted(str(p) for p in folder.glob("libzmq*") if str(p) not in candidates)
    wanted = zmq.zmq_version_info()
    for path in sorted(candidates, key=lambda p: "pyzmq" not in p):
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY) if _loaded(path) else None
        if lib is None:
            continue
        major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        lib.zmq_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
        if (major.value, minor.value, patch.value) == wanted:
            return lib
    raise LibzmqNotFound(
        f"cannot find the libzmq {'.'.join(map(str, wanted))} pyzmq runs on "
        f"(looked at: {', '.join(candidates) or 'nothing'})"
    )


def _loaded(path: str) -> bool:
    """Whether ``path`` is already loaded into this process (never loads a second copy)."""
    try:
        ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    return True


def _bind() -> None:
    lib = _loaded_libzmq()
    _zmqio.bind(
        {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _zmqio.FUNCTIONS}
    )


_bind()


class FastSocket:
    """One pyzmq socket's receives and sends through :mod:`octopis.transport._zmqio`.
    A closed socket raises ``zmq.ZMQError(ENOTSOCK)``, as pyzmq does."""

    __slots__ = ("_handle", "socket")

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self._handle = socket.underlying

    def _open(self) -> int:
        if self.socket.closed:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        return self._handle

    def receive(self, limit: int, runs: bool = False) -> list[list[bytes]]:
        """The messages waiting (each a list of parts), up to ``limit`` frames (parts after
        the first of each message; a one-part message counts 1); ``[]`` if none. With
        ``runs``, consecutive messages from one sender come back as one
        ``[sender, body, body, ...]``."""
        return _zmqio.receive(self._open(), limit, runs)

    def send_batch(self, queue: deque[list], most: int, max_bytes: int, room: int) -> int:
        """The frames at the head of ``queue`` that may leave now (routing frames while
        ``room`` lasts; at most ``most``, about ``max_bytes``) as one message: how many
        were sent, 0 if none may leave, -1 if the pipe is full (nothing sent)."""
        return _zmqio.send_batch(self._open(), queue, most, max_bytes, room)

    def events(self) -> int:
        """``ZMQ_EVENTS`` as an int (POLLIN 1, POLLOUT 2); it resets the FD's signal."""
        return _zmqio.events(self._open())

    def send_parts(self, parts: list[bytes]) -> bool:
        """``parts`` as one message; False (nothing sent) if the pipe is full."""
        return _zmqio.send_parts(self._open(), parts)
