"""What a composite subscription's stream yields (DESIGN §12): one
:class:`CompositeNotification` per match, carrying the match's publications."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from octopis.client.deliveries import Received
from octopis.wire.client import CompositeNotice


@dataclass(frozen=True, slots=True)
class CompositeNotification:
    """One match of a composite subscription, delivered once: its publications (earliest
    published first), each with the indices of the composite's parts it fills in this
    match (``roles``, in the order of :attr:`parts`; part 0 is the first in the
    subscription's text). ``dropped``, ``late`` and ``cut`` are the host's join's
    totals when it sent this: publications it let go to stay within ``[composite]
    max_held``, publications that reached it later than ``[composite] lateness``,
    arrivals whose matches were cut; while all three are 0 no match was missed."""

    subscriber: str
    sub_id: str
    parts: tuple[Received, ...]
    roles: tuple[tuple[int, ...], ...]
    received_at: float
    dropped: int = 0
    late: int = 0
    cut: int = 0

    @property
    def publications(self) -> tuple[dict[str, Any], ...]:
        """The parts' publications."""
        return tuple(r.publication for r in self.parts)

    def filling(self, part: int) -> tuple[Received, ...]:
        """The publications that fill part ``part`` in this match."""
        return tuple(r for r, roles in zip(self.parts, self.roles, strict=True) if part in roles)


def composite_notification(
    subscriber: str, message: CompositeNotice, received_at: float
) -> CompositeNotification:
    """The notification a broker's ``composite`` notice carries."""
    parts = []
    roles = []
    for publisher, session, seq, published_at, publication, filled in message.parts:
        parts.append(
            Received(
                subscriber,
                publisher,
                seq,
                published_at,
                received_at,
                publication,
                math.nan,
                session,
            )
        )
        roles.append(tuple(filled))
    return CompositeNotification(
        subscriber,
        message.sub_id,
        tuple(parts),
        tuple(roles),
        received_at,
        message.dropped,
        message.late,
        message.cut,
    )
