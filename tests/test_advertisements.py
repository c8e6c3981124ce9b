"""Advertisements (DESIGN §12): ``intersects`` never denies a publication both filters
match; with advertisements on, every subscriber gets exactly what it gets with them off
when each publisher advertises before publishing (advertisements arriving after the
subscriptions they draw included), SBP sends no more messages, and a publication outside
its publisher's advertisements is refused."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conditions import accounting, closing_control, until
from conftest import secure_fig2
from hypothesis import given, settings
from hypothesis import strategies as st
from laws import scots, sized
from test_covering import _values, subscriptions
from test_covering_laws import Op

from octopis.client import Publisher, Subscriber, UnadvertisedError
from octopis.cluster.launcher import LocalCluster
from octopis.core import ProtocolError, UnadvertisedPublication, make_broker, recovery
from octopis.core.clustered import ClusteredBroker
from octopis.failure_schedule import Failure
from octopis.filters.covering import intersects
from octopis.filters.language import Subscription, parse_publication, parse_subscription
from octopis.matching import ReferenceMatcher
from octopis.settings import BrokerSettings, Routing, load_settings
from octopis.sim import InjectedCongestion, LatencyModel, Simulator
from octopis.topology import Scot, build_preset

FIG2 = build_preset("fig2")
LATENCY = LatencyModel(0.001, 0.0)
"""Every hop takes 1 ms, so both runs' messages take the same paths at the same times."""
SETTLE = 0.05
"""Seconds after which an advertisement made has crossed any SCOT drawn here."""

# -- intersects --------------------------------------------------------------------------


def _common_publication(a: Subscription, b: Subscription) -> dict | None:
    """A publication matching both, if one exists among those made of the values that
    tell the two apart (attributes are independent in a conjunction: one attribute at a
    time, each taking a value both accept on it)."""
    values = [*_values(a, b), "absent"]
    attrs = sorted({p.attr for s in (a, b) for p in s.predicates})
    pub: dict = {}
    for attr in attrs:
        fits = [
            v
            for v in values
            if all(
                p.test(None if v == "absent" else v)
                for s in (a, b)
                for p in s.predicates
                if p.attr == attr
            )
        ]
        if not fits:
            return None
        if fits[0] != "absent":
            pub[attr] = fits[0]
    assert a.matches(pub) and b.matches(pub)
    return pub


@given(subscriptions, subscriptions)
def test_intersects_never_denies_a_common_publication(a: Subscription, b: Subscription) -> None:
    if not intersects(a, b):
        assert _common_publication(a, b) is None, (a, b)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("[x,<,5]", "[x,>=,5]", False),
        ("[x,<,5]", "[x,>,4]", True),
        ("[x,=,3]", "[x,<>,3]", False),
        ("[k,eq,'a']", "[k,eq,'b']", False),
        ("[k,eq,'ab']", "[k,str-prefix,'b']", False),
        ("[k,eq,'ab']", "[k,str-prefix,'a']", True),
        ("[k,eq,'a']", "[k,>,1]", False),
        ("[k,eq,'a']", "[x,>,1]", True),
        ("[k,isPresent]", "[k,>,1]", True),
    ],
)
def test_intersects_decides(a: str, b: str, expected: bool) -> None:
    assert intersects(parse_subscription(a), parse_subscription(b)) is expected
    assert intersects(parse_subscription(b), parse_subscription(a)) is expected


# -- the law in the simulator ------------------------------------------------------------


ADVERTS = ["[x,<,4]", "[x,>=,6]", "[k,eq,'a']", "[k,eq,'b'],[x,<,8]", "[x,>=,2],[x,<,5]"]


def _subscription_text(rng: random.Random) -> str:
    bound = rng.randint(1, 9)
    return rng.choice(
        [
            f"[x,<,{bound}]",
            f"[x,>,{bound}]",
            f"[k,eq,'{rng.choice('abc')}']",
            f"[k,eq,'{rng.choice('ab')}'],[x,>=,{bound}]",
            "[k,isPresent]",
        ]
    )


def scenario(scot: Scot, seed: int, publishers: int = 4, initial: int = 15) -> list[Op]:
    """Subscriptions over the first second, advertisements over the first 1.5 s (many
    after the subscriptions they draw), then churn and publications from 1 s to 3 s,
    each publisher publishing inside its advertisement from :data:`SETTLE` after it, and
    withdrawing it after its last publication."""
    rng = random.Random(seed)
    brokers = sorted(scot.brokers)
    ops = [
        Op(rng.uniform(0, 1), "sub", f"S{i}", rng.choice(brokers), _subscription_text(rng))
        for i in range(initial)
    ]
    live = {op.who for op in ops}
    for i in range(10):
        t = rng.uniform(1.0, 3.0)
        if live and rng.random() < 0.5:
            who = rng.choice(sorted(live))
            live.discard(who)
            ops.append(Op(max(t, 1.0), "unsub", who))
        else:
            who = f"S{initial + i}"
            ops.append(Op(t, "sub", who, rng.choice(brokers), _subscription_text(rng)))
    for j in range(publishers):
        who, broker, advert = f"P{j}", rng.choice(brokers), rng.choice(ADVERTS)
        since = rng.uniform(0, 1.5)
        ops.append(Op(since, "adv", who, broker, advert))
        times = sorted(rng.uniform(since + SETTLE, 3.0) for _ in range(8))
        a = parse_subscription(advert)
        for t in times:
            for _ in range(100):
                text = f"[x,{rng.randrange(10)}],[k,'{rng.choice('abc')}']"
                if a.matches(parse_publication(text)):
                    ops.append(Op(t, "pub", who, broker, text))
                    break
        ops.append(Op(times[-1] + 0.001, "unadv", who, broker))
    return sorted(ops, key=lambda op: (op.at, op.kind))


def run(
    scot: Scot,
    mode: str,
    advertisements: bool,
    ops: list[Op],
    congested: float = 0.0,
    failures: tuple[Failure, ...] = (),
) -> Simulator:
    links = InjectedCongestion.random_icols(scot, congested, seed=1) if congested else None
    sim = Simulator(
        scot,
        mode,
        latency=LATENCY,
        links=links,
        oracle_factory=ReferenceMatcher,
        advertisements=advertisements,
        covering="off",  # compared with the paper's SBP, which advertisements prune
    )
    for failure in failures:
        sim.fail(failure)
    return replay(sim, ops, advertisements)


def replay(sim: Simulator, ops: list[Op], advertisements: bool) -> Simulator:
    """Schedule ``ops`` on ``sim`` at their times (advertisement ops only with
    ``advertisements``) and run it to the end."""
    sub_ids: dict[str, str] = {}
    adv_ids: dict[str, str] = {}

    def act(op: Op) -> None:
        if op.kind == "sub":
            sub_ids[op.who] = sim.subscribe(op.who, op.broker, parse_subscription(op.text))
        elif op.kind == "unsub":
            sim.unsubscribe(sub_ids[op.who])
        elif op.kind == "pub":
            sim.publish(op.who, op.broker, parse_publication(op.text))
        elif advertisements and op.kind == "adv":
            adv_ids[op.who] = sim.advertise(op.who, op.broker, parse_subscription(op.text))
        elif advertisements and op.kind == "unadv":
            sim.unadvertise(op.who, adv_ids[op.who])

    for op in ops:
        sim.at(op.at, act, op)
    sim.run()
    return sim


def _sent(sim: Simulator, kind: str) -> int:
    return sum(core.counts()[f"sent.{kind}"] for core in sim.cores.values())


@settings(max_examples=sized(25, 100), deadline=None)
@given(scots(), st.sampled_from(["snr", "dnr"]), st.integers(0, 10**6), st.booleans())
def test_advertisements_change_no_delivery(
    scot: Scot, mode: str, seed: int, congested: bool
) -> None:
    ops = scenario(scot, seed)
    congestion = 0.5 if congested and mode == "dnr" else 0.0
    off = run(scot, mode, False, ops, congestion)
    on = run(scot, mode, True, ops, congestion)
    assert on.ledger.received == off.ledger.received
    assert _sent(on, "subscribe") <= _sent(off, "subscribe")
    assert _sent(on, "unsubscribe") <= _sent(off, "unsubscribe")


def test_law_holds_on_fig2_and_saves_messages() -> None:
    """On fig2, several scenarios: deliveries equal and SBP strictly cheaper overall."""
    saved = 0
    for seed in range(6):
        for mode in ("snr", "dnr"):
            ops = scenario(FIG2, seed)
            off, on = run(FIG2, mode, False, ops), run(FIG2, mode, True, ops)
            assert on.ledger.received == off.ledger.received
            assert sum(off.ledger.received.values()) > 0
            saved += _sent(off, "subscribe") - _sent(on, "subscribe")
    assert saved > 0


def test_the_law_fails_without_sending_held_subscriptions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subscription made before the advertisement that draws it must be sent when the
    advertisement arrives; without that, subscribers lose notifications."""
    monkeypatch.setattr(ClusteredBroker, "_opened", lambda self, *args: [])
    lost = 0
    for seed in range(6):
        ops = scenario(FIG2, seed)
        off, on = run(FIG2, "snr", False, ops), run(FIG2, "snr", True, ops)
        lost += sum(off.ledger.received.values()) - sum(on.ledger.received.values())
    assert lost > 0


def failure_scenario(scot: Scot, seed: int, spared: set[str]) -> list[Op]:
    """Subscriptions and advertisements before (0–1.3 s), during (1.6–2.8 s) and after
    (3.2–4 s) a failure from 1.5 s to 3 s, at brokers in ``spared`` only; publications
    from 6 s to 8 s, when every restart has been resynced; withdrawals of some
    subscriptions during the failure and of every advertisement at the end."""
    rng = random.Random(seed)
    brokers = sorted(spared)
    ops: list[Op] = []
    windows = [(0.0, 1.3), (1.6, 2.8), (3.2, 4.0)]
    for i in range(24):
        lo, hi = windows[i % 3]
        who = f"S{i}"
        ops.append(
            Op(rng.uniform(lo, hi), "sub", who, rng.choice(brokers), _subscription_text(rng))
        )
    for i in range(0, 24, 5):
        ops.append(Op(rng.uniform(1.6, 2.8), "unsub", f"S{i}"))
    for j in range(5):
        lo, hi = windows[j % 3]
        who, broker, advert = f"P{j}", rng.choice(brokers), rng.choice(ADVERTS)
        ops.append(Op(rng.uniform(lo, hi), "adv", who, broker, advert))
        a = parse_subscription(advert)
        for t in sorted(rng.uniform(6.0, 8.0) for _ in range(6)):
            for _ in range(100):
                text = f"[x,{rng.randrange(10)}],[k,'{rng.choice('abc')}']"
                if a.matches(parse_publication(text)):
                    ops.append(Op(t, "pub", who, broker, text))
                    break
        ops.append(Op(8.5, "unadv", who, broker))
    ops = [op for op in ops if not (op.kind == "unsub" and _made_after(ops, op))]
    return sorted(ops, key=lambda op: (op.at, op.kind))


def _made_after(ops: list[Op], withdrawal: Op) -> bool:
    return any(o.kind == "sub" and o.who == withdrawal.who and o.at >= withdrawal.at for o in ops)


@pytest.mark.parametrize("mode", ["snr", "dnr"])
@pytest.mark.parametrize("seed", range(4))
def test_a_restarted_broker_gets_the_advertisements_and_subscriptions_it_needs(
    mode: str, seed: int
) -> None:
    """A broker of fig2 killed at 1.5 s and restarted at 3 s (empty), or a link cut
    meanwhile, while subscriptions and advertisements are made and withdrawn elsewhere:
    afterwards every subscriber gets what it gets with advertisements off (the restarted
    broker's neighbours hand it their advertisements and the subscriptions they sent it,
    and it passes its cluster's on toward the advertisements it holds)."""
    rng = random.Random(seed)
    brokers = sorted(FIG2.brokers)
    victim = rng.choice(brokers)
    neighbour = rng.choice(sorted(FIG2.graph[victim]))
    for failure in (Failure((victim,), 1.5, 3.0), Failure((victim, neighbour), 1.5, 3.0)):
        spared = set(brokers) - set(failure.ends)
        ops = failure_scenario(FIG2, seed, spared)
        off = run(FIG2, mode, False, ops, failures=(failure,))
        on = run(FIG2, mode, True, ops, failures=(failure,))
        assert sum(off.ledger.received.values()) > 0
        assert on.ledger.received == off.ledger.received, (failure, victim)
        assert on.ledger.received == Counter(dict.fromkeys(off.ledger.expected, 1))


@settings(max_examples=sized(15, 60), deadline=None)
@given(scots(), st.sampled_from(["snr", "dnr"]), st.integers(0, 10**6), st.booleans())
def test_restarts_and_cuts_on_random_scots_change_no_delivery(
    scot: Scot, mode: str, seed: int, cut: bool
) -> None:
    """The law of the restart test above on random SCOTs: a random broker killed and
    restarted, or a random link cut and restored, amid subscriptions and
    advertisements."""
    rng = random.Random(seed)
    brokers = sorted(scot.brokers)
    victim = rng.choice(brokers)
    ends = (victim, rng.choice(sorted(scot.graph[victim]))) if cut else (victim,)
    failure = Failure(ends, 1.5, 3.0)
    spared = set(brokers) - set(ends)
    if not spared:
        return
    ops = failure_scenario(scot, seed, spared)
    off = run(scot, mode, False, ops, failures=(failure,))
    on = run(scot, mode, True, ops, failures=(failure,))
    assert on.ledger.received == off.ledger.received, failure


def test_the_restart_law_fails_without_handing_advertisements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the advertisements in a restarted broker's shares, it holds subscriptions
    back from directions that have publishers, and subscribers lose notifications."""
    monkeypatch.setattr(recovery, "advertisement_share", lambda core, restarted: [])
    lost = 0
    for seed in range(8):
        rng = random.Random(seed)
        brokers = sorted(FIG2.brokers)
        victim = rng.choice(brokers)
        failure = Failure((victim,), 1.5, 3.0)
        ops = failure_scenario(FIG2, seed, set(brokers) - {victim})
        off = run(FIG2, "snr", False, ops, failures=(failure,))
        on = run(FIG2, "snr", True, ops, failures=(failure,))
        lost += sum(off.ledger.received.values()) - sum(on.ledger.received.values())
    assert lost > 0


# -- unit behaviour ----------------------------------------------------------------------


def test_subscription_goes_only_toward_an_advertised_publisher() -> None:
    """On fig2 under SNR a subscription with no advertisement anywhere stays at its host;
    one advertisement draws it along one path, then its withdrawal goes the same way."""
    sim = Simulator(FIG2, "snr", latency=LATENCY, advertisements=True)
    brokers = sorted(FIG2.brokers)
    host, far = brokers[0], brokers[-1]
    sub_id = sim.subscribe("S", host, parse_subscription("[x,<,5]"))
    sim.run()
    assert [b for b, c in sim.cores.items() if sub_id in c.table.entries] == [host]
    sim.advertise("P", far, parse_subscription("[x,<,3]"))
    sim.advertise("Q", far, parse_subscription("[x,>,7]"))
    sim.run()
    holding = {b for b, c in sim.cores.items() if sub_id in c.table.entries}
    assert host in holding and far in holding and len(holding) < len(brokers)
    sim.publish("P", far, {"x": 1})
    sim.run()
    assert sim.ledger.received[("S", "P", 1)] == 1
    sim.unsubscribe(sub_id)
    sim.run()
    assert not any(sub_id in c.table.entries for c in sim.cores.values())


def test_every_broker_holds_an_advertisement_once_and_its_withdrawal_clears_it() -> None:
    sim = Simulator(FIG2, "dnr", latency=LATENCY, advertisements=True)
    broker = sorted(FIG2.brokers)[3]
    adv_id = sim.advertise("P", broker, parse_subscription("[x,<,3]"))
    sim.run()
    held = [c for c in sim.cores.values() if adv_id in c.advertising.entries]
    assert len(held) == len(FIG2.brokers)
    assert _sent(sim, "advertise") == len(FIG2.brokers) - 1
    sim.unadvertise("P", adv_id)
    sim.run()
    assert not any(c.advertising.entries for c in sim.cores.values())


def test_publication_outside_the_advertisement_is_refused() -> None:
    sim = Simulator(FIG2, "snr", latency=LATENCY, advertisements=True)
    broker = sorted(FIG2.brokers)[0]
    with pytest.raises(UnadvertisedPublication, match="advertise"):
        sim.publish("P", broker, {"x": 1})
    sim.advertise("P", broker, parse_subscription("[x,<,3]"))
    sim.publish("P", broker, {"x": 1})
    with pytest.raises(UnadvertisedPublication, match="outside every advertisement"):
        sim.publish("P", broker, {"x": 4})


def test_advertisements_go_with_covering_and_not_with_bid() -> None:
    both = make_broker(FIG2, sorted(FIG2.brokers)[0], "snr", covering="active", advertisements=True)
    assert isinstance(both, ClusteredBroker)
    assert both.covering is not None and both.advertising is not None
    with pytest.raises(ValueError, match="mode snr or dnr"):
        make_broker(FIG2, sorted(FIG2.brokers)[0], "bid", advertisements=True)
    core = make_broker(FIG2, sorted(FIG2.brokers)[0], "snr")
    assert isinstance(core, ClusteredBroker)
    with pytest.raises(ProtocolError, match="advertisements = on"):
        core.advertise("P", parse_subscription("[x,<,3]"))


def test_the_setting_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(BrokerSettings(routing=Routing(advertisements="on")).to_toml(changed_only=True))
    assert "advertisements = " in path.read_text()
    assert load_settings(path).routing.advertisements == "on"
    assert BrokerSettings().routing.advertisements == "off"
    # covering is active by default, with advertisements on or off
    assert (BrokerSettings().routing.covering, load_settings(path).routing.covering) == (
        "active",
        "active",
    )
    assert (
        BrokerSettings(routing=Routing(covering="active", advertisements="on")).routing.covering
        == "active"
    )
    assert Simulator(FIG2, "snr", advertisements=True).covering == "active"
    assert Simulator(FIG2, "snr").covering == "active"


# -- on broker processes -----------------------------------------------------------------


@pytest.fixture
def fig2_advertising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    yield from secure_fig2(
        tmp_path, monkeypatch, BrokerSettings(routing=Routing(advertisements="on"))
    )


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_fig2_processes_route_subscriptions_toward_advertisers(
    fig2_advertising: LocalCluster,
) -> None:
    """fig2 under DNR with advertisements on: a subscription at c:0 stays in cluster 0's
    tree until a publisher at a:1 advertises; then it reaches a:1 (SECONDARY), and only
    there outside cluster 0 (7 entries, not 18). A publication before the advertisement,
    or outside it, is refused with UnadvertisedError; one inside is delivered once."""
    cluster = fig2_advertising
    scot = cluster.scot
    received: Counter[int] = Counter()

    async def sizes() -> dict[str, int]:
        stats = await cluster.call_all("stats")
        return {b: s["routing_table_size"] for b, s in stats.items()}

    async def total(entries: int) -> bool:
        return sum((await sizes()).values()) == entries

    async def scenario() -> tuple[dict[str, int], list[str]]:
        sub = await Subscriber.connect(
            scot.client_endpoints("c:0"), "s", on_notification=lambda n: received.update([n.seq])
        )
        await sub.subscribe("[class,eq,'STOCK'],[price,<,5]")
        await until(lambda: total(6), "the subscription spreads in cluster 0", 20)
        pub = await Publisher.connect(scot.client_endpoints("a:1"), "p")
        refused = []
        with pytest.raises(UnadvertisedError) as before:
            await pub.publish({"class": "STOCK", "price": 1.0})
        refused.append(str(before.value))
        await pub.advertise("[class,eq,'STOCK']")
        await until(lambda: total(7), "the subscription reaches a:1", 20)
        seq = await pub.publish({"class": "STOCK", "price": 1.0})
        with pytest.raises(UnadvertisedError) as outside:
            await pub.publish({"class": "BOND", "price": 1.0})
        refused.append(str(outside.value))
        await until(lambda: received[seq] > 0, "the delivery", 20)
        await asyncio.sleep(0.5)
        held = await sizes()
        await pub.close()
        await sub.close()
        return held, refused

    held, refused = asyncio.run(closing_control(cluster, scenario()))
    assert sum(held.values()) == 7 and held["a:1"] == 1 and held["a:2"] == 0, held
    assert all("advertise" in text for text in refused), refused
    assert sum(received.values()) == 1


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_a_publisher_that_fails_over_advertises_again(fig2_advertising: LocalCluster) -> None:
    """fig2 (DNR), advertisements on: the publisher at c:0 publishes until the subscriber at
    a:0 has one (before that, a publication may precede the subscription's spread to c:0
    and match nothing: a probe, delivered at most once); then c:0 is killed, its
    connection fails over to b:0, advertises there again before it sends its
    unacknowledged publications, and every publication made after the first delivery
    reaches the subscriber exactly once: expected, delivered, duplicated and lost."""
    cluster = fig2_advertising
    scot = cluster.scot
    received: Counter[int] = Counter()

    async def scenario() -> tuple[list[int], list[int], Publisher]:
        sub = await Subscriber.connect(
            scot.client_endpoints("a:0"), "s", on_notification=lambda n: received.update([n.seq])
        )
        await sub.subscribe("[class,eq,'STOCK']")
        pub = await Publisher.connect(scot.client_endpoints("c:0"), "p")
        await pub.advertise("[class,eq,'STOCK']")
        probes: list[int] = []

        async def publish_one() -> bool:
            probes.append(await pub.publish({"class": "STOCK", "price": 1.0}, timeout=30))
            return bool(received)

        await until(publish_one, "first delivery", 20)
        os.kill(cluster.processes["c:0"].pid, signal.SIGKILL)
        after: list[int] = []
        for _ in range(40):
            after.append(await pub.publish({"class": "STOCK", "price": 2.0}, timeout=30))
            await asyncio.sleep(0.02)
        try:
            await until(lambda: all(received[s] for s in after), "every delivery", 30)
        except AssertionError as missed:
            missing = [s for s in after if not received[s]]
            raise AssertionError(
                f"{missed}: {len(missing)} of {len(after)} never came, seqs {missing} "
                f"(received {sorted(received)}; publisher's outages {pub.connection.outages})"
            ) from None
        await asyncio.sleep(0.5)  # a repeat would arrive meanwhile
        await sub.close()
        await pub.close()
        return probes, after, pub

    probes, after, pub = asyncio.run(closing_control(cluster, scenario()))
    counts = accounting("s", len(after), Counter({s: received[s] for s in after if received[s]}))
    print(f"probes {len(probes)}, deliveries of them {sum(received[s] for s in probes)}")
    assert pub.connection.outages and pub.connection.outages[0]["to"] == (
        scot.brokers["b:0"].client_endpoint
    )
    assert counts["delivered"] == counts["expected"] == 40, counts
    assert counts["lost"] == counts["duplicates"] == 0, counts
    assert set(received) <= set(probes) | set(after) and max(received.values()) == 1, received
