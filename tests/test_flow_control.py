"""Flow control between real broker processes (DESIGN §8): backpressure travels hop by
hop to the publisher, and a slow subscriber is handled by the broker's policy while the
others get everything exactly once. Brokers run in the clear on a line a:0 – b:0 – c:0."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest
from conditions import accounting, closing_control, reader_on, tables_hold, until

from octopis.client import Connection, DroppedError, Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster
from octopis.settings import BrokerSettings, Clients, Links, Memory, Routing

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

PADDING = {f"pad{i}": "x" * 1000 for i in range(10)}
"""10 kB per notification, so that kernel socket buffers hold few of them."""


@pytest.mark.parametrize("trigger", ["queue_limit", "memory_budget"])
def test_a_slow_link_slows_the_publisher_two_hops_back(
    line_of: Callable[[BrokerSettings], LocalCluster], trigger: str
) -> None:
    """b:0 → c:0 carries 250 messages/s; a publisher on a:0 offers far more. b:0's queue
    toward c:0 stops near ``queue_limit`` (or, with a memory budget below every broker's
    RSS, wherever b:0 finds it over budget with data waiting) because b:0 withholds its
    acknowledgements from a:0, whose custody fills, whose publisher runs out of credit:
    the publisher is slowed, nothing is dropped, the subscriber on c:0 gets every
    notification exactly once."""
    queue = {"queue_limit": 100} if trigger == "queue_limit" else {}
    budget = {"budget_mb": 1} if trigger == "memory_budget" else {}
    settings = BrokerSettings(
        links=Links(capacities={"b:0>c:0": 250.0}, custody_limit=50, retain=0.0, **queue),
        memory=Memory(**budget),
    )
    cluster = line_of(settings)
    scot = cluster.scot
    total = 1000  # 4 s at 250/s; b:0's queue and a:0's custody fill within the first 200
    got: Counter[int] = Counter()

    async def scenario() -> tuple[dict, float, float]:
        sub = await reader_on(cluster, "c:0", got)
        await until(lambda: tables_hold(cluster, 1), "the subscription reaches a:0", 20)
        pub = await Publisher.connect(scot.brokers["a:0"].client_endpoint, "feed")
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(total):
            await pub.publish({"class": "STOCK", "symbol": "X", "close": float(i)}, wait=False)
        await pub.flush(120)
        rate = total / (loop.time() - started)
        await until(lambda: len(got) >= total, "every notification arrives", 60)
        elapsed = loop.time() - started
        stats = await cluster.call_all("stats")
        await pub.close()
        await sub.close()
        return stats, rate, elapsed

    stats, rate, elapsed = asyncio.run(closing_control(cluster, scenario()))
    counts = accounting("reader", total, got)
    print(f"publisher rate {rate:.0f}/s; b:0 longest queue {stats['b:0']['queue_seen']['max']}")
    assert counts["delivered"] == total and counts["duplicates"] == counts["lost"] == 0
    b0 = stats["b:0"]["counters"]
    episodes = "backpressure.episodes" if trigger == "queue_limit" else "memory.pressure_episodes"
    assert b0[episodes] >= 1
    assert b0["backpressure.acks_withheld"] > 0
    # withheld once per look at backpressure, not once per frame from a:0 (the rule the
    # simulator follows too: test_pressure.py)
    print(f"withheld {b0['backpressure.acks_withheld']} in {elapsed:.2f} s")
    assert b0["backpressure.acks_withheld"] <= elapsed / settings.links.ack_interval + 2
    assert stats["a:0"]["custody"]["b:0"]["times_full"] > 0  # a:0 was held back
    held_from = settings.links.queue_limit if trigger == "queue_limit" else 0
    bound = held_from + 2 * settings.links.custody_limit
    assert stats["b:0"]["queue_seen"]["max"] <= bound
    # a:0's backlog for b:0 left in batches; the paced b:0 -> c:0 sends a frame a message
    held_back, paced = stats["a:0"]["batches"]["b:0"], stats["b:0"]["batches"]["c:0"]
    print(f"a:0 -> b:0 {held_back}, b:0 -> c:0 {paced}")
    assert held_back["frames"] > held_back["messages"]
    assert paced["frames"] == paced["messages"]


def _slow_consumer_run(
    cluster: LocalCluster, total: int
) -> tuple[Counter[int], list[int], str | None, Connection, dict]:
    """A reader and a subscriber that stops reading, both on c:0; ``total`` notifications
    of 10 kB from a:0 at up to 1,000/s (the reader keeps up). The slow one then reads all
    it can. Returns the reader's
    counts, the slow one's sequence numbers, the error that ended its stream, its
    connection and c:0's stats."""
    scot = cluster.scot
    got: Counter[int] = Counter()
    slow_seqs: list[int] = []

    async def scenario() -> tuple[str | None, Connection, dict]:
        reader = await reader_on(cluster, "c:0", got)
        slow_connection = Connection(scot.brokers["c:0"].client_endpoint, receive_buffer=10)
        await slow_connection.open()
        slow = Subscriber("slow", slow_connection, buffer=10)
        stream = await slow.subscribe("[class,eq,'STOCK']")
        await until(lambda: tables_hold(cluster, 2), "both subscriptions spread", 20)
        pub = await Publisher.connect(scot.brokers["a:0"].client_endpoint, "feed")
        for i in range(total):
            await pub.publish({"class": "STOCK", **PADDING, "close": float(i)}, wait=False)
            if i % 100 == 99:
                await asyncio.sleep(0.1)
        await pub.flush(120)
        await until(lambda: len(got) >= total, "the reader gets everything", 60)
        stats = (await cluster.ask(["c:0"], "stats", 5))["c:0"]
        # every copy for it was kept or dropped once the reader had everything: it reads
        # what was kept (waiting up to 5 s for each), then one more would be one too many
        dropped = stats["counters"].get("deliveries_dropped.slow_consumer", 0)
        ended = None
        try:
            while len(slow_seqs) + dropped < total:
                slow_seqs.append((await stream.get(timeout=5)).seq)
            while True:
                slow_seqs.append((await stream.get(timeout=0.5)).seq)
        except DroppedError as exc:
            ended = str(exc)
        except TimeoutError:
            pass
        await pub.close()
        await reader.close()
        await slow_connection.close()
        return ended, slow_connection, stats

    ended, connection, stats = asyncio.run(closing_control(cluster, scenario()))
    accounting("reader", total, got)
    return got, slow_seqs, ended, connection, stats


SLOW = {"sndhwm": 200, "backlog_limit": 800}
"""A small allowance per client connection, so that a few thousand notifications fill it
(a second of the test's rate for the reader)."""


def test_deliveries_of_one_pass_reach_their_connection_together(
    line_of: Callable[[BrokerSettings], LocalCluster],
) -> None:
    """DESIGN §5 on client sockets: a burst of publications at a:0 for a subscriber on
    a:0 is handled in passes, and each pass's deliveries leave as one message; the SDK
    takes them apart, each exactly once."""
    total = 2000
    cluster = line_of(BrokerSettings())
    got: Counter[int] = Counter()

    async def scenario() -> dict:
        await cluster.wait_ready(60)
        endpoint = cluster.scot.brokers["a:0"].client_endpoint
        sub = await Subscriber.connect(
            endpoint, "reader", on_notification=lambda n: got.update([n.seq])
        )
        await sub.subscribe("[class,eq,'STOCK']")
        pub = await Publisher.connect(endpoint, "feed")
        for i in range(total):
            await pub.publish({"class": "STOCK", "close": float(i)}, wait=False)
        await pub.flush(60)
        await until(lambda: len(got) >= total, "every notification arrives", 60)
        stats = (await cluster.ask(["a:0"], "stats", 5))["a:0"]
        await pub.close()
        await sub.close()
        return stats["counters"]

    counters = asyncio.run(closing_control(cluster, scenario()))
    counts = accounting("reader", total, got)
    print(f"a:0 deliveries {counters['deliveries']}, batched {counters['deliveries_batched']}")
    assert counts["delivered"] == total and counts["duplicates"] == counts["lost"] == 0
    assert counters["deliveries"] == total
    assert counters["deliveries_batched"] > 0


def test_a_slow_subscriber_is_disconnected_with_its_reason(
    line_of: Callable[[BrokerSettings], LocalCluster],
) -> None:
    """Default policy: the connection that stopped reading is dropped when its backlog
    reaches the limit, its subscription withdrawn; its stream ends with that reason after
    what was already on its way; the reader beside it loses nothing."""
    total = 5000
    cluster = line_of(BrokerSettings(clients=Clients(**SLOW), routing=Routing(covering="off")))
    got, slow_seqs, ended, _, stats = _slow_consumer_run(cluster, total)
    assert len(got) == total and set(got.values()) == {1}
    assert ended is not None and "slow consumer" in ended and "clients.backlog_limit" in ended
    assert stats["counters"]["slow_consumers_dropped"] == 1
    assert stats["routing_table_size"] == 1  # only the reader's subscription is left
    assert len(slow_seqs) == len(set(slow_seqs)) < total
    print(f"slow subscriber got {len(slow_seqs)} before its stream ended: {ended}")


def test_a_slow_subscriber_loses_its_oldest_with_a_count(
    line_of: Callable[[BrokerSettings], LocalCluster],
) -> None:
    """drop_oldest: the slow subscriber stays subscribed; what it receives plus what the
    broker reports dropped is exactly what was published; the reader loses nothing."""
    total = 5000
    cluster = line_of(
        BrokerSettings(
            clients=Clients(**SLOW, slow_policy="drop_oldest"), routing=Routing(covering="off")
        )
    )
    got, slow_seqs, ended, connection, stats = _slow_consumer_run(cluster, total)
    assert len(got) == total and set(got.values()) == {1}
    assert ended is None
    dropped = stats["counters"]["deliveries_dropped.slow_consumer"]
    print(f"slow subscriber got {len(slow_seqs)}, the broker dropped {dropped}")
    assert dropped > 0
    assert connection.overflowed == dropped
    assert len(slow_seqs) == len(set(slow_seqs)) == total - dropped


def test_a_broker_short_of_delivery_capacity_queues_and_holds_its_neighbours_back(
    line_of: Callable[[BrokerSettings], LocalCluster],
) -> None:
    """``clients.capacity`` 300 deliveries/s and ``clients.queue_limit`` 100: a publisher
    on a:0 offers far more to a reader on c:0. c:0's deliveries wait for their slots, in
    order; past the limit c:0 withholds its acknowledgements, b:0 and then a:0 fill their
    custody and the publisher is slowed. Nothing is dropped, nothing is reordered, and
    c:0's queue stays within the limit plus what one custody buffer can add."""
    settings = BrokerSettings(
        clients=Clients(capacity=300.0, queue_limit=100), links=Links(custody_limit=50, retain=0.0)
    )
    cluster = line_of(settings)
    total = 1500
    got: Counter[int] = Counter()
    order: list[int] = []

    async def scenario() -> dict:
        await cluster.wait_ready(60)
        sub = await Subscriber.connect(
            cluster.scot.brokers["c:0"].client_endpoint,
            "reader",
            on_notification=lambda n: (got.update([n.seq]), order.append(n.seq)),
        )
        await sub.subscribe("[class,eq,'STOCK']")
        await until(lambda: tables_hold(cluster, 1), "the subscription reaches a:0", 20)
        pub = await Publisher.connect(cluster.scot.brokers["a:0"].client_endpoint, "feed")
        for i in range(total):
            await pub.publish({"class": "STOCK", "symbol": "X", "close": float(i)}, wait=False)
        await pub.flush(120)
        await until(lambda: len(got) >= total, "every notification arrives", 60)
        stats = await cluster.call_all("stats")
        await pub.close()
        await sub.close()
        return stats

    stats = asyncio.run(closing_control(cluster, scenario()))
    counts = accounting("reader", total, got)
    c0 = stats["c:0"]
    print(
        f"c:0 paced {c0['counters']['deliveries_paced']}, most waiting "
        f"{c0['deliveries_waiting_max']}; a:0 custody full {stats['a:0']['custody']['b:0']}"
    )
    assert counts["delivered"] == total and counts["duplicates"] == counts["lost"] == 0
    assert order == sorted(order)
    assert c0["counters"]["deliveries_paced"] > 0 and c0["deliveries_waiting"] == 0
    assert c0["counters"]["backpressure.episodes"] >= 1
    assert c0["counters"]["backpressure.acks_withheld"] > 0
    assert stats["a:0"]["custody"]["b:0"]["times_full"] > 0
    assert 100 <= c0["deliveries_waiting_max"] <= 100 + 2 * settings.links.custody_limit
