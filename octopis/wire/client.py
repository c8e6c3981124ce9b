"""The client protocol (DESIGN §4), declared once: every request a client sends a
broker, every reply and notice the broker sends back, and the delivery message.

A client is a DEALER talking to the broker's ROUTER:
  - a request is a map tagged by ``op`` (:data:`ClientRequest`), decoded and validated in
    one step by :func:`decode_request` (:class:`RequestError` naming the problem);
    ``req``, when set, asks for a reply, which
    echoes it;
  - a reply (:class:`Reply`: ``{"op", "req", ...}``) answers one request; a refusal is
    :class:`ErrorReply`; a notice (:class:`Notice`) tells a client something unasked and names
    it (``client``); both are maps tagged by ``op`` (:data:`BrokerMessage`), read and
    checked by :func:`decode_reply`;
  - a delivery message is ``[names, body, ..., names, body, stamp]``: per delivery
    ``names``, the packed list of the connection's client names it is for, and ``body``,
    the NOTIFY body of the peer protocol exactly as the broker received or encoded it
    once (:func:`delivery_fields` reads it); last the broker's ``time.time()`` as the
    message left it (:data:`~octopis.wire.LEFT_AT`, 8 bytes), which splits a
    notification's delay into the overlay's share (publisher to broker egress) and the
    client's (egress to the SDK's callback).

This module and :mod:`octopis.wire` are the whole of what a client needs to speak to a
broker, so the SDK imports them and :mod:`octopis.filters` only.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import msgspec.inspect

from octopis.wire import (
    DECODE_ERRORS,
    MAX_SEQ,
    MAX_TIME,
    ClaimedRecord,
    ClientName,
    NotifyBody,
    Sequence,
    unpack,
)


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
    ``published_at``; ``body`` its opaque body (bytes the overlay carries to every
    subscriber unchanged and never matches; the broker refuses one longer than its
    ``[clients] body_bytes``)."""

    seq: Sequence
    published_at: float
    publication: str | dict[str, Any]
    session: Sequence = 0
    body: bytes = b""


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


class Reply(msgspec.Struct, tag_field="op", frozen=True, kw_only=True):
    """What a broker answers a request numbered ``req`` (DESIGN §4)."""

    req: int | None = None


class WelcomeReply(Reply, tag="welcome"):
    """The answer to a hello: the broker, its routing mode, its place in the SCOT, and
    the seconds of silence after which it drops a client (``[clients] timeout``)."""

    broker: str
    mode: str
    cluster: int
    region: str
    timeout: float


class AliveReply(Reply, tag="alive"):
    """The answer to a heartbeat."""


class ByeReply(Reply, tag="bye"):
    """The answer to a bye, behind every delivery made to the connection before it."""


class SubscribedReply(Reply, tag="subscribed"):
    """A subscription made, as ``sub_id``."""

    sub_id: str


class UnsubscribedReply(Reply, tag="unsubscribed"):
    """Subscription ``sub_id`` withdrawn, behind every delivery made for it."""

    sub_id: str


class AdoptedReply(Reply, tag="adopted"):
    """Subscription ``sub_id``, moving here, is delivered here from now on."""

    sub_id: str


class AdvertisedReply(Reply, tag="advertised"):
    """An advertisement made, as ``adv_id``."""

    adv_id: str


class ReplayingReply(Reply, tag="replaying"):
    """A replay under way as ``id``: :class:`ReplayedNotice` and
    :class:`ReplayDoneNotice` follow."""

    id: str


class ClaimingReply(Reply, tag="claiming"):
    """A durable record's claim under way as ``id``: :class:`ReplayDoneNotice` follows."""

    id: str


class AckedReply(Reply, tag="acked"):
    """A durable subscription's acknowledgement recorded."""


class PublishedReply(Reply, tag="published"):
    """Publication ``seq`` taken: its copies are kept (DESIGN §7)."""

    seq: int


class ErrorReply(Reply, tag="error"):
    """A request refused, ``message`` naming why; ``error`` names a refusal a client may
    act on (``unadvertised``, ``not_kept``)."""

    message: str
    error: str | None = None


class Notice(msgspec.Struct, tag_field="op", frozen=True, kw_only=True):
    """What a broker tells a client (``client``, its name on the connection; empty: the
    connection) unasked, behind the deliveries made before it."""

    client: str = ""


class MoveNotice(Notice, tag="move"):
    """Move subscriptions ``sub_ids`` to broker ``to`` (DESIGN §9); ``inside``: within
    the cluster (adopted there) rather than subscribed again."""

    to: str
    inside: bool
    sub_ids: list[str]


class ReleasedNotice(Notice, tag="released"):
    """Moved subscription ``sub_id`` is no longer delivered here (DESIGN §9)."""

    sub_id: str


class WithdrawnNotice(Notice, tag="withdrawn"):
    """Durable subscription ``sub_id`` was claimed where its client came back (§11)."""

    sub_id: str


class ReplayedNotice(Notice, tag="replayed"):
    """Publications replay ``id`` answered: NOTIFY bodies (DESIGN §11)."""

    id: str
    bodies: list[bytes]


class ReplayDoneNotice(Notice, tag="replay_done"):
    """Replay ``id`` ended (or a late part of it, ``late``): the stores that
    ``answered``, the brokers ``unstored`` without one and those ``silent``, the ``gaps``
    stores no longer hold (``[publisher, session, first, last]``), how many were
    ``published``, the stores whose answer was ``truncated``, and the durable records
    ``claimed`` (DESIGN §11)."""

    id: str
    answered: list[str]
    unstored: list[str]
    silent: list[str]
    gaps: list[tuple[str, int, int, int]]
    published: int
    late: bool
    truncated: list[str]
    claimed: list[ClaimedRecord]


class CompositeNotice(Notice, tag="composite"):
    """A match of composite subscription ``sub_id`` (DESIGN §12): per part ``[publisher,
    session, seq, published_at, publication, parts]``; the join's counts so far."""

    sub_id: str
    parts: list[tuple[str, int, int, float, dict[str, Any], list[int]]]
    dropped: int
    late: int
    cut: int


class CompositeDroppedNotice(Notice, tag="composite_dropped"):
    """Composite subscription ``sub_id``'s join let publications go (DESIGN §12)."""

    sub_id: str
    dropped: int
    late: int
    cut: int


class DroppedNotice(Notice, tag="dropped"):
    """The broker drops the connection for ``reason`` (DESIGN §8); ``req``: the request
    it answers, when it answers one (a request from a connection it dropped before)."""

    reason: str
    req: int | None = None


class OverflowNotice(Notice, tag="overflow"):
    """The broker dropped the connection's ``dropped`` oldest deliveries (DESIGN §8)."""

    dropped: int


BrokerMessage = (
    WelcomeReply
    | AliveReply
    | ByeReply
    | SubscribedReply
    | UnsubscribedReply
    | AdoptedReply
    | AdvertisedReply
    | ReplayingReply
    | ClaimingReply
    | AckedReply
    | PublishedReply
    | ErrorReply
    | MoveNotice
    | ReleasedNotice
    | WithdrawnNotice
    | ReplayedNotice
    | ReplayDoneNotice
    | CompositeNotice
    | CompositeDroppedNotice
    | DroppedNotice
    | OverflowNotice
)
"""Every reply and notice a broker sends a client."""

_reply_decoder = msgspec.msgpack.Decoder(BrokerMessage)

AFTER_DELIVERIES = (UnsubscribedReply, ByeReply)
"""Replies that follow every delivery the broker made to their connection before them,
as notices do (DESIGN §4, §7, §9): a client lets a connection go once the broker has
answered its withdrawal (a subscription moved across clusters) or its bye (the
connection left at a fail-over), so nothing may still wait for it there. Any other
reply does not wait for deliveries."""


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


class ReplyError(ValueError):
    """A reply or notice from a broker that is not well-formed; the message names the
    problem."""


def decode_reply(payload: bytes) -> BrokerMessage:
    """Decode and check one reply or notice from a broker; :class:`ReplyError` naming
    the problem (a broker of another version, a corrupted frame). Fields a newer broker
    adds are ignored."""
    try:
        return _reply_decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise ReplyError(f"bad reply: {exc}") from None
    except DECODE_ERRORS as exc:
        raise ReplyError(f"reply is not msgpack: {exc}") from None


def op_of(message: Request | dict[str, Any]) -> str:
    """The ``op`` a request is tagged with (``"subscribe"`` for a
    :class:`SubscribeRequest`; a raw map's own), for messages about it."""
    op = message.get("op") if isinstance(message, dict) else message.__struct_config__.tag
    return str(op)


def is_reply(payload: bytes, kind: type[Reply]) -> bool:
    """Whether ``payload`` is a reply of ``kind`` (one that cannot be read is not)."""
    try:
        return type(_reply_decoder.decode(payload)) is kind
    except (msgspec.ValidationError, *DECODE_ERRORS):
        return False


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


read_notify = msgspec.msgpack.Decoder(NotifyBody).decode
"""``read_notify(body)``: the :class:`NotifyBody` of a delivery (the broker checked it;
a body that is not one raises ``msgspec`` errors)."""


def delivery_fields(body: bytes) -> tuple[str, int, float, dict[str, Any], int, bytes]:
    """``(publisher, seq, published_at, publication, session, body)`` of a delivery's
    NOTIFY ``body`` (the last: the publication's opaque body, empty when it has none)."""
    n = read_notify(body)
    return n.publisher, n.seq, n.published_at, n.publication, n.session, n.body
