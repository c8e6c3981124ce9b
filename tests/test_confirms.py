"""When a publisher's publication is confirmed (DESIGN §7, §11): on broker processes and in
the simulator by the same rule, :class:`~octopis.core.custody.PublishReceipt`'s. The
confirm waits for the retention store's commit and for every copy a link keeps in
custody until its neighbour acknowledges it; a copy its link gives back (the neighbour
declared down) and that the node then holds for the neighbour is no longer waited for.

One scenario, run on three broker processes and in the simulator: the line a:0 – b:0 –
c:0 (SNR), a subscriber at c:0, a publisher at a:0. The publisher publishes
:data:`UNMATCHED` publications no subscription matches (no copy leaves a:0: confirmed
at the store's commit); b:0 stops (SIGSTOP; the simulator's stall) and the publisher
publishes :data:`MATCHED` that c:0's subscription takes (their copies wait in a:0's
custody for b:0: not confirmed); a:0 declares b:0 down after :data:`DOWN_AFTER`, takes
the copies back and routes them again, with no live path to c:0 (each counted
``undeliverable.no_live_path``): no copy is kept any more, and they are confirmed, b:0
still stopped. The confirmed counts after each step, and a:0's counts, agree.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import networkx as nx
import pytest

from octopis.cluster.launcher import LocalCluster, find_free_base_port
from octopis.failure_schedule import Failure
from octopis.filters.language import parse_subscription
from octopis.settings import BrokerSettings, Links
from octopis.sim import LatencyModel, Simulator
from octopis.topology import Scot, build_scot, complete_factor

UNMATCHED, MATCHED = 3, 5
"""Publications no subscription matches, then publications c:0's subscriber takes."""
DOWN_AFTER = 5.0
"""``[links] down_after`` (the simulator's detection): long enough that a:0 cannot
declare b:0 down between the copies' reaching its custody and the count that follows."""
FILTER = "[class,eq,'Q']"
COUNTED = ("custody.rerouted", "undeliverable.no_live_path")
"""a:0's core counts the two runs compare: copies taken back and routed again, and those
with no live path."""
STEPS = ("unmatched published", "b:0 stopped, matched in custody", "b:0 declared down")
"""When the confirms are counted."""


def _line(base_port: int = 20000) -> Scot:
    """a:0 – b:0 – c:0, its client ports from ``base_port`` (the simulator uses none)."""
    return build_scot(nx.path_graph(["a", "b", "c"]), complete_factor(1), name="line",
                      base_port=base_port)  # fmt: skip


def simulated_confirms() -> tuple[list[int], int, dict[str, int]]:
    """The scenario in the simulator: the confirmed count after each of :data:`STEPS`
    and at the end, and a:0's :data:`COUNTED` counts."""
    sim = Simulator(_line(), "snr", seed=1, latency=LatencyModel(0.001, 0.002))
    sim.subscribe("S", "c:0", parse_subscription(FILTER))
    sim.run()
    start, counts = sim.now, []
    sim.fail(Failure(("b:0",), 1.0, 2.0 + 2 * DOWN_AFTER, stall=True), start, detection=DOWN_AFTER)
    for i in range(UNMATCHED):
        sim.at(start + 0.1 * (i + 1), sim.publish, "P", "a:0", {"class": "Z", "n": i})
    for i in range(MATCHED):
        sim.at(start + 1.5 + 0.1 * i, sim.publish, "P", "a:0", {"class": "Q", "n": i})
    for until in (0.9, 1.0 + DOWN_AFTER / 2, 2.0 + DOWN_AFTER):
        sim.run(until=start + until)
        counts.append(len(sim.retention.confirmed))
    sim.run()
    a = sim.cores["a:0"].counts()
    return counts, len(sim.retention.confirmed), {key: a[key] for key in COUNTED}


def test_the_simulator_confirms_once_the_store_and_custody_hold_the_publication() -> None:
    """The simulator's half (the quick tier's): nothing confirmed while its copies wait
    in custody for a stopped neighbour; each once the neighbour is declared down and
    a:0 routed them again (nothing kept: no live path), and nothing after."""
    counts, confirmed, a = simulated_confirms()
    assert counts == [UNMATCHED, UNMATCHED, UNMATCHED + MATCHED]
    assert confirmed == UNMATCHED + MATCHED
    assert a == dict.fromkeys(COUNTED, MATCHED)


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_processes_and_the_simulator_confirm_at_the_same_steps(tmp_path: Path) -> None:
    """The scenario on three broker processes: the confirms counted at the publisher
    after each of :data:`STEPS` are the simulator's. Each count waits for a state
    (a:0's custody for b:0 holds the copies; a:0 holds them for b:0), never a time."""
    from conditions import closing_control, until

    from octopis.client import Publisher, Subscriber

    scot = _line(find_free_base_port(3))
    path = tmp_path / "line.json"
    path.write_text(json.dumps(scot.to_json()))
    settings = BrokerSettings(links=Links(down_after=DOWN_AFTER))
    cluster = LocalCluster(scot, path, "snr", tmp_path, settings, secure=False, forked=True)
    cluster.spawn()

    def stat(broker: str, *keys: str) -> Callable[[], object]:
        async def read() -> object:
            value = await cluster.call(broker, "stats")
            for key in keys:
                value = value[key]
            return value

        return read

    async def scenario() -> tuple[list[int], dict[str, int]]:
        await cluster.wait_ready(60)
        sub = await Subscriber.connect(scot.brokers["c:0"].client_endpoint, "S")
        await sub.subscribe(FILTER)
        custody = stat("a:0", "custody", "b:0", "unacknowledged")

        async def settled() -> bool:
            return await stat("a:0", "routing_table_size")() == 1 and await custody() == 0

        await until(settled, "a:0 has the subscription, b:0 acknowledged it", 30)
        pub = await Publisher.connect(scot.brokers["a:0"].client_endpoint, "P")
        for i in range(UNMATCHED):
            await pub.publish({"class": "Z", "n": i})
        counts = [UNMATCHED]
        core = stat("a:0", "core")
        cluster.pause("b:0", True)
        try:
            tasks = [
                asyncio.create_task(pub.publish({"class": "Q", "n": i}, timeout=60))
                for i in range(MATCHED)
            ]

            async def kept() -> bool:
                return await custody() == MATCHED

            await until(kept, "a:0's custody for b:0 holds the copies", 30)
            counts.append(UNMATCHED + sum(t.done() for t in tasks))

            async def rerouted() -> bool:
                return (await core()).get("custody.rerouted", 0) == MATCHED  # type: ignore[union-attr]

            await until(rerouted, "a:0 declared b:0 down and routed the copies again", 30)
            await asyncio.wait_for(asyncio.gather(*tasks), 30)  # b:0 still stopped
            counts.append(UNMATCHED + sum(t.exception() is None for t in tasks))
            a = await core()
        finally:
            cluster.pause("b:0", False)
        for client in (pub, sub):
            await client.close()
        return counts, {key: a.get(key, 0) for key in COUNTED}  # type: ignore[union-attr]

    try:
        processed, a = asyncio.run(closing_control(cluster, scenario()))
    finally:
        cluster.stop()
    simulated, _, simulated_a = simulated_confirms()
    assert processed == simulated, (STEPS, processed, simulated)
    assert processed == [UNMATCHED, UNMATCHED, UNMATCHED + MATCHED]
    assert a == simulated_a == dict.fromkeys(COUNTED, MATCHED)
