"""The SDK against real broker processes on 127.0.0.1 (DESIGN §7): fail-over when the
host broker is killed, a killed client's subscriptions withdrawn everywhere, sessions at a
stalled broker, and moves. The SDK without brokers: tests/test_client_sdk.py.

From where a durable subscriber's new host owes it after a fail-over (its replay's start,
not the fail-over) is a rule of the node and the SDK's client policy, run by the
simulator: tests/test_durable.py ``test_a_record_made_at_a_failover_owes_from_the_replays_start``
and the regression seed 134 of tests/test_nemesis.py ``test_the_seeds_that_found_bugs_pass``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from conditions import accounting, closing_control, reader_on, tables_hold, until
from conftest import ready_again, secure_fig2, shared_secure_fig2

from octopis.client import (
    BlockingPublisher,
    BrokerError,
    Connection,
    ConnectionGroup,
    HandshakeFailed,
    NotAClientSocket,
    Publisher,
    Subscriber,
)
from octopis.cluster.launcher import LocalCluster
from octopis.core import Notification
from octopis.defaults import CLOCK_SKEW
from octopis.settings import BrokerSettings, Clients, Links, Routing

pytestmark = pytest.mark.timeout(300)

CLIENT_TIMEOUT = 2.0
"""The brokers' client timeout in these tests (default 10 s), to keep them short."""


MOVE_SETTINGS = BrokerSettings(
    clients=Clients(timeout=CLIENT_TIMEOUT, move_timeout=6.0), routing=Routing(covering="off")
)
"""Moves by adoption inside a cluster: the paper's SBP (covering off; with covering the
SDK subscribes afresh, as across clusters)."""
"""Client timeout as above; a move order lapses after 6 s (default 30 s)."""

SHARED = pytest.mark.xdist_group("client-fig2")
"""The tests that neither kill nor stop a broker share one fig2 (:func:`shared_fig2`) on
one worker; each starts once every table is empty again."""


class Tally:
    """A subscriber's deliveries by (session, sequence number) of its publisher ``p``, and
    when each was published. On the overlay these tests share, the replay after a
    fail-over may bring an earlier test's ``p`` (another session) published up to
    :data:`~octopis.defaults.CLOCK_SKEW` before the subscription (DESIGN §11): those are
    told apart from repeats of this test's own, and held to that bound
    (:meth:`earlier`)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[int, int]] = Counter()
        self.published_at: dict[tuple[int, int], float] = {}
        self.subscribed_at = time.time()
        """Reset just before the subscription (:meth:`subscribing`)."""

    def __call__(self, notification: Notification) -> None:
        key = (notification.session, notification.seq)
        self.counts[key] += 1
        self.published_at[key] = notification.published_at

    def subscribing(self) -> None:
        """The subscription is about to be made."""
        self.subscribed_at = time.time()

    def of(self, session: int, published: list[int]) -> Counter[int]:
        """Deliveries of each of ``published`` in ``session``."""
        return Counter({seq: self.counts[(session, seq)] for seq in published})

    def seqs(self, session: int) -> set[int]:
        """Sequence numbers delivered in ``session``."""
        return {seq for s, seq in self.counts if s == session}

    def earlier(self, session: int) -> dict[tuple[int, int], tuple[int, float]]:
        """The deliveries of another session than ``session`` that break the bound: a
        repeat, or one published more than CLOCK_SKEW before the subscription."""
        since = self.subscribed_at - CLOCK_SKEW
        return {
            key: (n, self.published_at[key])
            for key, n in self.counts.items()
            if key[0] != session and (n > 1 or self.published_at[key] < since)
        }


BROKEN = pytest.mark.xdist_group("client-fig2-broken")
"""The tests that kill or stop a broker of theirs share another fig2
(:func:`broken_overlay`) on one worker; each starts with every broker running and ready."""


@pytest.fixture(scope="module")
def broken_overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The fig2 (client timeout :data:`CLIENT_TIMEOUT`) of the tests that kill or stop a
    broker, for the module."""
    settings = BrokerSettings(clients=Clients(timeout=CLIENT_TIMEOUT))
    yield from shared_secure_fig2(tmp_path_factory, "client-broken", settings)


@pytest.fixture
def fig2(broken_overlay: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> LocalCluster:
    """:func:`broken_overlay` with a broker an earlier test killed started again, once
    every broker is ready and no table holds a subscription of an earlier test."""
    return ready_again(broken_overlay, monkeypatch)


@pytest.fixture(scope="module")
def shared_overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The module's fig2; its keys reach the SDK ($OCTOPIS_KEYS) only in the tests that
    use it (:func:`shared_fig2`), not in the module's others that run on the same worker
    while it lives (they may talk to brokers in the clear)."""
    yield from shared_secure_fig2(tmp_path_factory, "client-fig2", MOVE_SETTINGS)


@pytest.fixture
def shared_fig2(
    shared_overlay: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LocalCluster, dict[str, Counter]]]:
    """The module's fig2 (:data:`MOVE_SETTINGS`), once no subscription of an earlier test
    is left in any table, with every broker's counters at that moment (a test checks
    counts as differences from them)."""
    cluster = ready_again(shared_overlay, monkeypatch)

    async def counters() -> dict[str, Counter]:
        stats = await cluster.call_all("stats")
        return {broker: Counter(s["counters"]) for broker, s in stats.items()}

    yield cluster, asyncio.run(closing_control(cluster, counters()))


@BROKEN
@pytest.mark.processes
def test_a_subscriber_fails_over_when_its_broker_is_killed(fig2: LocalCluster) -> None:
    """c:0 hosts the subscriber; a:0 the publisher (path a–b–c), publishing at 50/s.
    After kill -9 of c:0 the subscriber moves to b:0 (same cluster first), subscribes
    again there, then replays from the overlay's retention what was published while it
    was away (DESIGN §11): every publication, before, during and after the outage,
    arrives exactly once; the replay's only gap is the dead broker's own store. (DNR; SNR
    and restarts: tests/test_cluster.py::test_killed_hosts_lose_no_subscriber_anything.)"""
    cluster = fig2
    scot = cluster.scot
    received = Tally()

    async def scenario() -> tuple[dict, list[int], Subscriber, int]:
        sub = await Subscriber.connect(scot.client_endpoints("c:0"), "s", on_notification=received)
        received.subscribing()
        await sub.subscribe("[class,eq,'STOCK']")
        pub = await Publisher.connect(scot.client_endpoints("a:0"), "p")
        published: list[int] = []

        async def publish(count: int) -> None:
            for _ in range(count):
                published.append(await pub.publish({"class": "STOCK", "price": 1.0}))
                await asyncio.sleep(0.02)

        async def delivered_once() -> bool:
            await publish(1)
            return bool(received.seqs(pub.session))

        # a publication is owed once the subscription has reached the publisher's broker
        await until(lambda: tables_hold(cluster, 1), "the subscription spreads", 10)
        await until(delivered_once, "first delivery", 10)
        os.kill(cluster.processes["c:0"].pid, signal.SIGKILL)
        await asyncio.gather(
            publish(200),
            until(lambda: bool(sub.replays), "fail-over and replay", 30),
        )
        with contextlib.suppress(AssertionError):  # what is missing is named below
            await until(lambda: all(received.of(pub.session, published).values()), "deliveries", 30)
        kept = (await cluster.ask(["a:0"], "stats", 10))["a:0"]["retention"]
        assert kept["retention.rows"] >= len(published) and kept["retention.bytes"] > 0
        await sub.close()
        await pub.close()
        return sub.connection.outages[0], published, sub, pub.session

    outage, published, sub, session = asyncio.run(closing_control(cluster, scenario()))
    print(f"fail-over: away {outage['seconds']:.2f} s, {outage['from']} -> {outage['to']}")
    print(f"replay: {sub.replays[0]}")
    assert outage["to"] == scot.brokers["b:0"].client_endpoint
    counts = accounting("s", len(published), received.of(session, published))
    missing = sorted(set(published) - received.seqs(session))
    record = {k: v for k, v in sub.replays[0].items() if k != "delivered"}
    assert counts["lost"] == counts["duplicates"] == 0, (missing, record, outage)
    assert received.seqs(session) == set(published)
    assert not received.earlier(session)
    gap = sub.replays[0]["gap"]
    assert sub.replays[0]["replayed"] > 0
    assert (gap.silent, gap.unstored, gap.trimmed, gap.error) == (("c:0",), (), (), None)
    assert list(sub.gaps) == [gap]  # the dead broker's own store could not answer: said


SUBSCRIBER = textwrap.dedent(
    """
    import asyncio, sys
    from octopis.client import Subscriber

    async def main():
        sub = await Subscriber.connect(sys.argv[1], "doomed")
        for i in range(5):
            await sub.subscribe(f"[class,eq,'STOCK'],[n,=,{i}]")
        print("subscribed", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await sub.close()

    asyncio.run(main())
    """
)


@pytest.mark.processes
@SHARED
@pytest.mark.parametrize("ending", ["killed", "closed"])
def test_a_gone_clients_subscriptions_leave_every_table(
    shared_fig2: tuple[LocalCluster, dict[str, Counter]], ending: str
) -> None:
    """A client killed (-9) is dropped at the client timeout; one that closes says bye and
    is let go at once (``clients_left``). Either way its subscriptions leave every table."""
    fig2, before = shared_fig2
    endpoint = fig2.scot.brokers["f:2"].client_endpoint
    client = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, endpoint],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "subscribed"

        async def emptied(size: int) -> bool:
            stats = await fig2.call_all("stats")
            return {s["routing_table_size"] for s in stats.values()} == {size}

        async def scenario() -> tuple[float, dict]:
            await until(lambda: emptied(5), "subscriptions everywhere", 20)
            if ending == "killed":
                client.send_signal(signal.SIGKILL)
            else:
                client.communicate("close\n", timeout=30)
            assert client.wait() in (0, -signal.SIGKILL)
            took = await until(lambda: emptied(0), "withdrawal", CLIENT_TIMEOUT + 10)
            counters = (await fig2.call_all("stats"))["f:2"]["counters"]
            return took, Counter(counters) - before["f:2"]

        took, counters = asyncio.run(closing_control(fig2, scenario()))
    finally:
        client.kill()
        client.wait()
    print(f"withdrawn from every table {took:.2f} s after the client was {ending}")
    assert counters.get("clients_dropped", 0) == (ending == "killed")
    assert counters.get("clients_left", 0) == (ending == "closed")
    assert counters["subscriptions_withdrawn"] == 5


@BROKEN
@pytest.mark.processes
def test_a_subscriber_keeps_its_session_at_a_stalled_broker_it_left(fig2: LocalCluster) -> None:
    """c:0, the subscriber's broker, is stopped (SIGSTOP) past the SDK's liveness and
    resumed: the subscriber fails over (to b:0 unless it is slow to answer) but keeps
    heartbeating c:0 until ``linger`` seconds after it re-subscribed, longer than the
    client timeout, and then says bye. So
    c:0 never drops it for silence, and every notification published from a:0 throughout
    arrives exactly once (copies from both brokers meanwhile are absorbed)."""
    scot = fig2.scot
    received = Tally()
    linger = CLIENT_TIMEOUT * 2

    async def scenario() -> tuple[Connection, list[int], dict, Subscriber, int]:
        connection = Connection(scot.client_endpoints("c:0"), linger=linger)
        await connection.open()
        sub = Subscriber("s", connection, on_notification=received)
        received.subscribing()
        await sub.subscribe("[class,eq,'STOCK']")
        pub = await Publisher.connect(scot.client_endpoints("a:0"), "p")
        published: list[int] = []

        async def publish(count: int) -> None:
            for _ in range(count):
                published.append(await pub.publish({"class": "STOCK", "price": 1.0}))
                await asyncio.sleep(0.02)

        async def stall() -> None:
            fig2.pause("c:0", True)
            await until(lambda: bool(connection.outages), "fail-over", 20)
            fig2.pause("c:0", False)

        async def delivered_once() -> bool:
            await publish(1)
            return bool(received.seqs(pub.session))

        # a publication is owed once the subscription has reached the publisher's broker
        await until(lambda: tables_hold(fig2, 1), "the subscription spreads", 10)
        await until(delivered_once, "first delivery", 10)
        await asyncio.gather(publish(300), stall())

        async def let_go() -> bool:
            return (await fig2.call("c:0", "stats"))["counters"].get("clients_left", 0) == 1

        await until(let_go, "bye to c:0", linger + 20)
        with contextlib.suppress(AssertionError):  # what is missing is named below
            await until(lambda: len(received.seqs(pub.session)) >= len(published), "deliveries", 20)
        counters = (await fig2.call("c:0", "stats"))["counters"]
        await sub.close()
        await pub.close()
        return connection, published, counters, sub, pub.session

    connection, published, counters, sub, session = asyncio.run(closing_control(fig2, scenario()))
    print(f"fail-over: {connection.outages[0]}; absorbed {connection.duplicates_absorbed}")
    assert connection.outages[0]["to"] != scot.brokers["c:0"].client_endpoint
    assert counters.get("clients_dropped", 0) == 0
    counts = accounting("s", len(published), received.of(session, published))
    missing = sorted(set(published) - received.seqs(session))
    records = [{k: v for k, v in r.items() if k != "delivered"} for r in sub.replays]
    assert counts["lost"] == counts["duplicates"] == 0, (missing, records, connection.outages)
    assert received.seqs(session) == set(published)
    assert not received.earlier(session)


@pytest.mark.processes
@SHARED
def test_the_sdk_connects_by_broker_id_and_says_why_a_connection_fails(
    shared_fig2: tuple[LocalCluster, dict[str, Counter]],
) -> None:
    """On a secure fig2 recorded in its run directory: a subscriber connected by broker
    id and run directory (keys found there), and a blocking publisher the same way, one
    notification between them. A client without keys, and one pointed at a peer socket
    (by endpoint alone, and with the run directory), each get a named error from the
    socket's monitor, not :class:`NoReply` at the open's timeout (times printed only)."""
    fig2, _ = shared_fig2
    fig2.write_state()
    run_dir = fig2.run_dir
    scot = fig2.scot

    async def timed(connecting: Coroutine[Any, Any, Any]) -> tuple[BaseException, float]:
        started = time.monotonic()
        try:
            await connecting
        except Exception as exc:
            return exc, time.monotonic() - started
        raise AssertionError("the connection opened")

    async def scenario() -> tuple[list[tuple[BaseException, float]], int]:
        sub = await Subscriber.connect("f:2", run_dir=run_dir)
        assert sub.connection.endpoints == scot.client_endpoints("f:2")
        assert sub.name.startswith("subscriber-")
        stream = await sub.subscribe("[class,eq,'STOCK'],[symbol,eq,'ID']")
        await until(lambda: tables_hold(fig2, 1), "the subscription spread", 30)
        with BlockingPublisher.connect("a:0", "by-id", run_dir=run_dir) as pub:
            await asyncio.to_thread(pub.publish, {"class": "STOCK", "symbol": "ID", "close": 1.0})
        got = await stream.get(timeout=10)
        await sub.close()
        a0 = scot.brokers["a:0"]
        errors = [
            await timed(Publisher.connect(a0.client_endpoint, keys=False)),
            await timed(Subscriber.connect(scot.brokers["b:0"].endpoint)),  # $OCTOPIS_KEYS
            await timed(Subscriber.connect(scot.brokers["b:0"].endpoint, run_dir=run_dir)),
        ]
        return errors, got.seq

    errors, seq = asyncio.run(closing_control(fig2, scenario()))
    assert seq == 1
    (keyless, keyless_s), (peer, peer_s), (named, named_s) = errors
    assert isinstance(keyless, HandshakeFailed) and "wants CurveZMQ keys" in str(keyless)
    assert isinstance(peer, NotAClientSocket) and "peer socket" in str(peer)
    assert isinstance(named, NotAClientSocket) and "b:0's peer socket" in str(named)
    print(f"named errors after {keyless_s:.2f} s, {peer_s:.2f} s and {named_s:.2f} s")


@pytest.mark.processes
def test_subscription_ids_are_unguessable_and_bound_to_their_owner(
    line_of: Callable[[BrokerSettings], LocalCluster],
) -> None:
    """Each id a broker process hands out carries 48 random bits of its own beside the
    process's epoch, so one id tells nothing of the next; another client, even one that
    knows the id, cannot withdraw it, and the owner keeps getting notifications."""
    cluster = line_of(BrokerSettings())
    endpoint = cluster.scot.brokers["b:0"].client_endpoint

    async def scenario() -> tuple[list[str], str, list[int]]:
        await cluster.wait_ready(60)
        alice = await Subscriber.connect(endpoint, "alice")
        mallory = await Subscriber.connect(endpoint, "mallory")
        streams = [await alice.subscribe("[class,eq,'STOCK']") for _ in range(2)]
        ids = [s.sub_id for s in streams]
        request = {"op": "unsubscribe", "client": "mallory", "sub_id": ids[0]}
        with pytest.raises(BrokerError) as refused:
            await mallory.connection.request(request)
        pub = await Publisher.connect(endpoint, "feed")
        await pub.publish({"class": "STOCK", "symbol": "X", "close": 1.0})
        got = [(await s.get(timeout=10)).seq for s in streams]
        for client in (pub, mallory, alice):
            await client.close()
        return ids, str(refused.value), got

    ids, refusal, got = asyncio.run(closing_control(cluster, scenario()))
    pattern = re.compile(r"b:0#[0-9a-f]+\.(\d)\.([0-9a-f]{12})")
    matches = [pattern.fullmatch(sub_id) for sub_id in ids]
    assert all(matches), ids
    assert [m.group(1) for m in matches] == ["1", "2"]
    assert matches[0].group(2) != matches[1].group(2)
    assert f"mallory holds no subscription {ids[0]}" in refusal
    assert got == [1, 1]


AFTER_MOVES = 100
"""Notifications published after both moves are done: each subscriber's new host alone
then serves it."""


@pytest.mark.processes
@SHARED
def test_subscribers_move_inside_and_across_clusters_mid_stream(
    shared_fig2: tuple[LocalCluster, dict[str, Counter]],
) -> None:
    """While c:2 publishes, a:0 is told to move subscriber "inside" to f:0 (its cluster:
    the path a–b–c–e–f turns) and "across" to d:1 (another cluster: subscribe there,
    withdraw at a:0 a linger later); the stream goes on for :data:`AFTER_MOVES`
    notifications after both moves are done (the old subscriptions released or
    withdrawn). Each holds three subscriptions;
    all three subscribers (a third, "still", never moves) get every notification of
    theirs exactly once, and afterwards every table holds each subscription once, at
    its new host."""
    cluster, before = shared_fig2
    scot = cluster.scot
    got: dict[str, Counter[int]] = {name: Counter() for name in ("inside", "across", "still")}
    filters = [f"[class,eq,'STOCK'],[n,=,{i}]" for i in range(3)]
    wanted = {"inside": {0, 1, 2}, "across": {0, 1}, "still": {2}}

    sent: dict[int, int] = {}  # each publication's sequence number → its n

    def owed(name: str) -> set[int]:
        """The sequence numbers ``name`` subscribed to (by their ``n``)."""
        return {seq for seq, n in sent.items() if n in wanted[name]}

    async def connect(name: str, broker: str) -> Subscriber:
        connection = Connection(scot.client_endpoints(broker), linger=2.0)
        await connection.open()
        sub = Subscriber(name, connection, on_notification=lambda n: got[name].update([n.seq]))
        for i in sorted(wanted[name]):
            await sub.subscribe(filters[i])
        return sub

    async def scenario() -> tuple[dict, dict]:
        subs = [await connect("inside", "a:0"), await connect("across", "a:0")]
        subs.append(await connect("still", "b:1"))
        await until(lambda: tables_hold(cluster, 6), "subscriptions everywhere", 20)
        pub = await Publisher.connect(scot.client_endpoints("c:2"), "p")
        moved_at = None  # how many were sent when both moves were done
        while moved_at is None or len(sent) < moved_at + AFTER_MOVES:
            i = len(sent)
            sent[await pub.publish({"class": "STOCK", "n": i % 3, "price": 1.0})] = i % 3
            if i == 150:
                to_f = scot.brokers["f:0"].client_endpoint
                to_d = scot.brokers["d:1"].client_endpoint
                assert len(await cluster.call("a:0", "move", "inside", to_f, True)) == 3
                assert len(await cluster.call("a:0", "move", "across", to_d, False)) == 2
            if moved_at is None and i > 150 and all(s.moves for s in subs[:2]):
                moved_at = len(sent)
            assert i < 5000, "the moves were not done within 4,850 notifications"
            await asyncio.sleep(0.01)
        try:
            await until(lambda: all(got[n].keys() >= owed(n) for n in got), "deliveries", 20)
        except AssertionError as late:
            missing = {n: sorted(owed(n) - got[n].keys()) for n in got}
            moves = [list(s.moves) for s in subs[:2]]
            raise AssertionError(f"{late}; missing {missing}; moves {moves}") from None
        tables = await cluster.call_all("table")
        counters = Counter((await cluster.call("a:0", "stats"))["counters"]) - before["a:0"]
        moves = {s.name: s.moves[0] for s in subs[:2]}
        for sub in subs:
            await sub.close()
        await pub.close()
        return tables, {**moves, "counters": counters}

    tables, moves = asyncio.run(closing_control(cluster, scenario()))
    for name, counts in got.items():
        assert set(counts) <= set(sent), f"{name} got what was never published"
        assert set(counts) <= owed(name), f"{name} got what it did not subscribe to"
        assert accounting(name, len(owed(name)), counts) == {
            "expected": len(owed(name)),
            "delivered": len(owed(name)),
            "duplicates": 0,
            "lost": 0,
        }
    print("moves:", moves)
    assert moves["inside"]["inside"] and not moves["across"]["inside"]
    assert moves["counters"]["moves.released"] == 3
    hosts: Counter[str] = Counter()
    for broker, table in tables.items():
        assert len(table) == 6, broker
        hosts.update(broker for entry in table.values() if entry["local"])
    assert hosts == Counter({"f:0": 3, "d:1": 2, "b:1": 1})


MOVER = textwrap.dedent(
    """
    import asyncio, sys
    from octopis.client import Subscriber

    async def main():
        sub = await Subscriber.connect(sys.argv[1], "mover")
        for i in range(3):
            await sub.subscribe(f"[class,eq,'STOCK'],[n,=,{i}]")
        print("subscribed", flush=True)
        while sub.mover._moving is None:
            await asyncio.sleep(0.001)
        print("told", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.processes
@SHARED
@pytest.mark.parametrize("when", ["told", "adopted"])
def test_a_subscriber_killed_while_moving_leaves_no_trace(
    shared_fig2: tuple[LocalCluster, dict[str, Counter]], when: str
) -> None:
    """A subscriber of a:0 is told to move to f:0 and killed (-9) as soon as it has been
    told, or once f:0 has adopted its three subscriptions. Guarantee: its subscriptions
    leave every table (a:0 keeps an orphaned one until the move reaches it or the move
    order lapses, never withdrawing across the turning path), no broker sees a message
    that breaks the protocol, and a subscriber that stays gets every notification once."""
    cluster, before = shared_fig2
    scot = cluster.scot
    mover = subprocess.Popen(
        [sys.executable, "-c", MOVER, scot.brokers["a:0"].client_endpoint],
        stdout=subprocess.PIPE,
        text=True,
    )
    got: Counter[int] = Counter()

    async def scenario() -> tuple[list[int], dict]:
        reader = await reader_on(cluster, "b:0", got)
        await until(lambda: tables_hold(cluster, 4), "subscriptions everywhere", 20)
        pub = await Publisher.connect(scot.client_endpoints("e:1"), "p")
        sent: list[int] = []

        async def publish() -> None:
            for i in range(400):
                sent.append(await pub.publish({"class": "STOCK", "n": i % 3, "price": 1.0}))
                await asyncio.sleep(0.01)

        async def adopted() -> bool:
            counters = Counter((await cluster.call("f:0", "stats"))["counters"])
            return (counters - before["f:0"])["moves.adopted"] == 3

        async def kill() -> None:
            await until(lambda: len(got) >= 50, "the stream under way", 20)
            to = scot.brokers["f:0"].client_endpoint
            assert len(await cluster.call("a:0", "move", "mover", to, True)) == 3
            assert mover.stdout is not None
            assert await asyncio.to_thread(mover.stdout.readline) == "told\n"
            if when == "adopted":
                await until(adopted, "adoption at f:0", 10)
            mover.send_signal(signal.SIGKILL)

        await asyncio.gather(publish(), kill())
        took = await until(lambda: tables_hold(cluster, 1), "the mover's withdrawal", 20)
        print(f"the mover's subscriptions left every table {took:.2f} s after the stream")
        await until(lambda: len(got) >= len(sent), "deliveries", 20)
        stats = await cluster.call_all("stats")
        await reader.close()
        await pub.close()
        return sent, stats

    try:
        assert mover.stdout is not None and mover.stdout.readline() == "subscribed\n"
        sent, stats = asyncio.run(closing_control(cluster, scenario()))
    finally:
        mover.kill()
        mover.wait()
    assert accounting("reader", len(sent), got)["lost"] == 0
    assert sum(got.values()) == len(sent)
    errors = {
        b: {k: s["counters"].get(k, 0) for k in ("protocol_errors", "internal_errors")}
        for b, s in stats.items()
    }
    assert all(set(e.values()) == {0} for e in errors.values()), errors
    counters = Counter(stats["a:0"]["counters"]) - before["a:0"]
    print(when, {k: v for k, v in counters.items() if k.startswith(("moves", "clients", "sub"))})
    assert counters["moves.ordered"] == 3


@pytest.fixture
def fig2_stalls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """fig2 for moves amid stalls: links declared down after 3 s (a stall of 0.9 s stays a
    client-side fail-over, not a link failure); covering off, for moves by adoption."""
    settings = BrokerSettings(
        clients=Clients(timeout=3.0, move_timeout=6.0),
        links=Links(down_after=3.0),
        routing=Routing(covering="off"),
    )
    yield from secure_fig2(tmp_path, monkeypatch, settings)


@pytest.mark.processes
def test_moves_amid_false_failovers_lose_nothing(fig2_stalls: LocalCluster) -> None:
    """16 subscribers on 15 brokers of fig2 (connections with 0.6 s liveness) while c:2
    publishes 400 notifications: every 0.1 s one subscriber is told by its host to move
    to a random broker (inside its cluster or across), and every 1–2.5 s one host is
    stopped for 0.9 s, so its connection fails over in the middle of moves to, from and
    through it (two runs: 70–79 move orders, 3–4 stalls). Guarantee: every subscriber gets
    every notification exactly once. More moves amid publications are a law on the node
    (tests/test_sim_moves.py ``test_publications_during_moves_reach_everyone_exactly_once``;
    pauses: tests/test_nemesis.py ``test_the_seeds_pass``)."""
    cluster = fig2_stalls
    scot = cluster.scot
    rng = random.Random(7)
    hosts = [b for b in scot.brokers if b != "c:2"]
    by_endpoint = {broker.client_endpoint: b for b, broker in scot.brokers.items()}
    got: dict[str, Counter[int]] = {}
    happened: Counter[str] = Counter()

    async def scenario() -> tuple[list[int], list[Subscriber], list[Connection]]:
        group = ConnectionGroup()
        connections = {
            b: Connection(scot.client_endpoints(b), liveness=0.6, linger=2.0, group=group)
            for b in hosts
        }
        for connection in connections.values():
            await connection.open()
        subs = []
        for i in range(16):
            name = f"s{i}"
            got[name] = counts = Counter()
            sub = Subscriber(
                name, connections[hosts[i % len(hosts)]], lambda n, c=counts: c.update([n.seq])
            )
            await sub.subscribe("[class,eq,'STOCK']")
            if i % 2:
                await sub.subscribe("[class,eq,'STOCK'],[price,>,0.5]")
            subs.append(sub)
        await until(lambda: tables_hold(cluster, 24), "subscriptions everywhere", 30)
        pub = await Publisher.connect(scot.client_endpoints("c:2"), "p")
        sent: list[int] = []

        async def publish() -> None:
            for _ in range(400):
                sent.append(await pub.publish({"class": "STOCK", "price": 1.0}))
                await asyncio.sleep(0.01)

        async def move() -> None:
            while len(sent) < 400:
                await asyncio.sleep(0.1)
                sub = rng.choice(subs)
                host = by_endpoint[sub.connection.endpoint]
                to = rng.choice([b for b in hosts if b != host])
                inside = to.split(":")[1] == host.split(":")[1]
                try:
                    to_endpoint = scot.brokers[to].client_endpoint
                    await cluster.call(host, "move", sub.name, to_endpoint, inside)
                    happened["move orders"] += 1
                except Exception:  # moving already, or its host has not heard of it yet
                    happened["refused orders"] += 1

        async def stall() -> None:
            while len(sent) < 400:
                await asyncio.sleep(rng.uniform(1.0, 2.5))
                victim = rng.choice(
                    sorted({by_endpoint[s.connection.endpoint] for s in subs} - {"c:2"})
                )
                cluster.pause(victim, True)
                await asyncio.sleep(0.9)
                cluster.pause(victim, False)
                happened["stalls"] += 1

        await asyncio.gather(publish(), move(), stall())
        await until(lambda: not any(s.moving for s in subs), "moves over", 30)
        await until(lambda: all(len(c) >= len(sent) for c in got.values()), "deliveries", 30)
        family = [c for connection in connections.values() for c in connection.family]
        await until(  # a late repeat could come only from a session left at a fail-over
            lambda: not any(c.reading_left_sessions for c in family), "left sessions ended", 30
        )
        for connection in connections.values():
            await connection.close()
        await pub.close()
        return sent, subs, family

    sent, subs, connections = asyncio.run(closing_control(cluster, scenario()))
    happened["fail-overs"] = sum(len(c.outages) for c in connections)
    happened["moves made"] = sum(len(s.moves) for s in subs)
    happened["stale orders"] = sum(s.stale_moves for s in subs)
    happened["repeats absorbed"] = sum(c.duplicates_absorbed for c in connections)
    print(dict(happened))
    assert happened["fail-overs"] > 0 and happened["moves made"] > 0
    total = Counter()
    for name, counts in got.items():
        total.update(accounting(name, len(sent), Counter({s: counts[s] for s in sent})))
    assert total["lost"] == total["duplicates"] == 0, total
    assert all(set(counts) == set(sent) for counts in got.values())
