"""Peer-link frames ↔ routing messages (DESIGN §4, §7); body kinds in :mod:`octopis.wire`.

A frame is two ZeroMQ message parts: the sender's broker id (UTF-8) and a body, one
msgpack array ``[kind, ...fields]``: HELLO ``[0, incarnation, peer_incarnation]`` (the
link handshake; ``peer_incarnation`` is the receiver's as the sender knows it, 0 when
unknown), SUBSCRIBE, UNSUBSCRIBE, NOTIFY, and HEARTBEAT ``[4, incarnation, acked_incarnation,
acked]``, SYNCED ``[5, entries]`` (end of a resync), MOVE ``[6, sub_id, host]`` and REHOST
``[7, sub_id, host]`` (a subscriber moving inside its cluster, DESIGN §9), ADVERTISE
``[11, adv_id, host, filter, state, via]`` and UNADVERTISE ``[12, adv_id, state]``
(advertisements, DESIGN §12; ``via`` a region or nil).
Filters travel as PADRES text, publications as msgpack maps, the CBV as
``[bytes, nbits]``. A replay (DESIGN §11) is REPLAY ``[8, req_id, host, filters, since,
after, budget, state, until, answer_max, answer_bytes, claim]`` (``until`` nil: no end),
REPLAY_DATA ``[9, req_id, [NOTIFY body, ...]]`` and REPLAY_ECHO ``[10, req_id, seen,
answered, unstored, silent, gaps, published, truncated, claimed]``, a claimed durable
record being ``[broker, filters, since, after, updated]``. Keeping the sender out of
the body lets a broker forward an unchanged notification with the very bytes it received.
:func:`decode_peer` validates everything it reads and raises :class:`WireError` naming
the problem; a broker drops such a frame and keeps serving.
"""

from __future__ import annotations

from functools import partial
from math import inf, isfinite
from typing import Annotated, Any, NamedTuple

import msgspec
from bitarray import bitarray, frozenbitarray

from octopis._match import is_plain_publication, plain_notification
from octopis.core import (
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
from octopis.core.replay import Claimed, Replay, ReplayData, ReplayEcho, ReplayMessage
from octopis.filters.language import FilterError, parse_subscription, validate_publication
from octopis.filters.limits import VALID_ATTRIBUTES
from octopis.wire import (
    ADVERTISE,
    DECODE_ERRORS,
    HEARTBEAT,
    HELLO,
    MAX_TIME,
    MOVE,
    NOTIFY,
    REHOST,
    REPLAY,
    REPLAY_DATA,
    REPLAY_ECHO,
    SUBSCRIBE,
    SYNCED,
    UNADVERTISE,
    UNSUBSCRIBE,
    Sequence,
    pack,
    stamp_problem,
    unpack,
)


class WireError(ValueError):
    """A frame that cannot be decoded into a valid message."""


class Hello(NamedTuple):
    """Link handshake (DESIGN §7): the sender runs as ``incarnation`` (random per process
    start) and knows the receiver as ``peer_incarnation`` (0: not yet). A receiver takes
    data from a neighbour only after a HELLO naming its own incarnation, so nothing queued
    for an earlier process of it is replayed into it."""

    incarnation: int
    peer_incarnation: int = 0


class Heartbeat(NamedTuple):
    """Liveness and custody acknowledgement (DESIGN §7): the sender's incarnation (a
    restart shows at once), how many data frames it has taken from the receiver, whose
    incarnation was ``acked_incarnation``, since their handshake (cumulative), and whether
    it is *serving*: resynced since its start, so that routing through it is safe."""

    incarnation: int
    acked_incarnation: int = 0
    acked: int = 0
    serving: bool = False


class Synced(NamedTuple):
    """The sender has handed over its resync state (``entries`` subscriptions) after its
    handshake with this incarnation of the receiver (DESIGN §7). ``complete`` false: the
    sender was missing shares itself and hands its share later (until then the receiver
    routes toward it as if its side matched). ``wants_share``: the sender lacks the
    receiver's share (it started after the receiver's table was built, or next to it).
    ``predecessor``: the sender knew an earlier incarnation of the receiver (it restarted;
    a BID broker learns so that its table lost what was subscribed before)."""

    entries: int
    complete: bool = True
    wants_share: bool = False
    predecessor: bool = False


Control = Hello | Heartbeat | Synced
"""Link-level messages: never routed, never queued behind data for long."""


PeerMessage = Message | Control | ReplayMessage
"""Everything a peer frame carries."""


def encode_peer(sender: str, message: PeerMessage) -> list[bytes]:
    """The two parts of a frame carrying ``message`` from broker ``sender``."""
    return [sender.encode(), encode_body(message)]


def encode_body(message: PeerMessage) -> bytes:
    """The body part of a frame for ``message``."""
    if isinstance(message, Notification):
        dests = None if message.destinations is None else [list(d) for d in message.destinations]
        return pack(
            [
                NOTIFY,
                message.publisher,
                message.seq,
                message.published_at,
                message.publication,
                _cbv_out(message.cbv),
                dests,
                None if message.tunnel is None else list(message.tunnel),
                message.session,
            ]
        )
    if isinstance(message, Subscribe):
        return pack(
            [
                SUBSCRIBE,
                message.sub_id,
                message.host,
                message.subscription.to_text(),
                int(message.state),
                _cbv_out(message.cbv),
                message.issued_at,
                message.hops,
            ]
        )
    if isinstance(message, Unsubscribe):
        return pack([UNSUBSCRIBE, message.sub_id, int(message.state)])
    if isinstance(message, Move):
        return pack([MOVE, message.sub_id, message.host])
    if isinstance(message, Rehost):
        return pack([REHOST, message.sub_id, message.host])
    if isinstance(message, Advertise):
        return pack(
            [
                ADVERTISE,
                message.adv_id,
                message.host,
                message.advertisement.to_text(),
                int(message.state),
                message.via,
            ]
        )
    if isinstance(message, Unadvertise):
        return pack([UNADVERTISE, message.adv_id, int(message.state)])
    if isinstance(message, Hello):
        return pack([HELLO, message.incarnation, message.peer_incarnation])
    if isinstance(message, Synced):
        return pack(
            [SYNCED, message.entries, message.complete, message.wants_share, message.predecessor]
        )
    if isinstance(message, Replay):
        since = [list(item) for item in message.since]
        return pack(
            [
                REPLAY,
                message.req_id,
                message.host,
                list(message.filters),
                since,
                message.after,
                message.budget,
                int(message.state),
                None if message.until == inf else message.until,
                message.answer_max,
                message.answer_bytes,
                message.claim,
            ]
        )
    if isinstance(message, ReplayData):
        return pack([REPLAY_DATA, message.req_id, [encode_body(n) for n in message.notifications]])
    if isinstance(message, ReplayEcho):
        return pack(
            [
                REPLAY_ECHO,
                message.req_id,
                message.seen,
                list(message.answered),
                list(message.unstored),
                list(message.silent),
                [list(gap) for gap in message.gaps],
                message.published,
                list(message.truncated),
                [
                    [c.broker, list(c.filters), [list(x) for x in c.since], c.after, c.updated]
                    for c in message.claimed
                ],
            ]
        )
    if isinstance(message, Heartbeat):
        return pack(
            [
                HEARTBEAT,
                message.incarnation,
                message.acked_incarnation,
                message.acked,
                message.serving,
            ]
        )
    raise TypeError(f"cannot encode {type(message).__name__}")


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
    try:
        data = unpack(body)
    except DECODE_ERRORS as exc:
        raise WireError(f"frame from {sender!r} is not msgpack: {exc}") from None
    if not isinstance(data, list) or not data:
        raise WireError(f"frame from {sender!r} is not [kind, ...]")
    kind = data[0]
    if type(kind) is not int:  # msgpack's true or 3.0 would compare equal to a kind
        raise WireError(f"frame kind must be an integer, got {kind!r} from {sender}")
    try:
        if kind == NOTIFY:
            return _notification(data)
        if kind == SUBSCRIBE:
            return _subscribe(data)
        if kind == UNSUBSCRIBE:
            _expect(data, 3, "UNSUBSCRIBE")
            return Unsubscribe(_str(data[1], "sub_id"), _state(data[2]))
        if kind == MOVE:
            _expect(data, 3, "MOVE")
            return Move(_str(data[1], "sub_id"), _str(data[2], "host"))
        if kind == REHOST:
            _expect(data, 3, "REHOST")
            return Rehost(_str(data[1], "sub_id"), _str(data[2], "host"))
        if kind == ADVERTISE:
            _expect(data, 6, "ADVERTISE")
            return Advertise(
                _str(data[1], "adv_id"),
                _str(data[2], "host"),
                parse_subscription(_str(data[3], "filter")),
                _state(data[4]),
                None if data[5] is None else _str(data[5], "via"),
            )
        if kind == UNADVERTISE:
            _expect(data, 3, "UNADVERTISE")
            return Unadvertise(_str(data[1], "adv_id"), _state(data[2]))
        if kind == HEARTBEAT:
            _expect(data, 5, "HEARTBEAT")
            if type(data[4]) is not bool:
                raise WireError("HEARTBEAT serving flag must be true or false")
            return Heartbeat(
                _incarnation(data[1], "incarnation"),
                _incarnation(data[2], "acked incarnation"),
                _incarnation(data[3], "acked count"),
                data[4],
            )
        if kind == SYNCED:
            _expect(data, 5, "SYNCED")
            if not all(type(flag) is bool for flag in data[2:5]):
                raise WireError("SYNCED flags must be true or false")
            return Synced(_incarnation(data[1], "entries"), data[2], data[3], data[4])
        if kind == REPLAY:
            return _replay(data)
        if kind == REPLAY_DATA:
            _expect(data, 3, "REPLAY_DATA")
            if not isinstance(data[2], list) or not all(type(b) is bytes for b in data[2]):
                raise WireError("REPLAY_DATA must carry a list of NOTIFY bodies")
            notifications = tuple(decode_body(sender, b) for b in data[2])
            if not all(type(n) is Notification for n in notifications):
                raise WireError("REPLAY_DATA must carry NOTIFY bodies only")
            return ReplayData(_str(data[1], "req_id"), notifications)
        if kind == REPLAY_ECHO:
            return _replay_echo(data)
        if kind == HELLO:
            _expect(data, 3, "HELLO")
            return Hello(
                _incarnation(data[1], "incarnation"), _incarnation(data[2], "peer incarnation")
            )
    except FilterError as exc:
        raise WireError(f"bad content from {sender}: {exc}") from None
    raise WireError(f"unknown frame kind {kind!r} from {sender}")


def _names(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(type(x) is str and x for x in value):
        raise WireError(f"{what} must be a list of non-empty strings")
    return tuple(value)


def _since(value: Any, what: str) -> tuple[tuple[str, int, int], ...]:
    if not isinstance(value, list) or not all(
        isinstance(x, list)
        and len(x) == 3
        and type(x[0]) is str
        and stamp_problem(x[2], 0.0, x[1]) is None
        for x in value
    ):
        raise WireError(f"{what} must be [[publisher, session, seq], ...]")
    return tuple((p, s, q) for p, s, q in value)


def _seconds(value: Any, what: str) -> float:
    if type(value) not in (int, float) or not isfinite(value) or abs(value) > MAX_TIME:
        raise WireError(f"{what} must be a finite number of seconds")
    return float(value)


def _replay(data: list) -> Replay:
    _expect(data, 12, "REPLAY")
    _, req_id, host, filters, since, after, budget, state, until, count, size, claim = data
    for text in _names(filters, "REPLAY filters"):
        parse_subscription(text)  # raises FilterError, naming the problem
    if type(claim) is not str:
        raise WireError("REPLAY claim must be a string")
    return Replay(
        _str(req_id, "req_id"),
        _str(host, "host"),
        tuple(filters),
        _since(since, "REPLAY since"),
        _seconds(after, "REPLAY after"),
        _seconds(budget, "REPLAY budget"),
        _state(state),
        inf if until is None else _seconds(until, "REPLAY until"),
        _incarnation(count, "answer_max"),
        _incarnation(size, "answer_bytes"),
        claim,
    )


def _claimed(value: Any) -> tuple[Claimed, ...]:
    if not isinstance(value, list) or not all(isinstance(c, list) and len(c) == 5 for c in value):
        raise WireError("REPLAY_ECHO claimed must be [[broker, filters, since, after, updated]]")
    return tuple(
        Claimed(
            _str(broker, "claimed broker"),
            _names(filters, "claimed filters"),
            _since(since, "claimed since"),
            _seconds(after, "claimed after"),
            _seconds(updated, "claimed updated"),
        )
        for broker, filters, since, after, updated in value
    )


def _replay_echo(data: list) -> ReplayEcho:
    _expect(data, 10, "REPLAY_ECHO")
    _, req_id, seen, answered, unstored, silent, gaps, published, truncated, claimed = data
    if type(seen) is not bool:
        raise WireError("REPLAY_ECHO seen flag must be true or false")
    if not isinstance(gaps, list) or not all(
        isinstance(g, list)
        and len(g) == 4
        and type(g[0]) is str
        and all(type(x) is int and x >= 0 for x in g[1:])
        for g in gaps
    ):
        raise WireError("REPLAY_ECHO gaps must be [[publisher, session, first, last], ...]")
    return ReplayEcho(
        _str(req_id, "req_id"),
        seen,
        _names(answered, "REPLAY_ECHO answered"),
        _names(unstored, "REPLAY_ECHO unstored"),
        _names(silent, "REPLAY_ECHO silent"),
        tuple((g[0], g[1], g[2], g[3]) for g in gaps),
        _incarnation(published, "published"),
        _names(truncated, "REPLAY_ECHO truncated"),
        _claimed(claimed),
    )


def _notification(data: list) -> Notification:
    if len(data) != 9:
        raise WireError(f"NOTIFY frame has {len(data)} fields, expected 9")
    _, publisher, seq, published_at, publication, cbv, dests, tunnel, session = data
    if dests is not None:
        if not isinstance(dests, list) or not all(
            isinstance(d, list) and len(d) == 2 and all(isinstance(x, str) for x in d)
            for d in dests
        ):
            raise WireError("NOTIFY destinations must be [[broker, sub_id], ...]")
        dests = tuple((d[0], d[1]) for d in dests)
    if type(publisher) is not str or not publisher:
        _str(publisher, "publisher")
    if type(published_at) is int:
        published_at = float(published_at)
    problem = stamp_problem(seq, published_at, session)
    if problem is not None:
        raise WireError(problem)
    if not is_plain_publication(publication, VALID_ATTRIBUTES):
        validate_publication(publication)  # raises, naming the problem, or learns a name
    return _new_notification(
        (
            publisher,
            seq,
            published_at,
            publication,
            None if cbv is None else _cbv_in(cbv),
            dests,
            None if tunnel is None else _tunnel(tunnel),
            session,
        )
    )


_new_notification = partial(tuple.__new__, Notification)
"""``Notification`` from its eight fields in order, without the generated ``__new__``
(half the cost; a notification is built per frame received)."""

PLAIN_NOTIFY_HEAD = bytes([0x99, NOTIFY])
"""A NOTIFY body's first two bytes: a MessagePack array of nine, kind 3."""
_plain_notification_fields = msgspec.msgpack.Decoder(
    tuple[
        int,
        Annotated[str, msgspec.Meta(min_length=1)],
        Sequence,
        Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)],
        dict[str, str | int | float],
        None,
        None,
        None,
        Sequence,
    ]
).decode
"""The common notification's fields, decoded and checked in C: no CBV, destinations or
tunnel, a publisher, the stamp :func:`stamp_problem` accepts, a flat publication (whose
names and numbers :func:`is_plain_publication` then checks). It only ever accepts what the full
decoding accepts, to the same fields; anything else is decoded in full, which decides
and names the problem (tests/test_wire.py checks both ways)."""
decode_plain_notification = partial(
    plain_notification,
    PLAIN_NOTIFY_HEAD,
    _plain_notification_fields,
    DECODE_ERRORS,
    VALID_ATTRIBUTES,
    Notification,
)
"""``decode_plain_notification(body)``: the :class:`Notification` in a NOTIFY body of
the common shape, decoded and checked in one compiled call; None for any other body (the
caller then uses :func:`decode_body_in_full`, which decides and words the error)."""


def _tunnel(value: Any) -> Tunnel:
    if not isinstance(value, list) or len(value) != 4:
        raise WireError("NOTIFY tunnel must be [cluster, target, origin, tried]")
    cluster, target, origin, tried = value
    if _int(cluster, "tunnel cluster") < 0 or _int(tried, "tunnel tried") < 0:
        raise WireError("NOTIFY tunnel cluster and tried must not be negative")
    return Tunnel(cluster, _str(target, "tunnel target"), _str(origin, "tunnel origin"), tried)


def _subscribe(data: list) -> Subscribe:
    _expect(data, 8, "SUBSCRIBE")
    _, sub_id, host, text, state, cbv, issued_at, hops = data
    return Subscribe(
        _str(sub_id, "sub_id"),
        _str(host, "host"),
        parse_subscription(_str(text, "filter")),
        _state(state),
        _cbv_in(cbv),
        _float(issued_at, "issued_at"),
        _int(hops, "hops"),
    )


def _cbv_out(cbv: frozenbitarray | None) -> list | None:
    return None if cbv is None else [cbv.tobytes(), len(cbv)]


def _cbv_in(value: Any) -> frozenbitarray | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], bytes)
        or type(value[1]) is not int
        or not 0 < value[1] <= 8 * len(value[0])
    ):
        raise WireError("CBV must be [bytes, nbits]")
    bits = bitarray()
    bits.frombytes(value[0])
    return frozenbitarray(bits[: value[1]])


def _expect(data: list, length: int, kind: str) -> None:
    if len(data) != length:
        raise WireError(f"{kind} frame has {len(data)} fields, expected {length}")


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise WireError(f"{name} must be a non-empty string")
    return value


def _int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"{name} must be an integer")
    return value


def _float(value: Any, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not isfinite(value):
        raise WireError(f"{name} must be a finite number")
    return float(value)


def _incarnation(value: Any, name: str) -> int:
    if type(value) is not int or not 0 <= value < 2**63:
        raise WireError(f"{name} must be an integer in [0, 2**63)")
    return value


def _state(value: Any) -> SubState:
    try:
        return SubState(value)
    except ValueError:
        raise WireError(f"subscription state must be 1 or 2, got {value!r}") from None
