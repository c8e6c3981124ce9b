"""How a subscriber moves to a broker of another cluster (DESIGN §9), sans-IO: make
before break. It subscribes afresh at the new broker, keeps its old subscriptions
``linger`` seconds more (the new ones spread meanwhile, and copies the old ones routed
come in), then withdraws them. The client knows no more than that: nothing tells it
when a new subscription has reached every broker, so a copy routed by a subscription
that takes longer than ``linger`` to spread is lost. The SDK
(``octopis.client.moving``) and the simulator's clients both perform these steps, in
this order."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from octopis.defaults import CLIENT_LIVENESS, LINGER


@dataclass(frozen=True)
class Resubscribe:
    """Subscribe afresh at the new broker to what ``sub_ids`` subscribe to."""

    sub_ids: tuple[str, ...]


@dataclass(frozen=True)
class Linger:
    """Wait ``seconds``: both brokers deliver meanwhile (a repeat is dropped)."""

    seconds: float


@dataclass(frozen=True)
class WithdrawOld:
    """Withdraw ``sub_ids`` at the old broker (a move's step; not
    :data:`octopis.core.sessions.Withdraw`, the node's withdraw function)."""

    sub_ids: tuple[str, ...]


MoveStep = Resubscribe | Linger | WithdrawOld


def move_across(sub_ids: Iterable[str], linger: float = LINGER) -> list[MoveStep]:
    """The steps of moving ``sub_ids`` to a broker that cannot adopt them (another
    cluster, covering, BID), in order: :class:`Resubscribe`, :class:`Linger` for
    ``linger`` seconds, :class:`WithdrawOld`."""
    moved = tuple(sub_ids)
    return [Resubscribe(moved), Linger(linger), WithdrawOld(moved)]


def release_wait(linger: float = LINGER, liveness: float = CLIENT_LIVENESS) -> float:
    """Seconds a move inside a cluster waits for the old broker to release what the new
    one adopted: past that the move ends without it, and the client goes on reading both
    brokers (a repeat is dropped) rather than lose what the old one may still deliver."""
    return linger + 4 * liveness
