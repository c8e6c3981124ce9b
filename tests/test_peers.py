"""Peer links between real broker processes (DESIGN §7): failure detection, restart with
a new incarnation, resync, and withdrawal of what the dead process had subscribed."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conditions import accounting, closing_control, tables_hold, until
from conftest import secure_fig2

from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster
from octopis.settings import BrokerSettings, Routing

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

NEIGHBOURS_OF_C0 = ("b:0", "d:0", "e:0", "c:1", "c:2")


@pytest.fixture
def fig2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    # the paper's SBP (covering off): the tests read settling from equal table sizes
    yield from secure_fig2(tmp_path, monkeypatch, BrokerSettings(routing=Routing(covering="off")))


def test_kill_detect_restart_resync_and_route_again(fig2: LocalCluster) -> None:
    """Subscribers on five brokers and one on c:0, kill -9 of inner broker c:0 (its
    subscriber dies with it): each of its neighbours declares it down after T and no
    sooner; restarted, it is handed back exactly the table it had less its dead
    subscriber's entry (entry by entry, and as its neighbours' ``resync_view`` says), each
    neighbour withdraws the predecessor's subscription so that no broker keeps it, c:0
    is ready, and routes again: notifications from a:0 through c:0 reach d:0 and f:0
    exactly once."""
    scot = fig2.scot
    hosts = ("a:0", "d:0", "f:0", "b:1", "e:2")
    got: Counter[tuple[str, int]] = Counter()

    async def scenario() -> tuple[dict, dict, list[float], dict[str, dict]]:
        subs = []
        for host in hosts:
            sub = await Subscriber.connect(
                scot.brokers[host].client_endpoint,
                f"s-{host}",
                on_notification=lambda n: got.update([(n.subscriber, n.seq)]),
            )
            await sub.subscribe("[class,eq,'STOCK']")
            subs.append(sub)
        gone = await Subscriber.connect(scot.brokers["c:0"].client_endpoint, "gone")
        await gone.subscribe("[class,eq,'STOCK']")
        everyone = len(hosts) + 1
        await until(lambda: _all_equal(fig2, "routing_table_size", everyone), "SBP settles", 20)
        before = (await fig2.ask(["c:0"], "table", 5))["c:0"]

        os.kill(fig2.processes["c:0"].pid, signal.SIGKILL)
        await gone.close()  # the client goes down with its broker: its bye finds no one
        await until(lambda: _all_see_down(fig2, "c:0"), "detection", 10)
        stats = await fig2.ask(list(NEIGHBOURS_OF_C0), "stats", 5)
        silences = [d["silent"] for s in stats.values() for d in s["detections"]]

        fig2.spawn_one("c:0")
        await fig2.wait_ready(60, ["c:0"])
        await until(lambda: _all_equal(fig2, "routing_table_size", len(hosts)), "withdrawal", 20)
        after = (await fig2.ask(["c:0"], "table", 5))["c:0"]
        views = await fig2.ask(list(NEIGHBOURS_OF_C0), "resync_view", 5, "c:0")
        view = {sub_id: n for n, ids in views.items() for sub_id in ids}
        assert view == {sub_id: e["last_hop"] for sub_id, e in after.items()}

        pub = await Publisher.connect(scot.brokers["a:0"].client_endpoint, "p")
        for _ in range(50):
            await pub.publish({"class": "STOCK", "price": 2.0})
        expected = {(f"s-{h}", seq) for h in hosts for seq in range(1, 51)}
        await until(lambda: expected <= got.keys(), "deliveries after restart", 20)
        stats = await fig2.ask(list(scot.brokers), "stats", 5)
        for client in (*subs, pub):
            await client.close()
        return before, after, silences, stats

    before, after, silences, stats = asyncio.run(closing_control(fig2, scenario()))
    print(f"detection: silent {min(silences):.2f}-{max(silences):.2f} s at the neighbours")
    assert len(silences) == len(NEIGHBOURS_OF_C0)
    assert min(silences) >= BrokerSettings().links.down_after
    kept = {sub_id: e for sub_id, e in before.items() if not e["local"]}
    assert len(before) == len(hosts) + 1 and len(kept) == len(hosts) and after == kept
    restarted = stats["c:0"]
    assert restarted["ready"] and restarted["routing_table_size"] == len(hosts)
    withdrawn = {b for b, s in stats.items() if s["counters"].get("predecessor_entries_withdrawn")}
    assert withdrawn == set(NEIGHBOURS_OF_C0)
    assert {s["routing_table_size"] for s in stats.values()} == {len(hosts)}
    assert [k for k, n in got.items() if n != 1] == []


def test_a_paused_broker_comes_back_as_itself_and_gets_what_it_missed(
    fig2: LocalCluster,
) -> None:
    """``kill -STOP`` of c:0 for a few seconds: its neighbours declare it down, route
    around it, and hold the subscription made meanwhile; ``kill -CONT``: the same
    incarnation is back (no restart, no resync), the held subscription crosses it, and
    every notification reaches every subscriber exactly once."""
    scot = fig2.scot
    got: Counter[tuple[str, int]] = Counter()

    def on(n) -> None:
        got.update([(n.subscriber, n.seq)])

    async def scenario() -> dict:
        subs = []
        for host in ("a:0", "d:0"):
            sub = await Subscriber.connect(
                scot.brokers[host].client_endpoint, f"s-{host}", on_notification=on
            )
            await sub.subscribe("[class,eq,'STOCK']")
            subs.append(sub)
        await until(lambda: _all_equal(fig2, "routing_table_size", 2), "SBP settles", 20)
        pub = await Publisher.connect(scot.brokers["a:0"].client_endpoint, "p")
        pid = fig2.processes["c:0"].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await until(lambda: _all_see_down(fig2, "c:0"), "detection", 10)
            late = await Subscriber.connect(
                scot.brokers["f:0"].client_endpoint, "s-f:0", on_notification=on
            )
            subs.append(late)
            await late.subscribe("[class,eq,'STOCK']")
            for _ in range(20):
                await pub.publish({"class": "STOCK", "price": 1.0})
        finally:
            os.kill(pid, signal.SIGCONT)
        await until(lambda: _all_equal(fig2, "routing_table_size", 3), "held SBP crosses", 20)
        for _ in range(20):
            await pub.publish({"class": "STOCK", "price": 2.0})
        expected = {(f"s-{h}", seq) for h in ("a:0", "d:0", "f:0") for seq in range(21, 41)}
        expected |= {(f"s-{h}", seq) for h in ("a:0", "d:0") for seq in range(1, 21)}
        await until(lambda: expected <= got.keys(), "deliveries", 20)
        stats = await fig2.ask(list(scot.brokers), "stats", 5)
        for client in (*subs, pub):
            await client.close()
        return stats

    stats = asyncio.run(closing_control(fig2, scenario()))
    counters = Counter()
    for s in stats.values():
        counters.update(s["counters"])
    assert counters["links_down"] >= len(NEIGHBOURS_OF_C0)
    assert counters["peer_restarts"] == 0 and counters["resync_entries_sent"] == 0
    assert [k for k, n in got.items() if n != 1] == []


async def _all_equal(cluster: LocalCluster, key: str, value: object) -> bool:
    stats = await cluster.ask(list(cluster.scot.brokers), "stats", 5)
    return all(s is not None and s[key] == value for s in stats.values())


async def _all_see_down(cluster: LocalCluster, dead: str) -> bool:
    stats = await cluster.ask(list(NEIGHBOURS_OF_C0), "stats", 5)
    return all(s["links"][dead]["state"] == "down" for s in stats.values())


@pytest.mark.timeout(600)
def test_a_subscription_flood_cuts_passes_short_and_no_link_goes_silent(
    line_of: Callable[[BrokerSettings], LocalCluster],
) -> None:
    """20,000 subscriptions made at once on a:0 of the line a:0 – b:0 – c:0 reach b:0 and
    c:0 as batches of up to 64 bodies. Amid the flood b:0 is stopped (SIGSTOP) until a:0
    has taken :data:`BACKLOG` more subscriptions (at most :data:`STOPPED_AT_MOST` s),
    and then works through that backlog starved (:func:`_starve`): a pass under way when
    one of the stalls begins lasts past ``PASS_SECONDS``, and must be cut at its next
    body (counted, ``input_passes_cut``) so that heartbeats and acknowledgements leave at
    once: no neighbour is declared down (T = 1 s; b:0 is silent for the first stop and
    the stalls, about 0.55 s at most); every table holds every subscription, and
    notifications published at c:0 right after reach every matching subscription on a:0
    exactly once. Every broker took the collector's passes over the flood's objects
    while its input was dry (``memory.gc_idle``).

    A backlog alone does not make a pass reach ``PASS_SECONDS``: a pass takes at most
    ``PEER_BATCH`` (256) bodies and the rest of its last message, and a full pass of the
    flood's subscriptions took ~6 ms of CPU here; only time b:0 does not run in the
    middle of a pass does. With a single 0.4 s stop the cuts came from the stop landing
    inside a pass or from the other processes' contention for the machine's 2 cores
    (passes of 2-9 ms of CPU over 20-60 ms), and b:0 had none in 1 run of 3 on a loaded
    machine. A stall cuts nothing only if it begins between two passes (0.1-0.5 ms
    between passes of ~6 ms, logged); logged pass by pass, each of 8 stalls over 2 runs
    began inside a pass, which was then cut."""
    cluster = line_of(
        BrokerSettings(routing=Routing(covering="off"))
    )  # the flood reaches every table
    scot = cluster.scot
    subscribers, each, published = 4, 5000, 10
    got: Counter[tuple[str, int]] = Counter()

    async def scenario() -> tuple[dict[str, dict], tuple[float, int]]:
        await cluster.wait_ready(60)
        subs = [
            await Subscriber.connect(
                scot.brokers["a:0"].client_endpoint,
                f"s{k}",
                on_notification=lambda n: got.update([(n.subscriber, n.seq)]),
            )
            for k in range(subscribers)
        ]
        flood = asyncio.gather(
            *(s.subscribe(f"[class,eq,'STOCK'],[price,>,{i}]") for s in subs for i in range(each))
        )
        await until(lambda: _table_holds(cluster, "a:0", 1000), "the flood starts", 30)
        paused = await _starve(cluster, "b:0", "a:0")
        await flood
        # 30 s alone; five times that beside paper75 on a loaded CI run (how long is
        # bench's question: here only that it spreads)
        await until(lambda: tables_hold(cluster, subscribers * each), "the flood spreads", 300)
        pub = await Publisher.connect(scot.brokers["c:0"].client_endpoint, "feed")
        for _ in range(published):
            await pub.publish({"class": "STOCK", "symbol": "X", "price": 2.5})
        await until(lambda: sum(got.values()) >= subscribers * published, "deliveries", 30)
        stats = await cluster.call_all("stats")
        for client in (pub, *subs):
            await client.close()
        return stats, paused

    stats, (paused_for, backlog) = asyncio.run(closing_control(cluster, scenario()))
    cut = {b: s["counters"].get("input_passes_cut", 0) for b, s in stats.items()}
    idle = {b: s["gc"]["idle_passes"] for b, s in stats.items()}
    print(
        f"b:0 stopped {paused_for:.3f} s while a:0 took at least {backlog} subscriptions; "
        f"passes cut short: {cut}; idle collector: {idle}"
    )
    assert cut["b:0"] > 0
    assert all(sum(passes) > 0 for passes in idle.values()), idle
    assert not any(s["detections"] for s in stats.values()), (
        f"b:0 stopped {paused_for:.3f} s, then {STALLS} x {STALL_SECONDS} s",
        {b: s["detections"] for b, s in stats.items()},
    )
    counts = accounting("subscribers on a:0", subscribers * published, got)
    assert counts["delivered"] == counts["expected"]
    assert counts["duplicates"] == counts["lost"] == 0


BACKLOG = 1000
"""Subscriptions a:0 takes while b:0 is stopped: ~4 passes of PEER_BATCH bodies, ~23 ms
of b:0's work here (a full pass of flood subscriptions took 6 ms of CPU), more than the
STALLS run slices give it, so that b:0 is inside a pass when each stall begins."""
STOPPED_AT_MOST = 0.4
"""Seconds b:0 is stopped for the backlog at most: with the stalls after it, b:0's
silence stays well under T = 1 s (``links.down_after``)."""
STALLS, RUN_SECONDS, STALL_SECONDS = 4, 0.003, 0.03
"""Then b:0 works through its backlog in slices: it runs RUN_SECONDS (under the CPU time
of a full pass) and is stopped for STALL_SECONDS (over PASS_SECONDS, 0.02), STALLS
times: the pass under way when a stall begins lasts past PASS_SECONDS, as on a starved
machine, and must be cut at its next body."""

STARVE = """import os, select, signal, sys, time
pid, most, stalls, run, stall = int(sys.argv[1]), *map(float, sys.argv[2:])
started = time.monotonic()
os.kill(pid, signal.SIGSTOP)
try:
    print("stopped", flush=True)
    select.select([sys.stdin], [], [], most)
    print(time.monotonic() - started, flush=True)
    for _ in range(int(stalls)):
        os.kill(pid, signal.SIGCONT)
        time.sleep(run)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stall)
finally:
    os.kill(pid, signal.SIGCONT)
"""
"""What :func:`_starve` runs in a process of its own: stop ``pid`` until its stdin is
readable (a line or its end) or ``most`` seconds have passed (printing how long), then
``stalls`` times let it run ``run`` seconds and stop it ``stall`` seconds; let it go
on."""


async def _starve(cluster: LocalCluster, starved: str, sender: str) -> tuple[float, int]:
    """Stop ``starved`` (SIGSTOP) until ``sender``'s routing table has grown by
    :data:`BACKLOG` subscriptions (read over its kept control connection), at most
    :data:`STOPPED_AT_MOST` seconds; then let it work through that backlog in
    :data:`STALLS` slices. Returns how long it was stopped first and how many
    subscriptions ``sender`` took meanwhile, at least: amid the flood a:0 answered its
    control RPC ~0.2 s late here, so on a loaded machine the stop runs to its bound, and
    a reading that may have come after ``starved`` went on is left out. Timed and
    signalled by a process of its own, so that neither this test's event loop nor its
    collector's passes (which a thread would wait out for the GIL) stretch the stops: on
    a loaded machine the loop woke from a 0.4 s sleep up to 0.45 s late, and the
    collector's passes over the flood's 20,000 requests took up to 0.5 s (2 s once)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STARVE,
        str(cluster.processes[starved].pid),
        *map(str, (STOPPED_AT_MOST, STALLS, RUN_SECONDS, STALL_SECONDS)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    assert await child.stdout.readline() == b"stopped\n"
    released = asyncio.ensure_future(child.stdout.readline())
    first = took = await _table_size(cluster, sender)
    while took - first < BACKLOG:
        await asyncio.sleep(0.01)
        size = await _table_size(cluster, sender)
        if released.done():  # read after b:0 went on, perhaps
            break
        took = size
    child.stdin.close()
    stopped = await released
    await child.wait()
    assert child.returncode == 0, f"stopping {starved} failed (exit {child.returncode})"
    return float(stopped), took - first


async def _table_size(cluster: LocalCluster, broker: str) -> int:
    return (await cluster.call(broker, "status"))["routing_table_size"]


async def _table_holds(cluster: LocalCluster, broker: str, at_least: int) -> bool:
    """``broker``'s routing table holds ``at_least`` subscriptions (for :func:`until`)."""
    stats = await cluster.ask([broker], "stats", 5)
    return stats[broker]["routing_table_size"] >= at_least
