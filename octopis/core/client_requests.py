"""What a broker does with a client's request (DESIGN §4, §7, §8, §11, §12), sans-IO, once
for the broker process and the simulator: what is refused, with a message naming the
problem and nothing changed; what the request then makes, holds, attaches or withdraws;
and what the client is told.

- a filter (a subscription's, an advertisement's, a replay's) that does not parse is
  refused (:class:`~octopis.filters.language.FilterError` naming the position) before
  anything is made (:func:`subscribe`, :func:`advertise`; a replay's:
  :func:`~octopis.core.replay.check_replay_filters`, the rule a neighbour's REPLAY meets too);
- a subscription is refused past its client's limit (:meth:`ClientTable.subscribe`),
  and a durable one that cannot be (a composite, or a new record past ``durable.max``:
  :meth:`Durables.room`); else it is made, held for the client, and a durable one's
  record attached (:func:`subscribe`; :func:`adopt` for one moving here);
- a client withdraws only what it holds; a durable subscription's record ends with it,
  unless it moved (:func:`unsubscribe`);
- an acknowledgement names a durable subscription kept here (:func:`acknowledge`);
- a publication is refused for its body's size, then for its text or data, then for
  its connection's unanswered publications or the deliveries waiting
  (:class:`~octopis.core.client_flow.ClientFlow`, :func:`admit_publication`), then
  outside its publisher's advertisements
  (:func:`~octopis.core.sessions.check_advertised`, which the simulator asks too); its
  answer waits for the copies kept in custody and names a refusal by the disk
  (:func:`published`);
- which failures are the client's and what error each gets (:func:`refusal`): the
  others are the broker's own (an internal error).

The shells decode, call these, and carry out the actions; they send the replies, write
the durable records and start the replays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from octopis.core.bid import BidBroker
from octopis.core.client_flow import ClientFlow
from octopis.core.clustered import ClusteredBroker
from octopis.core.composite_hosting import HostedComposites
from octopis.core.durable import DurableError, Durables
from octopis.core.messages import Action, ProtocolError, UnadvertisedPublication
from octopis.core.sessions import ClientTable, SessionRefused, Withdraw
from octopis.core.sessions import adopt as adopt_here
from octopis.core.sessions import advertise as advertise_here
from octopis.filters.composite import Composite, as_filter
from octopis.filters.language import (
    FilterError,
    Publication,
    Subscription,
    parse_publication,
    validate_publication,
)
from octopis.wire.client import ErrorReply, PublishedReply

Filter = str | Mapping[str, Any] | Subscription | Composite
"""A filter as a request carries it (PADRES text or the dict form) or as parsed."""
LocalSubscribe = Callable[[str, Subscription | Composite, float], tuple[str, list[Action]]]
"""How a shell makes a local subscription (client key, filter, now) → its id and the
core's actions: the core's ``subscribe``, or the composite host's ``local_subscribe``."""


class RequestRefused(ValueError):
    """A client request refused by a rule here; the message names the problem."""


class DurableRequest(NamedTuple):
    """A durable subscription as a request names it: the broker's ``records``, its
    ``name``, and the ``key`` of the connection holding it (a claim by that connection
    keeps the record, DESIGN §11)."""

    records: Durables
    name: str
    key: str


class Refusal(NamedTuple):
    """A request refused: the error reply (without its ``req``), the counter it counts
    in, and whether the broker warns of it."""

    reply: ErrorReply
    counter: str
    warn: bool


REFUSALS = (RequestRefused, SessionRefused, DurableError, FilterError, ProtocolError)
"""The failures that are the client's: its request is refused with their message."""


def refusal(exc: Exception) -> Refusal | None:
    """What a client is told when its request raised ``exc``: a publication outside its
    advertisements is ``unadvertised``; :data:`REFUSALS` are refused with their message;
    None: the failure is the broker's own."""
    if isinstance(exc, UnadvertisedPublication):
        reply = ErrorReply(message=str(exc), error="unadvertised")
        return Refusal(reply, "publications_refused.unadvertised", False)
    if isinstance(exc, REFUSALS):
        return Refusal(ErrorReply(message=str(exc)), "client_errors", True)
    return None


def subscribe(
    sessions: ClientTable,
    key: str,
    name: str,
    subscription: Filter,
    local_subscribe: LocalSubscribe,
    now: float,
    durable: DurableRequest | None = None,
) -> tuple[str, list[Action]]:
    """Client ``key`` (named ``name``) subscribes ``subscription`` at ``now``: parsed,
    within its limit, ``durable`` if it may be (see the module docstring; each refusal
    raised before anything is made), made by ``local_subscribe``, held, and a durable
    one's record attached; returns its sub id and the core's actions."""
    parsed = as_filter(subscription)

    def make() -> tuple[str, list[Action]]:
        if durable is not None:
            durable.records.room(name, durable.name, parsed)
        return local_subscribe(key, parsed, now)

    sub_id, actions = sessions.subscribe(key, name, make)
    if durable is not None:
        filters = (parsed.to_text(),)
        durable.records.attach(name, durable.name, durable.key, sub_id, filters, now)
    return sub_id, actions


def unsubscribe(
    sessions: ClientTable,
    key: str,
    name: str,
    sub_id: str,
    withdraw: Withdraw,
    durables: Durables | None = None,
    moved: bool = False,
) -> tuple[list[Action], str | None]:
    """Client ``key`` (``name``) withdraws ``sub_id`` (``moved``: to another broker):
    only one it holds (:meth:`ClientTable.unsubscribe`); the core's actions, and the
    claim to start if a durable record of it ended (:meth:`Durables.unsubscribed`)."""
    actions = sessions.unsubscribe(key, name, sub_id, withdraw)
    claim = durables.unsubscribed(sub_id, moved) if durables is not None else None
    return actions, claim


def adopt(
    core: ClusteredBroker | BidBroker,
    sessions: ClientTable,
    key: str,
    name: str,
    sub_id: str,
    composites: HostedComposites | None = None,
    durable: DurableRequest | None = None,
    now: float = 0.0,
) -> list[Action]:
    """Client ``key`` (``name``) moving here takes over ``sub_id``
    (:func:`~octopis.core.sessions.adopt`), a ``durable`` one's record attached at
    ``now`` with the filters its claim brings; the core's actions. A durable one past
    ``durable.max`` is refused before anything is adopted (:meth:`Durables.room`)."""
    if durable is not None:
        durable.records.room(name, durable.name)
    actions = adopt_here(core, sessions, key, name, sub_id, composites)
    if durable is not None:
        durable.records.attach(name, durable.name, durable.key, sub_id, (), now)
    return actions


def advertise(
    core: ClusteredBroker | BidBroker, key: str, advertisement: Filter
) -> tuple[str, list[Action]]:
    """Local publisher ``key`` advertises (DESIGN §12): parsed, then as
    :func:`~octopis.core.sessions.advertise` says; its id and the core's actions."""
    return advertise_here(core, key, as_filter(advertisement))


def acknowledge(
    records: Durables,
    client: str,
    name: str,
    since: list[tuple[str, int, int]],
    now: float,
    after: float | None = None,
) -> None:
    """``client`` took its durable ``name``'s deliveries up to ``since``
    (:meth:`Durables.ack`); :class:`RequestRefused` if no record of it is kept here."""
    if not records.ack(client, name, since, now, after):
        raise RequestRefused(f"{records.id} keeps no durable subscription {name!r}")


def admit_publication(
    flow: ClientFlow, publication: str | dict, body: int, unanswered: int
) -> Publication:
    """A publication (its text or data, a body of ``body`` bytes) from a connection with
    ``unanswered`` publications: parsed and admitted, or refused (in the module
    docstring's order, counted by ``flow``). Whether its publisher advertised it is
    :func:`~octopis.core.sessions.check_advertised`'s, asked next by both shells."""
    problem = flow.refuse_body(body)
    if problem is not None:
        raise RequestRefused(problem)
    parsed = (
        parse_publication(publication)
        if isinstance(publication, str)
        else validate_publication(publication)
    )
    problem = flow.refuse_publication(unanswered)
    if problem is not None:
        raise RequestRefused(problem)
    return parsed


def published(seq: int, refused: str | None = None) -> PublishedReply | ErrorReply:
    """The answer to publication ``seq`` once its copies are kept (DESIGN §7): taken, or
    ``not_kept`` naming why (``refused``: the disk refused its commit)."""
    if refused is not None:
        return ErrorReply(message=refused, error="not_kept")
    return PublishedReply(seq=seq)
