"""A seeded nemesis (DESIGN §7): faults drawn from a seed, run on the brokers' own nodes in
the simulator, and a checker that reads the whole history.

A seed decides everything: the topology (fig2 or paper75), the routing mode (SNR, DNR,
BID), covering and advertisements, the subscribers and publishers, and a schedule of
faults while they publish — brokers that crash and restart (empty, a new incarnation),
brokers paused (SIGSTOP: the process runs nothing until it resumes, its neighbours and
its subscribers hear nothing from it meanwhile, :mod:`octopis.sim.pauses`),
links partitioned both ways for a while, and subscribers whose connection dies (they
fail over and replay), historic queries asked after publishing of what was
published in a window, durable subscribers that leave and come back, at their broker
or another, driving the brokers' own durable records (:mod:`octopis.sim.durable_clients`),
and composite subscribers joined by the node's own composite hosting and held to a
brute-force oracle (:mod:`octopis.sim.composite_clients`).
The same seed gives the same events in the same order and the same verdict, in any
process (each link draws its latencies from a stream of its own, and the node's choices do
not follow a set's order, which ``PYTHONHASHSEED`` changes), so a failing seed is a
reproducible bug; :func:`shrink` drops faults and subscribers while it
still fails, to the shortest history that does.

The checker (:func:`check`) holds every subscriber to exactly once: no duplicate, nothing
it did not ask for, and every publication it should have had either delivered or
accounted for — counted undeliverable by a broker (with its reason), or, for a subscriber
that failed over, published while it was away and named in a gap reported to it.
Anything else is a silent loss. At the end, nothing is still held for a neighbour that
is back, and no broker still misses the resync share of a neighbour its link reaches. A
historic query gets each publication of its window
that matches once and nothing else, or a store it did not hear from named in a gap
reported to it (or its host died under it, which its client sees).

Beside those, 0-2 faults on links and clocks (drawn apart, so that the draws above stay
what they were): one-way partitions (what ``A`` sends ``B`` is lost; over TCP that stalls
both directions once ``B`` declares ``A`` down and stops sending: see
:mod:`octopis.sim.failures` for the model), delay spikes on one link (frames late, in
order, below ``links.down_after``: a longer one is a partition), and publishers' clocks
skewed by up to :data:`SKEW` seconds either way (their stamps are what a replay's and a
historic query's window compare). One draw in four adds a heal during another
neighbour's resync: a broker restarts while its link to one neighbour is cut, another
neighbour restarts meanwhile, and the share it is owed can be paid only after the heal.

One seed in three adds a fault of a broker's retention store
(:mod:`octopis.nemesis.store_faults`, drawn apart too): a disk full for a while (the store
refuses its commits: publications routed and then refused, then refused before they are
routed, each refusal told to the publisher; nothing committed before is touched), or a
power failure (the broker dies; run with ``[retention] sync = "normal"`` its store loses
the commits the operating system had not written yet, confirmed as they were; with
``full`` nothing confirmed). The checker reads the stores: a publication confirmed to its
publisher is still in its store, or :attr:`Verdict.losses` name the store that lost it
and why (a replay is told no gap for it: no store can tell what a power failure took); a
refused one is counted refused; a replay is told what a store trimmed as a gap.

What TCP rules out is not injected: frames reordered, duplicated or lost one at a time
on a live connection (a connection that resets loses what was in flight, which a
partition models).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from octopis.failure_schedule import Failure
from octopis.filters.composite import parse_composite
from octopis.filters.language import Predicate, Subscription
from octopis.matching import ReferenceMatcher
from octopis.nemesis.checks import COUNTS, Query, check_composites, check_durables, check_historic
from octopis.nemesis.store_faults import (
    STORE_KINDS,
    DiskFull,
    PowerLoss,
    StoreFault,
    check_stores,
    draw_store_faults,
    schedule_store_fault,
    store_fault_kind,
    store_fault_text,
)
from octopis.sim.durable_clients import DurableSimulator
from octopis.sim.engine import LatencyModel, Simulator
from octopis.sim.stores import in_gaps
from octopis.topology import Scot, build_preset

PRESETS = ("fig2", "paper75")
MODES = ("snr", "dnr", "bid")
LINK_KINDS = ("one-way", "delay", "skew")
"""The faults on links and clocks, drawn apart (:func:`_link_faults`)."""
FAULT_KINDS = ("crash", "pause", "partition", "client", *LINK_KINDS, *STORE_KINDS)
DURATION = 5.0
"""Seconds of publishing; faults fall in the first four and last up to three."""
HORIZON = 300.0
"""Simulated seconds after publishing begins by which a run must have ended (no event
left): the last scheduled client action comes ~45 s in; one still busy at this horizon
never ends (a message going round for ever), and the checker says so."""
SKEW = 0.5
"""The bound on a publisher's clock skew (seconds ahead or behind)."""
SPIKE = 0.6
"""The longest delay spike on a link: below ``links.down_after`` less a heartbeat, so
that no one declares the link down (a longer spike is a partition)."""


@dataclass(frozen=True)
class ClientFault:
    """Subscriber ``subscriber``'s connection dies at ``at`` (it fails over and replays)."""

    subscriber: str
    at: float


@dataclass(frozen=True)
class DelaySpike:
    """From ``at`` to ``until`` what ``src`` sends ``dst`` arrives ``extra`` seconds late,
    in order."""

    src: str
    dst: str
    at: float
    until: float
    extra: float


@dataclass(frozen=True)
class ClockSkew:
    """Publisher ``publisher``'s clock runs ``offset`` seconds ahead (behind, if negative)."""

    publisher: str
    offset: float


Fault = Failure | ClientFault | DelaySpike | ClockSkew | StoreFault
Historic = tuple[float, str, str, int, float, float]
"""A historic query: (time, asker, broker, k, after, until)."""
DurableRun = tuple[str, str, int, float | None, float, str]
"""A durable subscriber: (client, broker, k, leaves at (None: never), comes back at, at
broker)."""


@dataclass(frozen=True)
class Scenario:
    """Everything one run does, drawn from ``seed`` (:func:`draw`)."""

    seed: int
    preset: str
    mode: str
    covering: str
    advertisements: bool
    subscribers: tuple[tuple[str, str, int], ...]
    """(subscriber, broker, k): subscribes to ``[x,<,k]``."""
    publications: tuple[tuple[float, str, int], ...]
    """(time, broker, x): its publisher at ``broker`` publishes ``{x}``."""
    faults: tuple[Fault, ...]
    withdrawals: tuple[tuple[float, str], ...] = ()
    """(time, subscriber): it withdraws its subscription (at its broker, if alive)."""
    historics: tuple[Historic, ...] = ()
    """(time, asker, broker, k, after, until): ``asker`` at ``broker`` asks for what was
    published in ``[after, until)`` matching ``[x,<,k]`` (times from the start of
    publishing)."""
    durables: tuple[DurableRun, ...] = ()
    """Durable subscribers (:mod:`octopis.sim.durable_clients`): each subscribes to
    ``[x,<,k]`` at its broker before publishing, may leave, and comes back."""
    composites: tuple[tuple[str, str, str], ...] = ()
    """(client, broker, composite subscription's text): it subscribes at ``broker``
    before publishing (:mod:`octopis.sim.composite_clients`)."""

    def describe(self) -> str:
        """The scenario as lines a person reads (the history a failing seed prints)."""
        lines = [
            f"seed {self.seed}: {self.preset}, {self.mode.upper()}, covering {self.covering}, "
            f"advertisements {'on' if self.advertisements else 'off'}, "
            f"{len(self.subscribers)} subscribers, {len(self.publications)} publications"
        ]
        lines += [f"  {_fault_text(f)}" for f in self.faults]
        lines += [f"  withdraw {s} @{at:.3f}" for at, s in self.withdrawals]
        lines += [
            f"  historic {asker} at {broker} [x,<,{k}] in [{after:.3f}, {until:.3f}) @{at:.3f}"
            for at, asker, broker, k, after, until in self.historics
        ]
        lines += [
            f"  durable {c} at {broker} [x,<,{k}]"
            + ("" if leave is None else f" leaves @{leave:.3f}, back at {there} @{back:.3f}")
            for c, broker, k, leave, back, there in self.durables
        ]
        lines += [f"  composite {c} at {broker} {text}" for c, broker, text in self.composites]
        return "\n".join(lines)


@dataclass
class Verdict:
    """What :func:`run` found: the counts every run reports, and the problems (empty: it
    passed)."""

    scenario: Scenario
    expected: int = 0
    delivered: int = 0
    duplicated: int = 0
    lost: int = 0
    """Expected and not delivered (accounted for or not)."""
    silent: int = 0
    """Of :attr:`lost`, those neither counted undeliverable nor in a reported gap."""
    gaps: int = 0
    refused: int = 0
    """Expected and not delivered, refused to their publishers (a full disk): not lost."""
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    """The counts per subscriber kind: live, failed over, historic, durable."""
    faults: dict[str, int] = field(default_factory=dict)
    stores: dict[str, int] = field(default_factory=dict)
    """Publications the stores confirmed, refused, and lost saying why."""
    losses: list[str] = field(default_factory=list)
    """Each store's named losses of confirmed publications: how many, which, and why."""
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No problem found."""
        return not self.problems


def _fault_text(fault: Fault) -> str:
    if isinstance(fault, DiskFull | PowerLoss):
        return store_fault_text(fault)
    if isinstance(fault, ClientFault):
        return f"client {fault.subscriber} connection dies @{fault.at:.3f}"
    if isinstance(fault, DelaySpike):
        return (f"delay {fault.src}->{fault.dst} +{fault.extra:.3f} s @{fault.at:.3f} "
                f"until {fault.until:.3f}")  # fmt: skip
    if isinstance(fault, ClockSkew):
        return f"skew {fault.publisher}'s clock {fault.offset:+.3f} s"
    back = "never" if fault.until is None else f"{fault.until:.3f}"
    ends = "->".join(fault.ends) if fault.one_way else "-".join(fault.ends)
    return f"{fault_kind(fault)} {ends} @{fault.at:.3f} until {back}"


def fault_kind(fault: Fault) -> str:
    """One of :data:`FAULT_KINDS`."""
    if isinstance(fault, DiskFull | PowerLoss):
        return store_fault_kind(fault)
    if isinstance(fault, ClientFault):
        return "client"
    if isinstance(fault, DelaySpike):
        return "delay"
    if isinstance(fault, ClockSkew):
        return "skew"
    if fault.one_way:
        return "one-way"
    return "pause" if fault.stall else "crash" if fault.is_broker else "partition"


def draw(
    seed: int,
    *,
    presets: tuple[str, ...] = ("fig2",),
    max_faults: int = 3,
    links: bool = True,
    composites: bool = True,
    stores: bool = True,
) -> Scenario:
    """The scenario of ``seed``: a topology of ``presets``, a mode, covering and
    advertisements, 6-16 subscribers and 10-30 publications on random brokers, 1 to
    ``max_faults`` crashes, pauses, partitions and client faults at random times,
    (``links``) 0 to 2 one-way partitions, delay spikes and skewed publisher clocks,
    (``composites``) 0 to 2 composite subscribers and (``stores``) a store fault (drawn
    last and apart: a seed kept for a bug found before they were drawn replays without
    them)."""
    rng = random.Random(seed)
    preset = rng.choice(presets)
    scot = _scot(preset)
    brokers = sorted(scot.brokers)
    mode = rng.choice(MODES)
    covering = rng.choice(("off", "active")) if mode != "bid" else "off"
    advertisements = mode != "bid" and rng.random() < 0.3
    subscribers = tuple(
        (f"S{i}", rng.choice(brokers), rng.randint(1, 9)) for i in range(rng.randint(6, 16))
    )
    count = rng.randint(10, 30)
    publications = tuple(
        sorted((round(rng.uniform(0, DURATION), 6), rng.choice(brokers), rng.randrange(10))
               for _ in range(count))
    )  # fmt: skip
    faults: list[Fault] = []
    for _ in range(rng.randint(1, max_faults)):
        kind = rng.choice(FAULT_KINDS[:4])
        at = round(rng.uniform(0, DURATION - 1), 6)
        until = round(at + rng.uniform(0.2, 3.0), 6)
        if kind == "client":
            faults.append(ClientFault(rng.choice(subscribers)[0], at))
        elif kind == "partition":
            a = rng.choice(brokers)
            faults.append(Failure((a, rng.choice(sorted(scot.graph[a]))), at, until))
        else:
            broker = rng.choice(brokers)
            busy = [f for f in faults if isinstance(f, Failure) and f.ends == (broker,)]
            if any(f.at < until and at < (f.until or DURATION) for f in busy):
                continue  # a process is not paused while it is dead, nor killed twice
            faults.append(Failure((broker,), at, until, stall=kind == "pause"))
    withdrawals = tuple(
        sorted((round(rng.uniform(0, DURATION), 6), rng.choice(subscribers)[0])
               for _ in range(rng.randint(0, 3)))
    )  # fmt: skip
    faults += _link_faults(seed, scot, publications) if links else ()
    if stores:
        publishers = sorted({b for _, b, _ in publications})
        busy = [f for f in faults if isinstance(f, Failure)]
        faults += draw_store_faults(seed, publishers, DURATION, busy)
    return Scenario(
        seed,
        preset,
        mode,
        covering,
        advertisements,
        subscribers,
        publications,
        tuple(faults),
        withdrawals,
        _historics(seed, brokers),
        _durables(seed, brokers),
        _composites(seed, brokers) if composites else (),
    )


def _link_faults(
    seed: int, scot: Scot, publications: tuple[tuple[float, str, int], ...]
) -> tuple[Fault, ...]:
    """0-2 one-way partitions, delay spikes on a link and skewed publisher clocks, drawn
    apart from the rest of the scenario (as :func:`_historics`: earlier draws stay)."""
    rng = random.Random(f"{seed}/links")
    brokers = sorted(scot.brokers)
    faults: list[Fault] = []
    if rng.random() < 0.25:
        faults += _resync_race(rng, scot)
    for _ in range(rng.randint(0, 2)):
        kind = rng.choice(LINK_KINDS)
        at = round(rng.uniform(0, DURATION - 1), 6)
        a = rng.choice(brokers)
        b = rng.choice(sorted(scot.graph[a]))
        if kind == "one-way":
            faults.append(Failure((a, b), at, round(at + rng.uniform(0.2, 3.0), 6), one_way=True))
        elif kind == "delay":
            until = round(at + rng.uniform(0.1, 2.0), 6)
            faults.append(DelaySpike(a, b, at, until, round(rng.uniform(0.05, SPIKE), 6)))
        elif publications:
            broker = rng.choice(publications)[1]
            faults.append(ClockSkew(f"P{broker}", round(rng.uniform(-SKEW, SKEW), 6)))
    return tuple(faults)


def _resync_race(rng: random.Random, scot: Scot) -> list[Fault]:
    """A heal during another neighbour's resync: broker ``N`` restarts while its link to
    ``M`` is cut, so it serves without ``M``'s share; its neighbour ``R`` restarts
    meanwhile and is owed ``N``'s share, which ``N`` can pay only once the link to ``M``
    heals and ``M``'s share comes in (a share paid late)."""
    n = rng.choice(sorted(b for b in scot.brokers if len(scot.graph[b]) >= 2))
    m, r = rng.sample(sorted(scot.graph[n]), 2)
    at = round(rng.uniform(0, 1.5), 6)
    back = round(at + rng.uniform(0.2, 0.8), 6)
    again = round(back + rng.uniform(1.1, 1.6), 6)
    cut = round(max(0.0, at - rng.uniform(0, 0.2)), 6)
    return [
        Failure((n, m), cut, round(again + rng.uniform(1.5, 2.5), 6)),
        Failure((n,), at, back),
        Failure((r,), again, round(again + rng.uniform(0.1, 0.4), 6)),
    ]


def _historics(
    seed: int, brokers: list[str]
) -> tuple[tuple[float, str, str, int, float, float], ...]:
    """0-2 historic queries after publishing, drawn apart from the rest of the scenario
    (the draws of earlier versions, and the seeds kept for their bugs, stay as they were)."""
    rng = random.Random(f"{seed}/historic")
    queries = []
    for i in range(rng.randint(0, 2)):
        after = round(rng.uniform(0, 0.6 * DURATION), 6)
        queries.append((
            round(DURATION + rng.uniform(0.5, 3.5), 6),
            f"H{i}",
            rng.choice(brokers),
            rng.randint(1, 9),
            after,
            round(after + rng.uniform(0.5, DURATION), 6),
        ))  # fmt: skip
    return tuple(queries)


def _durables(seed: int, brokers: list[str]) -> tuple[DurableRun, ...]:
    """0-2 durable subscribers (none in two seeds of three: each costs three rounds
    across the overlay, a claim as it starts, a claim and a replay as it comes back), drawn
    apart from the rest of the scenario (as :func:`_historics`): most leave while
    publishing and come back 0.1-3 s later at a broker drawn (their own, one time in
    three); one in five stays away past
    :data:`~octopis.defaults.LOOKBACK` and comes back where it left."""
    rng = random.Random(f"{seed}/durable")
    runs = []
    for i in range(rng.choice((0, 0, 0, 0, 1, 2))):
        broker = rng.choice(brokers)
        k = rng.randint(1, 9)
        if rng.random() < 0.15:
            runs.append((f"D{i}", broker, k, None, 0.0, broker))
            continue
        leave = round(rng.uniform(0, DURATION - 1), 6)
        if rng.random() < 0.2:
            runs.append((f"D{i}", broker, k, leave, round(DURATION + rng.uniform(30, 40), 6),
                         broker))  # fmt: skip
            continue
        there = broker if rng.random() < 1 / 3 else rng.choice(brokers)
        runs.append((f"D{i}", broker, k, leave, round(leave + rng.uniform(0.1, 3.0), 6), there))
    return tuple(runs)


def _composites(seed: int, brokers: list[str]) -> tuple[tuple[str, str, str], ...]:
    """0-2 composite subscribers (none in one seed of two), drawn apart (as
    :func:`_historics`): a pair of publications in a window, a pair of equal values in a
    window (a variable; one publication can be a match alone), or either of two parts."""
    rng = random.Random(f"{seed}/composite")
    drawn = []
    for i in range(rng.choice((0, 0, 1, 2))):
        a, b = rng.randint(1, 6), rng.randint(3, 8)
        window = round(rng.uniform(0.2, 2.0), 3)
        text = rng.choice((
            f"{{[x,<,{a}]}} & {{[x,>,{b}]}} within {window}s",
            f"{{[x,<,{a}],[x,=,$I$v]}} & {{[x,>=,0],[x,=,$I$v]}} within {window}s",
            f"{{[x,<,{a}]}} | {{[x,>,{b}]}}",
        ))  # fmt: skip
        drawn.append((f"C{i}", rng.choice(brokers), text))
    return tuple(drawn)


_SCOTS: dict[str, Scot] = {}


def _scot(preset: str) -> Scot:
    scot = _SCOTS.get(preset)
    if scot is None:
        scot = _SCOTS[preset] = build_preset(preset)
    return scot


def simulate(
    scenario: Scenario,
) -> tuple[DurableSimulator, dict[str, float], dict[str, Query]]:
    """Run ``scenario`` to its end on a fresh simulator (deterministic: its seed draws the
    link latencies too); returns it, when each subscriber that withdrew did, and the
    historic queries asked (by req_id)."""
    scot = _scot(scenario.preset)
    sim = DurableSimulator(
        scot,
        scenario.mode,
        seed=scenario.seed,
        latency=LatencyModel(0.001, 0.002),
        oracle_factory=ReferenceMatcher,
        covering=scenario.covering,
        advertisements=scenario.advertisements,
    )
    sim._failure_state()  # the stores keep the history even if no fault is left (shrunk)
    if scenario.advertisements:
        everything = Subscription((Predicate("x", "<", 10),))
        for broker in sorted({b for _, b, _ in scenario.publications}):
            sim.advertise(f"P{broker}", broker, everything)
    for subscriber, broker, k in scenario.subscribers:
        sim.subscribe(subscriber, broker, Subscription((Predicate("x", "<", k),)))
    for client, broker, k, *_ in scenario.durables:
        sim.durable_subscribe(client, broker, Subscription((Predicate("x", "<", k),)))
    for client, broker, text in scenario.composites:
        sim.composites.subscribe(client, broker, parse_composite(text))
    sim.run()
    start = sim.now
    for client, _, _, leave, back, there in scenario.durables:
        if leave is not None:
            sim.at(start + leave, sim.durable_leave, client)
            sim.at(start + back, sim.durable_return, client, there)
    for fault in scenario.faults:
        if isinstance(fault, ClientFault):
            sim.fail_client(fault.subscriber, start + fault.at)
        elif isinstance(fault, DelaySpike):
            sim.slow_link(fault.src, fault.dst, start + fault.at, start + fault.until, fault.extra)
        elif isinstance(fault, ClockSkew):
            sim.clocks[fault.publisher] = fault.offset
        elif isinstance(fault, DiskFull | PowerLoss):
            schedule_store_fault(sim, fault, start)
        else:
            sim.fail(fault, start)
    for at, broker, x in scenario.publications:
        sim.at(start + at, sim.publish, f"P{broker}", broker, {"x": x})
    withdrawn: dict[str, float] = {}
    for at, subscriber in scenario.withdrawals:
        sim.at(start + at, _withdraw, sim, subscriber, withdrawn)
    asked: dict[str, Query] = {}
    for at, asker, broker, k, after, until in scenario.historics:
        query = Query(asker, k, start + after, start + until)
        sim.at(start + at, _ask, sim, broker, query, asked)
    sim.run(start + HORIZON)
    return sim, withdrawn, asked


def _ask(sim: Simulator, broker: str, query: Query, asked: dict[str, Query]) -> None:
    """``query``'s asker asks it of ``broker`` now, if that broker is alive (a client
    cannot connect to a dead one)."""
    state = sim.failures
    if state is not None and broker in state.dead:
        return
    asker, k, after, until = query
    req_id = sim.historic(asker, broker, Subscription((Predicate("x", "<", k),)), after, until)
    asked[req_id] = query


def _withdraw(sim: Simulator, subscriber: str, withdrawn: dict[str, float]) -> None:
    """``subscriber`` withdraws its oldest subscription at its broker now, if that broker
    is alive and it is still connected there (the SDK's ``unsubscribe`` fails otherwise);
    a paused broker takes the request when it resumes."""
    home = sim._home.get(subscriber)
    if home is not None and sim._asleep(home, _withdraw, sim, subscriber, withdrawn):
        return
    state = sim.failures
    if home is None or (state is not None and (home in state.dead or not sim.nodes[home].serving)):
        return
    if (subscriber, home) in sim.cut_clients or subscriber in sim.failed_over:
        return  # the simulator's clients withdraw only where they first subscribed
    entries = sim.cores[home].table.entries
    mine = [
        sid
        for sid, s in sim.subscriber_of.items()
        if s == subscriber and sid in entries and entries[sid].local
    ]
    if mine:
        sim.unsubscribe(mine[0])
        withdrawn.setdefault(subscriber, sim.now)


def check(
    sim: Simulator,
    withdrawn: dict[str, float] | None = None,
    asked: dict[str, Query] | None = None,
) -> tuple[list[str], dict[str, int]]:
    """The problems in ``sim``'s history (see the module docstring) and its counts:
    expected, delivered, duplicated, lost, silent (lost and not accounted for), gaps,
    refused (not delivered, refused to their publishers: not lost), and the stores'
    (:func:`~octopis.nemesis.store_faults.check_stores`: ``stores``, ``losses``). A
    subscriber that ``withdrew`` (at the time given) is owed nothing published before it
    that had not reached it by then; each historic query ``asked`` is held to its window
    (:func:`check_historic`)."""
    withdrawn = withdrawn or {}
    report = sim.report()
    failures = report.get("failures", {})
    problems = []
    if sim.events.pending():
        problems.append(f"the run did not end: {sim.events.pending()} events still pending "
                        f"{HORIZON:.0f} s after publishing began")  # fmt: skip
    for group in ("host_alive", "host_dead"):
        counts = failures.get(group)
        if counts and (counts["duplicates"] or counts["unexpected"]):
            problems.append(f"{group}: {counts['duplicates']} duplicated, "
                            f"{counts['unexpected']} unexpected")  # fmt: skip
    if not failures and (report["duplicates"] or report["unexpected"]):
        problems.append(f"{report['duplicates']} duplicated, {report['unexpected']} unexpected")
    notes = {n.key: n for ns in sim.published.values() for n in ns}
    published = {key: n.published_at for key, n in notes.items()}
    clocks = sim.clocks
    when_sent = {key: at - clocks.get(key[0], 0.0) for key, at in published.items()}
    when_sent.update(sim.publishers.entered)  # sent again after a fail-over: entered then
    undeliverable = sim.undeliverable_keys

    def accounted(s: str, p: str, q: int) -> bool:
        told = in_gaps(sim.store_gaps.get(s, set()), notes[(p, q)])
        if sim.replay_gaps.get(s) or told or (p, q) in sim.retention.lost:  # lost: named
            return True
        when = when_sent.get((p, q))
        if s in withdrawn and when is not None and when <= withdrawn[s]:
            return True
        away = when is not None and any(a <= when < b for a, b in sim.outages.get(s, ()))
        return not away and (p, q) in undeliverable

    state = sim.failures
    for broker, node in sim.nodes.items():
        for neighbour, copies in node.holding().items():
            if state is not None and not state.broken(broker, neighbour):
                problems.append(f"{broker} still holds {copies} copies for {neighbour}, "
                                "which is back")  # fmt: skip
        for neighbour in node.status()["missing_shares"]:  # type: ignore[union-attr]
            if state is not None and not state.severed(broker, neighbour):
                problems.append(f"{broker} still misses {neighbour}'s resync share, though "
                                "their link carries")  # fmt: skip
    refused = sim.retention.refused
    missing = {
        key for key in sim.ledger.expected - set(sim.ledger.received) if key[1:] not in refused
    }
    silent = sorted(key for key in missing if not accounted(*key))
    if silent:
        problems.append(f"{len(silent)} lost without a count or a reported gap: {silent[:3]}")
    historic = check_historic(sim, asked or {}, notes)
    problems += historic.pop("problems")
    kinds = {
        "live": _ledger_counts(
            sim, silent, lambda s: s in sim.clients.subscriptions_of and s not in sim.failed_over
        ),
        "failed over": _ledger_counts(sim, silent, sim.failed_over.__contains__),
        "historic": {
            **historic,
            "gaps": sum(
                1 for s in {q.asker for q in (asked or {}).values()} if sim.replay_gaps.get(s)
            ),
        },
    }
    if isinstance(sim, DurableSimulator):
        durable_problems, kinds["durable"] = check_durables(sim)
        problems += durable_problems
    if sim.composites.clients:
        composite_problems, kinds["composite"] = check_composites(sim)
        problems += composite_problems
    counts: dict[str, Any] = {
        key: sum(k.get(key, 0) for k in kinds.values()) for key in (*COUNTS, "refused")
    }
    counts["kinds"] = kinds
    store_problems, counts["stores"], counts["losses"] = check_stores(sim)
    problems += store_problems
    return problems, counts


def _ledger_counts(
    sim: Simulator, silent: list[tuple[str, str, int]], among: Callable[[str], bool]
) -> dict[str, int]:
    """The ledger's counts (:data:`COUNTS`, and ``refused``: not delivered, refused to
    their publishers) of the subscribers ``among`` accepts."""
    ledger = sim.ledger
    expected = {key for key in ledger.expected if among(key[0])}
    received = {key: n for key, n in ledger.received.items() if among(key[0])}
    refused = {key for key in expected - received.keys() if key[1:] in sim.retention.refused}
    return {
        "expected": len(expected),
        "delivered": len(expected & received.keys()),
        "duplicated": sum(received.values()) - len(received),
        "lost": len(expected - received.keys() - refused),
        "refused": len(refused),
        "silent": sum(1 for key in silent if among(key[0])),
        "gaps": sum(1 for s, g in sim.replay_gaps.items() if g and among(s)),
    }


def run(scenario: Scenario) -> Verdict:
    """Simulate and check ``scenario``; an exception in the run is a problem too."""
    faults = {kind: 0 for kind in FAULT_KINDS}
    for fault in scenario.faults:
        faults[fault_kind(fault)] += 1
    try:
        problems, counts = check(*simulate(scenario))
    except Exception as exc:
        return Verdict(scenario, faults=faults, problems=[f"the run raised {exc!r}"])
    return Verdict(scenario, faults=faults, problems=problems, **counts)


def shrink(scenario: Scenario, fails: Callable[[Scenario], bool] | None = None) -> Scenario:
    """The smallest scenario found that still fails: faults (store faults too), then
    subscribers, durable and composite ones, withdrawals, historic queries and
    publications dropped one at a time while ``fails`` (default: :func:`run` finds a
    problem), as hypothesis shrinks an example; deterministic."""
    fails = fails or (lambda s: not run(s).passed)
    current = scenario
    for name in (
        "faults", "subscribers", "durables", "composites", "withdrawals", "historics",
        "publications",
    ):  # fmt: skip
        i = 0
        while i < len(getattr(current, name)):
            items = getattr(current, name)
            smaller = replace(current, **{name: items[:i] + items[i + 1 :]})
            if fails(smaller):
                current = smaller
            else:
                i += 1
    return current


def sweep(
    seeds: range, *, presets: tuple[str, ...] = ("fig2",), max_faults: int = 3
) -> dict[str, Any]:
    """Run every seed of ``seeds``: runs, passed, the failing seeds, faults injected by
    kind, and the summed counts."""
    table: dict[str, Any] = {
        "runs": 0, "passed": 0, "failing": [], "faults": {}, "kinds": {}, "stores": {}
    }  # fmt: skip
    totals = dict.fromkeys(
        ("expected", "delivered", "duplicated", "lost", "silent", "gaps", "refused"), 0
    )
    for seed in seeds:
        verdict = run(draw(seed, presets=presets, max_faults=max_faults))
        table["runs"] += 1
        table["passed"] += verdict.passed
        if not verdict.passed:
            table["failing"].append(seed)
        for kind, n in verdict.faults.items():
            table["faults"][kind] = table["faults"].get(kind, 0) + n
        for key, n in verdict.stores.items():
            table["stores"][key] = table["stores"].get(key, 0) + n
        for key in totals:
            totals[key] += getattr(verdict, key)
        for kind, counts in verdict.kinds.items():
            summed = table["kinds"].setdefault(kind, {})
            for key, n in counts.items():
                summed[key] = summed.get(key, 0) + n
    table.update(totals)
    return table
