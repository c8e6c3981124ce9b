"""What one round of the balancer decides (DESIGN §9), pure so that the ``octopis
balance`` process (:mod:`octopis.balance.loop`) and the simulator make the same decisions:
the options, the plan they name, and the moves a round orders."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from octopis.balance.plans import (
    ALPHA,
    BETA,
    GAMMA,
    LR_HIGH,
    LR_LOW,
    LR_SAFE,
    TARGET,
    BrokerLoad,
    LoadState,
    Plan,
    PlannedMove,
    coefficient_of_variation,
    dynamic_migration,
    high_load_plan,
    low_load_plan,
    shared_interest,
    shuffle,
)

HISTORY_LIMIT = 10_000
"""Load samples and move decisions a balancer keeps (the last ones): `octopis balance
run` may run for weeks, a simulation for as long; the report counts every move and says
how many decisions it no longer holds."""

PLANS = ("ldm", "sdm", "shuffle", "high-load", "low-load")
MEASURES = ("deliveries", "output")
"""What a broker's load is for a plan: ``deliveries`` per second to its own subscribers
(BAD's broker load, the data a broker moves for the subscribers it serves: all of it
goes where they go) or ``output`` per second, notification copies to neighbours as well
(Dynamoth's LR; relaying stays where the routing puts it, whoever moves)."""
RATIO_PLANS = ("high-load", "low-load")


@dataclass(frozen=True)
class BalanceOptions:
    """Which plan, its thresholds (the papers' defaults), and the pace of the rounds."""

    plan: str = "ldm"
    alpha: float = ALPHA
    beta: float = BETA
    gamma: float = GAMMA
    lr_high: float = LR_HIGH
    lr_safe: float = LR_SAFE
    lr_low: float = LR_LOW
    interval: float = 12.0
    """Seconds between rounds: at least the brokers' load window (10 s by default)."""
    sample: float = 1.0
    """Seconds between load samples (the timeline) between rounds."""
    max_moves: int = 50
    """Moves one round orders at most: the next round sees their effect first."""
    rounds: int = 0
    """Rounds to run; 0: until stopped."""
    act: bool = True
    """False: plan and log each round, move nothing (a dry run, or a baseline)."""
    cooldown: float = 30.0
    """Seconds a moved subscriber is left where it went: a move across clusters takes
    the SDK's linger (10 s) to finish, and the loads need a window to show it."""
    smoothing: float = 30.0
    """Seconds over which a subscriber's delivery rate is averaged (exponentially) for
    the plans, by client name so that it moves with the subscriber: a short load window
    counts a few deliveries per subscriber, too few to rank them by; 0: the window's
    rates as read (:class:`SubscriberLoads`)."""
    measure: str = ""
    """One of :data:`MEASURES`; empty: ``deliveries`` for BAD's plans (ldm, sdm, shuffle),
    ``output`` for Dynamoth's (high-load, low-load: load ratios against the capacity of
    the whole broker), which take nothing else."""
    target: float = TARGET
    """ldm, sdm: the coefficient of variation a triggered plan moves subscribers down to (α
    if it is above α): planning to α itself leaves the measured spread at α plus its
    noise (:data:`~octopis.balance.plans.TARGET`)."""

    def __post_init__(self) -> None:
        if self.plan not in PLANS:
            raise ValueError(f"unknown plan {self.plan!r}; choose one of {', '.join(PLANS)}")
        if self.measure and self.measure not in MEASURES:
            raise ValueError(
                f"unknown load measure {self.measure!r}; choose one of {', '.join(MEASURES)}"
            )
        if self.plan in RATIO_PLANS and self.measure not in ("", "output"):
            raise ValueError(f"the {self.plan} plan works on load ratios: its measure is output")
        if self.interval <= 0 or self.sample <= 0 or self.max_moves < 1 or self.rounds < 0:
            raise ValueError("interval and sample must be > 0, max_moves ≥ 1, rounds ≥ 0")
        if self.smoothing < 0:
            raise ValueError("smoothing must be ≥ 0 seconds")
        if self.target < 0:
            raise ValueError("the target coefficient of variation must be ≥ 0")

    @property
    def load_measure(self) -> str:
        """The measure the plan balances (:attr:`measure`, or the plan's own)."""
        return self.measure or ("output" if self.plan in RATIO_PLANS else "deliveries")


ELASTIC_CHANGES = ("add-cluster", "remove-cluster")


@dataclass
class Elasticity:
    """Dynamoth's elasticity on a SCOT (issue 18, DESIGN §9): the unit of growth is a
    cluster (one broker per region). :meth:`decide` asks for one more cluster once the
    mean load ratio has stayed above ``lr_high`` for ``t_wait`` seconds, and for the last
    cluster to go once it has stayed below ``lr_low`` as long; after a change, nothing for
    ``t_wait`` (Dynamoth's wait for a plan's effect) while the loads show it."""

    lr_high: float = LR_HIGH
    lr_low: float = LR_LOW
    t_wait: float = 60.0
    min_clusters: int = 1
    max_clusters: int = 16
    _above_since: float | None = None
    _below_since: float | None = None
    _changed_at: float = float("-inf")

    def __post_init__(self) -> None:
        if not 0 <= self.lr_low < self.lr_high or self.t_wait < 0:
            raise ValueError("elasticity needs 0 ≤ lr_low < lr_high and t_wait ≥ 0")
        if not 1 <= self.min_clusters <= self.max_clusters:
            raise ValueError("elasticity needs 1 ≤ min_clusters ≤ max_clusters")

    def decide(self, now: float, mean_ratio: float, clusters: int) -> str | None:
        """``add-cluster``, ``remove-cluster`` or None, for the mean load ratio at ``now``
        of an overlay of ``clusters`` clusters; a change returned is taken as made."""
        if mean_ratio <= self.lr_high:
            self._above_since = None
        elif self._above_since is None:
            self._above_since = now
        if mean_ratio >= self.lr_low:
            self._below_since = None
        elif self._below_since is None:
            self._below_since = now
        if now - self._changed_at < self.t_wait:
            return None
        change = None
        if self._above_since is not None and now - self._above_since >= self.t_wait:
            change = "add-cluster" if clusters < self.max_clusters else None
        elif self._below_since is not None and now - self._below_since >= self.t_wait:
            change = "remove-cluster" if clusters > self.min_clusters else None
        if change is not None:
            self._changed_at = now
            self._above_since = self._below_since = None
        return change


def client_name(subscriber: str) -> str:
    """The client name of a subscriber key (``name@connection@broker`` as the balancer
    reads it, or a bare name as the simulator has it)."""
    return subscriber.split("@", 1)[0]


class SubscriberLoads:
    """Each subscriber's delivery rate averaged exponentially over ``smoothing`` seconds,
    by client name: the load windows a balancer reads are short (it must see its moves),
    and a subscriber gets a few deliveries in one, so its rate read there is mostly
    noise, and LDM ranking by it moves subscribers at random near α. A subscriber's rate
    is its own (its subscriptions and the publications), so it carries over a move
    unchanged: the average follows the name to its new broker at once, and a broker's
    load in the plan is the sum of its subscribers' averages plus what it does for no
    subscriber (relaying, for the ``output`` measure) as read. Names no longer read are
    forgotten, so the table holds at most what the last reading did."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing
        self._rates: dict[str, float] = {}
        self._at = -math.inf

    def update(self, state: LoadState, now: float) -> None:
        """Fold the rates read in ``state`` at time ``now`` (seconds) into the averages."""
        read: dict[str, float] = defaultdict(float)
        for subscriber, load in state.loads.items():
            read[client_name(subscriber)] += load
        weight = 1.0 if self.smoothing <= 0 else 1.0 - math.exp(-(now - self._at) / self.smoothing)
        old = self._rates
        self._rates = {
            n: old[n] + weight * (r - old[n]) if n in old else r for n, r in read.items()
        }
        self._at = now

    def applied(self, state: LoadState) -> LoadState:
        """``state`` with each subscriber's load its name's average (split between its
        keys, two brokers reporting it during a move, as they read), and each broker's
        load changed by as much as its subscribers' were."""
        read: dict[str, float] = defaultdict(float)
        keys: dict[str, int] = defaultdict(int)
        for subscriber, load in state.loads.items():
            read[client_name(subscriber)] += load
            keys[client_name(subscriber)] += 1
        loads, change = {}, dict.fromkeys(state.brokers, 0.0)
        for subscriber, load in state.loads.items():
            name = client_name(subscriber)
            average = self._rates.get(name, read[name])
            share = load / read[name] if read[name] > 0 else 1.0 / keys[name]
            loads[subscriber] = average * share
            if state.hosts[subscriber] in change:
                change[state.hosts[subscriber]] += loads[subscriber] - load
        brokers = {
            b: BrokerLoad(max(0.0, v.load + change[b]), v.capacity, v.cluster)
            for b, v in state.brokers.items()
        }
        return LoadState(brokers, loads, state.hosts, state.interests)


def load_sample(loads: dict[str, float], outputs: dict[str, float]) -> dict[str, Any]:
    """One point of a balancer's timeline: each broker's load in the measure balanced,
    and its output (copies + deliveries per second); the coefficient of variation and
    mean of both."""
    return {
        "cov": coefficient_of_variation(loads.values()),
        "mean": sum(loads.values()) / len(loads),
        "loads": loads,
        "cov_output": coefficient_of_variation(outputs.values()),
        "mean_output": sum(outputs.values()) / len(outputs),
        "outputs": outputs,
    }


def collapse(moves: list[PlannedMove]) -> list[PlannedMove]:
    """One move per subscriber: the first the plan makes of it. A plan may move one
    subscriber on again as loads shift in its estimate; its first destination is the
    one chosen inside its cluster when one could take it, and the next round, on
    measured loads, moves it on if it must."""
    first: dict[str, PlannedMove] = {}
    for move in moves:
        first.setdefault(move.subscriber, move)
    return list(first.values())


def make_plan(options: BalanceOptions, state: LoadState) -> Plan:
    """The plan ``options.plan`` names, with its thresholds."""
    if options.plan in ("ldm", "sdm"):
        return dynamic_migration(
            state,
            options.alpha,
            options.beta,
            target=min(options.target, options.alpha),
            scheme=options.plan,
            similarity=shared_interest(state) if options.plan == "sdm" else None,
            max_moves=options.max_moves,
        )
    if options.plan == "shuffle":
        return shuffle(state, options.gamma, options.beta)
    if options.plan == "high-load":
        return high_load_plan(state, options.lr_high, options.lr_safe)
    return low_load_plan(state, options.lr_low, options.lr_safe)


def recently_moved(moves: Iterable[Mapping[str, Any]], now: float, cooldown: float) -> set[str]:
    """The subscribers that ``moves`` (records with ``subscriber``, ``t`` and, for an
    order that failed, a true ``error``) moved less than ``cooldown`` seconds before
    ``now``: :func:`plan_round` leaves them where they went (a failed order moved none)."""
    return {m["subscriber"] for m in moves if not m.get("error") and now - m["t"] < cooldown}


def plan_round(options: BalanceOptions, state: LoadState, recent: set[str]) -> Plan:
    """The plan of one round: subscribers whose client (``name`` of a key
    ``name@connection@broker``, or the whole key) was moved lately, in ``recent``, are
    left where they are (their load stays on their brokers); the plan's moves collapsed
    to one per subscriber (:func:`collapse`)."""
    names = {s.split("@", 1)[0] for s in recent} | recent
    keep = {s for s in state.hosts if s.split("@", 1)[0] not in names}
    if len(keep) < len(state.hosts):
        state = state.keeping(keep)
    plan = make_plan(options, state)
    plan.moves = collapse(plan.moves)
    return plan
