"""The elasticity experiment (issue 18, DESIGN §9): a load that ramps up and down on
fig2's broker processes, and the balancer adding and removing clusters as it goes.

    python -m bench.experiments elastic

fig2 in DNR with keys on; every broker counts ``capacity`` messages/s (copies plus
deliveries) as its capacity, so its load ratio is its output over that. 96 subscribers,
eight for each of twelve symbols of the real quotes, spread over the brokers; one
publisher at c:0 sends those symbols' quotes round-robin at a rate that ramps from
``low`` to ``high`` and back (:data:`RAMP`). The balancer (LDM on delivery load, plus
Dynamoth's elasticity with a cluster as the unit: one more once the mean load ratio has
stayed above LR_high for T_wait, the last one fewer once it has stayed below LR_low as
long) runs in the same process and carries its changes out with ``octopis scale``'s
machinery. Written under ``--out`` (default ``bench/results``):

- ``elastic.json``: the balancer's report (timeline with mean load ratio and cluster
  count, changes with their seconds to ready, moves), the publication rate and delay
  per 5 s, and the exactly-once counts;
- ``elastic.md``: the changes and counts; ``elastic.png``: rate and mean load ratio,
  cluster count, and delay over time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from octopis.balance.policy import BalanceOptions, Elasticity
from octopis.client import Connection, ConnectionGroup, Publisher, Received, Subscriber
from octopis.cluster.launcher import LocalCluster, find_free_base_port
from octopis.cluster.scale import elastic_balancer
from octopis.keys import KEYS_ENV
from octopis.quotes import read_quote_dir
from octopis.settings import BrokerSettings, Links, Load, Routing
from octopis.topology import build_preset

RAMP = ((0, 2.0), (30, 2.0), (70, 40.0), (130, 40.0), (170, 2.0), (260, 2.0))
"""(second, publications/s): the rate is interpolated between these points."""
SYMBOLS = 12
PER_SYMBOL = 8
CAPACITY = 25.0
BIN = 5.0


def rate_at(t: float) -> float:
    """The ramp's rate at ``t`` seconds."""
    for (t0, r0), (t1, r1) in itertools.pairwise(RAMP):
        if t0 <= t <= t1:
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
    return RAMP[-1][1]


def quote_stream() -> tuple[list[str], list[dict[str, Any]]]:
    """The twelve symbols with the most quotes, and their quotes interleaved round-robin."""
    by_symbol: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for quote in read_quote_dir():
        by_symbol[quote["symbol"]].append(quote)
    symbols = sorted(by_symbol, key=lambda s: (-len(by_symbol[s]), s))[:SYMBOLS]
    depth = min(len(by_symbol[s]) for s in symbols)
    return symbols, [by_symbol[s][i] for i in range(depth) for s in symbols]


async def _experiment(cluster: LocalCluster, symbols: list[str], quotes: list[dict]) -> dict:
    group = ConnectionGroup()
    connections = {
        b: Connection(cluster.scot.client_endpoints(b), linger=2.0, group=group)
        for b in sorted(cluster.scot.brokers)
    }
    for connection in connections.values():
        await connection.open()
    got: dict[str, Counter[int]] = defaultdict(Counter)
    delays: list[tuple[float, float]] = []

    def on_notification(n: Received) -> None:
        got[n.subscriber][n.seq] += 1
        delays.append((n.received_at, n.received_at - n.published_at))

    subscribers = []
    for i in range(SYMBOLS * PER_SYMBOL):
        broker = sorted(connections)[i % len(connections)]
        sub = Subscriber(f"s{i}", connections[broker], on_notification)
        await sub.subscribe(f"[class,eq,'STOCK'],[symbol,eq,'{symbols[i % SYMBOLS]}']")
        subscribers.append(sub)
    options = BalanceOptions(interval=3.0, sample=1.0, beta=1.0, cooldown=10.0, max_moves=16)
    elastic = Elasticity(t_wait=10.0, min_clusters=3, max_clusters=6)
    balancer = elastic_balancer(cluster, options, elastic)
    pub = await Publisher.connect(cluster.scot.client_endpoints("c:0"), "feed")
    sent: list[tuple[int, str, float]] = []
    started_wall = time.time()
    started = time.monotonic()
    running = asyncio.create_task(balancer.run())
    end = RAMP[-1][0]
    while (t := time.monotonic() - started) < end:
        quote = quotes[len(sent) % len(quotes)]
        seq = await pub.publish(quote, wait=False)
        sent.append((seq, quote["symbol"], time.time()))
        await asyncio.sleep(1 / rate_at(t))
        if running.done():
            break
    running.cancel()
    ended = await asyncio.gather(running, return_exceptions=True)
    await pub.flush(60)
    await pub.close()
    expected = {
        sub.name: {seq for seq, s, _ in sent if s == symbols[i % SYMBOLS]}
        for i, sub in enumerate(subscribers)
    }
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(expected[n] - set(got[n]) for n in expected):
        await asyncio.sleep(0.5)
    family = [c for connection in connections.values() for c in connection.family]
    for connection in connections.values():
        await connection.close()
    counts: Counter[str] = Counter()
    for name, wanted in expected.items():
        mine = got[name]
        counts["expected"] += len(wanted)
        counts["delivered"] += len(wanted & set(mine))
        counts["duplicated"] += sum(n - 1 for n in mine.values())
        counts["lost"] += len(wanted - set(mine))
    return {
        "balancer_error": repr(ended[0]) if isinstance(ended[0], Exception) else None,
        "balance": balancer.report(),
        "counts": dict(counts),
        "repeats_dropped": sum(c.duplicates_absorbed for c in family),
        "sdk_failovers": sum(len(c.outages) for c in family),
        "moves_made": sum(len(s.moves) for s in subscribers),
        "bins": _bins(sent, delays, started_wall),
        "ramp": RAMP,
        "capacity": CAPACITY,
    }


def _bins(sent: list[tuple[int, str, float]], delays: list[tuple[float, float]], t0: float) -> list:
    """Per :data:`BIN` seconds: publications/s, and the delay p50 and p99 of the
    deliveries received in it."""
    rates: Counter[int] = Counter(int((at - t0) // BIN) for _, _, at in sent)
    delayed: dict[int, list[float]] = defaultdict(list)
    for at, delay in delays:
        delayed[int((at - t0) // BIN)].append(delay)
    out = []
    for k in range(max([*rates, *delayed], default=-1) + 1):
        values = sorted(delayed.get(k, []))
        out.append(
            {
                "t": k * BIN,
                "rate": rates.get(k, 0) / BIN,
                "p50": statistics.median(values) if values else None,
                "p99": values[min(len(values) - 1, int(len(values) * 0.99))] if values else None,
            }
        )
    return out


def run(out: Path) -> dict[str, Any]:
    """Start fig2, run the ramp, stop; write the JSON, table and plot; return the report."""
    symbols, quotes = quote_stream()
    scot = build_preset("fig2", base_port=find_free_base_port(18 + 6 * 3))
    with tempfile.TemporaryDirectory(prefix="octopis-elastic-") as tmp:
        run_dir = Path(tmp)
        path = run_dir / "fig2.json"
        path.write_text(json.dumps(scot.to_json()))
        settings = BrokerSettings(
            links=Links(down_after=3.0),
            load=Load(window=3, capacity=CAPACITY),
            routing=Routing(covering="off"),
        )
        cluster = LocalCluster(scot, path, "dnr", run_dir, settings)
        cluster.spawn()
        os.environ[KEYS_ENV] = str(cluster.keys_dir)
        try:

            async def main() -> dict:
                try:
                    await cluster.wait_ready(120)
                    return await _experiment(cluster, symbols, quotes)
                finally:
                    await cluster.close_control()

            report = asyncio.run(main())
        finally:
            cluster.stop()
    out.mkdir(parents=True, exist_ok=True)
    (out / "elastic.json").write_text(json.dumps(report, indent=1))
    (out / "elastic.md").write_text(table(report))
    plot(report, out / "elastic.png")
    return report


def table(report: dict[str, Any]) -> str:
    """The changes, the moves and the exactly-once counts, as Markdown."""
    balance = report["balance"]
    lines = [
        "# Elasticity: fig2 under a load ramp",
        "",
        f"Capacity {report['capacity']:g} messages/s per broker; ramp (s, publications/s) "
        f"{report['ramp']}; LR_high 1.0, LR_low 0.2, T_wait 10 s, 3 to 6 clusters.",
        "",
        "| t (s) | change | mean load ratio before | clusters after | seconds to ready |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {c['t']:.0f} | {c['change']} | {c['mean_ratio']:.2f} | "
        + (
            f"{c['clusters']} | {c['seconds']:.1f} |"
            if "error" not in c
            else f"failed: {c['error']} | |"
        )
        for c in balance["changes"]
    ]
    counts = report["counts"]
    lines += [
        "",
        f"Moves ordered {balance['moves']} ({balance['moves_inside']} inside a cluster, "
        f"{balance['moves_across']} across, {balance['moves_failed']} failed); made by the "
        f"SDK {report['moves_made']}; repeats the SDK dropped {report['repeats_dropped']}; "
        f"SDK fail-overs {report['sdk_failovers']}.",
        "",
        f"Exactly once: expected {counts['expected']}, delivered {counts['delivered']}, "
        f"duplicated {counts['duplicated']}, lost {counts['lost']}.",
        "",
    ]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Rate and mean load ratio, cluster count, delay over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = report["balance"]["timeline"]
    bins = report["bins"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ax = axes[0]
    ax.plot([b["t"] for b in bins], [b["rate"] for b in bins], color="grey", label="publications/s")
    ax.set_ylabel("publications/s")
    twin = ax.twinx()
    twin.plot([t["t"] for t in timeline], [t["mean_ratio"] for t in timeline], label="mean LR")
    for level in (1.0, 0.2):
        twin.axhline(level, linestyle=":", color="black", linewidth=0.8)
    twin.set_ylabel("mean load ratio")
    ax.legend(loc="upper left")
    twin.legend(loc="upper right")
    axes[1].step([t["t"] for t in timeline], [t["clusters"] for t in timeline], where="post")
    axes[1].set_ylabel("clusters")
    for change in report["balance"]["changes"]:
        for a in axes:
            a.axvline(change["t"], color="red", alpha=0.3)
    with_delay = [b for b in bins if b["p50"] is not None]
    axes[2].plot([b["t"] for b in with_delay], [b["p50"] for b in with_delay], label="p50")
    axes[2].plot([b["t"] for b in with_delay], [b["p99"] for b in with_delay], label="p99")
    axes[2].set_ylabel("delay (s)")
    axes[2].set_xlabel("seconds")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
