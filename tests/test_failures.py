"""Failure laws in the simulator (DESIGN §7): detours along squares, custody, edge dedup
and resync keep every subscriber on a live broker at exactly once, or count the copy
that no live path could carry; with no failure none of it fires (see test_sim.py)."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Sequence

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from laws import scots, sized

from octopis.cli.main import main
from octopis.client_policy import SEAM_FILLED
from octopis.core import DEFAULT_COVERING, Notification
from octopis.core.neighbours import Neighbours, liveness_tick, stall
from octopis.defaults import BUFFER, CLIENT_LIVENESS, HEARTBEAT
from octopis.failure_schedule import Failure, FailureSpecError, parse_failure, read_schedule
from octopis.filters.language import Predicate, Subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import LatencyModel, Simulator
from octopis.sim.custody import message_of
from octopis.sim.durable_clients import DurableSimulator
from octopis.topology import Scot, build_preset, build_scot, complete_factor

FIG2 = build_preset("fig2")
PAPER75 = build_preset("paper75")
FAIL_AT, BACK_AT = 1.0, 3.0
"""Seconds into publishing: the failure, the restart (or link back)."""


def _run(
    scot: Scot,
    mode: str,
    failures: list[Failure],
    *,
    seed: int = 1,
    subscribers: int = 60,
    publications: int = 50,
    clients: Sequence[tuple[str, float]] = (),
    covering: str = DEFAULT_COVERING,
    seam_limit: int = BUFFER,
) -> Simulator:
    """Random ``[x,<,k]`` subscribers everywhere, then publications from random brokers
    spread over five seconds, with ``failures`` and the subscribers' connection failures
    ``clients`` (subscriber, time) scheduled from the first publication."""
    rng = random.Random(seed)
    sim = Simulator(
        scot,
        mode,
        seed=seed,
        latency=LatencyModel(0.001, 0.002),
        oracle_factory=ReferenceMatcher,
        covering=covering,
    )
    sim.seam_limit = seam_limit
    brokers = sorted(scot.brokers)
    for i in range(subscribers):
        bound = rng.randint(1, 9)
        sim.subscribe(f"S{i}", rng.choice(brokers), Subscription((Predicate("x", "<", bound),)))
    sim.run()
    start = sim.now
    for failure in failures:
        sim.fail(failure, start)
    for subscriber, at in clients:
        sim.fail_client(subscriber, start + at)
    for j in range(publications):
        broker = rng.choice(brokers)
        sim.at(start + 5.0 * j / publications, sim.publish, f"P{broker}", broker, {"x": j % 10})
    sim.run()
    return sim


def _law(sim: Simulator) -> dict:
    """No duplicate anywhere, nothing unexpected; every expected delivery arrived, or is
    accounted for. To a subscriber whose host lived: its notification was counted
    undeliverable somewhere. To a subscriber that failed over (its host died): what was
    published while it was away (host dead, not yet subscribed again elsewhere) only a
    replay can give it, so it must have come or the replay reported a gap (a silent
    part of the overlay that never answered); later, as for the others. Anything else
    is a silent loss, and removing replay or SNR's detours makes some."""
    report = sim.report()["failures"]
    for group in ("host_alive", "host_dead"):
        assert report[group]["duplicates"] == report[group]["unexpected"] == 0, report[group]
    published = {(n.publisher, n.seq): n.published_at for ns in sim.stores.values() for n in ns}

    def accounted(s: str, p: str, q: int) -> bool:
        if sim.replay_gaps.get(s):
            return True
        away = any(a <= published[(p, q)] < b for a, b in sim.outages.get(s, ()))
        return not away and (p, q) in sim.undeliverable_keys

    missing = sim.ledger.expected - set(sim.ledger.received)
    silent = [key for key in missing if not accounted(*key)]
    assert not silent, f"lost without a count or a reported gap: {sorted(silent)[:5]}"
    return report


def _singles(scot: Scot, restart: float | None = BACK_AT) -> list[Failure]:
    brokers = [Failure((b,), FAIL_AT, restart) for b in sorted(scot.brokers)]
    return brokers + [Failure((u, v), FAIL_AT, BACK_AT) for u, v in sorted(scot.graph.edges)]


@pytest.mark.spread
@pytest.mark.parametrize("mode", ["dnr", "snr"])
@pytest.mark.parametrize("scot", [FIG2, PAPER75], ids=["fig2", "paper75"])
def test_every_single_failure_while_publishing_loses_nothing(scot: Scot, mode: str) -> None:
    """Every broker killed and restarted, every link cut and restored, mid-stream, in DNR
    and in SNR (whose detours are DNR's, congestion left out): each subscriber on a live
    broker gets every matching notification exactly once, with nothing counted
    undeliverable but the copies held for the dead broker (dropped when it comes back as
    a new process: its own subscribers are gone); detours, custody and dedup do the
    work. (SNR on paper75 takes every third failure: fig2 has every kind of broker and
    link, and SNR's detours are DNR's code, which paper75 checks in full. At the quick
    size, ``sized``, fig2 takes every second failure, paper75 every 15th in DNR and every
    27th in SNR: a sample of the same law, brokers and links.)"""
    fired = {"tunnel.started": 0, "tunnel.fanout": 0, "custody.rerouted": 0}
    singles = _singles(scot)
    stride = sized(2, 1) if scot is not PAPER75 else sized(27, 3) if mode == "snr" else sized(15, 1)
    for failure in singles[::stride]:
        report = _law(_run(scot, mode, [failure]))
        assert report["host_alive"]["lost"] == 0, failure
        assert report["host_alive"]["delivered"] == report["host_alive"]["expected_deliveries"]
        allowed = {"undeliverable.held_for_restarted"} if failure.is_broker else set()
        counted = {k for k in report if k.startswith("undeliverable")}
        assert counted <= allowed, (failure, report)
        for key in fired:
            fired[key] += report.get(key, 0)
    assert all(fired.values()), fired


def test_bid_counts_what_a_failure_costs() -> None:
    """BID, the paper's static baseline, does not detour: what it loses to a failure is
    counted, never silent. (Brokers stay dead: BID has no resync, so a restarted BID
    broker starts empty.)"""
    undeliverable = 0
    for failure in _singles(FIG2, restart=None)[:: sized(3, 1)]:
        report = _law(_run(FIG2, "bid", [failure]))
        undeliverable += sum(n for k, n in report.items() if k.startswith("undeliverable"))
    assert undeliverable > 0


def test_restarted_broker_is_resynced_to_its_neighbours_view() -> None:
    """After a restart every broker's table holds what it held before the failure,
    except the entries of the dead broker's own subscribers (withdrawn by epoch): the
    paper's SBP, where every table holds every subscription (covering off; what covering
    hands a restarted broker: tests/test_covering_laws.py)."""
    sim = _run(PAPER75, "dnr", [], publications=0, covering="off")
    before = {b: set(c.table.entries) for b, c in sim.cores.items()}
    dead = "viii:2"
    sim.fail(Failure((dead,), 0.0, 2.0), sim.now)
    sim.run()
    hosted = {sid for sid in before[dead] if sid.startswith(f"{dead}#")}
    for broker, core in sim.cores.items():
        assert set(core.table.entries) == before[broker] - hosted, broker
    assert sim.failure_counts["brokers_restarted"] == 1


@pytest.mark.parametrize("scot", [FIG2, PAPER75], ids=["fig2", "paper75"])
def test_dnr_broker_cut_off_for_a_while_gets_what_it_missed(scot: Scot) -> None:
    """Every broker in turn stalls (paused: it runs nothing, its neighbours hear nothing
    from it, :mod:`octopis.sim.pauses`) and comes back: the copies a fan-out could not
    give it are held by its region's brokers and sent on its return, so its subscribers
    get everything published elsewhere exactly once; what it published itself while
    stalled is counted, never silently lost. (At the quick size, ``sized``, fig2 stalls
    every second broker, paper75 every ninth.)"""
    released = 0
    for broker in sorted(scot.brokers)[:: sized(9, 3) if scot is PAPER75 else sized(2, 1)]:
        sim = _run(scot, "dnr", [Failure((broker,), FAIL_AT, BACK_AT, stall=True)], seed=7)
        report = _law(sim)
        missed = [
            (s, p, q)
            for s, p, q in sim.ledger.expected - set(sim.ledger.received)
            if sim._home[s] == broker and p != f"P{broker}"
        ]
        assert not missed, (broker, missed[:5])
        assert not {k for k in report if k.startswith("undeliverable.held")}, report
        released += report.get("held.released", 0)
    assert released > 0


def test_tunnel_crosses_through_another_cluster_when_its_icol_is_cut() -> None:
    """e:0 dead and c:1–c:0 cut: a copy detouring around e:0 toward c:0 enters c:0 from
    c:2 rather than fanning out as if c:0 were dead (which would skip its subscribers)."""
    failures = [Failure(("e:0",), 0.0, None), Failure(("c:0", "c:1"), 0.0, None)]
    sim = _run(FIG2, "dnr", failures, subscribers=60, publications=60)
    report = _law(sim)
    assert report["host_alive"]["lost"] == 0
    assert report["host_alive"]["delivered"] == report["host_alive"]["expected_deliveries"]
    assert sim.cores["c:2"].stats["tunnel.relayed"] > 0


@pytest.mark.parametrize(
    "failures",
    [
        [Failure(("f:0",), 0.0, 1.0), Failure(("f:2",), 0.5, 1.2)],
        [Failure(("c:0",), 0.0, 1.0), Failure(("e:0",), 0.2, 3.0), Failure(("f:0",), 0.1, 2.0)],
        [Failure(("b:1",), 0.0, 1.0), Failure(("b:1", "c:1"), 0.5, 3.0)],
    ],
    ids=["icol-neighbours", "tree-line", "restart-behind-cut-link"],
)
@pytest.mark.parametrize("mode", ["dnr", "snr"])
def test_adjacent_restarts_end_with_every_share(mode: str, failures: list[Failure]) -> None:
    """A broker restarted next to a dead or cut-off neighbour gets that neighbour's share
    when it can be given, and routes toward that side until then: in the end every table
    holds what it held before, less the dead brokers' own subscriptions, plus those
    their subscribers made again where they failed over; nothing was lost silently.
    (Known gap: brokers beyond a neighbour that was dead when a host restarted keep that
    host's earlier subscriptions, which cost traffic, never a delivery; only a line of
    dead brokers shows it.) Covering off: the tables compared are the paper's SBP's."""
    sim = _run(FIG2, mode, [], publications=0, covering="off")
    before = {b: set(c.table.entries) for b, c in sim.cores.items()}
    start = sim.now
    for failure in failures:
        sim.fail(failure, start)
    for j in range(40):
        broker = sorted(FIG2.brokers)[j % 18]
        sim.at(start + 4.0 * j / 40, sim.publish, f"P{broker}", broker, {"x": j % 10})
    sim.run()
    _law(sim)
    dead = {f.ends[0] for f in failures if f.is_broker}
    hosted = {sid for b in dead for sid in before[b] if sid.startswith(f"{b}#")}
    moved = {sid for sid, s in sim.subscriber_of.items() if s in sim.failed_over} - hosted
    moved -= set().union(*before.values())  # made again by the dead hosts' subscribers
    stale = 0
    for broker, core in sim.cores.items():
        assert not core.missing_shares, broker
        entries = set(core.table.entries)
        assert before[broker] - hosted <= entries, broker
        assert entries - before[broker] == moved, broker
        stale += len(entries & hosted)
    assert stale == 0 or len(dead) > 2, stale
    assert sim.failure_counts["brokers_restarted"] == len(dead)


def _failures(
    scot: Scot, draw: st.DrawFn, count: int, subscribers: int
) -> tuple[list[Failure], list[tuple[str, float]]]:
    """``count`` failures of any brokers, links and subscribers' connections, adjacent
    or overlapping alike, each from a random time; a broker or link lasting, healed or
    restarted, a connection failed for good (its subscriber fails over)."""
    items = [(b,) for b in sorted(scot.brokers)] + sorted(scot.graph.edges) + [("client",)]
    failures: list[Failure] = []
    clients: list[tuple[str, float]] = []
    for _ in range(count):
        ends = draw(st.sampled_from(items))
        at = draw(st.floats(0.0, 4.0))
        if ends == ("client",):
            clients.append((f"S{draw(st.integers(0, subscribers - 1))}", at))
            continue
        back = st.floats(at + 0.1, at + 4.0)
        until = draw(st.one_of(st.none(), back))
        failures.append(Failure(tuple(ends), at, until))
    return failures, clients


@given(scots(), st.sampled_from(["dnr", "snr", "bid"]), st.integers(0, 2**16), st.data())
def test_up_to_three_failures_while_publishing(
    scot: Scot, mode: str, seed: int, data: st.DataObject
) -> None:
    failures, clients = _failures(scot, data.draw, data.draw(st.integers(1, 3)), 30)
    sim = _run(scot, mode, failures, seed=seed, subscribers=30, publications=30, clients=clients)
    _law(sim)


@pytest.mark.parametrize(
    ("first_back", "second_back"), [(4.0, 5.0), (2.0, 4.0)], ids=["none-back", "back-in-round"]
)
def test_subscribers_whose_every_broker_died_keep_trying_until_one_is_back(
    first_back: float, second_back: float
) -> None:
    """One region, two clusters, both brokers killed at once, r0:0 back after
    ``first_back`` s and r0:1 after ``second_back`` s: every subscriber tries its list (its
    own broker last; each dead one silent for the liveness, 1.5 s) and keeps trying until
    one answers, and replays what it missed there; nothing is lost silently.

    - none-back (4 s, 5 s): no broker is back by the end of the first round (3 s). Found
      by the law: the simulator's subscribers gave up when every broker of their list
      was dead.
    - back-in-round (2 s, 4 s): r0:1's subscribers try r0:0 while it is still dead, then
      r0:1, and end their round at 4.5 s, when no restart is pending any more, though
      r0:0 has been back since 2 s. Found by the law: they gave up at the end of a round
      once no restart was pending (111 deliveries lost without a count or a gap)."""
    scot = build_scot(nx.empty_graph(["r0"]), complete_factor(2), name="pair")
    failures = [Failure(("r0:0",), 0.0, first_back), Failure(("r0:1",), 0.0, second_back)]
    sim = _run(scot, "dnr", failures, seed=0, subscribers=30, publications=30)
    report = _law(sim)
    assert report["replays"]["subscribers_failed_over"] == 30
    assert report["failover.no_live_broker"] > 0
    assert sim.ledger.summary()["lost"] == 0


def test_subscribers_whose_every_broker_is_gone_for_good_stop_after_one_round() -> None:
    """Both brokers of the pair killed for good: each subscriber, and each publisher that
    sent to its dead broker, tries its list once (the other broker, then its own), and its
    tries end there, as the client policy says once every broker of its list is gone for
    good (``failover_tries``); the run ends."""
    scot = build_scot(nx.empty_graph(["r0"]), complete_factor(2), name="pair")
    failures = [Failure(("r0:0",), 0.0), Failure(("r0:1",), 0.0)]
    sim = _run(scot, "dnr", failures, seed=0, subscribers=10, publications=10)
    report = sim.report()["failures"]
    publishers = sim.publishers.leaving  # still leaving: their tries ended
    assert len(publishers) == 2
    assert report["failover.no_live_broker"] == 10 + len(publishers)
    assert report["replays"]["subscribers_failed_over"] == 0
    assert "publishers_failed_over" not in report


def test_a_subscriber_whose_connection_fails_replays_what_it_missed() -> None:
    """Five subscribers' connections to their (live) brokers fail mid-stream: each fails
    over, subscribes again elsewhere and replays; its old broker delivers into the void
    until it drops the silent client. Everyone gets everything exactly once."""
    clients = [(f"S{i}", 1.0 + 0.3 * i) for i in range(5)]
    sim = _run(FIG2, "dnr", [], seed=5, clients=clients)
    report = _law(sim)
    assert report["clients_cut"] == report["clients_dropped"] == 5
    assert report["replays"]["subscribers_failed_over"] == 5
    assert report["deliveries_to_cut_clients"] > 0 and report["replays"]["replayed"] > 0
    assert sim.ledger.summary()["lost"] == 0


def test_a_replaying_subscriber_is_told_the_gap_of_a_seam_that_overflowed() -> None:
    """The SDK's seam rule (``Seam.shortfall``) in the simulator: with no room for live
    deliveries while a replay is under way, each goes through and the subscriber is told
    the seam fell short, as the SDK tells it; nothing is lost. (Publications every 10 ms,
    so that live deliveries come while the replays are under way.)"""
    clients = [(f"S{i}", 1.0 + 0.3 * i) for i in range(5)]
    sim = _run(FIG2, "dnr", [], seed=5, clients=clients, publications=500)
    assert not sim.seam_gaps and "seam_overflowed" not in sim.replay_counts
    full = _run(FIG2, "dnr", [], seed=5, clients=clients, seam_limit=0, publications=500)
    assert full.replay_counts["seam_overflowed"] >= len(full.seam_gaps) > 0
    assert _law(full)["replays"]["seam_gaps"] == len(full.seam_gaps)
    assert all(told == {SEAM_FILLED} for told in full.seam_gaps.values())
    assert full.ledger.summary()["lost"] == 0


@pytest.mark.parametrize("mode", ["dnr", "snr"])
def test_subscribers_that_fail_over_get_what_was_published_while_they_were_away(
    mode: str,
) -> None:
    """Every broker of fig2 killed in turn (restarted later; every second one at the quick
    size, ``sized``): its subscribers fail over and replay; they get everything exactly
    once (no gap: every store answers, the dead broker's once it is back). Without the
    replay the law finds the silent loss."""
    moved = replayed = 0
    for broker in sorted(FIG2.brokers)[:: sized(2, 1)]:
        sim = _run(FIG2, mode, [Failure((broker,), FAIL_AT, BACK_AT)], seed=3)
        report = _law(sim)
        assert report["host_dead"]["lost"] == report["replays"]["gaps"] == 0, broker
        moved += report["replays"]["subscribers_failed_over"]
        replayed += report["replays"].get("replayed", 0)
    assert moved >= sized(20, 40) and replayed > 0, (moved, replayed)
    sim = _run(FIG2, mode, [], seed=3, publications=0)
    sim.replay_on_failover = False
    start = sim.now
    sim.fail(Failure(("c:0",), FAIL_AT, BACK_AT), start)
    for j in range(50):
        sim.at(start + 5.0 * j / 50, sim.publish, "Pa:0", "a:0", {"x": j % 10})
    sim.run()
    with pytest.raises(AssertionError, match="lost without a count or a reported gap"):
        _law(sim)


def test_a_failing_over_subscriber_learns_a_broker_is_dead_only_by_its_silence() -> None:
    """As the SDK does, a simulated subscriber notices its host's death by its heartbeat
    watch (``client_policy.silence``: the liveness, and up to a heartbeat interval
    more), then tries its list in order: the next broker, dead too, costs it a hello
    unanswered for the liveness, then it connects to the one after. It knows nothing of
    which brokers are dead."""
    sim = Simulator(FIG2, "snr", seed=3, covering="off")
    sim.subscribe("S", "c:0", Subscription((Predicate("x", "<", 5),)))
    sim.run()
    start = sim.now
    first, second, third = "c:0", *FIG2.failover_order("c:0")[:2]
    for broker in (first, second):
        sim.fail(Failure((broker,), 1.0, 30.0), start)
    sim.run()
    noticed = sim._noticed("S", first, start + 1.0)
    assert start + 1.0 + CLIENT_LIVENESS < noticed <= start + 1.0 + CLIENT_LIVENESS + 0.5
    assert sim.outages["S"] == [(start + 1.0, noticed + CLIENT_LIVENESS)]
    assert sim.first_home["S"] == first and sim._home["S"] == third


def test_a_durable_subscriber_fails_over_twice_along_the_list_it_began_with() -> None:
    """As the SDK's connection keeps the endpoint list it was made with, a durable
    subscriber that failed over from c:0 to the next broker and loses that one too goes
    on along c:0's list (the broker after it there), as a plain subscriber does, not
    along the list of the broker it is at."""
    sim = DurableSimulator(FIG2, "snr", seed=3, covering="off")
    sim.durable_subscribe("D", "c:0", Subscription((Predicate("x", "<", 5),)))
    sim.subscribe("S", "c:0", Subscription((Predicate("x", "<", 5),)))
    sim.run()
    start = sim.now
    first, second, third = "c:0", *FIG2.failover_order("c:0")[:2]
    assert FIG2.failover_order(second)[0] != third  # the two lists part here
    sim.fail(Failure((first,), 1.0, 60.0), start)
    sim.fail(Failure((second,), 10.0, 60.0), start)
    sim.run()
    assert sim.durable_clients["D"].counts["failed_over"] == 2
    assert sim.durable_clients["D"].host == sim._home["S"] == third


def test_no_failure_no_failure_report() -> None:
    sim = _run(FIG2, "dnr", [])
    assert "failures" not in sim.report()
    assert sim.report()["lost"] == sim.report()["duplicates"] == 0


@pytest.mark.parametrize(
    ("text", "link", "problem"),
    [
        ("c:0", False, "expected BROKER@T"),
        ("c:0@x", False, "times must be numbers"),
        ("c:0@3:2", False, "need 0 <= T < RESTART_T"),
        ("c:0@-1", False, "need 0 <= T"),
        ("a:0@1", True, "name two different brokers"),
        ("a:0-a:0@1", True, "name two different brokers"),
        ("c:0@1", None, "give the time it resumes, BROKER@T:RESUME_T"),
    ],
)
def test_bad_failure_specs_are_refused(text: str, link: bool | None, problem: str) -> None:
    """``link`` None: a stall."""
    with pytest.raises(FailureSpecError, match=problem):
        parse_failure(text, link=bool(link), stall=link is None)


def test_schedule_file(tmp_path) -> None:
    path = tmp_path / "failures.txt"
    path.write_text(
        "# kill, cut, stall\nbroker c:0@1:3\nlink a:0-b:0@2  # for good\nstall d:1@1:2\n"
    )
    assert read_schedule(path) == [
        Failure(("c:0",), 1.0, 3.0),
        Failure(("a:0", "b:0"), 2.0),
        Failure(("d:1",), 1.0, 2.0, stall=True),
    ]
    path.write_text("router c:0@1\n")
    with pytest.raises(FailureSpecError, match=r"failures\.txt:1: start with 'broker', 'link' or"):
        read_schedule(path)


def test_sim_cli_reports_failures(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "--preset", "fig2", "--mode", "dnr", "--subscribers", "40"]
    args += ["--publishers", "6", "--notifications", "20", "--json"]
    assert main([*args, "--fail", "c:0@0.5:4", "--fail-link", "a:1-b:1@1"]) == 0
    report = json.loads(capsys.readouterr().out)["failures"]
    assert report["brokers_killed"] == report["brokers_restarted"] == report["links_cut"] == 1
    assert report["host_alive"]["lost"] == report["host_alive"]["duplicates"] == 0
    assert main([*args, "--stall", "c:0@0.5:2"]) == 0
    report = json.loads(capsys.readouterr().out)["failures"]
    assert report["brokers_paused"] == 1 and "links_cut" not in report
    assert report["detections"] == len(FIG2.brokers["c:0"].neighbours)
    assert main([*args, "--fail", "zz:9@1"]) == 2
    assert "not a broker of fig2" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["snr", "dnr", "bid"])
def test_a_broker_routes_through_a_neighbour_only_while_its_node_says_so(mode: str) -> None:
    """Which links a simulated broker routes and replays through is its node's
    ``Neighbours.routable``, the rule the broker process writes into its LST's rows, and
    a neighbour becomes routable only by its own word (its node serves, as its heartbeat
    says). c:1 restarts and b:1's frames to it are lost for a while soon after; every
    0.5 ms each live broker's view is checked against its node. A copy of the rule in
    the simulator (a set of its own of the links each broker detected down) let the
    restarted broker route through neighbours whose share had not come yet."""
    sim = Simulator(
        FIG2, mode, seed=1, latency=LatencyModel(0.001, 0.002), oracle_factory=ReferenceMatcher
    )
    for i, broker in enumerate(sorted(FIG2.brokers)):
        sim.subscribe(f"S{i}", broker, Subscription((Predicate("x", "<", 10),)))
    sim.run()
    start = sim.now
    sim.fail(Failure(("c:1",), 0.1, 0.5), start)
    sim.fail(Failure(("b:1", "c:1"), 0.7, 0.8, one_way=True), start)
    seen: Counter[str] = Counter()

    def check() -> None:
        assert sim.failures is not None
        dead = sim.failures.dead
        for broker, node in sim.nodes.items():
            if broker in dead:
                continue
            view = sim._view(broker)
            for n in sim.scot.graph[broker]:
                routable = node.neighbours.routable(n)
                seen["routable" if routable else "not routable"] += 1
                assert view.down(n) is not routable, (sim.now - start, broker, n)
                assert not routable or n in dead or sim.nodes[n].serving, (broker, n)
        if sim.now < start + 3.0:
            sim.at(sim.now + 0.0005, check)

    sim.at(start, check)
    for k in range(200):
        sim.at(start + 0.01 * k, sim.publish, "Pc:1", "c:1", {"x": 1})
    sim.run()
    assert seen["routable"] and seen["not routable"] > 50  # both were looked at
    report = _law(sim)
    print(mode, dict(seen), report["host_alive"])
    if mode != "bid":  # BID has no resync: c:1's restart loses its table (counted)
        assert report["host_alive"]["lost"] == 0
        assert report["host_alive"]["delivered"] == report["host_alive"]["expected_deliveries"]


def test_a_broker_restarted_next_to_a_dead_neighbour_serves_and_holds_nothing_back() -> None:
    """r0:1 dies for good while r0:0 crashes twice over (restarts at 1 s and at 2 s):
    the restarted r0:0 declares its dead neighbour down when its detection is due and
    serves on its live neighbour's share, rather than holding its publications until a
    second restart drops them (a detection that skipped neighbours never heard lost
    Pr0:0's second publication for 17 subscribers on live hosts, uncounted)."""
    graph = nx.Graph()
    graph.add_edge("r0", "r1")
    scot = build_scot(graph, 2, name="pair")
    failures = [
        Failure(("r0:1",), 0.0, None),
        Failure(("r0:0",), 0.0, 1.0),
        Failure(("r0:0",), 0.0, 2.0),
    ]
    sim = _run(scot, "dnr", failures, seed=0, subscribers=30, publications=30)
    report = _law(sim)
    print(report["host_alive"])
    assert report["host_alive"]["lost"] == report["host_alive"]["duplicates"] == 0
    assert report["host_alive"]["delivered"] == report["host_alive"]["expected_deliveries"]


def test_a_replay_around_a_dead_broker_keeps_its_gap_until_its_own_parts_fill_it() -> None:
    """Found by hypothesis: DNR on two regions × two clusters, r0:0 dead from the first
    publication to 3 s, r1:0 from 3 s to 4 s. r0:0's subscribers fail over to r1:0 at
    1.5 s and replay; r0:0 is silent (and r0:1, reached only through it, is not asked):
    the gap names r0:0. At 4.5 s they fail over to r0:1 and replay again, asking after
    the last of Pr0:1 they got live (6), so Pr0:1's 1 and 2 are not asked for again;
    r0:0 answers that second replay. The simulator withdrew the first replay's gap then,
    and the loss went unreported; the SDK narrows a gap only by late parts of its own
    replay, and so does the simulator now: the loss stays reported."""
    tree = nx.Graph()
    tree.add_edge("r0", "r1")
    failures = [Failure(("r0:0",), 0.0, 3.0), Failure(("r1:0",), 3.0, 4.0)]
    sim = _run(build_scot(tree, 2), "dnr", failures, seed=0, subscribers=30, publications=30)
    _law(sim)
    assert sim.replay_gaps["S11"] == {"r0:0"}


def test_a_link_that_heals_after_a_restart_hears_the_first_heartbeat_once() -> None:
    """A broker restarts while its link to a neighbour is cut; when the link heals the two
    meet (the handshake), and each hears the other's first heartbeat once, as on a
    process link (the simulator heard it at the handshake and again behind it)."""
    sim = Simulator(FIG2, "snr", seed=3, latency=LatencyModel(0.001, 0.002), covering="off")
    a, b = sorted(FIG2.graph.edges)[0]
    sim.subscribe("S", a, Subscription((Predicate("x", "<", 5),)))
    sim.run()
    start = sim.now
    heard: Counter[tuple[str, str]] = Counter()
    hear = sim._heard

    def counted(src: str, dst: str, serving: bool) -> None:
        if sim.now >= start + 5.0:
            heard[(src, dst)] += 1
        hear(src, dst, serving)

    sim._heard = counted  # type: ignore[method-assign]
    sim.fail(Failure((a, b), 1.0, 5.0), start)
    sim.fail(Failure((a,), 2.0, 3.0), start)
    sim.run()
    assert heard == {(a, b): 1, (b, a): 1}
    assert sim.nodes[a].neighbours.routable(b) and sim.nodes[b].neighbours.routable(a)
    assert (a, b) not in sim.failures.failed_at and (b, a) not in sim.failures.failed_at


def test_custody_keeps_what_the_receiver_has_not_acknowledged() -> None:
    """The simulator's links keep what the process's keep: while ``A``'s frames to ``B``
    are lost (a one-way cut), every notification ``A`` sent ``B`` since the cut stays
    unacknowledged in ``A``'s custody, while every other link's receiver acknowledges
    what it took within a round trip (each link's receiver has acknowledged at most the
    count its sender numbered); at the detections what was kept is routed again, and the
    run keeps the failure law."""
    a, b = sorted(FIG2.graph.edges)[0]
    sent_after_cut: list[object] = []
    cut = math.inf

    def forwarded(src: str, dst: str, message: object) -> None:
        if (src, dst) == (a, b) and sim.now >= cut and type(message) is Notification:
            sent_after_cut.append(message)

    sim = Simulator(FIG2, "snr", seed=3, latency=LatencyModel(0.001, 0.002), on_forward=forwarded)
    brokers = sorted(FIG2.brokers)
    for i, broker in enumerate(brokers):
        sim.subscribe(f"S{i}", broker, Subscription((Predicate("x", "<", 10),)))
    sim.run()
    start = sim.now
    cut = start + FAIL_AT
    sim.fail(Failure((a, b), FAIL_AT, BACK_AT, one_way=True), start)
    for j in range(200):
        broker = brokers[j % len(brokers)]
        sim.at(start + 2.0 * j / 200, sim.publish, f"P{broker}", broker, {"x": j % 10})
    sim.run(until=cut + 0.5)  # before anyone detects the cut
    custody = sim.failures.custody
    kept = [message_of(copy) for _, sent, copy in custody.of(a, b).unacked if sent >= cut]
    assert sent_after_cut and kept == sent_after_cut
    for (src, dst), link in custody.links.items():
        receiver = sim.nodes[dst].neighbours[src]
        assert receiver.acked <= link.numbered
        if {src, dst} != {a, b}:
            assert all(sim.now - sent < 0.05 for _, sent, _ in link.unacked), (src, dst)
    sim.run()
    report = _law(sim)
    assert report["custody.rerouted"] >= len(kept)


@pytest.mark.parametrize("mode", ["dnr", "snr"])
def test_a_cut_shorter_than_down_after_is_noticed_by_no_one_and_loses_nothing(mode: str) -> None:
    """A link cut for less than ``down_after`` (the simulator's ``detection``) is, as
    over TCP, seen by neither end: no detection, nothing routed around it, and what it
    carried meanwhile arrives after the heal, in order; every subscriber gets every
    publication exactly once. (The process's link is aborted, and what it carried lost,
    only after ``TCP_ABORT_AFTER`` times ``down_after``: ``transport.links.tcp_abort_ms``.)
    A cut a little longer than ``down_after`` is detected at both ends."""
    a, b = sorted(FIG2.graph.edges)[0]
    short = _run(FIG2, mode, [Failure((a, b), FAIL_AT, FAIL_AT + 0.8)], seed=5)
    report = _law(short)
    assert "detections" not in report and "lost_in_transit" not in report, report
    assert short.ledger.expected == set(short.ledger.received)
    assert not short.failures.stuck and not short.failures.cut_since
    longer = _run(FIG2, mode, [Failure((a, b), FAIL_AT, FAIL_AT + 1.2)], seed=5)
    assert _law(longer)["detections"] == 2


@pytest.mark.parametrize("mode", ["dnr", "snr"])
def test_a_paused_broker_is_declared_down_by_its_neighbours_and_declares_no_one(mode: str) -> None:
    """c:0 is paused (SIGSTOP) for two seconds: it runs nothing meanwhile, so each of its
    neighbours declares it down once (a detection each) and routes around it; on resume
    it excuses its own stall by its node's rule (``Neighbours.stalled``) and declares no
    one down; what reached it and what was published at it meanwhile waits, in order,
    and is taken at the resume; everyone gets everything exactly once. The process
    test ``test_cluster.test_stalled_broker_and_its_clients_lose_nothing`` shows the
    same (``declared_down_by`` is the number of its neighbours)."""
    broker = "c:0"
    sim = _run(FIG2, mode, [Failure((broker,), FAIL_AT, BACK_AT, stall=True)], seed=7)
    report = _law(sim)
    neighbours = sorted(FIG2.graph[broker])
    assert report["detections"] == len(neighbours), report
    assert all(sim.nodes[n].neighbours[broker].was_down > 0 for n in neighbours)
    assert all(sim.nodes[broker].neighbours[n].was_down == 0 for n in neighbours)
    assert "publications_refused" not in report
    assert any(p == f"P{broker}" for _, p, _ in sim.ledger.expected)
    assert sim.ledger.expected == set(sim.ledger.received)


@pytest.mark.parametrize("paused", [1.0, 2.5])
def test_the_subscribers_of_a_paused_broker_fail_over_after_the_sdks_liveness(
    paused: float,
) -> None:
    """A paused broker's subscribers hear nothing from it: once its heartbeat watch
    judges it silent (``CLIENT_LIVENESS`` and up to a heartbeat interval more) each fails
    over, and keeps the session it left until the SDK's
    linger is over, then says bye (counted ``clients_left``); the broker withdraws
    those subscriptions then, not before. A pause shorter than the liveness moves no
    one. Nothing is lost or duplicated either way. (Processes:
    ``test_client.test_a_subscriber_keeps_its_session_at_a_stalled_broker_it_left``.)"""
    broker = "c:0"
    failure = Failure((broker,), FAIL_AT, FAIL_AT + paused, stall=True)
    sim = _run(FIG2, "dnr", [failure], seed=7)
    report = _law(sim)
    homed = {s for s, home in sim.first_home.items() if home == broker}
    assert sim.ledger.expected == set(sim.ledger.received)
    if paused < CLIENT_LIVENESS:
        assert not sim.failed_over and "clients_left" not in report
        return
    assert homed and sim.failed_over == homed
    for s in homed:  # when each one's heartbeat watch judged it silent
        ((away, back),) = sim.outages[s]
        assert back == pytest.approx(sim._noticed(s, broker, away))
        assert CLIENT_LIVENESS < back - away <= CLIENT_LIVENESS + 0.5
    assert report["clients_left"] == len(homed)
    assert not any(sim.nodes[broker].sessions.subscriptions(s) for s in homed)


@pytest.mark.parametrize("pause", [0.15, 2.0])
def test_a_paused_broker_excuses_what_the_process_excuses(
    pause: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On resume a simulated broker excuses the time it did not run as the process's
    liveness tick does (``stall`` against ``liveness_tick``): a pause shorter than two
    ticks, which the process's tick cannot tell from its own lateness, excuses nothing;
    a longer one its length less a tick (the simulator once excused the whole pause)."""
    excused: list[float] = []
    monkeypatch.setattr(Neighbours, "stalled", lambda self, late: excused.append(late))
    _run(FIG2, "snr", [Failure(("c:0",), FAIL_AT, FAIL_AT + pause, stall=True)])
    tick = liveness_tick(HEARTBEAT)
    assert excused == [pytest.approx(stall(FAIL_AT + pause, FAIL_AT, tick))]
    assert excused[0] == (0.0 if pause < 2 * tick else pytest.approx(pause - tick))


def test_a_paused_broker_excuses_its_stall_by_its_nodes_rule() -> None:
    """c:0's link to b:0 is cut 0.5 s before c:0 is paused for 2 s and heals 0.1 s after
    it resumes: b:0 heard nothing from c:0 for 2.6 s and declares it down, but c:0 ran
    for only 0.6 s of that silence, less than ``down_after``: on resume it excuses its
    stall (``Neighbours.stalled``, the process's rule too: ``peer_liveness``) and
    declares no one down. Without the excuse it would declare b:0 down at the heal."""
    broker, cut = "c:0", "b:0"
    failures = [
        Failure((broker, cut), FAIL_AT, FAIL_AT + 2.6),
        Failure((broker,), FAIL_AT + 0.5, FAIL_AT + 2.5, stall=True),
    ]
    sim = _run(FIG2, "dnr", failures, seed=7)
    report = _law(sim)
    assert report["detections"] == len(FIG2.graph[broker]), report
    assert sim.nodes[cut].neighbours[broker].was_down > 0
    assert all(sim.nodes[broker].neighbours[n].was_down == 0 for n in FIG2.graph[broker])


def test_an_acknowledgement_sent_over_a_cut_link_arrives_at_the_heal() -> None:
    """What b:0 sends a:0 is cut for 0.5 s (one way, shorter than detection), just as a:0
    publishes five publications to b:0's subscriber: b:0 takes them and acknowledges at
    once (the ASK ahead of a confirmed copy), over the cut link. As TCP carries the
    process's heartbeat, the link carries those acknowledgements to the heal: a:0's
    custody settles and the publisher has its five confirms (the simulator once dropped
    an acknowledgement sent over a cut link, and with nothing more published the
    confirms never came)."""
    sim = Simulator(FIG2, "snr", seed=1)
    sim.subscribe("S", "b:0", Subscription((Predicate("x", ">=", 0),)))
    sim.run()
    start = sim.now
    sim.fail(Failure(("b:0", "a:0"), 0.0, 0.5, one_way=True), start)
    for i in range(5):
        sim.at(start + 0.01 + i * 0.01, sim.publish, "Pa:0", "a:0", {"x": i})
    sim.run()
    assert sim.report()["delivered"] == 5 and "detections" not in sim.failure_counts
    assert not sim.publishers.unanswered["Pa:0"]  # all five confirmed
    kept = sim.failures.custody.links.get(("a:0", "b:0"))
    assert kept is None or not kept.unacked
