"""Where a client's connection goes (DESIGN §7), sans-IO: the order it tries the brokers
of its list, when it leaves a silent one (:func:`failover_tries`) and when it connects
anew (:func:`connect_tries`, a durable subscriber coming back as a new process). The
SDK (``octopis.client.failover``) and the simulator's clients both walk these tries."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def failover_order(candidates: Sequence[T], current: T) -> list[T]:
    """The order a connection at ``current`` tries the others of its list
    ``candidates`` (the topology's order: the rest of its cluster first, DESIGN §7):
    those after ``current``, then those before it, ``current`` itself last (it may come
    back)."""
    start = candidates.index(current)
    return [*candidates[start + 1 :], *candidates[: start + 1]]


def connect_tries(
    order: Sequence[T], gone: Callable[[T], bool] = lambda _: False
) -> Iterator[T | None]:
    """The brokers a client tries in turn along ``order``, one after the other that did
    not answer (DESIGN §7): ``order``, then None (none answered: it waits a liveness
    before it goes round again), endlessly; the tries end instead of the None once every
    broker of ``order`` is ``gone`` for good, which a process never knows (one may
    restart) and a simulator does."""
    while True:
        yield from order
        if all(map(gone, order)):
            return
        yield None


def failover_tries(
    candidates: Sequence[T], current: T, gone: Callable[[T], bool] = lambda _: False
) -> Iterator[T | None]:
    """The brokers a connection leaving silent ``current`` tries in turn: its list in
    :func:`failover_order`, as :func:`connect_tries` goes round it."""
    return connect_tries(failover_order(candidates, current), gone)
