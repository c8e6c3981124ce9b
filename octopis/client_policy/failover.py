"""Where a client's connection goes (DESIGN §7), sans-IO: the order it tries the brokers
of its list, when it leaves a silent one (:func:`failover_tries`) and when it connects
anew (:func:`connect_tries`, a durable subscriber coming back as a new process), and what
it sends again at the broker it reaches (:class:`Unanswered`). The SDK
(``octopis.client.failover``) and the simulator's clients both walk these tries and
send again what these requests say."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

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


K = TypeVar("K")


class Unanswered(Generic[K, T]):
    """A connection's requests that await the broker's answer (DESIGN §4, §7), by key in
    the order first sent: a publication stays here until the broker confirms it (its
    neighbours and its store hold it) or refuses it. At a fail-over the connection sends
    again, at the next broker of its list, what :meth:`resend` gives: the requests its
    publications need there first (a publisher's advertisements), then every one still
    unanswered, each as first sent (a publication with its session and sequence number,
    which the brokers' dedup keeps once). A publisher that waited for an answer past its
    publish timeout gave it up (:meth:`answered`): never sent again. The SDK's
    ``Requests`` and the simulator's publishers keep theirs here."""

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: dict[K, T] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, key: object) -> bool:
        return key in self._waiting

    def get(self, key: K) -> T | None:
        """Request ``key``, if it awaits its answer."""
        return self._waiting.get(key)

    def sent(self, key: K, request: T) -> None:
        """``request`` was sent under ``key``; sent again, it keeps its first place."""
        self._waiting.setdefault(key, request)

    def answered(self, key: K) -> T | None:
        """Request ``key`` was answered (or given up): returns it, if it awaited one."""
        return self._waiting.pop(key, None)

    def waiting(self) -> list[T]:
        """The requests awaiting their answer, in the order first sent."""
        return list(self._waiting.values())

    def resend(self, first: Iterable[T] = ()) -> list[T]:
        """What a fail-over sends again at the new broker, in order: ``first``, then every
        request still unanswered (:meth:`waiting`)."""
        return [*first, *self._waiting.values()]
