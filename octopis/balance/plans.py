"""Load-balancing plans for a SCOT (DESIGN §9): which subscribers to move where.

Pure functions over a :class:`LoadState` (each broker's load and capacity, each
subscriber's load and host), so that the ``octopis balance`` process and the simulator
run the same decisions. Loads are output per second (notification copies plus
deliveries, :mod:`octopis.core.load`); a subscriber's load is its deliveries per
second, which moves with it.

- :func:`dynamic_migration` — BAD pub/sub's Algorithm 1 (LDM and SDM): while the
  coefficient of variation of broker loads exceeds α and the mean exceeds β, the heaviest
  subscriber of the most loaded broker that can move does; SDM's similarity is
  :func:`shared_interest`.
- :func:`shuffle` — BAD's greedy shuffle (GSH), for when the variation exceeds γ.
- :func:`high_load_plan` and :func:`low_load_plan` — Dynamoth's Algorithm 2 and its
  low-load counterpart, on load ratios LR = load / capacity.
- :func:`initial_broker` — BAD §5.1's placements of a new subscriber (nearest, round
  robin, random) and least loaded inside the nearest broker's cluster.

On a SCOT a move inside the subscriber's cluster updates only primary entries on the tree
path between the two hosts, while one across clusters is an unsubscribe plus a subscribe
(DESIGN §9). Every plan therefore looks for a destination inside the subscriber's
cluster first and leaves it only when no broker there can take the subscriber; each
:class:`Move` says which it is and why it was made.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

ALPHA = 0.15
"""BAD's threshold on the coefficient of variation for dynamic migration (its §6.2.2)."""
TARGET = 0.10
"""Coefficient of variation a triggered dynamic migration plans down to: below α, so that
a spread measured with sampling noise (loads over a few seconds, deliveries in clumps)
lands under α too, and the next round is not triggered by that noise alone (hysteresis;
BAD plans down to α itself)."""
GAMMA = 0.6
"""Coefficient of variation above which the whole placement is shuffled (BAD gives no
value; an extreme skew: one broker carrying most of a small overlay's load)."""
BETA = 50.0
"""Mean load (output per second) under which imbalance is left alone: an idle overlay is
not worth moving subscribers for (BAD's β, scaled to this system's units)."""
LR_HIGH = 1.0
"""Dynamoth: a load ratio of 1 or below is safe; above it a high-load plan is made."""
LR_SAFE = 0.8
"""Dynamoth's LR_safe: a high-load plan moves subscribers until the broker is below it."""
LR_LOW = 0.2
"""Mean load ratio under which the low-load plan drains the least loaded broker."""
PLACEMENTS = ("nearest", "round_robin", "random", "least_loaded")


@dataclass(frozen=True)
class BrokerLoad:
    """One broker as the balancer sees it."""

    load: float
    capacity: float
    cluster: int

    @property
    def ratio(self) -> float:
        """LR = load / capacity (Dynamoth's Eq. 1); 0 without a capacity."""
        return self.load / self.capacity if self.capacity else 0.0


@dataclass(frozen=True)
class LoadState:
    """Brokers by id, and each subscriber's load and host."""

    brokers: dict[str, BrokerLoad]
    loads: dict[str, float]
    """Subscriber → its load (deliveries per second)."""
    hosts: dict[str, str]
    """Subscriber → the broker it is attached to."""
    interests: dict[str, frozenset[str]] = field(default_factory=dict)
    """Subscriber → what its subscriptions ask for by equality
    (``Subscription.interests``), for SDM; empty when the plan needs none."""

    def on(self, broker: str) -> list[str]:
        """The subscribers of ``broker``, heaviest first (ties by name)."""
        return sorted(
            (s for s, h in self.hosts.items() if h == broker), key=lambda s: (-self.loads[s], s)
        )

    def moved(self, subscriber: str, target: str) -> LoadState:
        """The state once ``subscriber`` (and its load) is at ``target``."""
        source = self.hosts[subscriber]
        load = self.loads[subscriber]
        brokers = dict(self.brokers)
        brokers[source] = replace(brokers[source], load=brokers[source].load - load)
        brokers[target] = replace(brokers[target], load=brokers[target].load + load)
        return LoadState(brokers, self.loads, {**self.hosts, subscriber: target}, self.interests)

    def keeping(self, subscribers: set[str]) -> LoadState:
        """The state with only ``subscribers`` (the others' load stays on their brokers)."""
        return LoadState(
            self.brokers,
            {s: v for s, v in self.loads.items() if s in subscribers},
            {s: h for s, h in self.hosts.items() if s in subscribers},
            {s: i for s, i in self.interests.items() if s in subscribers},
        )


@dataclass(frozen=True)
class PlannedMove:
    """A planned move of ``subscriber`` from ``source`` to ``target`` (make-before-break)."""

    subscriber: str
    source: str
    target: str
    inside_cluster: bool
    reason: str


@dataclass
class Plan:
    """Moves in order, and the state they lead to (estimated)."""

    moves: list[PlannedMove] = field(default_factory=list)
    state: LoadState | None = None
    note: str = ""
    """Why the plan stopped where it did, when it could not reach its goal."""


def shared_interest(state: LoadState) -> Callable[[str, str], float]:
    """BAD's similarity of a subscriber and a broker for SDM, on a SCOT: for each interest
    the two share, the deliveries per second of the broker's subscribers holding it,
    weighted by how telling the interest is, log(N / n) for n of the N subscribers
    holding it (an interest everyone holds, such as ``class='STOCK'``, says nothing about
    what a broker already receives and weighs 0). The subscriber then joins brokers that
    already receive what it asks for and adds deliveries there, not copies. Taken from
    ``state`` once: a plan's own moves do not change it."""
    holders: dict[str, int] = {}
    for interests in state.interests.values():
        for interest in interests:
            holders[interest] = holders.get(interest, 0) + 1
    weight = {i: math.log(len(state.interests) / n) for i, n in holders.items()}
    by_broker: dict[str, dict[str, float]] = {}
    for subscriber, host in state.hosts.items():
        held = by_broker.setdefault(host, {})
        for interest in state.interests.get(subscriber, ()):
            held[interest] = held.get(interest, 0.0) + state.loads.get(subscriber, 0.0)

    def similarity(subscriber: str, broker: str) -> float:
        held = by_broker.get(broker, {})
        return sum(held.get(i, 0.0) * weight[i] for i in state.interests.get(subscriber, ()))

    return similarity


def coefficient_of_variation(loads: Iterable[float]) -> float:
    """σ / μ of the loads (BAD's Eq. 6–8, population σ); 0 when the mean is 0."""
    values = list(loads)
    mean = sum(values) / len(values) if values else 0.0
    if mean <= 0:
        return 0.0
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) / mean


def _cov_mean(state: LoadState) -> tuple[float, float]:
    loads = [b.load for b in state.brokers.values()]
    return coefficient_of_variation(loads), sum(loads) / len(loads)


def _by_load(state: LoadState, among: Iterable[str]) -> list[str]:
    return sorted(among, key=lambda b: (state.brokers[b].load, b))


def _under_load(limit: float, load: float) -> Callable[[BrokerLoad], bool]:
    """A broker that stays under ``limit`` with ``load`` more."""
    return lambda b: b.load + load < limit


def _under_ratio(limit: float, load: float) -> Callable[[BrokerLoad], bool]:
    """A broker whose load ratio stays under ``limit`` with ``load`` more."""
    return lambda b: b.capacity > 0 and (b.load + load) / b.capacity < limit


def _cluster_first(state: LoadState, source: str, fits: Callable[[BrokerLoad], bool]) -> str | None:
    """The least loaded broker that ``fits``, inside ``source``'s cluster if one does."""
    cluster = state.brokers[source].cluster
    others = [b for b in state.brokers if b != source]
    for among in ([b for b in others if state.brokers[b].cluster == cluster], others):
        for broker in _by_load(state, among):
            if fits(state.brokers[broker]):
                return broker
    return None


def dynamic_migration(
    state: LoadState,
    alpha: float = ALPHA,
    beta: float = BETA,
    *,
    target: float | None = None,
    scheme: str = "ldm",
    similarity: Callable[[str, str], float] | None = None,
    max_moves: int = 1000,
) -> Plan:
    """BAD's Algorithm 1, lines 5–20: when cov > ``alpha`` and the mean load > ``beta``,
    and then while cov > ``target`` (≤ α; ``None``: α itself, as BAD), take the most
    loaded broker's subscribers heaviest first and move the first that has a valid
    destination: one that, with it, stays below the source's load *without* it
    (BAD: below the source's load; so the sum of squared loads falls with every move and
    the plan ends). The stricter rule keeps a move from being worth undoing: BAD's lets a
    subscriber land where it makes its new broker the busier of the two, and on measured,
    lagging loads the rounds then move subscribers back and forth (1,275 moves for 1,000
    subscribers in the balance experiment under BAD's rule). LDM picks the least loaded
    such broker, inside the subscriber's cluster first; SDM the one of load under the mean
    most ``similarity(subscriber, broker)`` (:func:`shared_interest`).

    On a SCOT part of a broker's load is relaying, which no subscriber takes along: when
    the most loaded broker has no subscriber that can move, the next most loaded is
    tried (BAD would stop there), down to the mean: a broker under the mean load is
    never a source (moving among brokers under the mean lowers the spread by next to
    nothing, and relaying can keep the coefficient of variation above α whatever moves:
    without this floor the plan churns light subscribers between light brokers). The
    plan ends when balanced or when no broker above the mean has a subscriber that can
    move."""
    if scheme not in ("ldm", "sdm"):
        raise ValueError(f"scheme must be 'ldm' or 'sdm', not {scheme!r}")
    if scheme == "sdm" and similarity is None:
        raise ValueError("SDM needs a similarity(subscriber, broker) function")
    goal = alpha if target is None else target
    if not 0 <= goal <= alpha:
        raise ValueError(f"the target cov must be between 0 and α {alpha:g}, not {goal:g}")
    plan = Plan(state=state)
    cov, mean = _cov_mean(state)
    if cov <= alpha or mean <= beta:
        return plan
    trigger = f"cov {cov:.2f} > α {alpha:g} and mean {mean:.0f}/s > β {beta:g}/s"
    while len(plan.moves) < max_moves:
        cov, mean = _cov_mean(state)
        if cov <= goal or mean <= beta:
            break
        move = None
        for source in sorted(state.brokers, key=lambda b: (-state.brokers[b].load, b)):
            if state.brokers[source].load <= mean:
                break
            move = _first_movable(state, source, mean, scheme, similarity)
            if move is not None:
                break
        if move is None:
            plan.note = (
                "no broker above the mean load has a subscriber that can move to a less "
                "loaded one (what is left is relaying, which no subscriber takes along)"
            )
            break
        plan.moves.append(
            replace(
                move,
                reason=f"{trigger}, now {cov:.2f} > target {goal:g}: " + move.reason,
            )
        )
        state = state.moved(move.subscriber, move.target)
    plan.state = state
    return plan


def _first_movable(
    state: LoadState,
    source: str,
    mean: float,
    scheme: str,
    similarity: Callable[[str, str], float] | None,
) -> PlannedMove | None:
    """The heaviest subscriber of ``source`` with a valid destination, moved there."""
    peak = state.brokers[source].load
    for subscriber in state.on(source):
        load = state.loads[subscriber]
        if load <= 0:
            return None
        fits = _under_load(peak - load, load)
        if scheme == "ldm":
            target = _cluster_first(state, source, fits)
        else:
            assert similarity is not None
            under = [b for b in state.brokers if b != source and state.brokers[b].load < mean]
            ranked = sorted(under, key=lambda b, s=subscriber: (-similarity(s, b), b))
            target = next((b for b in ranked if fits(state.brokers[b])), None)
        if target is not None:
            chosen = "most similar" if scheme == "sdm" else "least loaded"
            return _move(
                state,
                subscriber,
                target,
                f"heaviest movable subscriber ({load:.0f}/s) of {source} ({peak:.0f}/s) to the "
                f"{chosen} broker that stays under it without the subscriber "
                f"({state.brokers[target].load:.0f}/s)",
            )
    return None


def shuffle(state: LoadState, gamma: float = GAMMA, theta: float = BETA) -> Plan:
    """BAD's greedy shuffle (GSH) when cov > ``gamma`` and the mean > ``theta``: every
    subscriber, heaviest first, goes to the broker with the least subscriber load so far
    (the rest of a broker's load, relaying, stays where it is); ties keep a subscriber
    where it is, then inside its cluster. Only subscribers whose broker changes move."""
    cov, mean = _cov_mean(state)
    if cov <= gamma or mean <= theta:
        return Plan(state=state, note=f"cov {cov:.2f} ≤ γ {gamma:g} or mean ≤ θ: no shuffle")
    attached = {b: 0.0 for b in state.brokers}
    for subscriber, host in state.hosts.items():
        attached[host] += state.loads[subscriber]
    assigned = {b: broker.load - attached[b] for b, broker in state.brokers.items()}
    plan = Plan()
    for subscriber in sorted(state.hosts, key=lambda s: (-state.loads[s], s)):
        host = state.hosts[subscriber]
        cluster = state.brokers[host].cluster
        target = min(
            state.brokers,
            key=lambda b: (assigned[b], b != host, state.brokers[b].cluster != cluster, b),
        )
        assigned[target] += state.loads[subscriber]
        if target != host:
            plan.moves.append(
                _move(state, subscriber, target, f"shuffle: cov {cov:.2f} > γ {gamma:g}")
            )
    for move in plan.moves:
        state = state.moved(move.subscriber, move.target)
    plan.state = state
    return plan


def high_load_plan(
    state: LoadState, lr_high: float = LR_HIGH, lr_safe: float = LR_SAFE, max_moves: int = 1000
) -> Plan:
    """Dynamoth's Algorithm 2: while some broker's estimated LR ≥ ``lr_high``, move the
    busiest subscribers of the broker with the highest LR, each to the broker with the
    lowest LR (inside its cluster first) that stays under ``lr_safe`` with it, until the
    broker is under ``lr_safe``. When no broker can take the next one, the plan stops and
    says so: the overlay needs more capacity (elasticity, DESIGN §9)."""
    plan = Plan(state=state)
    while len(plan.moves) < max_moves:
        hottest = max(state.brokers, key=lambda b: (state.brokers[b].ratio, b))
        if state.brokers[hottest].ratio < lr_high:
            break
        stuck = False
        while state.brokers[hottest].ratio >= lr_safe and len(plan.moves) < max_moves:
            movable = [s for s in state.on(hottest) if state.loads[s] > 0]
            if not movable:
                stuck = True
                break
            subscriber = movable[0]
            load = state.loads[subscriber]
            target = _cluster_first(state, hottest, _under_ratio(lr_safe, load))
            if target is None:
                stuck = True
                break
            ratio = state.brokers[hottest].ratio
            plan.moves.append(
                _move(
                    state,
                    subscriber,
                    target,
                    f"LR {ratio:.2f} of {hottest} ≥ LR_safe {lr_safe:g} (a broker over "
                    f"LR_high {lr_high:g}): its busiest subscriber ({load:.0f}/s) to the "
                    f"least loaded broker that stays under LR_safe",
                )
            )
            state = state.moved(subscriber, target)
        if stuck:
            plan.note = (
                f"{hottest} stays at LR {state.brokers[hottest].ratio:.2f}: no broker can take "
                "its busiest subscriber under LR_safe; the overlay needs more capacity"
            )
            break
    plan.state = state
    return plan


def low_load_plan(state: LoadState, lr_low: float = LR_LOW, lr_limit: float = LR_SAFE) -> Plan:
    """Dynamoth's low-load rebalancing: when the mean LR is below ``lr_low``, move every
    subscriber of the broker with the lowest LR to others (inside its cluster first)
    while each stays under ``lr_limit``; the broker is then free (for elasticity to
    remove). A subscriber that fits nowhere stays, and the plan says so."""
    ratios = [b.ratio for b in state.brokers.values()]
    mean = sum(ratios) / len(ratios)
    if mean >= lr_low:
        return Plan(state=state, note=f"mean LR {mean:.2f} ≥ LR_low {lr_low:g}: nothing to free")
    coolest = min(state.brokers, key=lambda b: (state.brokers[b].ratio, b))
    plan = Plan(state=state)
    for subscriber in state.on(coolest):
        load = state.loads[subscriber]
        target = _cluster_first(state, coolest, _under_ratio(lr_limit, load))
        if target is None:
            plan.note = f"{subscriber} fits on no other broker under LR {lr_limit:g}"
            break
        plan.moves.append(
            _move(state, subscriber, target, f"mean LR {mean:.2f} < LR_low {lr_low:g}: "
                  f"draining {coolest}, the least loaded broker")
        )  # fmt: skip
        state = state.moved(subscriber, target)
    plan.state = state
    return plan


def initial_broker(
    policy: str,
    nearest: str,
    state: LoadState,
    *,
    turn: int = 0,
    rng: random.Random | None = None,
) -> str:
    """Where a new subscriber goes (BAD §5.1): the ``nearest`` broker (as the client
    says), round robin (``turn``-th broker in id order), at random, or the least loaded
    broker of the nearest broker's cluster (moving inside a cluster is what a SCOT does
    cheaply, so that is where the least loaded is sought)."""
    brokers = sorted(state.brokers)
    if policy == "nearest":
        return nearest
    if policy == "round_robin":
        return brokers[turn % len(brokers)]
    if policy == "random":
        return (rng or random.Random()).choice(brokers)
    if policy == "least_loaded":
        cluster = state.brokers[nearest].cluster
        return _by_load(state, [b for b in brokers if state.brokers[b].cluster == cluster])[0]
    raise ValueError(f"placement {policy!r} is not one of {', '.join(PLACEMENTS)}")


def place_subscribers(
    policy: str, nearest: dict[str, str], state: LoadState, seed: int = 0
) -> dict[str, str]:
    """Where each new subscriber goes, in the order given, by :func:`initial_broker`
    (``nearest``: subscriber → the broker it would pick itself). Under ``least_loaded``
    each one placed adds one to its broker's load until loads are measured again, so
    that a batch of newcomers spreads over the cluster instead of all taking the broker
    that was the least loaded when they came."""
    rng = random.Random(seed)
    brokers = dict(state.brokers)
    current = LoadState(brokers, {}, {})
    placed = {}
    for turn, (subscriber, near) in enumerate(nearest.items()):
        broker = initial_broker(policy, near, current, turn=turn, rng=rng)
        brokers[broker] = replace(brokers[broker], load=brokers[broker].load + 1.0)
        placed[subscriber] = broker
    return placed


def _move(state: LoadState, subscriber: str, target: str, reason: str) -> PlannedMove:
    source = state.hosts[subscriber]
    inside = state.brokers[source].cluster == state.brokers[target].cluster
    return PlannedMove(subscriber, source, target, inside, reason)
