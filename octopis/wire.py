"""Wire formats shared by brokers and clients (DESIGN §4): MessagePack, nothing else.

This module is the whole of what a client needs to speak to a broker, so the SDK imports
it and :mod:`octopis.filters` only — never the matcher, the routing core or networkx.

Client protocol (a DEALER talking to the broker's ROUTER):
  - requests are maps tagged by ``op`` (:data:`ClientRequest`), decoded and validated in
    one step by :func:`decode_request`; ``req``, when set, is echoed in the reply;
  - replies are maps ``{"op", "req", ...}``; a refusal is ``{"op": "error", "message"}``;
  - a delivery message is ``[names, body, ..., names, body, stamp]``: per delivery
    ``names``, the packed list of the connection's client names it is for, and ``body``,
    the NOTIFY body of the peer protocol exactly as the broker received or encoded it
    once (:func:`delivery_fields` reads it); last the broker's ``time.time()`` as the
    message left it (:data:`LEFT_AT`, 8 bytes), which splits a notification's delay into
    the overlay's share (publisher to broker egress) and the client's (egress to the
    SDK's callback).

Peer protocol: bodies are arrays ``[kind, ...fields]`` with the kinds below; the codec
between bodies and routing messages lives in :mod:`octopis.transport.codec`.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any

import msgspec
import msgspec.inspect

HELLO, SUBSCRIBE, UNSUBSCRIBE, NOTIFY, HEARTBEAT, SYNCED, MOVE, REHOST = 0, 1, 2, 3, 4, 5, 6, 7
"""Peer body kinds: link handshake, SBP subscribe / unsubscribe, notification, liveness,
end of a resync, a subscriber's move inside its cluster and the note of its new host."""
REPLAY, REPLAY_DATA, REPLAY_ECHO = 8, 9, 10
"""Peer body kinds of a replay (DESIGN §11): the request, publications answered, an echo."""
ADVERTISE, UNADVERTISE = 11, 12
"""Peer body kinds of advertisements (DESIGN §12): one spreading, one withdrawn."""

pack = msgspec.msgpack.Encoder().encode
"""MessagePack encoding (msgspec: about half msgpack-python's time on our bodies)."""
unpack = msgspec.msgpack.Decoder().decode
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)
"""What :func:`unpack` raises for bytes that are not msgpack (msgspec raises
``UnicodeDecodeError`` for a string that is not UTF-8)."""
"""MessagePack decoding into plain Python values; ``msgspec.DecodeError`` on garbage."""

LEFT_AT = struct.Struct("<d")
"""The last part of a delivery message: when it left the broker (``time.time()``, the
system's real-time clock, the clock ``published_at`` is read from too)."""

MAX_CLIENT_NAME = 256
"""Longest client name a broker accepts (characters)."""

MAX_SEQ = 2**63 - 1
MAX_TIME = 1e12
"""Largest publication sequence number, largest |published_at| (seconds)."""

ClientName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CLIENT_NAME)]
Sequence = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]


def stamp_problem(seq: object, published_at: object, session: object = 0) -> str | None:
    """Why a publication's ``seq``, ``published_at`` and publisher ``session`` cannot be
    accepted, or None: one check for the client entry and the peer entry alike (DESIGN
    §8), so a copy accepted at one broker is never refused at the next."""
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        return f"'seq' must be an integer in [0, 2**63), not {seq!r}"[:120]
    if type(session) is not int or not 0 <= session <= MAX_SEQ:
        return f"'session' must be an integer in [0, 2**63), not {session!r}"[:120]
    if type(published_at) is not float or not abs(published_at) <= MAX_TIME:
        return f"'published_at' must be a finite time in seconds, not {published_at!r}"[:120]
    return None


class Request(
    msgspec.Struct, tag_field="op", forbid_unknown_fields=True, frozen=True, kw_only=True
):
    """Fields every client request has: ``client`` (its name on the connection) and an
    optional ``req`` number that asks for a reply."""

    client: ClientName
    req: int | None = None


class HelloRequest(Request, tag="hello"):
    """Handshake (and a barrier: answered after everything sent before it)."""


class SubscribeRequest(Request, tag="subscribe"):
    """Subscribe ``client`` to a filter: PADRES text (atomic or composite) or the dict
    form (a composite's with its parts as text). With ``durable``
    the subscription outlives the connection under that name (DESIGN §11): the broker
    keeps its record while the client is away."""

    filter: str | dict[str, Any]
    durable: ClientName | None = None


class UnsubscribeRequest(Request, tag="unsubscribe"):
    """Withdraw subscription ``sub_id`` of ``client``; a durable one ends, unless
    ``moved`` says it moved to another broker (its record went with it)."""

    sub_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    moved: bool = False


class AdoptRequest(Request, tag="adopt"):
    """Take over subscription ``sub_id``, which ``client`` holds at another broker of this
    one's cluster and is moving here (DESIGN §9): the broker delivers it from now on
    (a ``durable`` one's record is kept here from now on)."""

    sub_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    durable: ClientName | None = None


class PublishRequest(Request, tag="publish"):
    """Publish number ``seq`` of publisher ``client``'s ``session`` (a number the
    publisher draws at random when it starts, so that a publisher started again under the
    same name is not taken for a repeat of its earlier self), time-stamped
    ``published_at``."""

    seq: Sequence
    published_at: float
    publication: str | dict[str, Any]
    session: Sequence = 0


class AdvertiseRequest(Request, tag="advertise"):
    """``client`` will publish only what ``filter`` (PADRES text or the dict form) matches
    (with advertisements on, DESIGN §12); answered with the advertisement's ``adv_id``."""

    filter: str | dict[str, Any]


class ReplayRequest(Request, tag="replay"):
    """Ask the overlay for the retained publications matching ``filters`` that ``client``
    may have missed (DESIGN §11): of each ``since`` entry (publisher, session, seq) those
    numbered after ``seq``, of any other publisher those published at or after ``after``;
    none published at or after ``until``. ``historic``: a window of the past (a historic,
    hybrid or durable subscription), waited for longer. Each store answers at most
    ``answer_max`` publications and ``answer_bytes`` bytes (0: the brokers' bounds).
    Answered at once with the request's id, then by ``replayed`` notices and a
    ``replay_done`` one."""

    filters: Annotated[list[str], msgspec.Meta(min_length=1, max_length=10_000)]
    since: Annotated[list[tuple[ClientName, Sequence, Sequence]], msgspec.Meta(max_length=100_000)]
    after: Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)]
    until: Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)] | None = None
    historic: bool = False
    answer_max: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)] = 0
    answer_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)] = 0


class ClaimRequest(Request, tag="claim"):
    """Find durable subscription ``durable`` of ``client`` wherever its record is kept
    (DESIGN §11) and hand it to this broker: answered at once with the request's id, then
    by a ``replay_done`` notice whose ``claimed`` lists the records found."""

    durable: ClientName


class AckRequest(Request, tag="ack"):
    """``client`` took the deliveries of durable subscription ``durable`` up to
    ``since`` (publisher, session, seq): its replay starts after them. ``after``: what
    other publishers published since then is still owed (a record claimed from
    another broker carries it over)."""

    durable: ClientName
    since: Annotated[list[tuple[ClientName, Sequence, Sequence]], msgspec.Meta(max_length=100_000)]
    after: Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)] | None = None


class HeartbeatRequest(Request, tag="heartbeat"):
    """Liveness of a connection's clients (DESIGN §7: a silent client is dropped)."""


class ByeRequest(Request, tag="bye"):
    """The connection leaves: every subscription of its clients is withdrawn now rather
    than at the client timeout (a clean close, or the broker left at a fail-over)."""


ClientRequest = (
    HelloRequest
    | SubscribeRequest
    | UnsubscribeRequest
    | AdoptRequest
    | PublishRequest
    | AdvertiseRequest
    | ReplayRequest
    | ClaimRequest
    | AckRequest
    | HeartbeatRequest
    | ByeRequest
)
"""Every request a client may send."""

_request_decoder = msgspec.msgpack.Decoder(ClientRequest)
OPS = tuple(msgspec.inspect.type_info(r).tag for r in ClientRequest.__args__)


class RequestError(ValueError):
    """A client request that is not well-formed; the message names the problem."""


def decode_request(payload: bytes) -> ClientRequest:
    """Decode and validate one client request; :class:`RequestError` naming the field."""
    try:
        return _request_decoder.decode(payload)
    except msgspec.ValidationError as exc:
        if str(exc).endswith("- at `$.op`"):
            op = _op(payload)
            raise RequestError(f"unknown op {op!r}; expected one of {', '.join(OPS)}") from None
        raise RequestError(f"bad request: {exc}") from None
    except DECODE_ERRORS as exc:
        raise RequestError(f"request is not msgpack: {exc}") from None


def _op(payload: bytes) -> object:
    """The ``op`` of a request refused for it (the typed decoder stops there, so the rest
    may not even be msgpack)."""
    try:
        return unpack(payload).get("op")
    except DECODE_ERRORS as exc:
        raise RequestError(f"request is not msgpack: {exc}") from None


def request_number(payload: bytes) -> int | None:
    """The ``req`` of a request that failed to decode, if one can be read (for the reply)."""
    try:
        data = unpack(payload)
    except DECODE_ERRORS:
        return None
    req = data.get("req") if isinstance(data, dict) else None
    return req if type(req) is int else None


def delivery_fields(body: bytes) -> tuple[str, int, float, dict[str, Any], int]:
    """``(publisher, seq, published_at, publication, session)`` of a delivery's NOTIFY
    body."""
    data = unpack(body)
    return data[1], data[2], data[3], data[4], data[8]
