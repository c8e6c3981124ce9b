"""Covering and advertisements together (DESIGN §12): with ``covering = active`` and
``advertisements = on`` every subscriber gets exactly what it gets with both off (the
paper's SBP), under subscribe/withdraw churn (the broadest subscription withdrawn first
among others), advertisements made before and after the subscriptions they draw, and a
broker killed and restarted; SBP sends no more messages than with either alone, and
fewer somewhere. Without un-quenching, or without sending held-back subscriptions when an
advertisement arrives, subscribers lose notifications."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from laws import scots, sized
from test_advertisements import ADVERTS, LATENCY, SETTLE, Op, replay
from test_covering_laws import _subscription_text, churn_ops

from octopis.core.clustered import ClusteredBroker
from octopis.failure_schedule import Failure
from octopis.filters.language import parse_publication, parse_subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import Simulator
from octopis.topology import Scot, build_preset

FIG2 = build_preset("fig2")
FAILURE = (1.5, 3.0)
"""When the victim of a failure scenario dies and restarts (seconds)."""


def scenario(
    scot: Scot, seed: int, *, victim: str | None = None, initial: int = 15, churn: int = 20
) -> list[Op]:
    """``initial`` subscriptions over the first second (test_covering_laws' texts, which
    often cover one another), then ``churn`` subscriptions and withdrawals from 1 s to
    4.5 s, half of the withdrawals taking the live subscription that covers the most
    others; four publishers advertise at random in the first two seconds (many after the
    subscriptions they draw), publish inside their advertisement from 2 s (from 5 s with
    a ``victim``, once its restart is resynced) to 7 s and withdraw it at 7.5 s. No
    client is on ``victim``, which dies and restarts at :data:`FAILURE`."""
    rng = random.Random(seed)
    brokers = sorted(b for b in scot.brokers if b != victim)
    ops = [Op(rng.uniform(0, 1), "sub", f"S{i}", rng.choice(brokers), _subscription_text(rng))
           for i in range(initial)]  # fmt: skip
    ops += churn_ops(rng, brokers, ops, sorted(rng.uniform(1.0, 4.5) for _ in range(churn)))
    first = 5.0 if victim is not None else 2.0
    for j in range(4):
        who, broker, advert = f"P{j}", rng.choice(brokers), rng.choice(ADVERTS)
        ops.append(Op(rng.uniform(0, 2.0), "adv", who, broker, advert))
        a = parse_subscription(advert)
        for t in sorted(rng.uniform(first, 7.0) for _ in range(10)):
            for _ in range(100):
                text = f"[x,{rng.randrange(10)}],[k,'{rng.choice(['a', 'ab', 'b'])}']"
                if a.matches(parse_publication(text)):
                    ops.append(Op(t, "pub", who, broker, text))
                    break
        ops.append(Op(7.5, "unadv", who, broker))
    return sorted(ops, key=lambda op: (op.at, op.kind))


def run(
    scot: Scot,
    mode: str,
    ops: list[Op],
    *,
    covering: bool,
    advertisements: bool,
    victim: str | None = None,
    unquench: bool = True,
) -> Simulator:
    """Carry out ``ops`` with covering and advertisements as told (``victim`` killed and
    restarted at :data:`FAILURE`; ``unquench`` False: covering's withdrawals send nothing
    in their place)."""
    sim = Simulator(
        scot,
        mode,
        latency=LATENCY,
        oracle_factory=ReferenceMatcher,
        covering="active" if covering else "off",
        advertisements=advertisements,
    )
    for core in sim.cores.values():
        core.unquench = unquench  # type: ignore[union-attr]
    if victim is not None:
        sim.fail(Failure((victim,), *FAILURE))
    return replay(sim, ops, advertisements)


def racing(ops: list[Op]) -> set[tuple[str, str, int]]:
    """(subscriber, publisher, seq) of publications made within :data:`SETTLE` of one of
    the subscriber's subscriptions or withdrawals: a race either run may decide either
    way (a covering subscription may serve a fresh one before its own entry spreads)."""
    seq: Counter[str] = Counter()
    published = []
    for op in ops:
        if op.kind == "pub":
            seq[op.who] += 1
            published.append((op.who, seq[op.who], op.at))
    changes: dict[str, list[float]] = {}
    for op in ops:
        if op.kind in ("sub", "unsub"):
            changes.setdefault(op.who, []).append(op.at)
    return {
        (who, p, q)
        for p, q, at in published
        for who, times in changes.items()
        if any(abs(at - t) < SETTLE for t in times)
    }


def law(both: Simulator, neither: Simulator, ops: list[Op]) -> None:
    """``both`` (covering and advertisements) delivers what ``neither`` delivers, each
    delivery once, but in a race (:func:`racing`); and ``neither`` delivers exactly what
    the oracle expects of the publications outside races."""
    races = racing(ops)

    def settled(received: Counter) -> Counter:
        return Counter({k: n for k, n in received.items() if k not in races})

    expected = {k for k in neither.ledger.expected if k not in races}
    assert settled(neither.ledger.received) == Counter(dict.fromkeys(expected, 1))
    assert both.ledger.summary()["duplicates"] == 0, both.ledger.summary()
    got, want = settled(both.ledger.received), settled(neither.ledger.received)
    lost, extra = want - got, got - want
    assert not lost and not extra, f"lost {sorted(lost)[:5]}, extra {sorted(extra)[:5]}"


def _sbp(sim: Simulator) -> int:
    return sim.report()["sbp_messages"]


@settings(max_examples=sized(15, 60), deadline=None)
@given(scots(), st.sampled_from(["snr", "dnr"]), st.integers(0, 2**16), st.booleans())
def test_covering_with_advertisements_delivers_what_the_papers_sbp_delivers(
    scot: Scot, mode: str, seed: int, fail: bool
) -> None:
    """Random SCOTs, SNR and DNR, churn, advertisements before and after the
    subscriptions they draw, and (``fail``) a random broker killed mid-churn and
    restarted: covering with advertisements delivers what both off deliver."""
    victim = random.Random(seed).choice(sorted(scot.brokers)) if fail else None
    if victim is not None and len(scot.brokers) == 1:
        victim = None
    ops = scenario(scot, seed, victim=victim)
    neither = run(scot, mode, ops, covering=False, advertisements=False, victim=victim)
    both = run(scot, mode, ops, covering=True, advertisements=True, victim=victim)
    law(both, neither, ops)


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_every_restart_of_fig2_with_covering_and_advertisements(mode: str) -> None:
    """Every broker of fig2 killed mid-churn and restarted: its neighbours hand it their
    advertisements and what the combined rule sends it, it passes its cluster's on, and
    every subscriber gets what it gets with both off. (At the quick size, ``sized``,
    every third broker.)"""
    passed_on = 0
    for victim in sorted(FIG2.brokers)[:: sized(3, 1)]:
        ops = scenario(FIG2, 5, victim=victim)
        neither = run(FIG2, mode, ops, covering=False, advertisements=False, victim=victim)
        both = run(FIG2, mode, ops, covering=True, advertisements=True, victim=victim)
        law(both, neither, ops)
        assert sum(both.ledger.received.values()) > 0
        assert both.report()["failures"]["resync_advertisements_sent"] > 0, victim
        passed_on += both.cores[victim].stats["sent.subscribe"]
    assert passed_on > 0


def test_together_sbp_costs_no_more_than_either_alone() -> None:
    """fig2, twelve scenarios: the deliveries of all four settings agree, and SBP
    messages with both are at most those with either alone, summed, and fewer than
    either in some scenario."""
    totals: Counter[str] = Counter()
    fewer = 0
    for seed in range(6):
        for mode in ("snr", "dnr"):
            ops = scenario(FIG2, seed)
            neither = run(FIG2, mode, ops, covering=False, advertisements=False)
            runs = {
                "covering": run(FIG2, mode, ops, covering=True, advertisements=False),
                "advertisements": run(FIG2, mode, ops, covering=False, advertisements=True),
                "both": run(FIG2, mode, ops, covering=True, advertisements=True),
            }
            for name, sim in runs.items():
                law(sim, neither, ops)
                totals[name] += _sbp(sim)
            sbp = {name: _sbp(sim) for name, sim in runs.items()}
            fewer += sbp["both"] < min(sbp["covering"], sbp["advertisements"])
    assert totals["both"] <= totals["covering"] and totals["both"] <= totals["advertisements"]
    assert fewer > 0, totals


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_without_unquenching_the_law_fails(mode: str) -> None:
    """Withdrawals that do not send what they covered in their place (what is drawn
    over the link) leave the brokers beyond without either: the law finds the losses."""
    for seed in range(3):
        ops = scenario(FIG2, seed, initial=40, churn=40)
        neither = run(FIG2, mode, ops, covering=False, advertisements=False)
        both = run(FIG2, mode, ops, covering=True, advertisements=True)
        law(both, neither, ops)
        assert sum(c.stats["covering.unquenched"] for c in both.cores.values()) > 0
        broken = run(FIG2, mode, ops, covering=True, advertisements=True, unquench=False)
        with pytest.raises(AssertionError, match="lost"):
            law(broken, neither, ops)


def test_without_releasing_held_subscriptions_the_law_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An advertisement arriving after the subscriptions it draws must send them (the
    broadest, the rest quenched); without that, subscribers lose notifications."""
    runs = []
    for seed in range(3):
        for mode in ("snr", "dnr"):
            ops = scenario(FIG2, seed)
            neither = run(FIG2, mode, ops, covering=False, advertisements=False)
            law(run(FIG2, mode, ops, covering=True, advertisements=True), neither, ops)
            runs.append((mode, ops, neither))
    monkeypatch.setattr(ClusteredBroker, "_opened", lambda self, *args: [])
    for mode, ops, neither in runs:
        with pytest.raises(AssertionError, match="lost"):
            law(run(FIG2, mode, ops, covering=True, advertisements=True), neither, ops)


def test_an_advertisement_sends_the_broadest_of_what_it_draws() -> None:
    """fig2, SNR: three subscriptions at a:0, one covering the others, held back while no
    publisher advertises; an advertisement at f:0 draws all three, and only the broadest
    leaves a:0 (the others quenched); withdrawn, it is replaced by both narrower ones
    before its withdrawal, toward f:0 only, and a publication from f:0 still reaches
    them."""
    sim = Simulator(FIG2, "snr", latency=LATENCY, covering="active", advertisements=True)
    broad = sim.subscribe("broad", "a:0", parse_subscription("[x,<,9]"))
    narrow = [sim.subscribe(f"n{b}", "a:0", parse_subscription(f"[x,<,{b}]")) for b in (3, 5)]
    sim.run()
    assert [b for b, c in sim.cores.items() if len(c.table)] == ["a:0"]
    sim.advertise("P", "f:0", parse_subscription("[x,>=,0]"))
    sim.run()
    holding = {b for b, c in sim.cores.items() if broad in c.table}
    assert "f:0" in holding and len(holding) < len(FIG2.brokers)
    assert not any(n in c.table for b, c in sim.cores.items() if b != "a:0" for n in narrow)
    assert sim.cores["a:0"].stats["covering.quenched"] >= 2
    sim.unsubscribe(broad)
    sim.run()
    assert {b for b, c in sim.cores.items() if narrow[1] in c.table} == holding
    assert sim.cores["a:0"].stats["covering.unquenched"] == 1  # [x,<,5] covers [x,<,3]
    sim.publish("P", "f:0", {"x": 1})
    sim.run()
    assert sim.ledger.received == Counter({("n3", "P", 1): 1, ("n5", "P", 1): 1})
