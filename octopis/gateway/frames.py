"""STOMP frames (1.0, 1.1, 1.2), sans-IO: a bounded incremental decoder, an encoder, and
the CONNECT negotiation of version and heart-beats (DESIGN §13). No sockets here; the
listener feeds bytes in and writes bytes out.

A frame is ``COMMAND EOL (name:value EOL)* EOL body NUL`` with EOL ``\\n`` or ``\\r\\n``;
EOLs between frames are heart-beats. Header values are escaped in 1.1 (``\\n``, ``\\c``,
``\\\\``) and 1.2 (also ``\\r``), except in CONNECT and CONNECTED frames; an undefined
escape is an error. A repeated header keeps its first value. With ``content-length`` the
body is exactly that many bytes (NULs included) followed by a NUL; without it the body
runs to the first NUL.

Bounds (:class:`FrameLimits`): the header section's bytes, the number of headers, the
body's bytes. The decoder never holds more than one frame's worth of input beyond what it
has returned; a frame over a bound, or any malformed input, raises :class:`FrameError`
whose message names the problem — the listener answers with an ERROR frame and closes,
as the specification says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

VERSIONS = ("1.0", "1.1", "1.2")
CLIENT_COMMANDS = frozenset(
    (
        "CONNECT",
        "STOMP",
        "SEND",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "ACK",
        "NACK",
        "BEGIN",
        "COMMIT",
        "ABORT",
        "DISCONNECT",
    )
)
SERVER_COMMANDS = frozenset(("CONNECTED", "MESSAGE", "RECEIPT", "ERROR"))
_UNESCAPED = frozenset(("CONNECT", "STOMP", "CONNECTED"))
_ESCAPES = {
    "1.1": {"n": "\n", "c": ":", "\\": "\\"},
    "1.2": {"r": "\r", "n": "\n", "c": ":", "\\": "\\"},
}
_ESCAPE_OUT = {
    "1.1": str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"}),
    "1.2": str.maketrans({"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"}),
}
_ESCAPE = re.compile(r"\\(.?)", re.DOTALL)
_TO_ESCAPE = re.compile(r"[\\\r\n:]")
"""Characters some version escapes: text without them is written as it is."""


class FrameError(ValueError):
    """Input that is not a STOMP frame within the limits; the message names the problem."""


@dataclass(frozen=True)
class FrameLimits:
    """Bounds on one frame (``[stomp]`` header_bytes, headers, body_bytes)."""

    header_bytes: int
    """Bytes of the command line and headers together."""
    headers: int
    """Headers in one frame."""
    body_bytes: int
    """Bytes of one body."""


@dataclass
class Frame:
    """One frame: its command, headers (first value of a repeated name) and body."""

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    shared: str = ""
    """Header lines already escaped (:func:`header_lines`) that follow ``headers`` when
    the frame is written: those of a notification, made once for all its deliveries."""
    tail: bytes = b""
    """``encode_tail(shared, body)`` when made once for all the deliveries of a
    notification (:func:`encode` then writes it as it is)."""


class Decoder:
    """Turns a byte stream into frames, one at a time (:meth:`next_frame`).

    ``version`` sets the escaping rules (the listener sets it after CONNECT); ``commands``
    the commands accepted. ``heartbeats`` counts the EOLs seen between frames.
    """

    def __init__(
        self,
        limits: FrameLimits,
        commands: frozenset[str] = CLIENT_COMMANDS,
        version: str = "1.2",
    ) -> None:
        self.limits = limits
        self.commands = commands
        self.version = version
        self.heartbeats = 0
        self._buffer = bytearray()
        self._head: tuple[Frame, int, int | None] | None = None  # frame, body start, length

    def feed(self, data: bytes) -> None:
        """Append received bytes. Take the frames out (:meth:`next_frame` until None)
        before feeding more: then what is buffered is at most one frame and one read."""
        self._buffer += data

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive."""
        if self._head is None:
            self._skip_heartbeats()
            self._head = self._read_head()
            if self._head is None:
                return None
        frame, start, length = self._head
        buf = self._buffer
        if length is not None:
            end = start + length
            if len(buf) <= end:
                return None
            if buf[end] != 0:
                raise FrameError(
                    f"{frame.command} frame: the byte after content-length ({length}) "
                    "bytes of body is not NUL"
                )
        else:
            end = buf.find(0, start)
            if end < 0:
                if len(buf) - start > self.limits.body_bytes:
                    raise FrameError(
                        f"{frame.command} frame: body over {self.limits.body_bytes} bytes"
                    )
                return None
            if end - start > self.limits.body_bytes:
                raise FrameError(f"{frame.command} frame: body over {self.limits.body_bytes} bytes")
        frame.body = bytes(buf[start:end])
        del buf[: end + 1]
        self._head = None
        return frame

    def _skip_heartbeats(self) -> None:
        buf = self._buffer
        i = 0
        while i < len(buf):
            if buf[i] == 0x0A:
                i += 1
                self.heartbeats += 1
            elif buf[i] == 0x0D and i + 1 < len(buf) and buf[i + 1] == 0x0A:
                i += 2
                self.heartbeats += 1
            else:
                break
        if i:
            del buf[:i]

    def _read_head(self) -> tuple[Frame, int, int | None] | None:
        buf = self._buffer
        scan = min(len(buf), self.limits.header_bytes + 2)
        end = buf.find(b"\n\n", 0, scan)
        crlf = buf.find(b"\n\r\n", 0, scan)
        if crlf >= 0 and (end < 0 or crlf < end):
            end, sep = crlf, 3
        else:
            sep = 2
        if end < 0:
            if len(buf) > self.limits.header_bytes:
                raise FrameError(f"frame headers over {self.limits.header_bytes} bytes")
            if buf.startswith(b"\0"):
                raise FrameError("a NUL where a command was expected")
            return None
        if end + 1 > self.limits.header_bytes:
            raise FrameError(f"frame headers over {self.limits.header_bytes} bytes")
        try:
            text = bytes(buf[:end]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FrameError(f"frame headers are not UTF-8 (byte {e.start})") from None
        lines = text.split("\n")
        command = lines[0].removesuffix("\r")
        if command not in self.commands:
            raise FrameError(f"unknown command {command[:40]!r}")
        if len(lines) - 1 > self.limits.headers:
            raise FrameError(f"{command} frame: over {self.limits.headers} headers")
        escapes = None if command in _UNESCAPED else _ESCAPES.get(self.version)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            line = line.removesuffix("\r")
            name, colon, value = line.partition(":")
            if not colon:
                raise FrameError(f"{command} frame: header line {line[:40]!r} has no ':'")
            if escapes is not None:
                name, value = _unescape(name, escapes), _unescape(value, escapes)
            headers.setdefault(name, value)
        length = headers.get("content-length")
        size = None
        if length is not None:
            if not length.isdigit() or not length.isascii():
                raise FrameError(f"{command} frame: content-length {length[:40]!r} is not a number")
            size = int(length)
            if size > self.limits.body_bytes:
                raise FrameError(
                    f"{command} frame: content-length {size} is over {self.limits.body_bytes} bytes"
                )
        return Frame(command, headers), end + sep, size


def _unescape(text: str, escapes: dict[str, str]) -> str:
    if "\\" not in text:
        return text

    def one(m: re.Match[str]) -> str:
        out = escapes.get(m.group(1))
        if out is None:
            raise FrameError(f"undefined escape sequence {m.group()!r} in header {text[:40]!r}")
        return out

    return _ESCAPE.sub(one, text)


def header_lines(headers: dict[str, str], command: str, version: str) -> str:
    """``name:value`` lines (each ending in a newline) under ``version``'s escaping for a
    ``command`` frame; ``content-length`` is left out (:func:`encode` writes it)."""
    table = None if command in _UNESCAPED else _ESCAPE_OUT.get(version)
    lines = []
    for name, value in headers.items():
        if name == "content-length":
            continue
        if table is not None:
            if _TO_ESCAPE.search(name) is not None:
                name = name.translate(table)
            if _TO_ESCAPE.search(value) is not None:
                value = value.translate(table)
        elif "\n" in value or "\n" in name or ":" in name:
            raise FrameError(f"header {name[:40]!r} cannot be written in a {version} frame")
        lines.append(f"{name}:{value}\n")
    return "".join(lines)


def encode(frame: Frame, version: str = "1.2") -> bytes:
    """The bytes of ``frame`` under ``version``'s escaping (its :attr:`Frame.shared`
    lines after its own headers); a body gets ``content-length``."""
    head = frame.command + "\n" + header_lines(frame.headers, frame.command, version)
    if frame.tail:
        return head.encode("utf-8") + frame.tail
    if frame.body or frame.command in ("SEND", "MESSAGE", "ERROR"):
        return head.encode("utf-8") + encode_tail(frame.shared, frame.body)
    return (head + frame.shared + "\n").encode("utf-8") + frame.body + b"\0"


def encode_tail(shared: str, body: bytes) -> bytes:
    """What ends a frame with header lines ``shared`` and ``body``: those lines, its
    ``content-length``, the blank line, the body and the NUL."""
    return f"{shared}content-length:{len(body)}\n\n".encode() + body + b"\0"


def error_frame(message: str, receipt_id: str | None = None, detail: str = "") -> Frame:
    """An ERROR frame naming the problem (``message`` header, ``detail`` as the body)."""
    headers = {"message": message[:200].replace("\n", " "), "content-type": "text/plain"}
    if receipt_id is not None:
        headers["receipt-id"] = receipt_id
    return Frame("ERROR", headers, (detail or message).encode("utf-8"))


@dataclass(frozen=True)
class Session:
    """What CONNECT settles: the version and heart-beat periods (ms, 0 = none)."""

    version: str
    send_every: int
    """How often the server sends a heart-beat when it has nothing else to send."""
    expect_every: int
    """How often the client promised to send something (the liveness check's period)."""


def negotiate(headers: dict[str, str], heart_beat: tuple[int, int]) -> Session:
    """The session a CONNECT with ``headers`` gets from a server offering ``heart_beat``
    (``(can send every, wants to receive every)`` in ms). FrameError when no version is
    shared or the client's ``heart-beat`` header is malformed."""
    accept = headers.get("accept-version")
    if accept is None:
        version = "1.0"
    else:
        offered = {v.strip() for v in accept.split(",")}
        shared = [v for v in VERSIONS if v in offered]
        if not shared:
            raise FrameError(
                f"no supported version in accept-version {accept[:40]!r}: "
                f"this server speaks {', '.join(VERSIONS)}"
            )
        version = shared[-1]
    cx, cy = 0, 0
    beat = headers.get("heart-beat")
    if beat is not None and version != "1.0":
        m = re.fullmatch(r"\s*([0-9]{1,9})\s*,\s*([0-9]{1,9})\s*", beat)
        if m is None:
            raise FrameError(f"heart-beat {beat[:40]!r} is not two numbers 'cx,cy'")
        cx, cy = int(m.group(1)), int(m.group(2))
    sx, sy = heart_beat
    return Session(
        version,
        send_every=max(sx, cy) if sx and cy else 0,
        expect_every=max(cx, sy) if cx and sy else 0,
    )
