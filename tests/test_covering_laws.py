"""Covering laws in the simulator (DESIGN §12): with ``covering = active`` every
subscriber gets what it gets with covering off, under subscribe/withdraw churn (covering
subscriptions withdrawn first among others), with failures and restarts; SBP costs fewer
messages and tables hold fewer entries; and without un-quenching (a withdrawal sending
the subscriptions it covered in its place) subscribers lose notifications."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import networkx as nx
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from laws import scots, sized
from sim_scenarios import changed_scot
from test_failures import _failures

from octopis.core import ProtocolError, Subscribe, make_broker
from octopis.failure_schedule import Failure
from octopis.filters.covering import covers
from octopis.filters.language import parse_publication, parse_subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import InjectedCongestion, LatencyModel, Simulator
from octopis.topology import Scot, build_preset, build_scot

FIG2 = build_preset("fig2")
LATENCY = LatencyModel(0.001, 0.0)
"""Every hop takes 1 ms: the two runs' notifications take the same paths at the same
times, whatever subscription messages covering saves."""
SETTLE = 0.05
"""Seconds after which a subscription made or withdrawn has crossed any SCOT the laws
draw (a hop is 1 ms)."""


@dataclass(frozen=True)
class Op:
    """One step of a scenario at ``at`` seconds: ``sub`` (``who`` subscribes ``text`` at
    ``broker``), ``unsub`` (``who`` withdraws its subscription), ``pub`` (``who``
    publishes ``text`` at ``broker``), ``adv``/``unadv`` (publisher ``who`` at ``broker``
    advertises ``text``, or withdraws it)."""

    at: float
    kind: str
    who: str
    broker: str = ""
    text: str = ""


def _subscription_text(rng: random.Random) -> str:
    """Subscriptions that often cover one another: bounds on ``x``, a symbol ``k``."""
    bound = rng.randint(1, 9)
    shape = rng.randrange(5)
    if shape == 0:
        return f"[x,<,{bound}]"
    if shape == 1:
        return f"[k,eq,'{rng.choice('ab')}'],[x,<,{bound}]"
    if shape == 2:
        return f"[x,>=,{rng.randint(0, bound - 1)}],[x,<,{bound}]"
    if shape == 3:
        return f"[k,str-prefix,'a'],[x,<=,{bound}]"
    return "[k,isPresent]" if rng.random() < 0.5 else f"[x,>,{bound}]"


def churn_ops(
    rng: random.Random, brokers: list[str], made: list[Op], times: list[float]
) -> list[Op]:
    """At each of ``times``, a new subscription or (half the time, while any is live) a
    withdrawal, after the subscriptions ``made``: half of the withdrawals take the live
    subscription covering the most others, the rest a random one."""
    live = {op.who: op.text for op in made if op.kind == "sub"}
    count = len(live)
    ops: list[Op] = []
    for t in times:
        if live and rng.random() < 0.5:
            if rng.random() < 0.5:
                texts = {w: parse_subscription(text) for w, text in live.items()}
                who = max(
                    sorted(texts), key=lambda w: sum(covers(texts[w], s) for s in texts.values())
                )
            else:
                who = rng.choice(sorted(live))
            ops.append(Op(t, "unsub", who))
            del live[who]
        else:
            who = f"S{count}"
            count += 1
            live[who] = _subscription_text(rng)
            ops.append(Op(t, "sub", who, rng.choice(brokers), live[who]))
    return ops


def scenario(scot: Scot, seed: int, *, initial: int = 20, churn: int = 30) -> list[Op]:
    """``initial`` subscribers at time 0, then over five seconds ``churn`` subscriptions
    and withdrawals (half of the withdrawals take a live subscription covering the most
    others) among 50 publications from random brokers."""
    rng = random.Random(seed)
    brokers = sorted(scot.brokers)
    ops = [Op(0.0, "sub", f"S{i}", rng.choice(brokers), _subscription_text(rng))
           for i in range(initial)]  # fmt: skip
    start = 1.0
    times = sorted(rng.uniform(start, start + 5.0) for _ in range(churn))
    ops += churn_ops(rng, brokers, ops, times)
    for j in range(50):
        broker = rng.choice(brokers)
        x, k = rng.randrange(10), rng.choice(["a", "ab", "b"])
        ops.append(Op(start + 5.0 * j / 50, "pub", f"P{broker}", broker, f"[x,{x}],[k,'{k}']"))
    return sorted(ops, key=lambda op: op.at)


def run(
    scot: Scot,
    mode: str,
    covering: str,
    ops: list[Op],
    failures: list[Failure] = (),
    clients: list[tuple[str, float]] = (),
    *,
    unquench: bool = True,
    congested: float = 0.0,
    until: float = math.inf,
) -> Simulator:
    """Carry out ``ops`` (and ``failures``, ``clients``' connection failures, from time
    1) in the simulator. A subscriber on a dead broker, cut off from its broker or
    failed over elsewhere neither subscribes nor withdraws (the simulator's clients
    withdraw only where they first subscribed), the same in either run. ``congested``:
    that share of the iCOLs overloaded all along (DNR's detours, the same in either run).
    ``until``: a horizon in simulated seconds (the run ends by itself before it)."""
    links = InjectedCongestion.random_icols(scot, congested, seed=1) if congested else None
    sim = Simulator(
        scot,
        mode,
        latency=LATENCY,
        links=links,
        oracle_factory=ReferenceMatcher,
        covering=covering,
    )
    for core in sim.cores.values():
        core.unquench = unquench  # type: ignore[union-attr]
    for failure in failures:
        sim.fail(failure, 1.0)
    for subscriber, at in clients:
        sim.fail_client(subscriber, 1.0 + at)

    def dead(broker: str) -> bool:
        return sim.failures is not None and broker in sim.failures.dead

    def subscribe(op: Op) -> None:
        if not dead(op.broker):
            sim.subscribe(op.who, op.broker, parse_subscription(op.text))

    def unsubscribe(op: Op) -> None:
        home = sim._home.get(op.who)
        held = [
            sid
            for sid, s in sim.subscriber_of.items()
            if s == op.who and home is not None and not dead(home)
            and (entry := sim.cores[home].table.entries.get(sid)) is not None and entry.local
        ]  # fmt: skip
        if held and (op.who, home) not in sim.cut_clients and op.who not in sim.failed_over:
            sim.unsubscribe(held[0])

    def publish(op: Op) -> None:
        sim.publish(op.who, op.broker, parse_publication(op.text))

    act = {"sub": subscribe, "unsub": unsubscribe, "pub": publish}
    for op in ops:
        sim.at(op.at, act[op.kind], op)
    sim.run(until)
    return sim


def _published(ops: list[Op]) -> dict[tuple[str, int], tuple[float, str]]:
    """(publisher, seq) → (time, text) of each publication of ``ops``."""
    seq: dict[str, int] = {}
    out = {}
    for op in ops:
        if op.kind == "pub":
            seq[op.who] = seq.get(op.who, 0) + 1
            out[(op.who, seq[op.who])] = (op.at, op.text)
    return out


def fresh(ops: list[Op]) -> set[tuple[str, str, int]]:
    """(subscriber, publisher, seq) of the publications made within :data:`SETTLE` of
    one of the subscriber's subscriptions or withdrawals: a race either run may decide
    either way (a copy routed before a subscription spread, or delivered by a host that
    took it after the publication)."""
    changes: dict[str, list[float]] = {}
    for op in ops:
        if op.kind in ("sub", "unsub"):
            changes.setdefault(op.who, []).append(op.at)
    return {
        (who, p, q)
        for (p, q), (at, _) in _published(ops).items()
        for who, times in changes.items()
        if any(abs(at - t) < SETTLE for t in times)
    }


def late(ops: list[Op]) -> set[tuple[str, str, int]]:
    """(subscriber, publisher, seq) where the subscriber subscribed, to a subscription the
    publication matches, after it was published (or :data:`SETTLE` before)."""
    made = {op.who: (op.at, parse_subscription(op.text)) for op in ops if op.kind == "sub"}
    return {
        (who, p, q)
        for (p, q), (at, text) in _published(ops).items()
        for who, (since, subscription) in made.items()
        if since > at - SETTLE and subscription.matches(parse_publication(text))
    }


def settled(ops: list[Op]) -> set[tuple[str, str, int]]:
    """The deliveries owed by subscriptions at least :data:`SETTLE` old when published
    and not withdrawn before :data:`SETTLE` after: (subscriber, publisher, seq)."""
    since: dict[str, tuple[float, str]] = {}
    until: dict[str, float] = {}
    for op in ops:
        if op.kind == "sub":
            since[op.who] = (op.at, op.text)
        elif op.kind == "unsub":
            until[op.who] = op.at
    owed = set()
    for (p, q), (t, text) in _published(ops).items():
        pub = parse_publication(text)
        for who, (at, sub) in since.items():
            live = at + SETTLE <= t and until.get(who, float("inf")) > t + SETTLE
            if live and parse_subscription(sub).matches(pub):
                owed.add((who, p, q))
    return owed


def once(sim: Simulator, ops: list[Op]) -> None:
    """Nothing twice; nothing the oracle did not expect, but in a race (:func:`fresh`)."""
    summary = sim.ledger.summary()
    assert summary["duplicates"] == 0, summary
    unexpected = set(sim.ledger.received) - sim.ledger.expected - fresh(ops)
    assert not unexpected, f"{sim.covering}: unexpected {sorted(unexpected)[:5]}"


def accounted(sim: Simulator, key: tuple[str, str, int]) -> bool:
    """A missing delivery a failure explains: counted undeliverable, or published
    while its subscriber was failing over (a replay's to give) and the replay reported
    a gap (as tests/test_failures.py's law)."""
    s, p, q = key
    if sim.replay_gaps.get(s):
        return True
    published = {(n.publisher, n.seq): n.published_at for ns in sim.stores.values() for n in ns}
    away = any(a <= published.get((p, q), -1.0) < b for a, b in sim.outages.get(s, ()))
    return not away and (p, q) in sim.undeliverable_keys


def law(on: Simulator, off: Simulator | None, ops: list[Op]) -> None:
    """Covering on gets every delivery covering off gets that the oracle expects (of the
    publications both runs took), or a failure in its own run explains the miss; each
    once; and nothing the oracle did not expect but a copy reaching a matching
    subscription made after it was published (:func:`late`: a copy held for a link's
    return, or a race), in either run. ``off`` None: only the latter, for covering."""
    for sim in (on,) if off is None else (on, off):
        summary = sim.ledger.summary()
        assert summary["duplicates"] == 0, (sim.covering, summary)
        unexpected = set(sim.ledger.received) - sim.ledger.expected - late(ops)
        assert not unexpected, f"{sim.covering}: unexpected {sorted(unexpected)[:5]}"
    if off is None:
        return
    taken = {(n.publisher, n.seq) for ns in on.stores.values() for n in ns}
    missing = [
        key
        for key in set(off.ledger.received) & on.ledger.expected
        if key not in on.ledger.received
        and (not on.stores or key[1:] in taken)
        and not accounted(on, key)
    ]
    assert not missing, f"covering lost {len(missing)}: {sorted(missing)[:5]}"


@given(
    scots(),
    st.sampled_from(["snr", "dnr"]),
    st.integers(0, 2**16),
    st.sampled_from([0.0, 0.0, 0.3, 1.0]),
)
def test_covering_delivers_what_flooding_delivers_under_churn(
    scot: Scot, mode: str, seed: int, congested: float
) -> None:
    """No failures (DNR under congestion too): both runs deliver exactly the oracle's
    deliveries of settled subscriptions, the same ones, and covering delivers nothing
    else that flooding does not (a fresh subscription may be served sooner, by a
    covering one, never later); covering sends fewer or as many subscription messages."""
    ops = scenario(scot, seed)
    congested = congested if mode == "dnr" else 0.0
    off = run(scot, mode, "off", ops, congested=congested)
    on = run(scot, mode, "active", ops, congested=congested)
    owed = settled(ops)
    for sim in (off, on):
        once(sim, ops)
        lost = owed - set(sim.ledger.received)
        assert not lost, f"{sim.covering}: {len(lost)} settled deliveries lost {sorted(lost)[:5]}"
    law(on, off, ops)
    assert on.report()["sbp_messages"] <= off.report()["sbp_messages"] + sum(
        c.stats["covering.unquenched"] for c in on.cores.values()
    )


@given(scots(), st.sampled_from(["snr", "dnr"]), st.integers(0, 2**16), st.data())
def test_covering_delivers_what_flooding_delivers_with_failures(
    scot: Scot, mode: str, seed: int, data: st.DataObject
) -> None:
    """One to three failures of brokers (killed, restarted or not), links (cut, healed
    or not) and subscribers' connections, at any time, under the same churn: covering
    loses nothing flooding delivers, or its own run counts why."""
    ops = scenario(scot, seed, initial=15, churn=20)
    failures, clients = _failures(scot, data.draw, data.draw(st.integers(1, 3)), 15)
    try:
        off: Simulator | None = run(scot, mode, "off", ops, failures, clients)
    except ProtocolError:
        # Without covering, a subscription message lost in flight on a link as it is cut
        # leaves the receiver without the entry its withdrawal names (covering sends
        # what went over a link again when it is back, and ignores such a withdrawal).
        off = None
        event("flooding lost a subscription message on a cut link")
    on = run(scot, mode, "active", ops, failures, clients)
    law(on, off, ops)


def test_a_link_cut_for_good_beside_a_dead_broker_ends_the_run() -> None:
    """The example the law above once drew that never ended (seed 971, SNR, 2 × 2
    brokers): r1:0 killed and the link r0:0–r0:1 cut, both for good, at once. r0:1's
    heartbeat timer went on for ever on the cut link (what r0:0 kept pending for it
    stayed unacknowledged: no heartbeat crosses a cut whose connection aborted); it
    stops at the abort. Both runs end well before the horizon, and the law holds."""
    scot = build_scot(nx.Graph([("r0", "r1")]), 2)
    ops = scenario(scot, 971, initial=15, churn=20)
    failures = [Failure(("r1:0",), 3.857, None), Failure(("r0:0", "r0:1"), 3.857, None)]
    off = run(scot, "snr", "off", ops, failures, until=600.0)
    on = run(scot, "snr", "active", ops, failures, until=600.0)
    for sim in (off, on):
        assert sim.events.pending() == 0, f"{sim.covering}: still running at 600 s"
    law(on, off, ops)


def _stock(scot: Scot, seed: int) -> list[Op]:
    return scenario(scot, seed, initial=60, churn=60)


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_without_unquenching_subscribers_lose_notifications(mode: str) -> None:
    """The same churn with a withdrawal that does not send the subscriptions it covered
    in its place: the brokers beyond it hold neither, and the law finds the losses."""
    ops = _stock(FIG2, 7)
    off = run(FIG2, mode, "off", ops)
    on = run(FIG2, mode, "active", ops)
    law(on, off, ops)
    broken = run(FIG2, mode, "active", ops, unquench=False)
    assert sum(c.stats["covering.unquenched"] for c in on.cores.values()) > 0
    with pytest.raises(AssertionError, match="covering lost"):
        law(broken, off, ops)


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_every_restart_of_fig2_under_covering(mode: str) -> None:
    """Every broker of fig2 killed mid-churn and restarted: its neighbours hand it what
    covering sends now, it passes that on, and covering still loses nothing flooding
    delivers. (Among them the case of a restarted host whose own subscription covered
    others: its neighbours withdraw it once the restarted broker has passed on those
    it covered. At the quick size, ``sized``, every third broker.)"""
    ops = _stock(FIG2, 3)
    passed_on = 0
    for broker in sorted(FIG2.brokers)[:: sized(3, 1)]:
        failure = [Failure((broker,), 1.0, 2.5)]
        off = run(FIG2, mode, "off", ops, failure)
        on = run(FIG2, mode, "active", ops, failure)
        law(on, off, ops)
        passed_on += on.cores[broker].stats["sent.subscribe"]
    assert passed_on > 0


def test_a_restarted_broker_gets_what_covering_kept_away_from_it() -> None:
    """a:0 hosts a broad and a narrow subscription: the narrow one stays at a:0. c:0
    dies; the broad one is withdrawn meanwhile, so a:0 sends the narrow one in its
    place, and b:0 holds it for c:0. c:0 restarts: it gets the narrow one (held, then
    its share) and passes it on to d:0 and e:0 (e:0 and f:0 also keep the broad one c:0's
    predecessor sent them: its withdrawal, held for the predecessor, is not handed to the
    new process, as without covering); a publication from f:0 reaches the narrow one's
    subscriber."""
    sim = Simulator(FIG2, "snr", latency=LATENCY, covering="active")
    broad = sim.subscribe("broad", "a:0", parse_subscription("[x,<,9]"))
    narrow = sim.subscribe("narrow", "a:0", parse_subscription("[x,<,3]"))
    sim.run()
    assert all(narrow not in c.table for b, c in sim.cores.items() if b != "a:0")
    sim.fail(Failure(("c:0",), 0.0, 3.0), sim.now)
    sim.at(sim.now + 1.5, sim.unsubscribe, broad)
    sim.run()
    for broker in ("b:0", "c:0", "d:0", "e:0", "c:1", "c:2"):
        assert narrow in sim.cores[broker].table, broker
    assert sim.report()["failures"]["sbp_handed_late"] >= 1
    sim.publish("P", "f:0", {"x": 1})
    sim.run()
    assert ("narrow", "P", 1) in sim.ledger.received


def test_covering_cuts_messages_and_entries_on_stock_subscriptions() -> None:
    """paper75, 400 stock subscribers: far fewer SBP messages and entries, the same
    deliveries of 60 quotes (BID ignores the setting: it floods by subscription id)."""
    from octopis.quotes import random_quotes, stock_subscriptions

    scot = build_preset("paper75")
    quotes = random_quotes(600, seed=4, symbols=20)
    subs = stock_subscriptions(quotes, 400, seed=4)
    rng = random.Random(4)
    brokers = sorted(scot.brokers)
    homes = [rng.choice(brokers) for _ in subs]
    runs = {}
    for covering in ("off", "active"):
        sim = Simulator(scot, "dnr", latency=LATENCY, covering=covering)
        for i, s in enumerate(subs):
            sim.subscribe(f"S{i}", homes[i], s)
        sim.run()
        for j, q in enumerate(quotes[:60]):
            sim.publish(f"P{j % 20}", brokers[j % 20 * 3], q)
        sim.run()
        runs[covering] = sim
    off, on = runs["off"], runs["active"]
    assert off.ledger.received == on.ledger.received and on.ledger.summary()["lost"] == 0
    messages = {k: r.report()["sbp_messages"] for k, r in runs.items()}
    entries = {k: sum(len(c.table) for c in r.cores.values()) for k, r in runs.items()}
    assert messages["off"] == 400 * 74
    assert messages["active"] < 0.75 * messages["off"], messages
    assert entries["active"] < 0.75 * entries["off"], entries
    bid = make_broker(scot, brokers[0], "bid", covering="active")
    assert not hasattr(bid, "covering")


def test_a_duplicate_or_unknown_sbp_message_is_ignored_under_covering() -> None:
    """A covering broker's neighbour may be sent again what it holds (a restarted
    broker passing its share on, a link back) or a withdrawal of what it never got
    (sent by a predecessor, maybe): both are counted and ignored."""
    from bitarray import frozenbitarray

    from octopis.core import NoCongestion, SubState, Unsubscribe

    core = make_broker(FIG2, "b:0", "snr", covering="active")
    s = Subscribe("a:0#1", "a:0", parse_subscription("[x,<,1]"), SubState.PRIMARY,
                  frozenbitarray("100"), 0.0)  # fmt: skip
    assert core.receive("a:0", s, NoCongestion())
    assert core.receive("a:0", s, NoCongestion()) == []
    assert core.receive("a:0", Unsubscribe("a:0#9", SubState.PRIMARY), NoCongestion()) == []
    assert core.stats["covering.already_held"] == core.stats["covering.unsubscribe_not_held"] == 1
    with pytest.raises(ValueError, match="unknown covering 'lazy'"):
        make_broker(FIG2, "b:0", "snr", covering="lazy")


@given(scots(max_vertices=5, max_clusters=3), st.sampled_from(["snr", "dnr"]), st.data())
def test_moves_and_topology_changes_under_covering(
    scot: Scot, mode: str, data: st.DataObject
) -> None:
    """Subscribers move (inside their cluster too: with covering, by subscribing afresh
    and withdrawing after the broadcast is over) and a cluster or region joins or leaves
    while publications flow: every notification reaches every subscriber exactly once,
    with covering as without."""
    seed = data.draw(st.integers(0, 2**16))
    ops = scenario(scot, seed, churn=0)
    kind, new, refuge = changed_scot(scot, data)
    staying = sorted(b for b in scot.brokers if b in new.brokers)
    ops = [op for op in ops if op.broker in staying]
    moves = data.draw(
        st.lists(
            st.tuples(st.sampled_from(sorted({op.who for op in ops if op.kind == "sub"})),
                      st.sampled_from(staying), st.floats(1.0, 3.0)),
            max_size=4,
        )
    )  # fmt: skip

    def refuge_of(broker: str) -> str:
        region, cluster = broker.split(":")
        return f"{region}:0" if refuge == "cluster 0" else f"{refuge}:{cluster}"

    for covering in ("off", "active"):
        sim = Simulator(scot, mode, latency=LATENCY, oracle_factory=ReferenceMatcher,
                        covering=covering)  # fmt: skip
        for op in ops:
            if op.kind == "sub":
                sim.at(op.at, sim.subscribe, op.who, op.broker, parse_subscription(op.text))
            else:
                sim.at(op.at, sim.publish, op.who, op.broker, parse_publication(op.text))
        for who, broker, at in moves:
            sim.at(at, _move_unless_there, sim, who, broker)
        if kind.startswith("add"):
            sim.at(2.0, sim.reshape, new)
        else:
            sim.at(2.0, sim.shrink, new, refuge_of)
        sim.run()
        summary = sim.ledger.summary()
        assert summary["duplicates"] == summary["lost"] == summary["unexpected"] == 0, (
            covering,
            summary,
        )
        if covering == "active":
            assert sim.moves["inside"] == 0 and sim.moves["across"] == sim.moves["withdrawn"]


def _move_unless_there(sim: Simulator, subscriber: str, broker: str) -> None:
    if sim._home[subscriber] != broker and not sim.moving(subscriber):
        sim.move(subscriber, broker)


def test_looking_at_a_share_changes_nothing_handing_it_records_it() -> None:
    """What a restarted neighbour would be handed (the control RPC's ``resync_view``)
    is computed without touching covering's record; handing it makes it the record of
    the link: what went over it, and nothing else."""
    from octopis.core.resync import resync_messages

    sim = Simulator(FIG2, "snr", latency=LATENCY, covering="active")
    for i, bound in enumerate([9, 3, 5, 9]):
        sim.subscribe(f"S{i}", "a:0", parse_subscription(f"[x,<,{bound}]"))
    sim.run()
    core = sim.cores["b:0"]
    record = (dict(core.covering.sent), dict(core.covering.maybe))
    looked = [m.sub_id for m in resync_messages(core, "c:0")]
    assert (dict(core.covering.sent), dict(core.covering.maybe)) == record
    assert looked == core.covering.on_link("c:0") and len(looked) == 1  # the first [x,<,9]
    handed = [m.sub_id for m in resync_messages(core, "c:0", handed=True)]
    assert handed == looked and core.covering.on_link("c:0") == looked
