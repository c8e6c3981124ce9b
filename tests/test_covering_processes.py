"""Covering (``[routing] covering = "active"``, the default) with advertisements on broker
processes: a broker killed (kill -9) and restarted mid-stream is handed its neighbours'
covering share and passes it on, and every subscriber gets every matching notification
exactly once.

The other process tests run with covering active too (the default). That covering
delivers what flooding delivers, with fewer subscription messages, is a law on the
brokers' own node (tests/test_covering_laws.py
``test_covering_delivers_what_flooding_delivers_under_churn``); that a killed host's
subscribers fail over, replay and lose nothing under covering too
(``test_covering_delivers_what_flooding_delivers_with_failures``: brokers killed and
restarted and clients' connections failed; ``test_every_restart_of_fig2_under_covering``);
the SDK's fail-over from a killed process is tests/test_cluster.py's kill runs."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conditions import closing_control, until
from conftest import secure_fig2
from test_cluster import (
    no_leftover_brokers,  # noqa: F401 (autouse: no broker left behind)
)

from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster
from octopis.filters.language import parse_subscription
from octopis.settings import BrokerSettings, Routing

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]


BOTH = BrokerSettings(routing=Routing(covering="active", advertisements="on"))
VICTIM = "c:0"
"""The broker killed and restarted: an inner one (regions b, d and e lie beyond it)."""
SUBSCRIPTIONS = [
    ("a:0", "[class,eq,'STOCK'],[price,<,60]"),
    ("a:0", "[class,eq,'STOCK'],[price,<,20]"),
    ("b:1", "[class,eq,'STOCK']"),
    ("d:0", "[class,eq,'STOCK'],[price,<,30]"),
    ("d:0", "[class,eq,'STOCK'],[price,<,10]"),
    ("e:2", "[class,eq,'STOCK'],[price,>=,40]"),
    ("f:1", "[class,eq,'BOND']"),
    ("f:0", "[class,eq,'STOCK'],[price,<,90]"),
    ("b:0", "[class,eq,'STOCK'],[price,>=,50],[price,<,70]"),
    ("d:2", "[class,eq,'BOND'],[price,<,50]"),
]
"""(broker, filter) of each subscriber, several covering others; none on :data:`VICTIM`."""
PUBLISHERS = [
    ("a:1", "[class,eq,'STOCK'],[price,<,50]"),
    ("f:2", "[class,eq,'STOCK'],[price,>=,20]"),
    ("e:0", "[class,eq,'BOND']"),
]
"""(broker, advertisement) of each publisher; it publishes inside it."""


@pytest.fixture
def fig2_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    yield from secure_fig2(tmp_path, monkeypatch, BOTH)


def test_covering_with_advertisements_survives_a_restart(fig2_both: LocalCluster) -> None:
    """fig2 (DNR) with covering active and advertisements on: half the subscribers
    subscribe, the publishers advertise, the other half subscribe; publications flow,
    c:0 is killed (kill -9) and restarted meanwhile. Every notification the oracle
    expects (each publication to each subscription it matches) reaches the subscribers,
    all on brokers that stay alive, exactly once."""
    cluster = fig2_both
    scot = cluster.scot
    received: Counter[tuple[str, str, int]] = Counter()
    rng = random.Random(3)

    async def stats() -> dict[str, dict]:
        answers = await cluster.ask(sorted(scot.brokers), "stats", 10)
        return {b: s for b, s in answers.items() if s is not None}

    async def settled() -> bool:
        """The routing tables stay the same over half a second (SBP is over)."""
        before = {b: s["routing_table_size"] for b, s in (await stats()).items()}
        await asyncio.sleep(0.5)
        return before == {b: s["routing_table_size"] for b, s in (await stats()).items()}

    async def scenario() -> tuple[list[tuple[str, int, dict]], dict[str, dict]]:
        subscribers = []
        for i, (broker, _) in enumerate(SUBSCRIPTIONS):
            name = f"s{i}"

            def note(n: Any, name: str = name) -> None:
                received.update([(name, n.publisher, n.seq)])

            subscribers.append(
                await Subscriber.connect(scot.client_endpoints(broker), name, on_notification=note)
            )
        half = len(SUBSCRIPTIONS) // 2
        for sub, (_, text) in zip(subscribers[:half], SUBSCRIPTIONS[:half], strict=True):
            await sub.subscribe(text)
        publishers = []
        for j, (broker, advert) in enumerate(PUBLISHERS):
            pub = await Publisher.connect(scot.client_endpoints(broker), f"p{j}")
            await pub.advertise(advert)
            publishers.append(pub)
        for sub, (_, text) in zip(subscribers[half:], SUBSCRIPTIONS[half:], strict=True):
            await sub.subscribe(text)
        await until(settled, "the subscriptions spread", 30)
        before = await stats()
        published: list[tuple[str, int, dict]] = []

        async def publish(rounds: int) -> None:
            for _ in range(rounds):
                for j, pub in enumerate(publishers):
                    advert = parse_subscription(PUBLISHERS[j][1])
                    while True:
                        content = {
                            "class": rng.choice(["STOCK", "BOND"]),
                            "price": float(rng.randrange(100)),
                        }
                        if advert.matches(content):
                            break
                    published.append((f"p{j}", await pub.publish(content, timeout=30), content))
                await asyncio.sleep(0.02)

        await publish(20)
        cluster.kill(VICTIM)
        await publish(40)
        cluster.spawn_one(VICTIM)
        await publish(20)
        await cluster.wait_ready(60, [VICTIM], state="serving")
        await publish(20)
        owed = expected(published)
        await until(lambda: owed <= set(received), "every expected delivery", 60)
        await asyncio.sleep(1.0)  # time for a duplicate to show
        for client in (*subscribers, *publishers):
            await client.close()
        return published, before

    def expected(published: list[tuple[str, int, dict]]) -> set[tuple[str, str, int]]:
        filters = [parse_subscription(text) for _, text in SUBSCRIPTIONS]
        return {
            (f"s{i}", publisher, seq)
            for publisher, seq, content in published
            for i, f in enumerate(filters)
            if f.matches(content)
        }

    published, before = asyncio.run(closing_control(cluster, scenario()))
    owed = expected(published)
    counts = {
        "expected": len(owed),
        "delivered": len(owed & set(received)),
        "duplicates": sum(n - 1 for n in received.values()),
        "lost": len(owed - set(received)),
        "unexpected": len(set(received) - owed),
    }
    print(counts)
    assert counts["expected"] > 500, counts
    assert counts["delivered"] == counts["expected"], sorted(owed - set(received))[:5]
    assert counts["duplicates"] == counts["lost"] == counts["unexpected"] == 0, counts
    core: Counter[str] = Counter()
    for s in before.values():
        core.update(s["core"])
    assert core["covering.quenched"] > 0 and core["advertising.held_back"] > 0, core
