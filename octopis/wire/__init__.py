"""Wire formats shared by brokers and clients (DESIGN §4): MessagePack, nothing else.

The client protocol (requests, replies, notices, deliveries) is
:mod:`octopis.wire.client`; this module and that one are the whole of what a client needs
to speak to a broker, so the SDK imports them and :mod:`octopis.filters` only — never the
matcher, the routing core or networkx.

Peer protocol (DESIGN §2, §4: the wire declared once): a frame is the sender's broker id
and a body, and every body is one of the array-like tagged structs below
(:data:`PeerBody`), encoded as ``[kind, ...fields]``. Their fields are the only names
and positions of the peer protocol: :func:`decode_peer_body` checks a body against them
(raising :class:`WireError` naming the kind and field), the codec between bodies and
routing messages (:mod:`octopis.core.codec`) converts by name, and the compiled
NOTIFY path takes its positions from :class:`NotifyBody` (:data:`PLAIN_NOTIFY`).
"""

from __future__ import annotations

import re
import struct
from typing import Annotated, Any, Literal

import msgspec
import msgspec.inspect

HELLO, SUBSCRIBE, UNSUBSCRIBE, NOTIFY, HEARTBEAT, SYNCED, MOVE, REHOST = 0, 1, 2, 3, 4, 5, 6, 7
"""Peer body kinds: link handshake, SBP subscribe / unsubscribe, notification, liveness,
end of a resync, a subscriber's move inside its cluster and the note of its new host."""
REPLAY, REPLAY_DATA, REPLAY_ECHO = 8, 9, 10
"""Peer body kinds of a replay (DESIGN §11): the request, publications answered, an echo."""
ADVERTISE, UNADVERTISE = 11, 12
"""Peer body kinds of advertisements (DESIGN §12): one spreading, one withdrawn."""
RESENT = 13
"""Peer body kind of the routing messages a healed link sends again (DESIGN §7)."""
ASK = 14
"""Peer body kind of a sender's request for an acknowledgement at once (DESIGN §7)."""

pack = msgspec.msgpack.Encoder().encode
"""MessagePack encoding (msgspec: about half msgpack-python's time on our bodies)."""
unpack = msgspec.msgpack.Decoder().decode
"""MessagePack decoding into plain Python values; ``msgspec.DecodeError`` on garbage."""
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)
"""What :func:`unpack` raises for bytes that are not msgpack (msgspec raises
``UnicodeDecodeError`` for a string that is not UTF-8)."""

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
Name = Annotated[str, msgspec.Meta(min_length=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)]
"""A finite time or span in seconds (an integer is taken as a float)."""
State = Literal[1, 2]
"""An SBP step: 1 primary, 2 secondary (DESIGN §3)."""
Since = tuple[str, Sequence, Sequence]
"""The last sequence number seen of a publisher's session: ``(publisher, session, seq)``."""


class Fields(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """Values in an array, each field at its place and every one present (DESIGN §4)."""


class PeerBody(Fields):
    """A peer body: ``[kind, ...fields]`` (each subclass is tagged with its kind)."""


class Hello(PeerBody, tag=HELLO):
    """Link handshake (DESIGN §7): the sender runs as ``incarnation`` (random per process
    start) and knows the receiver as ``peer_incarnation`` (0: not yet). A receiver takes
    data from a neighbour only after a HELLO naming its own incarnation, so nothing queued
    for an earlier process of it is replayed into it."""

    incarnation: Sequence
    peer_incarnation: Sequence


class Heartbeat(PeerBody, tag=HEARTBEAT):
    """Liveness and custody acknowledgement (DESIGN §7): the sender's incarnation (a
    restart shows at once), how many data frames it has taken from the receiver, whose
    incarnation was ``acked_incarnation``, since their handshake (cumulative), and whether
    it is *serving*: resynced since its start, so that routing through it is safe."""

    incarnation: Sequence
    acked_incarnation: Sequence
    acked: Sequence
    serving: bool


class Synced(PeerBody, tag=SYNCED):
    """The sender has handed over its resync state (``entries`` subscriptions) after its
    handshake with this incarnation of the receiver (DESIGN §7). ``complete`` false: the
    sender was missing shares itself and hands its share later (until then the receiver
    routes toward it as if its side matched). ``wants_share``: the sender lacks the
    receiver's share (it started after the receiver's table was built, or next to it).
    ``predecessor``: the sender knew an earlier incarnation of the receiver (it restarted;
    a BID broker learns so that its table lost what was subscribed before)."""

    entries: Sequence
    complete: bool
    wants_share: bool
    predecessor: bool


class Resent(PeerBody, tag=RESENT):
    """A link healed with the same incarnation on both sides (DESIGN §7, custody): the
    sender numbered ``numbered`` routing messages since the handshake, and sends again
    those it has no acknowledgement for, as ``(number, body)``; the receiver takes the
    ones numbered past what it had taken (:func:`~octopis.core.custody.resent`)."""

    numbered: Count
    messages: tuple[tuple[Count, bytes], ...]


class Ask(PeerBody, tag=ASK):
    """The routing frames that follow hold a copy its publisher's confirm waits for: the
    receiver acknowledges them at once, before routing them, rather than within ``[links]
    ack_delay`` (DESIGN §7, custody; :func:`~octopis.core.custody.take`)."""


Control = Hello | Heartbeat | Synced | Resent | Ask
"""Link-level messages (the bodies are the messages): never routed, never queued behind
data for long."""


class Cbv(Fields):
    """DNR's cluster bit vector (DESIGN §3): ``nbits`` bits packed into ``bits``."""

    bits: bytes
    nbits: Annotated[int, msgspec.Meta(ge=1)]


class Route(Fields):
    """A detour along a SCOT square (DESIGN §7), as ``octopis.core.Tunnel`` names it."""

    cluster: Count
    target: Name
    origin: Name
    tried: Count


class NotifyBody(PeerBody, tag=NOTIFY):
    """A notification (DESIGN §4), field for field ``octopis.core.Notification``:
    ``publication`` a map of attribute names to values (the receiver checks both, naming
    the attribute at fault), ``destinations`` BID's ``[[broker, sub_id], ...]``, ``cbv``
    DNR's header, ``tunnel`` a detour's (each nil when absent); ``body`` the
    publication's opaque body (empty when it has none): carried unchanged to every
    subscriber and into retention, never matched."""

    publisher: Name
    seq: Sequence
    published_at: Seconds
    publication: dict[str, Any]
    cbv: Cbv | None
    destinations: tuple[tuple[str, str], ...] | None
    tunnel: Route | None
    session: Sequence
    body: bytes


class SubscribeBody(PeerBody, tag=SUBSCRIBE):
    """An SBP subscription (DESIGN §3), its filter as PADRES text."""

    sub_id: Name
    host: Name
    subscription: Name
    state: State
    cbv: Cbv | None
    issued_at: Seconds
    hops: int


class UnsubscribeBody(PeerBody, tag=UNSUBSCRIBE):
    """Withdraws ``sub_id`` along the steps its subscription took."""

    sub_id: Name
    state: State


class MoveBody(PeerBody, tag=MOVE):
    """A subscriber's move to ``host`` inside its cluster (DESIGN §9)."""

    sub_id: Name
    host: Name


class RehostBody(PeerBody, tag=REHOST):
    """The note of a moved subscriber's new ``host`` (DESIGN §9)."""

    sub_id: Name
    host: Name


class AdvertiseBody(PeerBody, tag=ADVERTISE):
    """An advertisement (DESIGN §12), its filter as PADRES text; ``via`` a region or nil."""

    adv_id: Name
    host: Name
    advertisement: Name
    state: State
    via: Name | None


class UnadvertiseBody(PeerBody, tag=UNADVERTISE):
    """Withdraws ``adv_id`` along the steps its advertisement took (DESIGN §12)."""

    adv_id: Name
    state: State


class ReplayBody(PeerBody, tag=REPLAY):
    """A replay request (DESIGN §11); ``until`` nil: no end; ``claim`` empty: no claim."""

    req_id: Name
    host: Name
    filters: tuple[Name, ...]
    since: tuple[Since, ...]
    after: Seconds
    budget: Seconds
    state: State
    until: Seconds | None
    answer_max: Sequence
    answer_bytes: Sequence
    claim: str


class ReplayDataBody(PeerBody, tag=REPLAY_DATA):
    """Publications answered for ``req_id``: NOTIFY bodies as they were stored."""

    req_id: Name
    notifications: list[bytes]


class ClaimedRecord(Fields):
    """A durable subscription's record handed over by ``broker`` (DESIGN §11)."""

    broker: Name
    filters: tuple[Name, ...]
    since: tuple[Since, ...]
    after: Seconds
    updated: Seconds


class ReplayEchoBody(PeerBody, tag=REPLAY_ECHO):
    """A broker's echo of a replay round (DESIGN §11); ``gaps`` are
    ``[publisher, session, first, last]``."""

    req_id: Name
    seen: bool
    answered: tuple[Name, ...]
    unstored: tuple[Name, ...]
    silent: tuple[Name, ...]
    gaps: tuple[tuple[str, Count, Count, Count], ...]
    published: Sequence
    truncated: tuple[Name, ...]
    claimed: tuple[ClaimedRecord, ...]


BODIES: tuple[type[PeerBody], ...] = (
    Hello,
    SubscribeBody,
    UnsubscribeBody,
    NotifyBody,
    Heartbeat,
    Synced,
    MoveBody,
    RehostBody,
    ReplayBody,
    ReplayDataBody,
    ReplayEchoBody,
    AdvertiseBody,
    UnadvertiseBody,
    Resent,
    Ask,
)
"""Every peer body, in the order of its kind."""
PeerBodies = (
    Hello
    | SubscribeBody
    | UnsubscribeBody
    | NotifyBody
    | Heartbeat
    | Synced
    | MoveBody
    | RehostBody
    | ReplayBody
    | ReplayDataBody
    | ReplayEchoBody
    | AdvertiseBody
    | UnadvertiseBody
    | Resent
    | Ask
)
"""What a peer body may be (the decoder's type)."""


def kind_name(body: type[PeerBody]) -> str:
    """``REPLAY_DATA`` for :class:`ReplayDataBody`: a kind's name in errors and logs."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", body.__name__.removesuffix("Body")).upper()


class WireError(ValueError):
    """A frame that cannot be decoded into a valid message; the text names the problem."""


_peer_decoder = msgspec.msgpack.Decoder(PeerBodies)
_PATH = re.compile(r" - at `\$\[(\d+)\]")


def decode_peer_body(body: bytes, sender: str) -> PeerBody:
    """The body a neighbour ``sender`` sent, checked against its declaration;
    :class:`WireError` naming the kind and field at fault (and ``sender``)."""
    try:
        return _peer_decoder.decode(body)
    except msgspec.ValidationError as exc:
        problem = str(exc)  # found before the rest was read: the rest may not be msgpack
    except DECODE_ERRORS as exc:
        raise WireError(f"frame from {sender!r} is not msgpack: {exc}") from None
    try:
        data = unpack(body)
    except DECODE_ERRORS as exc:
        raise WireError(f"frame from {sender!r} is not msgpack: {exc}") from None
    raise WireError(_problem(data, problem, sender))


def _problem(data: Any, problem: str, sender: str) -> str:
    """Words for a body ``data`` the decoder refused with ``problem``."""
    if not isinstance(data, list) or not data:
        return f"frame from {sender!r} is not [kind, ...]"
    kind = data[0]
    if type(kind) is not int:  # msgpack's true or 3.0 would compare equal to a kind
        return f"frame kind must be an integer, got {kind!r} from {sender}"
    if not 0 <= kind < len(BODIES):
        return f"unknown frame kind {kind!r} from {sender}"
    body = BODIES[kind]
    fields = body.__struct_fields__
    at = _PATH.search(problem)
    if at is None:
        return f"{kind_name(body)} frame has {len(data)} fields, expected {len(fields) + 1}"
    return f"{kind_name(body)} {fields[int(at[1]) - 1]} from {sender}: {problem}"


def body_positions(body: type[PeerBody]) -> dict[str, int]:
    """Where each field of ``body`` sits in its array (the kind is at 0)."""
    return {name: i for i, name in enumerate(body.__struct_fields__, 1)}


NOTIFY_HEAD = bytes([0x90 | (1 + len(NotifyBody.__struct_fields__)), NOTIFY])
"""A NOTIFY body's first two bytes: a MessagePack array (of fewer than 16) holding the
kind and the fields, then the kind."""
PLAIN_NIL = ("cbv", "destinations", "tunnel")
"""The fields a plain notification leaves nil."""
PLAIN_NOTIFY = tuple[
    tuple(
        [int]
        + [None if f.name in PLAIN_NIL else f.type for f in msgspec.structs.fields(NotifyBody)]
    )
]
"""The common NOTIFY body as a tuple type, made from :class:`NotifyBody`: no CBV,
destinations or tunnel. The compiled path decodes this shape and nothing else."""


def stamp_problem(seq: object, published_at: object, session: object = 0) -> str | None:
    """Why a publication's ``seq``, ``published_at`` and publisher ``session`` cannot be
    accepted, or None: the client entry's check, with the bounds of the peer body's
    :data:`Sequence` and :data:`Seconds` (DESIGN §8), so a copy accepted at one broker is
    never refused at the next."""
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        return f"'seq' must be an integer in [0, 2**63), not {seq!r}"[:120]
    if type(session) is not int or not 0 <= session <= MAX_SEQ:
        return f"'session' must be an integer in [0, 2**63), not {session!r}"[:120]
    if type(published_at) is not float or not abs(published_at) <= MAX_TIME:
        return f"'published_at' must be a finite time in seconds, not {published_at!r}"[:120]
    return None
