"""The rules of the client sessions a broker hosts (DESIGN §7, §8, §9), once for the
broker process and the simulator.

:class:`ClientTable` knows which local subscriptions each client holds here and decides
what a session's events mean for them:

- a client holds at most ``limit`` subscriptions (``limits.subscriptions_per_client``):
  one more is refused with a message that names the limit, and counted
  (:meth:`ClientTable.subscribe`, :func:`adopt`);
- a client withdraws only a subscription it holds here, which the table then forgets
  before the core withdraws it (:meth:`ClientTable.unsubscribe`); one withdrawn for its
  client (its durable record claimed elsewhere) is counted (:meth:`ClientTable.withdraw`);
- a client is gone when it says bye or is silent for more than the client timeout
  (:class:`Liveness`: judged at ticks a quarter timeout apart, with its requests read,
  the broker's own stalls excused);
- a client that is gone has every
  subscription withdrawn, except one it was told to move inside its cluster: that one
  is an *orphan*, kept until the move reaches this broker (the new host then withdraws
  it, if it must) or its deadline passes (then withdrawn here) — withdrawing it at once
  would cross the move on its path;
- a move order (:func:`order_move`) marks the client's subscriptions; a move that
  reached here releases one
  (its client, if still here, is told, behind its last delivery from here); an order
  past its deadline is forgotten and the client stays subscribed here;
- a move inside the cluster goes by adoption where the core adopts
  (:func:`moves_by_adoption`), else by subscribing afresh; BID adopts nothing and takes
  no advertisement (:func:`adopt`, :func:`advertise`).

It is sans-IO: the shell keys clients as it likes (the process: connection and name),
carries out the withdrawals it returns through the routing core, and sends the notices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from octopis.core.bid import BidBroker
from octopis.core.clustered import ClusteredBroker
from octopis.core.composite_hosting import HostedComposites
from octopis.core.messages import Action
from octopis.core.neighbours import stall
from octopis.defaults import MOVE_TIMEOUT
from octopis.filters.composite import Composite
from octopis.filters.language import Subscription

K = TypeVar("K")
Make = Callable[[], tuple[str, list[Action]]]
"""How a shell makes a client's subscription → its id and the core's actions: the
core's ``subscribe`` (the process's also hosts a composite one's parts)."""
Withdraw = Callable[[str, str], list[Action]]
"""How a shell withdraws a local subscription (client key, sub id) → the core's actions:
the core's ``unsubscribe``, or the process's, which also ends a composite's parts."""


TICKS_PER_TIMEOUT = 4
"""How many times per client timeout a broker judges its clients' silence: a client
silent for the timeout is dropped within a quarter of it more (if the broker runs)."""


class SessionRefused(ValueError):
    """A client request refused by a session rule; the message names the rule."""


class Liveness(Generic[K]):
    """When each client (by the shell's key: the process's connections) was last heard,
    and which are gone for their silence (DESIGN §7, §8), judged at the broker's ticks,
    one every :attr:`tick` (:data:`TICKS_PER_TIMEOUT` per ``timeout``): silent for more
    than the client timeout, judged only with every request that reached the broker read
    (one still unread may be a heartbeat); time the broker spent not running (a tick
    late past a tick, :func:`~octopis.core.neighbours.stall`) is nobody's silence. A
    client gone has its subscriptions withdrawn as :meth:`BrokerNode.client_gone` says.

    The broker process calls :meth:`ticked` at each tick. The simulator, which runs no
    timer while none is due, judges (:meth:`silent`) at the tick :meth:`due` names and
    reports a pause at its end (:meth:`after_pause`: the late tick, as the process's)."""

    __slots__ = ("last_seen", "tick", "timeout", "woke")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.tick = timeout / TICKS_PER_TIMEOUT
        self.woke = 0.0
        """When its last tick ran: the next runs a tick later, if the broker runs."""
        self.last_seen: dict[K, float] = {}

    def start(self, now: float) -> None:
        """Its ticks begin at ``now`` (else at time 0)."""
        self.woke = now

    def heard(self, key: K, now: float) -> None:
        """Client ``key`` was heard at ``now``."""
        self.last_seen[key] = now

    def forget(self, key: K) -> float:
        """``key`` has gone (dropped, or it said bye); when it was last heard."""
        return self.last_seen.pop(key)

    def ticked(self, now: float, *, caught_up: bool) -> list[K]:
        """A tick runs at ``now``: the time the broker did not run since its last one is
        excused (:func:`~octopis.core.neighbours.stall`), then the clients silent past
        the timeout (:meth:`silent`)."""
        late = stall(now, self.woke, self.tick)
        for key in self.last_seen:
            self.last_seen[key] += late
        self.woke = now
        return self.silent(now, caught_up=caught_up)

    def after_pause(self, since: float, now: float, *, caught_up: bool) -> list[K]:
        """The broker did not run from ``since`` to ``now`` (a pause; its ticks before
        ran on time): the tick that fell due meanwhile, if one did, runs now, late
        (:meth:`ticked`); the clients it finds silent."""
        self.woke += (since - self.woke) // self.tick * self.tick  # its last before
        if self.woke + self.tick > now:
            return []  # its next tick comes on time
        return self.ticked(now, caught_up=caught_up)

    def silent(self, now: float, *, caught_up: bool) -> list[K]:
        """The clients last heard more than the timeout before ``now``, if the broker has
        read every request that reached it (``caught_up``), else none."""
        if not caught_up:
            return []
        return [key for key, seen in self.last_seen.items() if now - seen > self.timeout]

    def tick_after(self, moment: float) -> float:
        """When the first tick after ``moment`` runs, if the broker runs on time from its
        last tick: what finds a move order past its deadline (the process expires them at
        its ticks, :meth:`ClientTable.expire`; the simulator's brokers alike)."""
        first = self.woke + (max(moment - self.woke, 0.0) // self.tick + 1) * self.tick
        return first if first > moment else first + self.tick  # rounded onto ``moment``

    def due(self) -> float | None:
        """When the first tick runs that finds a client silent (:meth:`silent`), if the
        broker runs on time from its last tick and hears none again; None: none known."""
        if not self.last_seen:
            return None
        seen = min(self.last_seen.values())
        due = self.woke + (max(seen + self.timeout - self.woke, 0.0) // self.tick + 1) * self.tick
        return due if due - seen > self.timeout else due + self.tick


class ClientTable:
    """Local subscriptions per client key and the move orders under way (see the module
    docstring). ``limit``: the most subscriptions one client holds here;
    ``move_timeout``: seconds a move order may take to reach here."""

    def __init__(self, limit: int, move_timeout: float = MOVE_TIMEOUT) -> None:
        self.limit = limit
        self.move_timeout = move_timeout
        self.held: dict[str, set[str]] = {}
        """Client key → the ids of its local subscriptions here."""
        self.moving: dict[str, float] = {}
        """Sub ids whose client was told to move them inside its cluster → the time by
        which the move must have reached here."""
        self.orphans: dict[str, tuple[str, float]] = {}
        """Moving sub ids whose client is gone → (client key, deadline)."""
        self.counters: Counter[str] = Counter()

    def subscriptions(self, key: str) -> set[str]:
        """The sub ids client ``key`` holds here (empty: none, or unknown)."""
        return self.held.get(key, set())

    def room(self, key: str, name: str) -> None:
        """Whether client ``key`` (called ``name`` in the refusal) may hold one more:
        :class:`SessionRefused` if it already holds ``limit``."""
        if len(self.held.get(key, ())) >= self.limit:
            self.counters["subscriptions_refused.limit"] += 1
            raise SessionRefused(
                f"{name} already holds {self.limit} subscriptions (limits.subscriptions_per_client)"
            )

    def attach(self, key: str, sub_id: str) -> None:
        """Client ``key`` holds ``sub_id`` here (after :meth:`room`)."""
        self.held.setdefault(key, set()).add(sub_id)

    def subscribe(self, key: str, name: str, make: Make) -> tuple[str, list[Action]]:
        """Client ``key`` (``name`` in a refusal) subscribes here: within its limit
        (:meth:`room`, nothing made past it), made by ``make``, then held for it; returns
        the sub id and the core's actions."""
        self.room(key, name)
        sub_id, actions = make()
        self.attach(key, sub_id)
        return sub_id, actions

    def unsubscribe(self, key: str, name: str, sub_id: str, withdraw: Withdraw) -> list[Action]:
        """Client ``key`` (``name`` in a refusal) withdraws ``sub_id``: only one it holds
        here (:class:`SessionRefused` if not, nothing changed), forgotten, then withdrawn
        by ``withdraw``; returns the core's actions."""
        if not self.detach(key, sub_id):
            raise SessionRefused(f"{name} holds no subscription {sub_id}")
        return withdraw(key, sub_id)

    def withdraw(self, key: str, sub_id: str, withdraw: Withdraw) -> list[Action] | None:
        """``sub_id`` of client ``key`` ends here for its client (its durable record was
        claimed by the host it came back at): if held, forgotten, withdrawn by
        ``withdraw`` and counted (the actions); None if ``key`` no longer holds it."""
        if not self.detach(key, sub_id):
            return None
        self.counters["subscriptions_withdrawn"] += 1
        return withdraw(key, sub_id)

    def detach(self, key: str, sub_id: str) -> bool:
        """Client ``key`` no longer holds ``sub_id`` (it withdrew it, or it was withdrawn
        for it): whether it held it."""
        held = self.held.get(key)
        if held is None or sub_id not in held:
            return False
        held.discard(sub_id)
        return True

    def gone(self, key: str) -> list[str]:
        """Client ``key`` is gone: the sub ids to withdraw now; those under a move order
        become orphans (:attr:`orphans`) instead."""
        withdraw = []
        for sub_id in sorted(self.held.pop(key, ())):
            deadline = self.moving.get(sub_id)
            if deadline is None:
                withdraw.append(sub_id)
            else:
                self.orphans[sub_id] = (key, deadline)
        self.counters["subscriptions_withdrawn"] += len(withdraw)
        return withdraw

    def deadline(self, now: float) -> float:
        """When a move ordered at ``now`` must have reached here."""
        return now + self.move_timeout

    def order_move(self, keys: Iterable[str], now: float, inside: bool) -> dict[str, list[str]]:
        """Clients ``keys`` are told to move at ``now``: per key, the sub ids to name in
        the order (keys holding none are left out); inside its cluster, each is marked
        moving until :meth:`deadline`."""
        deadline = self.deadline(now)
        ordered = {key: sorted(self.held.get(key, ())) for key in keys}
        ordered = {key: sub_ids for key, sub_ids in ordered.items() if sub_ids}
        for sub_ids in ordered.values():
            if inside:
                self.moving.update(dict.fromkeys(sub_ids, deadline))
            self.counters["moves.ordered"] += len(sub_ids)
        return ordered

    def released(self, key: str, sub_id: str) -> bool:
        """A move of ``sub_id`` reached its new host and released it here: whether its
        client is to be told (False: it was an orphan, its client is gone)."""
        self.moving.pop(sub_id, None)
        self.counters["moves.released"] += 1
        if self.orphans.pop(sub_id, None) is not None:
            return False
        return self.detach(key, sub_id)

    def expire(self, now: float) -> list[tuple[str, str]]:
        """Move orders past their deadline at ``now``: forgotten (the client stays
        subscribed here); orphans past it: returned as (client key, sub id) to withdraw."""
        for sub_id in [s for s, deadline in self.moving.items() if deadline < now]:
            del self.moving[sub_id]
            self.counters["moves.expired"] += 1
        late = [(key, s) for s, (key, deadline) in self.orphans.items() if deadline < now]
        for _, sub_id in late:
            del self.orphans[sub_id]
        self.counters["subscriptions_withdrawn"] += len(late)
        return late


def interests(core: ClusteredBroker | BidBroker, table: ClientTable, key: str) -> frozenset[str]:
    """What client ``key``'s subscriptions here ask for by equality
    (:meth:`Subscription.interests`; the balancer's SDM reads it, DESIGN §9): the union
    over the subscriptions it holds in ``table`` that ``core``'s routing table stores."""
    entries = core.table.entries
    held = (entries.get(sub_id) for sub_id in table.subscriptions(key))
    return frozenset().union(*(e.subscription.interests() for e in held if e is not None))


def moves_by_adoption(core: ClusteredBroker | BidBroker, inside: bool) -> bool:
    """Whether a client told to move to a broker ``inside`` this one's cluster (or not)
    moves its subscriptions by adoption (same ids; the path turns without losing a copy):
    inside, with a core that adopts (SNR, DNR without covering or advertisements,
    :attr:`ClusteredBroker.adopts`). Otherwise it subscribes afresh at its new host and
    the old subscription is withdrawn after (DESIGN §9)."""
    return inside and isinstance(core, ClusteredBroker) and core.adopts


def order_move(
    core: ClusteredBroker | BidBroker,
    table: ClientTable,
    keys: Iterable[str],
    now: float,
    inside: bool,
) -> tuple[bool, dict[str, list[str]]]:
    """Clients ``keys`` are told at ``now`` to move to a broker ``inside`` this one's
    cluster (or not): whether they move by adoption (:func:`moves_by_adoption`), and per
    key the sub ids to name in the order (:meth:`ClientTable.order_move`: by adoption,
    each is marked moving, kept as an orphan if its client goes before the move
    arrives)."""
    by_adoption = moves_by_adoption(core, inside)
    return by_adoption, table.order_move(keys, now, by_adoption)


def adopt(
    core: ClusteredBroker | BidBroker,
    table: ClientTable,
    key: str,
    name: str,
    sub_id: str,
    composites: HostedComposites | None = None,
) -> list[Action]:
    """Client ``key`` (``name`` in a refusal), moving here from another broker of this
    cluster, takes over ``sub_id`` (DESIGN §9): within its limit (:meth:`ClientTable.room`),
    held for it in ``table``; returns the core's actions. :class:`SessionRefused` under
    BID, which has no clusters, and for a composite the broker hosts (``composites``,
    :meth:`HostedComposites.movable_problem`): the client subscribes afresh."""
    if not isinstance(core, ClusteredBroker):
        raise SessionRefused(f"{core.id} routes by BID: move by subscribing afresh")
    if composites is not None and (problem := composites.movable_problem(sub_id)) is not None:
        raise SessionRefused(problem)
    return table.subscribe(key, name, lambda: (sub_id, core.adopt(key, sub_id)))[1]


def advertise(
    core: ClusteredBroker | BidBroker, key: str, advertisement: Subscription | Composite
) -> tuple[str, list[Action]]:
    """Local publisher ``key`` advertises (DESIGN §12): its id and the core's actions.
    :class:`SessionRefused` for a composite filter (an advertisement is one atomic
    filter) and under BID, which routes without advertisements."""
    if isinstance(advertisement, Composite):
        raise SessionRefused("an advertisement is one atomic filter, not a composite one")
    if not isinstance(core, ClusteredBroker):
        raise SessionRefused(f"{core.id} routes by BID: no advertisements")
    return core.advertise(key, advertisement)


def check_advertised(core: ClusteredBroker | BidBroker, key: str, publication: dict) -> None:
    """With advertisements on, raise
    :class:`~octopis.core.messages.UnadvertisedPublication` unless ``key`` advertised a
    filter ``publication`` matches (BID has none: nothing to check)."""
    if isinstance(core, ClusteredBroker):
        core.check_advertised(key, publication)
