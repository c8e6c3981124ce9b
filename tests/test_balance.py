"""Load-balancing plans (``octopis.balance``, DESIGN §9) as laws over random load states:
BAD's dynamic migration and shuffle, Dynamoth's high- and low-load plans, and the SCOT
rule that a destination inside the subscriber's cluster is preferred; and
``octopis balance plan`` on fig2's processes with a skewed placement."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conditions import accounting, closing_control, tables_hold, until
from conftest import ready_again, secure_fig2, shared_secure_fig2
from hypothesis import given
from hypothesis import strategies as st

from octopis.balance import rounds as rounds_module
from octopis.balance.loop import Balancer
from octopis.balance.observe import load_state
from octopis.balance.plans import (
    BrokerLoad,
    LoadState,
    Plan,
    PlannedMove,
    coefficient_of_variation,
    dynamic_migration,
    high_load_plan,
    initial_broker,
    low_load_plan,
    place_subscribers,
    shared_interest,
    shuffle,
)
from octopis.balance.policy import (
    BalanceOptions,
    Elasticity,
    SubscriberLoads,
    make_plan,
    recently_moved,
)
from octopis.balance.rounds import RESHAPED, BalanceRounds
from octopis.client import Connection, Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster
from octopis.settings import BrokerSettings, Load, Routing
from octopis.topology import Scot, TopologyError, build_preset
from octopis.topology_change import add_cluster
from octopis.wire.client import MoveNotice


@st.composite
def load_states(draw: st.DrawFn) -> LoadState:
    """2–4 clusters × 2–6 regions, capacities 500–5,000/s, up to 60 subscribers of
    0–400/s each (placed anywhere, skewed on purpose), plus relaying load per broker."""
    clusters, regions = draw(st.integers(2, 4)), draw(st.integers(2, 6))
    ids = [f"r{x}:{c}" for c in range(clusters) for x in range(regions)]
    hot = draw(st.sampled_from(ids))
    count = draw(st.integers(0, 60))
    loads = {f"s{i}": float(draw(st.integers(0, 400))) for i in range(count)}
    hosts = {s: hot if draw(st.booleans()) else draw(st.sampled_from(ids)) for s in loads}
    brokers = {}
    for b in ids:
        attached = sum(loads[s] for s, h in hosts.items() if h == b)
        relaying = float(draw(st.integers(0, 200)))
        capacity = float(draw(st.integers(500, 5000)))
        brokers[b] = BrokerLoad(attached + relaying, capacity, int(b.split(":")[1]))
    return LoadState(brokers, loads, hosts)


def replay(state: LoadState, plan: Plan) -> list[tuple[LoadState, PlannedMove]]:
    """Each move with the state it was made in; the last state must be the plan's."""
    steps = []
    for move in plan.moves:
        assert state.hosts[move.subscriber] == move.source != move.target
        assert move.inside_cluster == (
            state.brokers[move.source].cluster == state.brokers[move.target].cluster
        )
        assert move.reason
        steps.append((state, move))
        state = state.moved(move.subscriber, move.target)
    assert state == plan.state
    return steps


def total(state: LoadState) -> float:
    return sum(b.load for b in state.brokers.values())


@given(load_states())
def test_dynamic_migration_lowers_the_peak_until_balanced_or_stuck(state: LoadState) -> None:
    plan = dynamic_migration(state, alpha=0.15, beta=10.0)
    peaks = [max(b.load for b in state.brokers.values())]
    squares = [sum(b.load**2 for b in state.brokers.values())]
    for before, move in replay(state, plan):
        peak = before.brokers[move.source].load
        load = before.loads[move.subscriber]
        assert before.brokers[move.target].load + load < peak - load  # a valid migration
        # off the most loaded broker that has a subscriber with somewhere to go
        for name, b in before.brokers.items():
            if b.load > peak:
                assert not any(
                    t.load + 2 * before.loads[s] < b.load
                    for s in before.on(name)
                    for other, t in before.brokers.items()
                    if other != name and before.loads[s] > 0
                )
        after = before.moved(move.subscriber, move.target)
        squares.append(sum(b.load**2 for b in after.brokers.values()))
        if not move.inside_cluster:  # only when no broker of its cluster could take it
            cluster = before.brokers[move.source].cluster
            assert all(
                b.load + load >= peak - load
                for name, b in before.brokers.items()
                if b.cluster == cluster and name != move.source
            )
        peaks.append(max(b.load for b in after.brokers.values()))
    assert all(a >= b for a, b in itertools.pairwise(peaks))
    assert all(a > b for a, b in itertools.pairwise(squares))  # why the plan ends
    assert total(plan.state) == pytest.approx(total(state))
    cov = coefficient_of_variation(b.load for b in plan.state.brokers.values())
    mean = total(plan.state) / len(state.brokers)
    assert cov <= 0.15 or mean <= 10.0 or plan.note


@given(load_states(), st.sampled_from([0.0, 0.05, 0.1, 0.15]))
def test_a_plan_starts_above_alpha_and_moves_down_to_its_target(
    state: LoadState, target: float
) -> None:
    alpha, beta = 0.15, 10.0
    plan = dynamic_migration(state, alpha, beta, target=target)
    cov = coefficient_of_variation(b.load for b in state.brokers.values())
    mean = total(state) / len(state.brokers)
    if cov <= alpha or mean <= beta:
        assert not plan.moves  # hysteresis: a spread between target and α starts nothing
        return
    covs = [
        coefficient_of_variation(b.load for b in s.brokers.values()) for s, _ in replay(state, plan)
    ]
    assert all(c > target for c in covs)  # no move once the target is reached
    end = coefficient_of_variation(b.load for b in plan.state.brokers.values())
    assert end <= target or plan.note or len(plan.moves) == 1000
    with pytest.raises(ValueError, match="target cov"):
        dynamic_migration(state, alpha, beta, target=alpha + 0.01)


@given(load_states(), st.data())
def test_sdm_by_shared_interest_prefers_brokers_holding_what_the_subscriber_asks_for(
    state: LoadState, data: st.DataObject
) -> None:
    """``shared_interest``: a broker's similarity to a subscriber is the load of its
    subscribers sharing an interest with it, each interest weighted by log(N / holders)
    (one that every subscriber holds counts nothing); the ``sdm`` plan moves each
    subscriber to the fitting broker under the mean of the highest such similarity (as
    read before the plan)."""
    symbols = st.frozensets(st.sampled_from(["sym='A'", "sym='B'", "sym='C'", "x=1"]))
    interests = {s: data.draw(symbols) | {"class='STOCK'"} for s in state.loads}
    state = replace(state, interests=interests)
    similarity = shared_interest(state)
    for subscriber, mine in interests.items():
        for broker in state.brokers:
            expected = sum(
                state.loads[s] * math.log(len(interests) / sum(i in v for v in interests.values()))
                for i in mine
                for s, h in state.hosts.items()
                if h == broker and i in interests[s]
            )
            assert similarity(subscriber, broker) == pytest.approx(expected)
        common = shared_interest(
            replace(state, interests={s: frozenset({"class='STOCK'"}) for s in interests})
        )
        assert all(common(subscriber, b) == 0 for b in state.brokers)
    plan = make_plan(BalanceOptions("sdm", alpha=0.15, beta=10.0, target=0.15), state)
    for before, move in replay(state, plan):
        mean = total(before) / len(before.brokers)
        peak, load = before.brokers[move.source].load, before.loads[move.subscriber]
        assert before.brokers[move.target].load < mean
        assert not any(
            b.load < mean
            and b.load + load < peak - load
            and similarity(move.subscriber, name) > similarity(move.subscriber, move.target)
            for name, b in before.brokers.items()
            if name != move.source
        )


@given(load_states())
def test_sdm_moves_to_the_most_similar_broker_under_the_mean(state: LoadState) -> None:
    def similarity(subscriber: str, broker: str) -> float:
        return float(hash((subscriber, broker)) % 7)

    plan = dynamic_migration(state, alpha=0.15, beta=10.0, scheme="sdm", similarity=similarity)
    for before, move in replay(state, plan):
        mean = total(before) / len(before.brokers)
        assert before.brokers[move.target].load < mean
        peak = before.brokers[move.source].load
        load = before.loads[move.subscriber]
        better = [
            b
            for name, b in before.brokers.items()
            if name != move.source
            and b.load < mean
            and b.load + load < peak - load
            and similarity(move.subscriber, name) > similarity(move.subscriber, move.target)
        ]
        assert not better


@given(load_states())
def test_a_shuffle_leaves_subscriber_loads_within_one_subscriber_of_each_other(
    state: LoadState,
) -> None:
    plan = shuffle(state, gamma=0.0, theta=0.0)
    replay(state, plan)
    if not state.loads:
        return
    attached = {b: 0.0 for b in state.brokers}
    for subscriber, host in plan.state.hosts.items():
        attached[host] += state.loads[subscriber]
    relaying = {
        b: state.brokers[b].load - sum(state.loads[s] for s, h in state.hosts.items() if h == b)
        for b in state.brokers
    }
    heaviest = max(state.loads.values())
    # greedy list scheduling: each went to the least loaded, so the spread is one job
    shares = [relaying[b] + attached[b] for b in state.brokers]
    bottom = min(shares)
    assert all(share - bottom <= heaviest + max(relaying.values()) + 1e-6 for share in shares)


@given(load_states(), st.floats(0.3, 1.0), st.floats(0.05, 0.3))
def test_a_high_load_plan_brings_every_broker_under_lr_high_or_says_why(
    state: LoadState, lr_high: float, margin: float
) -> None:
    lr_safe = lr_high - margin
    plan = high_load_plan(state, lr_high, lr_safe)
    for before, move in replay(state, plan):
        target = before.brokers[move.target]
        assert (target.load + before.loads[move.subscriber]) / target.capacity < lr_safe
        assert before.brokers[move.source].ratio >= lr_safe  # relieved until under LR_safe
    assert all(b.ratio < lr_high for b in plan.state.brokers.values()) or plan.note


@given(load_states())
def test_a_low_load_plan_drains_the_coolest_broker(state: LoadState) -> None:
    plan = low_load_plan(state, lr_low=10.0, lr_limit=10.0)  # everything is "low"
    replay(state, plan)
    coolest = min(state.brokers, key=lambda b: (state.brokers[b].ratio, b))
    left = [s for s, h in plan.state.hosts.items() if h == coolest]
    assert not left or plan.note
    assert low_load_plan(state, lr_low=0.0).moves == []


def test_initial_placement_policies() -> None:
    brokers = {
        "a:0": BrokerLoad(300, 1000, 0),
        "b:0": BrokerLoad(100, 1000, 0),
        "a:1": BrokerLoad(0, 1000, 1),
    }
    state = LoadState(brokers, {}, {})
    assert initial_broker("nearest", "a:0", state) == "a:0"
    assert initial_broker("least_loaded", "a:0", state) == "b:0"  # inside a:0's cluster
    assert [initial_broker("round_robin", "a:0", state, turn=t) for t in range(4)] == [
        "a:0",
        "a:1",
        "b:0",
        "a:0",
    ]
    assert initial_broker("random", "a:0", state, rng=random.Random(3)) in brokers
    with pytest.raises(ValueError, match="placement 'far' is not one of"):
        initial_broker("far", "a:0", state)


def test_least_loaded_placement_spreads_newcomers_over_their_cluster() -> None:
    """Six newcomers near a:0 with a:0 already busy: least loaded puts none on a:0 and
    spreads them over b:0 and c:0 (cluster 0), counting each as it goes; nearest keeps
    them all on a:0; round robin deals them over every broker in id order."""
    brokers = {
        "a:0": BrokerLoad(50, 1000, 0),
        "b:0": BrokerLoad(0, 1000, 0),
        "c:0": BrokerLoad(1, 1000, 0),
        "a:1": BrokerLoad(0, 1000, 1),
    }
    state = LoadState(brokers, {}, {})
    nearest = {f"s{i}": "a:0" for i in range(6)}
    placed = place_subscribers("least_loaded", nearest, state)
    assert Counter(placed.values()) == {"b:0": 4, "c:0": 2}  # loads 4 and 3 after them
    assert set(place_subscribers("nearest", nearest, state).values()) == {"a:0"}
    dealt = place_subscribers("round_robin", nearest, state)
    assert list(dealt.values()) == ["a:0", "a:1", "b:0", "c:0", "a:0", "a:1"]
    assert place_subscribers("random", nearest, state, 7) == place_subscribers(
        "random", nearest, state, 7
    )
    assert state.brokers["b:0"].load == 0  # the caller's state is left as it was


def test_elasticity_waits_t_wait_above_or_below_and_after_each_change() -> None:
    """Dynamoth's rule with a cluster as the unit: a cluster more once the mean LR has
    stayed above LR_high for T_wait, the last one fewer once it has stayed below LR_low
    as long, nothing within T_wait of a change, never beyond the bounds."""
    e = Elasticity(lr_high=1.0, lr_low=0.2, t_wait=10.0, min_clusters=2, max_clusters=4)
    assert e.decide(0.0, 1.5, 3) is None  # above since 0
    assert e.decide(5.0, 0.9, 3) is None  # dipped: the wait starts again
    assert e.decide(6.0, 1.5, 3) is None
    assert e.decide(15.9, 1.5, 3) is None
    assert e.decide(16.0, 1.5, 3) == "add-cluster"
    assert e.decide(20.0, 1.5, 4) is None  # within T_wait of the change, and at the bound
    assert e.decide(40.0, 1.5, 4) is None  # max_clusters
    assert e.decide(41.0, 0.1, 4) is None
    assert e.decide(51.0, 0.1, 4) == "remove-cluster"
    assert e.decide(61.0, 0.1, 3) is None  # the timer starts again after a change
    assert e.decide(71.0, 0.1, 3) == "remove-cluster"
    assert e.decide(90.0, 0.1, 2) is None  # min_clusters
    with pytest.raises(ValueError, match="lr_low < lr_high"):
        Elasticity(lr_high=0.2, lr_low=0.5)


def _read(loads: dict[str, float], hosts: dict[str, str], relaying: float = 0.0) -> LoadState:
    """A state as the balancer reads it: brokers a:0, b:0, c:1, each loaded with its
    subscribers' rates plus ``relaying``."""
    brokers = {
        b: BrokerLoad(relaying + sum(v for s, v in loads.items() if hosts[s] == b), 0.0, c)
        for b, c in (("a:0", 0), ("b:0", 0), ("c:1", 1))
    }
    return LoadState(brokers, loads, hosts)


def test_subscriber_loads_average_the_noise_and_follow_a_move_at_once() -> None:
    """Readings of one subscriber alternating 0 and 20/s average to about 10/s; after it
    moves (a new key, at another broker) its average is its load there at once, the old
    broker's load drops by as much, and relaying is kept as read; a name no longer read
    is forgotten; smoothing 0 gives the state as read."""
    averaged = SubscriberLoads(smoothing=10.0)
    hosts = {"s@1@a:0": "a:0", "t@1@a:0": "a:0"}
    for t in range(60):
        averaged.update(_read({"s@1@a:0": 20.0 * (t % 2), "t@1@a:0": 5.0}, hosts), float(t))
    noisy = _read({"s@1@a:0": 0.0, "t@1@a:0": 5.0}, hosts, relaying=3.0)
    state = averaged.applied(noisy)
    assert 8.0 < state.loads["s@1@a:0"] < 12.0
    assert state.loads["t@1@a:0"] == pytest.approx(5.0)
    assert state.brokers["a:0"].load == pytest.approx(3.0 + 5.0 + state.loads["s@1@a:0"])
    moved = {"s@2@c:1": "c:1", "t@1@a:0": "a:0"}
    just_moved = _read({"s@2@c:1": 1.0, "t@1@a:0": 5.0}, moved)
    averaged.update(just_moved, 60.0)
    state = averaged.applied(just_moved)
    assert state.loads["s@2@c:1"] > 8.0 and state.brokers["c:1"].load > 8.0
    assert state.brokers["a:0"].load == pytest.approx(5.0)
    averaged.update(_read({"t@1@a:0": 5.0}, {"t@1@a:0": "a:0"}), 61.0)
    fresh = _read({"s@3@b:0": 2.0, "t@1@a:0": 5.0}, {"s@3@b:0": "b:0", "t@1@a:0": "a:0"})
    assert averaged.applied(fresh).loads["s@3@b:0"] == 2.0  # forgotten: taken as read
    as_read = SubscriberLoads(0.0)
    as_read.update(noisy, 0.0)
    assert as_read.applied(noisy).loads == noisy.loads
    assert as_read.applied(noisy).brokers == noisy.brokers


def test_a_subscriber_moved_within_the_cooldown_is_recent_unless_its_order_failed() -> None:
    """:func:`recently_moved`, which ``octopis balance`` and the simulator's balancer both
    hand :func:`plan_round`: moves less than ``cooldown`` before now, failed orders
    aside (the simulator's decisions carry no error)."""
    moves = [
        {"subscriber": "old", "t": 0.0, "error": ""},
        {"subscriber": "edge", "t": 10.0},
        {"subscriber": "failed", "t": 35.0, "error": "the client left"},
        {"subscriber": "new", "t": 39.0, "error": ""},
    ]
    assert recently_moved(moves, now=40.0, cooldown=30.0) == {"new"}
    assert recently_moved(moves, now=39.9, cooldown=30.0) == {"edge", "new"}
    assert recently_moved(moves, now=40.0, cooldown=0.0) == set()


def test_the_load_measure_is_deliveries_for_bads_plans_and_output_for_load_ratios() -> None:
    assert BalanceOptions("ldm").load_measure == "deliveries"
    assert BalanceOptions("shuffle", measure="output").load_measure == "output"
    assert BalanceOptions("high-load").load_measure == "output"
    with pytest.raises(ValueError, match="works on load ratios"):
        BalanceOptions("low-load", measure="deliveries")
    with pytest.raises(ValueError, match="unknown load measure 'cpu'"):
        BalanceOptions(measure="cpu")


def test_a_skewed_cluster_balances_inside_itself_first() -> None:
    """Two clusters, all subscribers on r0:0: LDM moves them to r1:0 and r2:0 (cluster 0)
    before anything crosses to cluster 1, and says why each moved."""
    brokers = {f"r{x}:{c}": BrokerLoad(0.0, 1000.0, c) for c in (0, 1) for x in range(3)}
    loads = {f"s{i}": 100.0 for i in range(6)}
    hosts = dict.fromkeys(loads, "r0:0")
    brokers["r0:0"] = BrokerLoad(600.0, 1000.0, 0)
    plan = dynamic_migration(LoadState(brokers, loads, hosts), alpha=0.15, beta=10.0)
    first = plan.moves[:2]
    assert {m.target for m in first} == {"r1:0", "r2:0"} and all(m.inside_cluster for m in first)
    assert "cov" in plan.moves[0].reason and "least loaded" in plan.moves[0].reason
    with pytest.raises(ValueError, match="SDM needs"):
        dynamic_migration(LoadState(brokers, loads, hosts), scheme="sdm")


SHARED = pytest.mark.xdist_group("balance-fig2")
"""The plan of a skewed overlay and the stale move order share one fig2
(:func:`shared_fig2`) on one worker."""


@pytest.fixture(scope="module")
def shared_fig2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """fig2 with a 30 s load window; moves by adoption inside a cluster: the paper's SBP
    (covering off). For the module."""
    settings = BrokerSettings(load=Load(window=30), routing=Routing(covering="off"))
    yield from shared_secure_fig2(tmp_path_factory, "balance-fig2", settings)


@pytest.fixture
def fig2(shared_fig2: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> LocalCluster:
    """:func:`shared_fig2` once every broker is ready and no table holds a subscription
    of an earlier test."""
    return ready_again(shared_fig2, monkeypatch)


@SHARED
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_a_plan_for_a_skewed_overlay_moves_the_hot_brokers_subscribers_inside_its_cluster(
    fig2: LocalCluster,
) -> None:
    """fig2 with six busy subscribers on a:0 and one on d:2: `octopis balance plan` reads
    every broker's load over the control RPC and moves subscribers off a:0, first to
    brokers of cluster 0, and says why; it moves nothing."""
    got: Counter[tuple[str, int]] = Counter()
    total = 600

    async def scenario() -> subprocess.CompletedProcess:
        subscribers = []
        for name, broker in [*((f"hot{i}", "a:0") for i in range(6)), ("cool", "d:2")]:
            sub = await Subscriber.connect(
                fig2.scot.brokers[broker].client_endpoint,
                name,
                on_notification=lambda n, name=name: got.update([(name, n.seq)]),
            )
            await sub.subscribe("[class,eq,'STOCK']")
            subscribers.append(sub)
        await until(lambda: tables_hold(fig2, 7), "the subscriptions spread", 30)
        pub = await Publisher.connect(fig2.scot.brokers["f:1"].client_endpoint, "feed")
        for i in range(total):
            await pub.publish({"class": "STOCK", "close": float(i)}, wait=False)
            if i % 100 == 99:
                await asyncio.sleep(0.3)
        await pub.flush(60)
        await until(lambda: len(got) >= 7 * total, "every delivery", 60)
        await pub.close()
        attached.update((await fig2.ask(["a:0"], "clients", 10))["a:0"])

        def plan(kind: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "octopis.cli.main", "balance", "plan", "--topology",
                 str(fig2.topology_path), "--keys", str(fig2.keys_dir), "--beta", "1",
                 "--plan", kind, "--json"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip

        try:  # the plans are made while the subscribers are attached
            return await asyncio.to_thread(plan, "ldm"), await asyncio.to_thread(plan, "sdm")
        finally:
            for sub in subscribers:
                await sub.close()

    attached: dict[str, dict] = {}
    plan, similar = asyncio.run(closing_control(fig2, scenario()))
    hot = {c: v for c, v in attached.items() if c.startswith("hot")}
    assert len(hot) == 6  # the clients RPC: what each asks for by equality, for SDM
    assert all(
        list(v["interests"]) == ["class='STOCK'"] and v["subscriptions"] == 1 for v in hot.values()
    )
    assert len(got) == 7 * total and set(got.values()) == {1}  # exactly once each
    assert plan.returncode == 0, plan.stderr
    report = json.loads(plan.stdout)
    moves = report["moves"]
    print(f"cov {report['cov']:.2f} -> {report['cov_after']:.2f}; {len(moves)} moves")
    assert report["cov"] > 0.15 and moves and report["cov_after"] < report["cov"]
    assert moves[0]["source"] == "a:0" and moves[0]["subscriber"].startswith("hot")
    assert moves[0]["inside_cluster"] and moves[0]["target"].endswith(":0")
    assert all(m["reason"].startswith("cov ") for m in moves)
    assert similar.returncode == 0, similar.stderr
    sdm = json.loads(similar.stdout)["moves"]
    assert sdm and all("most similar" in m["reason"] for m in sdm)
    assert sdm[0]["source"] == "a:0" and sdm[0]["subscriber"].startswith("hot")


@pytest.fixture
def fig2_quick_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    # moves by adoption inside a cluster: the paper's SBP (covering off)
    yield from secure_fig2(
        tmp_path, monkeypatch, BrokerSettings(load=Load(window=2), routing=Routing(covering="off"))
    )


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_octopis_balance_run_moves_subscribers_while_notifications_flow(
    fig2_quick_load: LocalCluster, tmp_path: Path
) -> None:
    """Twelve busy subscribers on a:0, one on d:2, a stream from f:1 at ~150/s: once
    a:0's and d:2's load analyses report the stream's deliveries, `octopis balance run`
    (three rounds, 3 s apart) orders moves off a:0 from the brokers' own load analysis;
    the subscribers follow them while the stream goes on, every notification reaches
    every subscriber exactly once, and the spread of load falls from the balancer's
    first sample, which is one of the stream's load (its mean above 0), to its last.

    The balancer used to start with the stream, and its first sample (0.5 s on) once
    came before any broker's window had a delivery in it: an idle overlay, mean 0 and
    cov 0 (``coefficient_of_variation`` of loads all 0), which no later cov is below."""
    cluster = fig2_quick_load
    got: Counter[tuple[str, int]] = Counter()
    names = [*(f"hot{i}" for i in range(12)), "cool"]
    report_path = tmp_path / "balance.json"

    async def scenario() -> tuple[int, list[Subscriber]]:
        subscribers, connections = [], []
        for name in names:
            broker = "d:2" if name == "cool" else "a:0"
            connection = Connection(cluster.scot.client_endpoints(broker), linger=2.0)
            await connection.open()
            connections.append(connection)
            sub = Subscriber(
                name,
                connection,
                on_notification=lambda n, name=name: got.update([(name, n.seq)]),
            )
            await sub.subscribe("[class,eq,'STOCK']")
            subscribers.append(sub)
        await until(lambda: tables_hold(cluster, len(names)), "the subscriptions spread", 30)
        pub = await Publisher.connect(cluster.scot.brokers["f:1"].client_endpoint, "feed")
        balancer: asyncio.Task | None = None
        sent = 0

        async def stream() -> None:  # until the balancer is done and its moves made
            nonlocal sent
            while (
                balancer is None
                or not balancer.done()
                or sent < 1500
                or any(s.moving for s in subscribers)
            ):
                await pub.publish({"class": "STOCK", "close": float(sent)}, wait=False)
                sent += 1
                if sent % 15 == 0:
                    await asyncio.sleep(0.1)

        flowing = asyncio.create_task(stream())
        await until(lambda: _measured(cluster, ("a:0", "d:2")), "the stream's load measured", 30)
        balancer = asyncio.create_task(
            asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable,
                    "-m",
                    "octopis.cli.main",
                    "balance",
                    "run",
                    "--topology",
                    str(cluster.topology_path),
                    "--keys",
                    str(cluster.keys_dir),
                    "--beta",
                    "1",
                    "--rounds",
                    "3",
                    "--interval",
                    "3",
                    "--sample",
                    "0.5",
                    "--report",
                    str(report_path),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
        )
        await flowing
        await balancer
        await pub.flush(60)
        await until(lambda: len(got) >= len(names) * sent, "every delivery", 60)
        await pub.close()
        for connection in connections:
            await connection.close()  # and those it opened as its clients moved
        return sent, subscribers

    sent, subscribers = asyncio.run(closing_control(cluster, scenario()))
    for name in names:
        counts = Counter({seq: n for (who, seq), n in got.items() if who == name})
        assert accounting(name, sent, counts) == {
            "expected": sent,
            "delivered": sent,
            "duplicates": 0,
            "lost": 0,
        }
    report = json.loads(report_path.read_text())
    made = [m for s in subscribers for m in s.moves]
    print(
        f"{report['moves']} moves ordered ({report['moves_inside']} inside), {len(made)} made; "
        f"cov {report['timeline'][0]['cov']:.2f} -> {report['timeline'][-1]['cov']:.2f}"
    )
    assert report["moves"] > 0 and report["moves_failed"] == 0
    assert len(made) == report["moves"]
    assert all(m["inside"] for m in made if m["to"].endswith(":0"))
    first, last = report["timeline"][0], report["timeline"][-1]
    assert first["mean"] > 0, first  # a sample of the stream's load, not of an idle overlay
    assert last["cov"] < first["cov"]


async def _measured(cluster: LocalCluster, brokers: tuple[str, ...]) -> bool:
    """Each of ``brokers``' load analysis reports deliveries (for :func:`until`): its
    window has seen the stream."""
    reports = await cluster.ask(list(brokers), "load", 5, 0)
    return all(r is not None and r["deliveries_per_s"] > 0 for r in reports.values())


@SHARED
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_a_stale_move_order_is_ignored_and_the_subscriber_keeps_its_subscription(
    fig2: LocalCluster,
) -> None:
    """A move order from a connection the subscriber is no longer on, or naming a
    subscription it no longer holds, is ignored and counted (the balance experiment lost
    8,174 deliveries when such orders withdrew subscriptions they did not replace); the
    subscriber keeps receiving everything exactly once."""
    got: Counter[int] = Counter()
    total = 50

    async def scenario() -> Subscriber:
        endpoints = fig2.scot.brokers
        sub = await Subscriber.connect(
            endpoints["a:0"].client_endpoint, "s", on_notification=lambda n: got.update([n.seq])
        )
        stream = await sub.subscribe("[class,eq,'STOCK']")
        elsewhere = Connection([endpoints["b:0"].client_endpoint])
        await elsewhere.open()
        to = endpoints["c:0"].client_endpoint
        order = MoveNotice(client="s", to=to, inside=True, sub_ids=[stream.sub_id])
        sub._on_notice(order, elsewhere)
        order = MoveNotice(client="s", to=to, inside=False, sub_ids=["a:0#gone"])
        sub._on_notice(order, sub.connection)
        assert not sub.moving
        await until(lambda: tables_hold(fig2, 1), "the subscription spreads", 30)
        pub = await Publisher.connect(endpoints["f:1"].client_endpoint, "feed")
        for i in range(total):
            await pub.publish({"class": "STOCK", "close": float(i)}, wait=False)
        await pub.flush(30)
        await until(lambda: len(got) >= total, "every delivery", 30)
        await pub.close()
        await elsewhere.close()
        await sub.close()
        return sub

    sub = asyncio.run(closing_control(fig2, scenario()))
    assert sub.stale_moves == 2 and not sub.moves
    counts = accounting("s", total, got)
    assert counts["delivered"] == total and counts["duplicates"] == counts["lost"] == 0


def test_a_balancer_skips_a_round_whose_load_reports_do_not_all_come() -> None:
    """A broker that does not answer a load read in time (a stalled machine) costs the
    balancer that sample or round, logged and counted, never the balancer itself: the
    rounds after it are made."""
    scot = build_preset("fig2")
    asked = itertools.count()

    async def ask(brokers: list[str], method: str, timeout: float, *args: object) -> dict:
        silent = next(asked) in (0, 2)  # the first sample and the first round's read
        report = {
            "capacity_per_s": 100.0,
            "deliveries_per_s": 1.0,
            "output_per_s": 2.0,
            "load_ratio": 0.02,
            "busiest_clients": {},
        }
        return {b: None if silent and b == "a:0" else report for b in brokers}

    options = BalanceOptions(interval=0.05, sample=0.02, rounds=3, act=False)
    balancer = Balancer(scot, ask, options, timeout=0.01)
    asyncio.run(asyncio.wait_for(balancer.run(), 10))
    report = balancer.report()
    assert report["rounds"] == 3 and report["reads_failed"] == 2
    assert report["timeline"] and all(t["cov"] == 0.0 for t in report["timeline"])


def test_load_reports_make_one_load_state_for_the_balancer_and_the_simulator() -> None:
    """:func:`load_state`, the rule both balancers read reports by: a broker's load is the
    measure asked for, an idle broker without a capacity of its own takes the largest
    measured on the others, and each reported client is a subscriber at its broker,
    named as the caller names it."""
    scot = build_preset("fig2")

    def report(capacity: float, clients: dict[str, float]) -> dict:
        return {
            "capacity_per_s": capacity,
            "deliveries_per_s": 5.0,
            "output_per_s": 7.0,
            "busiest_clients": clients,
        }

    reports = {"a:0": report(300.0, {"s1": 4.0}), "b:0": report(0.0, {}), "c:1": report(200.0, {})}
    state = load_state(reports, scot, "output", lambda client, broker: f"{client}@{broker}")
    assert {b: (x.load, x.capacity) for b, x in state.brokers.items()} == {
        "a:0": (7.0, 300.0),
        "b:0": (7.0, 300.0),
        "c:1": (7.0, 200.0),
    }
    assert state.brokers["c:1"].cluster == 1
    assert state.loads == {"s1@a:0": 4.0} and state.hosts == {"s1@a:0": "a:0"}
    by_deliveries = load_state(reports, scot, "deliveries", lambda client, _: client)
    assert by_deliveries.brokers["a:0"].load == 5.0 and by_deliveries.hosts == {"s1": "a:0"}


def _skewed() -> LoadState:
    """Six subscribers of 20/s, all on a:0 (brokers a:0, b:0, c:1): LDM moves some."""
    loads = {f"s{i}@1@a:0": 20.0 for i in range(6)}
    return _read(loads, dict.fromkeys(loads, "a:0"))


def _sampled(rounds: BalanceRounds, now: float, ratio: float) -> None:
    """A round of ``rounds`` at ``now`` on the skewed state, at mean load ratio ``ratio``."""
    rounds.new_round()
    state = _skewed()
    rounds.sampled(now, state, {b: v.load for b, v in state.brokers.items()}, ratio, 2)


def test_a_round_that_changes_shape_plans_no_moves_and_one_refused_plans_as_usual() -> None:
    """:class:`BalanceRounds`, the rounds of ``octopis balance`` and of the simulator:
    the elasticity rule is asked first; a change made leaves that round without a plan
    (the next one sees the new shape), a change refused is kept with its error and
    counted, and the round plans its moves as usual."""
    elastic = Elasticity(lr_high=1.0, lr_low=0.2, t_wait=0.0)
    rounds = BalanceRounds(BalanceOptions(beta=1.0), elastic)
    _sampled(rounds, 0.0, 1.5)
    assert rounds.elastic_change(0.0, 2) == "add-cluster"
    rounds.changed(0.0, "add-cluster", clusters=3, seconds=4.0)
    plan = rounds.plan(0.0)
    assert not plan.moves and plan.note == RESHAPED
    assert "planned" not in rounds.timeline[-1]
    _sampled(rounds, 1.0, 1.5)
    assert rounds.elastic_change(1.0, 3) == "add-cluster"
    rounds.changed(1.0, "add-cluster", error="a publisher on a leaving broker")
    plan = rounds.plan(1.0)
    assert plan.moves and all(m.source == "a:0" for m in plan.moves)
    assert rounds.timeline[-1]["planned"] == len(plan.moves)
    assert rounds.orders(plan) == plan.moves
    report = rounds.report()
    assert report["changes"] == [
        {"round": 1, "t": 0.0, "change": "add-cluster", "mean_ratio": 1.5, "clusters": 3,
         "seconds": 4.0},
        {"round": 2, "t": 1.0, "change": "add-cluster", "mean_ratio": 1.5,
         "error": "a publisher on a leaving broker"},
    ]  # fmt: skip
    assert report["changes_failed"] == 1 and report["rounds"] == 2


def test_without_act_the_rounds_ask_for_no_change_and_order_no_move() -> None:
    """A dry run (``act`` off) plans and keeps the plan's size in the timeline, but the
    elasticity rule is not asked and no move is to be ordered."""
    elastic = Elasticity(lr_high=1.0, lr_low=0.2, t_wait=0.0)
    rounds = BalanceRounds(BalanceOptions(beta=1.0, act=False), elastic)
    _sampled(rounds, 0.0, 1.5)
    assert rounds.elastic_change(0.0, 2) is None
    assert elastic.decide(0.0, 1.5, 2) == "add-cluster"  # the rule was left as it was
    plan = rounds.plan(0.0)
    assert plan.moves and rounds.timeline[-1]["planned"] == len(plan.moves)
    assert rounds.orders(plan) == []
    assert not rounds.report()["changes"] and not rounds.report()["decisions"]


def test_the_rounds_count_every_order_and_say_how_many_decisions_the_log_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Orders are counted inside a cluster, across, or failed, all of them, while the
    decision log keeps the last ``HISTORY_LIMIT`` and the report says how many it
    dropped; the next plan leaves out subscribers moved within the cooldown (not those
    whose order failed) and those still moving."""
    monkeypatch.setattr(rounds_module, "HISTORY_LIMIT", 3)
    rounds = BalanceRounds(BalanceOptions(beta=1.0, cooldown=30.0))
    _sampled(rounds, 0.0, 0.5)
    made = [
        PlannedMove("s0@1@a:0", "a:0", "b:0", True, "test"),
        PlannedMove("s1@1@a:0", "a:0", "c:1", False, "test"),
        PlannedMove("s2@1@a:0", "a:0", "b:0", True, "test"),
        PlannedMove("s3@1@a:0", "a:0", "c:1", False, "test"),
    ]
    for move in made:
        rounds.ordered(move, 0.0, [f"{move.subscriber}#1"], wall=100.0)
    failed = PlannedMove("s4@1@a:0", "a:0", "b:0", True, "test")
    rounds.ordered(failed, 0.0, error="the client left")
    report = rounds.report()
    assert (report["moves"], report["moves_inside"], report["moves_across"]) == (4, 2, 2)
    assert report["moves_failed"] == 1
    assert len(report["decisions"]) == 3 and report["decisions_dropped"] == 2
    assert report["decisions"][-1]["error"] == "the client left"
    assert report["decisions"][0] == {
        "round": 1, "t": 0.0, "wall": 100.0, "subscriber": "s2@1@a:0", "source": "a:0",
        "target": "b:0", "inside_cluster": True, "reason": "test",
        "sub_ids": ["s2@1@a:0#1"], "error": "",
    }  # fmt: skip
    _sampled(rounds, 1.0, 0.5)
    planned = {m.subscriber for m in rounds.plan(1.0, moving={"s0@1@a:0"}).moves}
    assert planned == {"s1@1@a:0", "s4@1@a:0", "s5@1@a:0"}  # s1: no longer in the log


def test_the_process_balancer_carries_out_what_its_rounds_decide() -> None:
    """:class:`Balancer` on answers made up for fig2, all six clients on a:0 at a mean
    load ratio of 2 (the elasticity rule, ``t_wait`` 0, asks for a cluster more every
    round): the first round's change is refused, kept with its error, and the round
    orders the plan's moves; the second round's is made, and it orders none."""
    scot = build_preset("fig2")
    clients = {f"s{i}@1": 20.0 for i in range(6)}
    asked: Counter[str] = Counter()

    async def ask(brokers: list[str], method: str, timeout: float, *args: object) -> dict:
        asked[method] += 1
        if method == "move":
            return {b: [f"{args[0]}#1"] for b in brokers}
        return {
            b: {
                "capacity_per_s": 100.0,
                "deliveries_per_s": 120.0 if b == "a:0" else 0.0,
                "output_per_s": 200.0,
                "load_ratio": 2.0,
                "busiest_clients": clients if b == "a:0" else {},
            }
            for b in brokers
        }

    refusals = [TopologyError("not now")]

    async def reshape(change: str) -> Scot:
        if refusals:
            raise refusals.pop()
        return add_cluster(scot)

    options = BalanceOptions(beta=1.0, interval=0.02, sample=1.0, rounds=2)
    elastic = Elasticity(lr_high=1.0, lr_low=0.2, t_wait=0.0)
    balancer = Balancer(scot, ask, options, timeout=1.0, elastic=elastic, reshape=reshape)
    asyncio.run(asyncio.wait_for(balancer.run(), 10))
    report = balancer.report()
    assert [c.get("error") for c in report["changes"]] == ["not now", None]
    assert report["changes"][1]["clusters"] == scot.clusters + 1 == balancer.scot.clusters
    assert report["moves"] == asked["move"] > 0
    assert {d["round"] for d in report["decisions"]} == {1}
    assert all(
        d["sub_ids"] == [d["subscriber"].rsplit("@", 1)[0] + "#1"] for d in report["decisions"]
    )
