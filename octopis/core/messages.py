"""Messages of the routing core and the actions it returns (DESIGN §2, paper §5–6).

The core is sans-IO: it takes one message and the link it came from and returns
:class:`Forward`, :class:`Hold` and :class:`Deliver` actions. Transports and the simulator
carry these objects; the wire encoding lives in the transport layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from functools import partial
from typing import Any, NamedTuple

from bitarray import frozenbitarray

from octopis.core._records import new_pair
from octopis.filters.language import Publication, Subscription


class SubState(IntEnum):
    """State of a subscription message in the two-step SBP (§5)."""

    PRIMARY = 1
    SECONDARY = 2


@dataclass(frozen=True, slots=True)
class Subscribe:
    """An SBP message. ``cbv`` has the host cluster's bit set (§4.4); BID leaves it empty.

    ``sub_id`` (host broker + sequence) serves unsubscribe and bookkeeping in SNR/DNR and
    duplicate detection in BID. ``issued_at`` and ``hops`` are for measurement only.
    """

    sub_id: str
    host: str
    subscription: Subscription
    state: SubState
    cbv: frozenbitarray | None
    issued_at: float
    hops: int = 0
    stored: Any = field(default=None, init=False, repr=False, compare=False)
    """Not part of the message (never encoded, compared or copied): the routing entry a
    broker made of this very object (:meth:`CoreBase._store`). A simulator hands one
    object to every receiver of a fan-out — nineteen secondary neighbours on a K20 — and
    they then share one immutable entry instead of holding one each (issue 16); a
    decoded message is one receiver's own, and the memo never serves another."""

    def onward(self, state: SubState) -> Subscribe:
        """This message one hop further from the host, in ``state``."""
        return Subscribe(
            self.sub_id,
            self.host,
            self.subscription,
            state,
            self.cbv,
            self.issued_at,
            self.hops + 1,
        )


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Removes ``sub_id`` along the same steps its :class:`Subscribe` took."""

    sub_id: str
    state: SubState


@dataclass(frozen=True, slots=True)
class Move:
    """Moves the host of ``sub_id`` inside its cluster to ``host`` (DESIGN §9): the new
    host sends it to the last hop of its entry, and every broker on the cluster-tree path
    back to the old host points its entry at the neighbour the move came from and passes
    it on. Make-before-break: the new host delivers before the path turns, and links are
    FIFO, so every notification meets either the old direction all the way to the old
    host or the new one all the way to the new host."""

    sub_id: str
    host: str


@dataclass(frozen=True, slots=True)
class Rehost:
    """Tells a neighbour of the old or the new host of a moved ``sub_id`` (off the path of
    the :class:`Move`) that it is now hosted at ``host``. Bookkeeping only: it changes no
    last hop and no CBV; a restarted broker's neighbours read the host to withdraw what
    its predecessor hosted (DESIGN §7)."""

    sub_id: str
    host: str


@dataclass(frozen=True, slots=True)
class Advertise:
    """An advertisement (DESIGN §12): publishers at ``host`` will publish only what
    ``advertisement`` matches. It spreads by SBP's two steps, as a subscription does.
    ``via`` is set on a SECONDARY copy: the region of the sender's cluster-tree neighbour
    it came from (None: the sender is in the host's region), so that the receiver knows
    which of its own tree neighbours lies toward the host's region."""

    adv_id: str
    host: str
    advertisement: Subscription
    state: SubState
    via: str | None = None


@dataclass(frozen=True, slots=True)
class Unadvertise:
    """Withdraws ``adv_id`` along the same steps its :class:`Advertise` took."""

    adv_id: str
    state: SubState


class Tunnel(NamedTuple):
    """A detour along a SCOT square (DESIGN §7): carry the copy to B(``target``,
    ``cluster``), which routes it as if it had come from its aCOL neighbour B(``origin``,
    ``cluster``). Relays on the way neither match nor deliver; ``tried`` is a bit mask of
    the clusters whose copy of the square the detour has used."""

    cluster: int
    target: str
    origin: str
    tried: int


class Notification(NamedTuple):
    """A publication in flight (immutable; ``_replace`` makes a changed copy).

    ``publisher``, ``seq`` and ``published_at`` identify it for delivery accounting;
    routing never reads them. ``session`` names the publisher's session (a random number
    per SDK publisher object, 0 in the simulator): a publisher that starts again under the
    same name numbers from 1 again, and edge dedup must not take its new notifications
    for copies of the old ones (DESIGN §7). ``cbv`` is DNR's header naming the clusters
    this copy must still serve (§6.3); ``destinations`` is BID's list of
    ``(broker, sub_id)`` (§6.1); ``tunnel`` marks a detour copy (DESIGN §7). ``body`` is
    the publication's opaque body (empty when it has none): carried, never matched.
    A tuple rather than a frozen dataclass: every broker builds one per notification it
    receives, and a tuple costs half as much to build.
    """

    publisher: str
    seq: int
    published_at: float
    publication: Publication
    cbv: frozenbitarray | None = None
    destinations: tuple[tuple[str, str], ...] | None = None
    tunnel: Tunnel | None = None
    session: int = 0
    body: bytes = b""

    @property
    def key(self) -> tuple[str, int]:
        """Identity of the publication for accounting: ``(publisher, seq)``."""
        return (self.publisher, self.seq)


Message = Subscribe | Unsubscribe | Notification | Move | Rehost | Advertise | Unadvertise


class Forward(NamedTuple):
    """Send ``message`` to neighbour broker ``link``."""

    link: str
    message: Message


forward_copy = partial(new_pair, Forward)
"""``forward_copy(link, message)``: a ``Forward`` built in one allocation, without the
generated ``__new__`` (a Python call); notification routing makes one per copy."""


class Hold(NamedTuple):
    """Keep ``message`` for neighbour ``link``, which is down and may only be stalled
    (DESIGN §7): send it if ``link`` comes back as the same process; if it comes back as
    a new one, or the hold is full, the copy is undeliverable (counted by whoever holds
    it). Only a tunnel's fan-out holds: the copy it could not give an unreachable B(y,c)."""

    link: str
    message: Notification


class Deliver(NamedTuple):
    """Hand ``notification`` to the local subscriber ``subscriber``."""

    subscriber: str
    notification: Notification


class Released(NamedTuple):
    """The old host's local subscriber ``subscriber`` no longer holds ``sub_id`` here: its
    :class:`Move` reached this broker, and nothing more of it is delivered here (the shell
    tells the client, which stops reading this broker for it)."""

    subscriber: str
    sub_id: str


Action = Forward | Hold | Deliver | Released


class ProtocolError(ValueError):
    """A message that breaks the routing protocol (wrong state, unknown link, duplicate)."""


class UnadvertisedPublication(ValueError):
    """A publication outside every advertisement its publisher made at its broker (with
    advertisements on, DESIGN §12): advertise a filter it matches first."""
