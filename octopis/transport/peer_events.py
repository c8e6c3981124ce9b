"""What a broker does with what arrives on its peer links: the events its peer links
(:mod:`~octopis.transport.peers`: input, liveness) hand it (DESIGN §7)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from octopis.core import Message, Notification
from octopis.core.codec import Synced
from octopis.core.node import Step


class PeerEvents(Protocol):
    """What the broker does with what arrives on its peer links."""

    def peer_message(self, sender: str, message: Message, body: bytes, now: float) -> None:
        """A routing message from neighbour ``sender`` (``body`` as received, at loop
        time ``now``)."""

    def peer_notifications(
        self, sender: str, run: Iterator[tuple[Notification, bytes]], now: float
    ) -> None:
        """Consecutive notifications from neighbour ``sender``, each with its body as
        received: :meth:`peer_message` for each, in order, with the per-message work done
        once. An exception leaves ``run`` just past the message that raised it, so the
        caller can count it and hand over the rest."""

    def link_down(
        self, neighbour: str, queued: list[list[bytes]], sent: Sequence[list[bytes]] = ()
    ) -> None:
        """``neighbour`` went silent or restarted; ``queued`` frames never reached it.
        Also at a heal, before the node's hand-over (:meth:`BrokerNode.heard`), with the
        routing frames put on its link while it was down (no replay round waits for a
        neighbour that is down), and at a handshake with a new incarnation
        (:meth:`BrokerNode.meet`), with those that waited for it and the ones ``sent`` to
        its predecessor without an acknowledgement."""

    def execute(self, actions: list[Any]) -> None:
        """Carry out the node's ``actions`` (a frame heard: :meth:`BrokerNode.heard`; a
        neighbour met: :meth:`BrokerNode.meet`)."""

    def synced(self, neighbour: str, synced: Synced) -> None:
        """``neighbour`` has handed us its share (whole or not) and says whether it
        wants ours (DESIGN §7): the node's step (:meth:`BrokerNode.share_heard`)."""

    def now_serving(self, steps: Iterator[Step]) -> None:
        """This broker has its resync state from every live neighbour (DESIGN §7): carry
        out the node's ``steps``, the local publications held meanwhile, then the shares
        owed (:meth:`BrokerNode.serve_if_ready`)."""
