"""Peer frames ↔ routing messages (DESIGN §4, §7); the bodies are declared in :mod:`octopis.wire`.

A frame is two ZeroMQ message parts: the sender's broker id (UTF-8) and a body, one of
the peer bodies of :mod:`octopis.wire` (``[kind, ...fields]``). A routing message has its
body's fields, by name and in order (checked when this module is imported), so each
converts to and from its body by name; a field that travels in another form is converted
by one function per field name: filters as PADRES text, the CBV as ``[bytes, nbits]``,
no ``until`` as nil, replayed notifications as NOTIFY bodies. The link-level messages
(HELLO, HEARTBEAT, SYNCED) are their bodies. Keeping the sender out of the body lets a
broker forward an unchanged notification with the very bytes it received.
:func:`decode_peer` validates everything it reads and raises :class:`WireError` naming
the problem; a broker drops such a frame and keeps serving.

This is the node's (DESIGN §2: its input is a frame from a neighbour): sans-IO, it turns
the bytes a shell moved into the messages the node takes, and both the broker process
and every tool that reads peer frames decode through it alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from math import inf
from operator import attrgetter, methodcaller
from typing import Any

import msgspec
from bitarray import bitarray, frozenbitarray

from octopis._match import is_plain_publication, plain_notification
from octopis.core.messages import (
    Advertise,
    Message,
    Move,
    Notification,
    Rehost,
    Subscribe,
    SubState,
    Tunnel,
    Unadvertise,
    Unsubscribe,
)
from octopis.core.replay import (
    Claimed,
    Replay,
    ReplayData,
    ReplayEcho,
    ReplayMessage,
    check_replay_filters,
)
from octopis.filters.language import FilterError, parse_subscription, validate_publication
from octopis.filters.limits import VALID_ATTRIBUTES
from octopis.wire import (
    DECODE_ERRORS,
    NOTIFY_HEAD,
    PLAIN_NOTIFY,
    AdvertiseBody,
    Ask,
    Cbv,
    ClaimedRecord,
    Control,
    Heartbeat,
    Hello,
    MoveBody,
    NotifyBody,
    PeerBody,
    RehostBody,
    ReplayBody,
    ReplayDataBody,
    ReplayEchoBody,
    Resent,
    Route,
    SubscribeBody,
    Synced,
    UnadvertiseBody,
    UnsubscribeBody,
    WireError,
    body_positions,
    decode_peer_body,
    pack,
)

__all__ = [
    "Ask",
    "Control",
    "Heartbeat",
    "Hello",
    "PeerMessage",
    "Resent",
    "Synced",
    "WireError",
    "decode_body",
    "decode_body_in_full",
    "decode_peer",
    "decode_plain_notification",
    "decode_sender",
    "encode_body",
    "encode_peer",
]

PeerMessage = Message | Control | ReplayMessage
"""Everything a peer frame carries."""

astuple = msgspec.structs.astuple


def encode_peer(sender: str, message: PeerMessage) -> list[bytes]:
    """The two parts of a frame carrying ``message`` from broker ``sender``."""
    return [sender.encode(), encode_body(message)]


def encode_body(message: PeerMessage) -> bytes:
    """The body part of a frame for ``message``."""
    if type(message) is Notification:
        if message.cbv is None and message.tunnel is None:
            return pack(NotifyBody(*message))  # the same fields in the same order (checked below)
        return pack(_notify_body(message))
    to_body = _TO_BODY.get(type(message))
    if to_body is None:
        raise TypeError(f"cannot encode {type(message).__name__}")
    return pack(to_body(message))


def decode_peer(parts: list[bytes]) -> tuple[str, PeerMessage]:
    """``(sender, message)`` of one frame; :class:`WireError` if it is malformed."""
    if len(parts) != 2:
        raise WireError(f"frame has {len(parts)} parts, expected [sender, body]")
    sender = decode_sender(parts[0])
    return sender, decode_body(sender, parts[1])


def decode_sender(part: bytes) -> str:
    """The sender's name from a frame's first part; :class:`WireError` if not UTF-8."""
    try:
        return part.decode()
    except UnicodeDecodeError:
        raise WireError("sender part is not UTF-8") from None


def decode_body(sender: str, body: bytes) -> PeerMessage:
    """The message in a frame's ``body`` from ``sender`` (named in errors);
    :class:`WireError` if it is malformed."""
    return decode_plain_notification(body) or decode_body_in_full(sender, body)


def decode_body_in_full(sender: str, body: bytes) -> PeerMessage:
    """:func:`decode_body` without trying :data:`decode_plain_notification` first: for a
    caller that has (it returned None), so that the body is not decoded twice."""
    decoded = decode_peer_body(body, sender)
    to_message = _TO_MESSAGE.get(type(decoded))
    if to_message is None:
        return decoded  # a link-level message is its body
    try:
        return to_message(decoded, sender)
    except FilterError as exc:
        raise WireError(f"bad content from {sender}: {exc}") from None


def _notify_body(message: Notification) -> NotifyBody:
    tunnel = message.tunnel
    return NotifyBody(
        message.publisher,
        message.seq,
        message.published_at,
        message.publication,
        _cbv_out(message.cbv),
        message.destinations,
        None if tunnel is None else Route(*tunnel),
        message.session,
        message.body,
    )


def _notification(body: NotifyBody, _: str = "") -> Notification:
    publication = body.publication
    if not is_plain_publication(publication, VALID_ATTRIBUTES):
        validate_publication(publication)  # raises, naming the problem, or learns a name
    tunnel = body.tunnel
    return _new_notification(
        (
            body.publisher,
            body.seq,
            body.published_at,
            publication,
            _cbv_in(body.cbv),
            body.destinations,
            None if tunnel is None else Tunnel(*astuple(tunnel)),
            body.session,
            body.body,
        )
    )


_new_notification = partial(tuple.__new__, Notification)
"""``Notification`` from its nine fields in order, without the generated ``__new__``
(half the cost; a notification is built per frame received)."""

_plain_notification_fields = msgspec.msgpack.Decoder(PLAIN_NOTIFY).decode
"""The common notification's fields (:data:`octopis.wire.PLAIN_NOTIFY`), decoded and
checked in C: no CBV, destinations or tunnel, a flat publication (whose names and numbers
:func:`is_plain_publication` then checks). It only ever accepts what the full decoding
accepts, to the same fields; anything else is decoded in full, which decides and names
the problem (tests/test_wire.py checks both ways)."""
decode_plain_notification = partial(
    plain_notification,
    NOTIFY_HEAD,
    _plain_notification_fields,
    DECODE_ERRORS,
    VALID_ATTRIBUTES,
    Notification,
    body_positions(NotifyBody)["publication"],
)
"""``decode_plain_notification(body)``: the :class:`Notification` in a NOTIFY body of
the common shape, decoded and checked in one compiled call; None for any other body (the
caller then uses :func:`decode_body_in_full`, which decides and words the error)."""


def _cbv_out(cbv: frozenbitarray | None) -> Cbv | None:
    return None if cbv is None else Cbv(cbv.tobytes(), len(cbv))


def _cbv_in(cbv: Cbv | None) -> frozenbitarray | None:
    if cbv is None:
        return None
    if cbv.nbits > 8 * len(cbv.bits):
        raise WireError(f"CBV must be [bytes, nbits]: {cbv.nbits} bits in {len(cbv.bits)} bytes")
    bits = bitarray()
    bits.frombytes(cbv.bits)
    return frozenbitarray(bits[: cbv.nbits])


def _replayed(bodies: list[bytes], sender: str) -> tuple[Notification, ...]:
    notifications = tuple(decode_body(sender, b) for b in bodies)
    if not all(type(n) is Notification for n in notifications):
        raise WireError(f"REPLAY_DATA from {sender} must carry NOTIFY bodies only")
    return notifications


_OUT: dict[str, Callable[[Any], Any]] = {
    "subscription": methodcaller("to_text"),
    "advertisement": methodcaller("to_text"),
    "cbv": _cbv_out,
    "until": lambda until: None if until == inf else until,
    "notifications": lambda notifications: [encode_body(n) for n in notifications],
    "claimed": lambda claimed: tuple(ClaimedRecord(*c) for c in claimed),
}
"""How a message's field travels, by field name (the rest travel as they are)."""
_IN: dict[str, Callable[[Any, str], Any]] = {
    "subscription": lambda text, _: parse_subscription(text),
    "advertisement": lambda text, _: parse_subscription(text),
    "state": lambda state, _: SubState(state),
    "cbv": lambda cbv, _: _cbv_in(cbv),
    "until": lambda until, _: inf if until is None else until,
    "filters": lambda filters, _: check_replay_filters(filters),
    "notifications": _replayed,
    "claimed": lambda claimed, _: tuple(Claimed(*astuple(c)) for c in claimed),
}
"""The reverse of :data:`_OUT`, checking what the declaration cannot (filters parse,
the CBV's bits fit its bytes); ``sender`` names the neighbour in errors."""


def _fields(cls: type) -> tuple[str, ...]:
    """The fields a message is built from, in order (a NamedTuple's or a dataclass's)."""
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return cls._fields


def _same_fields(message: type, body: type[msgspec.Struct]) -> None:
    """A message and its declaration agree on every field's name and position."""
    if _fields(message) != body.__struct_fields__:
        raise TypeError(
            f"{message.__name__}{_fields(message)} differs from its wire declaration "
            f"{body.__name__}{body.__struct_fields__}"
        )


def _converters(
    message: type, body: type[PeerBody]
) -> tuple[Callable[[Any], PeerBody], Callable[[PeerBody, str], Any]]:
    """``(to_body, to_message)`` for a routing message and its body, by field name."""
    _same_fields(message, body)
    names = body.__struct_fields__
    get = attrgetter(*names)
    out = [(i, _OUT[name]) for i, name in enumerate(names) if name in _OUT]
    into = [(i, _IN[name]) for i, name in enumerate(names) if name in _IN]

    def to_body(m: Any) -> PeerBody:
        values = list(get(m))
        for i, convert in out:
            values[i] = convert(values[i])
        return body(*values)

    def to_message(b: PeerBody, sender: str) -> Any:
        values = list(astuple(b))
        for i, convert in into:
            values[i] = convert(values[i], sender)
        return message(*values)

    return to_body, to_message


_same_fields(Notification, NotifyBody)
_same_fields(Tunnel, Route)
_same_fields(Claimed, ClaimedRecord)
_TO_BODY: dict[type, Callable[[Any], PeerBody]] = {
    Hello: lambda m: m,
    Heartbeat: lambda m: m,
    Synced: lambda m: m,
    Resent: lambda m: m,
    Ask: lambda m: m,
}
_TO_MESSAGE: dict[type, Callable[[Any, str], Any]] = {NotifyBody: _notification}
for _message, _body in (
    (Subscribe, SubscribeBody),
    (Unsubscribe, UnsubscribeBody),
    (Move, MoveBody),
    (Rehost, RehostBody),
    (Advertise, AdvertiseBody),
    (Unadvertise, UnadvertiseBody),
    (Replay, ReplayBody),
    (ReplayData, ReplayDataBody),
    (ReplayEcho, ReplayEchoBody),
):
    _TO_BODY[_message], _TO_MESSAGE[_body] = _converters(_message, _body)
