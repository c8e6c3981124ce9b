"""The peer frame: what a broker puts on an output link's queue (DESIGN §5, §7).

A frame is the list ``[sender, body, kind]``: the sending broker's name (bytes), one
encoded message (:mod:`octopis.core.codec`) and its kind, one of :data:`LINK`
(heartbeats, SYNCED), :data:`HANDSHAKE` (HELLO), :data:`DATA` (subscription messages) or
:data:`KEPT` (notifications, kept in custody until acknowledged). A local publication's
copy carries its :class:`~octopis.core.custody.PublishReceipt` as a fourth element,
dropped once the copy is acknowledged. Kinds order: ``kind >= DATA`` is a routing frame
(numbered per link, DESIGN §7). The Cython sender (``_zmqio.pyx``) reads the first three
elements at the same positions; every Python module reads a frame through this one.
"""

from __future__ import annotations

from octopis.core.codec import Control, decode_peer
from octopis.core.messages import Message
from octopis.transport.zmqio import DATA, HANDSHAKE, KEPT, LINK

__all__ = ["BODY", "DATA", "HANDSHAKE", "KEPT", "KIND", "LINK", "RECEIPT", "SENDER"]

SENDER, BODY, KIND, RECEIPT = 0, 1, 2, 3
"""Positions in a frame."""


def frame_of(sender: bytes, body: bytes, kind: int) -> list:
    """A new frame (without a receipt)."""
    return [sender, body, kind]


def is_routing(frame: list) -> bool:
    """A subscription message or a notification (numbered, acknowledged)."""
    return frame[KIND] >= DATA


def message_of(frame: list) -> Message | Control:
    """The message a frame carries (decoded again)."""
    return decode_peer(frame[:KIND])[1]


def receipt_of(frame: list) -> object | None:
    """The publication receipt a frame carries, or None."""
    return frame[RECEIPT] if len(frame) > RECEIPT else None


def without_receipt(frame: list) -> list:
    """The frame without its publication receipt."""
    return frame[:RECEIPT]
