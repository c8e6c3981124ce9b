"""A running overlay grown and shrunk by a cluster and a region (issue 18, DESIGN §9):
``octopis.cluster.scale`` on fig2's broker processes while notifications flow, and the
broker's ``relink`` refusing what it must.

The elastic balancer's decisions under load (a cluster added while the mean load ratio
stays above LR_high, LDM moving subscribers into it, the cluster removed below LR_low
with its subscribers moved out first, every notification exactly once) are a law on the
brokers' own node (tests/test_sim_topology_change.py
``test_the_elastic_balancer_grows_under_load_and_shrinks_back_without_loss``); on
processes, a cluster added and removed while notifications flow is
:func:`test_fig2_grows_a_cluster_and_a_region_and_shrinks_back_while_notifications_flow`,
``balance run --elastic`` removing one
:func:`test_octopis_scale_grows_an_overlay_that_octopis_up_started`, and the brokers'
load counts tests/test_load.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conditions import accounting, closing_control, until
from conftest import ready_again, shared_secure_fig2

from octopis.client import Connection, ConnectionGroup, Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster, find_free_base_port
from octopis.cluster.scale import change_overlay
from octopis.keys import Keys
from octopis.settings import BrokerSettings, Links, Routing
from octopis.topology import Scot, build_preset
from octopis.topology_change import (
    add_cluster,
    add_region,
    decode_view,
    relink_view,
    remove_cluster,
    remove_region,
)

SYMBOLS = 30
SUBSCRIBERS = 90
"""Three per symbol: enough for every broker of fig2 to host subscribers while the overlay
changes; that many more subscribers, and publications during changes, reach everyone
exactly once is a law on the brokers' own node (tests/test_sim_topology_change.py
``test_publications_during_a_change_reach_everyone_exactly_once``)."""
RATE = 200.0


SHARED = pytest.mark.xdist_group("scale-fig2")
"""The tests that change a running overlay through the control RPC share one fig2
(:func:`shared_roomy`) on one worker, in the module's order: the one that grows it and
leaves it grown (a new broker killed while it fills) comes last."""


@pytest.fixture(scope="module")
def shared_roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """fig2 (keys on) with ports for ten brokers more, links down after 3 s, the paper's
    SBP (covering off: a new broker's table is checked to hold every subscription); for
    the module."""
    settings = BrokerSettings(links=Links(down_after=3.0), routing=Routing(covering="off"))
    yield from shared_secure_fig2(tmp_path_factory, "scale-fig2", settings, room=10)


@pytest.fixture
def fig2_roomy(shared_roomy: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> LocalCluster:
    """The module's fig2, as fig2 (an earlier test that changed it changed it back), once
    every broker is ready and no table holds a subscription of an earlier test; its keys
    reach the SDK ($OCTOPIS_KEYS)."""
    fig2 = sorted(build_preset("fig2").brokers)
    assert sorted(shared_roomy.scot.brokers) == fig2, "an earlier test left the overlay changed"
    return ready_again(shared_roomy, monkeypatch)


LAST_SIZES: dict[str, object] = {}
"""Each broker's routing-table size (or the error its stats call raised) at the last
check: printed when a test fails waiting for a subscription to spread."""


async def _table_sizes(cluster: LocalCluster) -> set[int]:
    brokers = list(cluster.scot.brokers)
    answers = await asyncio.gather(
        *(cluster.call(b, "stats") for b in brokers), return_exceptions=True
    )
    sizes = {
        b: a["routing_table_size"] if isinstance(a, dict) else repr(a)
        for b, a in zip(brokers, answers, strict=True)
    }
    if sizes != LAST_SIZES:  # shown with the captured output when a test fails
        print("table sizes:", sizes)
        LAST_SIZES.clear()
        LAST_SIZES.update(sizes)
    return {a["routing_table_size"] if isinstance(a, dict) else -1 for a in answers}


@SHARED
@pytest.mark.processes
def test_fig2_grows_a_cluster_and_a_region_and_shrinks_back_while_notifications_flow(
    fig2_roomy: LocalCluster,
) -> None:
    """:data:`SUBSCRIBERS` on fig2, a publisher at c:0 sending 200 notifications/s (each
    to the three subscribers of its symbol): fig2 grows a fourth cluster, 30 subscribers join
    there, the cluster leaves again (they move across clusters first); a region joins as
    a leaf, 12 subscribers join there, it leaves (they move inside their clusters).
    Guarantee: every subscriber gets every notification of its symbol published while
    it was subscribed exactly once; each change reports the seconds to ready."""
    cluster = fig2_roomy
    group = ConnectionGroup()
    connections: dict[str, Connection] = {}
    got: dict[str, Counter[int]] = {}
    since: dict[str, int] = {}
    symbol_of: dict[str, int] = {}
    sent: list[tuple[int, int]] = []
    ready: dict[str, float] = {}
    subscribers: list[Subscriber] = []
    rate = [0.0]

    async def connection(broker: str) -> Connection:
        if broker not in connections:
            endpoints = cluster.scot.client_endpoints(broker)
            connections[broker] = Connection(endpoints, liveness=1.5, linger=2.0, group=group)
            await connections[broker].open()
        return connections[broker]

    async def subscribe(name: str, broker: str, symbol: int) -> None:
        got[name] = counts = Counter()
        symbol_of[name] = symbol
        sub = Subscriber(name, await connection(broker), lambda n, c=counts: c.update([n.seq]))
        await sub.subscribe(f"[class,eq,'STOCK'],[symbol,eq,'S{symbol}']")
        subscribers.append(sub)

    async def join(names: list[str], brokers: list[str]) -> None:
        """Subscribe ``names`` on ``brokers`` (in turn); each counts from the first
        notification published once every broker holds its subscription."""
        for i, name in enumerate(names):
            await subscribe(name, brokers[i % len(brokers)], i % SYMBOLS)
        size = len(got)
        await until(lambda: _held(cluster, size), "subscriptions everywhere", 60)
        for name in names:  # publications handed over from now on are routed after
            since[name] = len(sent)

    async def change(what: str, new: Scot) -> None:
        done = await change_overlay(cluster, new, timeout=90)
        ready[what] = done["seconds"]
        print(what, {k: v for k, v in done.items() if k != "relinked"})

    async def scenario() -> None:
        brokers = sorted(cluster.scot.brokers)
        await join([f"s{i}" for i in range(SUBSCRIBERS)], brokers)
        pub = await Publisher.connect(cluster.scot.client_endpoints("c:0"), "p")
        publishing = True

        async def publish() -> None:
            step = 1 / RATE
            next_at = time.monotonic()
            k = 0
            while publishing:
                symbol = k % SYMBOLS
                publication = {"class": "STOCK", "symbol": f"S{symbol}", "price": 1.0}
                seq = await pub.publish(publication, wait=False)
                sent.append((seq, symbol))
                k += 1
                next_at += step
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        began = time.monotonic()
        task = asyncio.create_task(publish())
        await until(lambda: len(sent) > 200, "publishing", 30)
        await change("add-cluster", add_cluster(cluster.scot))
        new = sorted(b for b in cluster.scot.brokers if b.endswith(":3"))
        await join([f"c{i}" for i in range(30)], new)
        await until(lambda: len(sent) > since["c0"] + 200, "publishing on four clusters", 30)
        await change("remove-cluster", remove_cluster(cluster.scot, 3))
        leaf = next(x for x in cluster.scot.regions if cluster.scot.acyclic.degree(x) == 1)
        await change("add-region", add_region(cluster.scot, "z", leaf))
        await join([f"r{i}" for i in range(12)], [f"z:{c}" for c in range(3)])
        await until(lambda: len(sent) > since["r0"] + 200, "publishing with region z", 30)
        await change("remove-region", remove_region(cluster.scot, "z"))
        await until(lambda: len(sent) > since["r0"] + 400, "publishing after the changes", 60)
        publishing = False
        await task
        rate[0] = len(sent) / (time.monotonic() - began)
        await pub.flush()
        assert not pub.refused, list(pub.refused)[:3]
        await pub.close()

        with contextlib.suppress(AssertionError):  # what is missing is named below
            await until(lambda: all(expected(n) <= set(got[n]) for n in got), "every delivery", 60)
        missing = {n: sorted(expected(n) - set(got[n]))[:10] for n in got}
        where = {s.name: (s.connection.endpoint, list(s.moves)) for s in subscribers}
        short = {n: (m, where[n]) for n, m in missing.items() if m}
        assert not short, f"missing (first 10) and where the subscriber is: {short}"
        await until(
            lambda: (
                not any(c.reading_left_sessions for x in connections.values() for c in x.family)
            ),
            "left sessions ended",
            30,
        )
        for x in connections.values():
            await x.close()

    def expected(name: str) -> set[int]:
        return {seq for seq, s in sent[since[name] :] if s == symbol_of[name]}

    asyncio.run(closing_control(cluster, scenario()))
    total: Counter[str] = Counter()
    for name, counts in got.items():
        early = {seq for seq, s in sent[: since[name]] if s == symbol_of[name]}
        mine = Counter({seq: n for seq, n in counts.items() if seq not in early})
        total.update(accounting(name, len(expected(name)), mine))
        assert set(mine) == expected(name), name
    moved = sum(len(s.moves) for s in subscribers)
    print(
        f"{len(sent)} notifications at {rate[0]:.0f}/s; ready after each change (s): {ready}; "
        f"moves made {moved}; totals {dict(total)}"
    )
    assert total["lost"] == total["duplicates"] == 0, total
    assert set(ready) == {"add-cluster", "remove-cluster", "add-region", "remove-region"}
    assert moved == 30 + 12
    assert sorted(cluster.scot.brokers) == sorted(build_preset("fig2").brokers)


@SHARED
@pytest.mark.processes
def test_a_relink_is_refused_while_the_core_routes_over_a_leaving_link(
    fig2_roomy: LocalCluster,
) -> None:
    """A broker told to drop the link to a neighbour that still hosts a subscriber (it
    routes that subscription over the link) refuses, names why, and keeps the link; a
    malformed view is refused naming the problem; the overlay still delivers."""
    cluster = fig2_roomy
    scot = cluster.scot
    smaller = remove_cluster(scot, 2)
    keys = Keys(cluster.keys_dir)

    def view(shape: Scot) -> dict[str, Any]:
        """a:0's view in ``shape``, as ``octopis scale`` sends it."""
        view = relink_view(shape, "a:0", lambda b: keys.broker_public(b).decode())
        return msgspec.to_builtins(view)

    async def scenario() -> None:
        received: list[int] = []
        sub = await Subscriber.connect(scot.client_endpoints("a:2"), "s")
        stream = await sub.subscribe("[class,eq,'STOCK']")
        await until(lambda: _held(cluster, 1), "subscription everywhere", 30)
        with pytest.raises(Exception, match="still routes subscriptions over a:2"):
            await cluster.call("a:0", "relink", view(smaller))
        with pytest.raises(Exception, match="not a relink view"):
            await cluster.call("a:0", "relink", {"clusters": 3})
        bad = view(scot)
        bad["neighbours"][0]["endpoint"] = "udp://x"
        with pytest.raises(Exception, match="is not tcp://"):
            await cluster.call("a:0", "relink", bad)
        status = await cluster.call("a:0", "status")
        assert status["neighbours"] == len(scot.brokers["a:0"].neighbours)
        pub = await Publisher.connect(scot.client_endpoints("a:0"), "p")
        for _ in range(20):
            received.append(await pub.publish({"class": "STOCK", "price": 1.0}))
        seen = [(await asyncio.wait_for(anext(stream), 10)).seq for _ in received]
        assert seen == received
        await pub.close()
        await sub.connection.close()

    asyncio.run(closing_control(cluster, scenario()))


async def _held(cluster: LocalCluster, size: int) -> bool:
    return await _table_sizes(cluster) == {size}


@pytest.mark.processes
def test_octopis_scale_grows_an_overlay_that_octopis_up_started(tmp_path: Path) -> None:
    """``octopis up`` a fig2 (SNR), ``octopis scale add-region`` and ``add-cluster`` on it:
    each prints what it did; ``octopis status`` then answers from every broker of the new
    version; ``scale remove-cluster 1`` is refused (only the last cluster may leave),
    changing nothing; an idle overlay's ``balance run --elastic`` (LR_low 0.5) removes
    the fourth cluster again; ``octopis down`` stops them all."""
    scot = build_preset("fig2", base_port=find_free_base_port(18 + 10))
    topology = tmp_path / "fig2.json"
    topology.write_text(json.dumps(scot.to_json()))
    run_dir = tmp_path / "run"

    def octopis(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "octopis.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=300,
        )

    up = octopis("up", str(topology), "--run-dir", str(run_dir), "--mode", "snr")
    assert up.returncode == 0, up.stderr
    try:
        grown = octopis("scale", "add-region", "z", "--attach-to", "a", "--run-dir", str(run_dir))
        assert grown.returncode == 0, grown.stderr
        assert "added z:0, z:1, z:2" in grown.stdout and "ready in" in grown.stdout
        refused = octopis("scale", "remove-cluster", "1", "--run-dir", str(run_dir))
        assert refused.returncode == 2 and "only the last, 2, can leave" in refused.stderr
        more = octopis("scale", "add-cluster", "--run-dir", str(run_dir), "--json")
        assert more.returncode == 0, more.stderr
        done = json.loads(more.stdout)
        assert sorted(done["added"]) == [f"{x}:3" for x in sorted([*scot.regions, "z"])]
        status = octopis("status", "--run-dir", str(run_dir), "--json")
        assert status.returncode == 0, status.stderr
        assert len(json.loads(status.stdout)) == 7 * 4
        shrunk = octopis(
            "balance", "run", "--run-dir", str(run_dir), "--elastic", "--rounds", "1",
            "--interval", "1", "--t-wait", "0", "--lr-low", "0.5", "--lr-high", "0.6",
            "--min-clusters", "3",
        )  # fmt: skip
        assert shrunk.returncode == 0, shrunk.stderr
        assert "remove-cluster at" in shrunk.stdout, shrunk.stdout
        status = octopis("status", "--run-dir", str(run_dir), "--json")
        assert len(json.loads(status.stdout)) == 7 * 3
    finally:
        down = octopis("down", "--run-dir", str(run_dir))
    assert down.returncode == 0 and "stopped 21 brokers" in down.stdout, down.stdout + down.stderr


@SHARED
@pytest.mark.processes
def test_a_new_broker_killed_while_it_fills_is_restarted_and_the_change_completes(
    fig2_roomy: LocalCluster,
) -> None:
    """fig2 grows a cluster while 36 subscribers (two on each broker) get a stream at
    100/s; one of the new brokers is killed (``kill -9``) as soon as it runs and started
    again 0.5 s later; the stream goes on for 300 notifications after the change. Guarantee:
    the change completes once it is back (its neighbours resync it as a restarted
    broker), and every subscriber gets every notification exactly once. Longer streams
    through changed overlays are a law on the brokers' own node (tests/test_sim_topology_change.py
    ``test_publications_during_a_change_reach_everyone_exactly_once``)."""
    cluster = fig2_roomy
    group = ConnectionGroup()
    got: dict[str, Counter[int]] = {}
    victim = "c:3"
    when: dict[str, float] = {}

    async def scenario() -> tuple[list[int], dict[str, Any]]:
        connections = {
            b: Connection(cluster.scot.client_endpoints(b), linger=2.0, group=group)
            for b in sorted(cluster.scot.brokers)
        }
        for connection in connections.values():
            await connection.open()
        for i, broker in enumerate(sorted(connections) * 2):
            got[f"s{i}"] = counts = Counter()
            sub = Subscriber(f"s{i}", connections[broker], lambda n, c=counts: c.update([n.seq]))
            await sub.subscribe("[class,eq,'STOCK']")
        await until(lambda: _held(cluster, len(got)), "subscriptions everywhere", 60)
        pub = await Publisher.connect(cluster.scot.client_endpoints("a:0"), "p")
        sent: list[int] = []
        publishing = True

        async def publish() -> None:
            while publishing:
                sent.append(await pub.publish({"class": "STOCK", "price": 1.0}, wait=False))
                await asyncio.sleep(0.01)

        async def kill_when_running() -> None:
            await until(lambda: victim in cluster.processes, f"{victim} started", 60)
            cluster.kill(victim)
            when["killed"] = time.monotonic()
            await asyncio.sleep(0.5)
            cluster.spawn_one(victim)

        stream = asyncio.create_task(publish())
        await until(lambda: len(sent) > 200, "publishing", 30)
        killer = asyncio.create_task(kill_when_running())
        when["command"] = time.monotonic()
        done = await change_overlay(cluster, add_cluster(cluster.scot), timeout=90)
        await killer
        assert when["killed"] < when["command"] + done["seconds"]  # before it was ready
        after = len(sent)  # 3 s more at 100/s through the grown overlay (was: 1,500 in all)
        await until(lambda: len(sent) > after + 300, "publishing after the change", 60)
        publishing = False
        await stream
        await pub.flush()
        assert not pub.refused, list(pub.refused)[:3]
        await pub.close()
        await until(lambda: all(set(sent) <= set(c) for c in got.values()), "deliveries", 60)
        for connection in connections.values():
            await connection.close()
        return sent, done

    sent, done = asyncio.run(closing_control(cluster, scenario()))
    total: Counter[str] = Counter()
    for name, counts in got.items():
        total.update(accounting(name, len(sent), counts))
    print(f"ready in {done['seconds']:.1f} s with {victim} killed and restarted; {dict(total)}")
    assert total["lost"] == total["duplicates"] == 0, total
    assert victim in done["added"] and cluster.scot.clusters == 4


def test_a_relink_view_is_checked_before_anything_changes() -> None:
    """A view whose endpoint lacks a host or port, whose key is not Z85, that names a
    neighbour twice, a cluster it does not have or no neighbour is refused, naming the problem; a
    well-formed one passes (so opening its links cannot fail halfway)."""
    scot = build_preset("fig2")
    key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
    good = msgspec.to_builtins(relink_view(scot, "c:0", lambda _: key))
    assert len(decode_view(good, secure=True).neighbours) == len(scot.brokers["c:0"].neighbours)
    cases = {
        "is not tcp://HOST:PORT": ("endpoint", "tcp://127.0.0.1"),
        "needs its Z85 public key": ("key", "~" * 40),
    }
    for problem, (field, value) in cases.items():
        bad = json.loads(json.dumps(good))
        bad["neighbours"][0][field] = value
        with pytest.raises(ValueError, match=problem):
            decode_view(bad, secure=True)
    twice = {**good, "neighbours": good["neighbours"] + good["neighbours"][:1]}
    with pytest.raises(ValueError, match="twice"):
        decode_view(twice, secure=False)
    with pytest.raises(ValueError, match="no cluster"):
        decode_view({**good, "clusters": 1}, secure=False)
    with pytest.raises(ValueError, match="names no neighbour"):
        decode_view({**good, "neighbours": []}, secure=False)
