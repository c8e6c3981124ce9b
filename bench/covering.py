"""Covering (DESIGN §12) off and active, in the calibrated simulator on paper75 (DNR):
the paper's workload, and one where subscriptions hardly ever cover one another.

    python -m bench.covering                      # writes bench/results/covering.{json,md}
    python -m bench.covering --subscribers 2000   # a smaller run

Workloads, each with 10,000 subscribers placed at random:

- ``stock``: the paper's subscriber-scalability workload as the process experiments
  build it (``spark_workloads.stock_workload`` on the real quotes of
  ``../shared/data/stockquotes``: stock subscriptions of 2% mean selectivity, 100
  publishers × 100 quotes at 60/min); built once under ``<out>/workload`` and reused;
- ``bands``: the matcher benchmark's ``uniform_bands`` shape (two bands of equal width
  over five attributes, 2% selectivity): a band never holds another of the same width,
  so almost nothing is covered; 100 publishers × 100 of its publications at 60/min.

For each workload and covering setting: SBP messages per subscription, routing entries
per broker (mean and largest), the CPU seconds the simulator spent on the subscriptions
(every broker's SBP work, covering's bookkeeping included), then the publications with
each broker's CPU charged the costs measured on the processes
(``bench/results/service.json``), for the notification delay and the deliveries (the
same in both settings, or the run fails). Matching time is measured apart, on the
compiled matcher: each broker's table, as it stands after the subscriptions, split into
its local, primary and secondary parts as a broker process holds it; a notification at
a transit hop matches the local and primary parts (µs per notification, mean over the
75 brokers), at its publisher's broker all three. The two settings' tables are timed in
alternation, and each broker's time is the least of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.profiles import PROFILES, REPO, build_workload, subset
from octopis.core.cluster_links import PRIMARY_PART, SECONDARY_PART
from octopis.core.clustered import ClusteredBroker
from octopis.core.table import LOCAL_PART, RoutingTable
from octopis.filters.language import Publication
from octopis.matching import Matcher
from octopis.shapes import uniform_bands
from octopis.sim import LatencyModel, Simulator
from octopis.sim.service import ServiceModel
from octopis.topology import Scot, build_preset
from octopis.workload import PublicationEvent, SubscriptionEvent, Workload

log = logging.getLogger("bench.covering")
SERVICE = REPO / "bench" / "results" / "service.json"
LATENCY, JITTER = 1e-4, 2e-4
"""Link latency, as in the other calibrated simulations (:mod:`bench.sim_experiments`)."""
PUBLISHERS, NOTIFICATIONS, RATE = 100, 100, 60.0
SETTINGS = ("off", "active")


def stock(scot: Scot, subscribers: int, out: Path, seed: int) -> Workload:
    """The paper's subscriber-scalability workload (Spark, real quotes), first
    ``subscribers`` of it."""
    topology = out / "topology" / "paper75.json"
    topology.parent.mkdir(parents=True, exist_ok=True)
    topology.write_text(json.dumps(scot.to_json(), indent=1))
    workload = build_workload(PROFILES["subscribers"]["full"], topology, out / "workload", seed)
    return subset(workload, subscribers, PUBLISHERS)


def bands(scot: Scot, subscribers: int, seed: int) -> Workload:
    """``uniform_bands`` subscriptions at random brokers; its publications from
    :data:`PUBLISHERS` publishers at random brokers, :data:`NOTIFICATIONS` each at
    :data:`RATE` per minute, starting within the first 5 s."""
    subscriptions, publications = uniform_bands(subscribers, seed)
    rng = random.Random(seed)
    brokers = sorted(scot.brokers)
    subs = [
        SubscriptionEvent(f"S{i}", rng.choice(brokers), s, 0.0) for i, s in enumerate(subscriptions)
    ]
    pubs = []
    interval = 60.0 / RATE
    for p in range(PUBLISHERS):
        broker, phase = rng.choice(brokers), rng.uniform(0.0, 5.0)
        for k in range(NOTIFICATIONS):
            publication = publications[(p * NOTIFICATIONS + k) % len(publications)]
            pubs.append(PublicationEvent(f"P{p}", broker, k + 1, phase + k * interval, publication))
    pubs.sort(key=lambda e: (e.time, e.publisher, e.seq))
    return Workload({"generator": "uniform_bands", "seed": seed}, subs, pubs)


def simulate(
    scot: Scot, workload: Workload, covering: str, service: ServiceModel
) -> tuple[Simulator, dict[str, Any]]:
    """Subscriptions (timed), then publications, in the calibrated simulator."""
    sim = Simulator(
        scot,
        "dnr",
        seed=1,
        latency=LatencyModel(LATENCY, JITTER),
        service=service,
        covering=covering,
    )
    for s in workload.subscriptions:
        sim.at(s.time, sim.subscribe, s.subscriber, s.broker, s.subscription)
    cpu = time.process_time()
    sim.run()
    cpu = time.process_time() - cpu
    sizes = [len(core.table) for core in sim.cores.values()]
    stats = {key: sum(core.stats[key] for core in sim.cores.values())
             for key in ("covering.quenched", "sent.subscribe")}  # fmt: skip
    start = sim.now
    for p in workload.publications:
        sim.at(start + p.time, sim.publish, p.publisher, p.broker, p.publication, p.seq)
    sim.run()
    report = sim.report()
    subscriptions = len(workload.subscriptions)
    return sim, {
        "covering": covering,
        "subscriptions": subscriptions,
        "sbp_messages": stats["sent.subscribe"],
        "sbp_per_subscription": stats["sent.subscribe"] / subscriptions,
        "quenched": stats["covering.quenched"],
        "entries_mean": statistics.mean(sizes),
        "entries_max": max(sizes),
        "subscription_cpu_s": cpu,
        "notification_delay": report["notification_delay"],
        "notification_messages": report["notification_messages"],
        "expected": report["expected_deliveries"],
        "delivered": report["delivered"],
        "duplicates": report["duplicates"],
        "lost": report["lost"],
    }


def compiled(core: ClusteredBroker) -> RoutingTable:
    """``core``'s table in compiled matchers, one per part, as a broker process holds it."""

    def part_of(entry: Any) -> str:
        if entry.local:
            return LOCAL_PART
        return PRIMARY_PART if entry.cluster == core.cluster else SECONDARY_PART

    table = RoutingTable((LOCAL_PART, PRIMARY_PART, SECONDARY_PART), Matcher, part_of)
    for entry in core.table.entries.values():
        table.add(entry)
    return table


def matching_times(
    sims: dict[str, Simulator], publications: list[Publication], rounds: int
) -> dict[str, dict[str, float]]:
    """µs per notification at a transit hop (local + primary parts) and at the
    publisher's broker (all parts), mean over brokers of each broker's least of
    ``rounds`` rounds, the settings timed in alternation."""
    tables = {c: {b: compiled(core) for b, core in sim.cores.items()} for c, sim in sims.items()}  # type: ignore[arg-type]
    for by_broker in tables.values():  # the compiled index is built at the first match
        for table in by_broker.values():
            for part in (LOCAL_PART, PRIMARY_PART, SECONDARY_PART):
                table.values(part, publications[0])
    best: dict[tuple[str, str, str], float] = {}
    for r in range(rounds):
        for covering in sims if r % 2 == 0 else reversed(list(sims)):
            for broker, table in tables[covering].items():
                for hop, parts in (
                    ("transit", (LOCAL_PART, PRIMARY_PART)),
                    ("host", (LOCAL_PART, PRIMARY_PART, SECONDARY_PART)),
                ):
                    started = time.perf_counter()
                    for publication in publications:
                        for part in parts:
                            table.values(part, publication)
                    spent = (time.perf_counter() - started) / len(publications) * 1e6
                    key = (covering, broker, hop)
                    best[key] = min(best.get(key, math.inf), spent)
    return {
        covering: {
            hop: statistics.mean(best[(covering, b, hop)] for b in tables[covering])
            for hop in ("transit", "host")
        }
        for covering in sims
    }


def run(out: Path, subscribers: int, seed: int, rounds: int, service: Path) -> dict[str, Any]:
    scot = build_preset("paper75")
    model = ServiceModel.load(service)
    shown = (
        service.resolve().relative_to(REPO) if service.resolve().is_relative_to(REPO) else service
    )
    results: dict[str, Any] = {"subscribers": subscribers, "seed": seed, "service": str(shown)}
    for name in ("stock", "bands"):
        workload = (
            stock(scot, subscribers, out, seed)
            if name == "stock"
            else bands(scot, subscribers, seed)
        )
        sims, rows = {}, {}
        for covering in SETTINGS:
            log.info("%s, covering %s: %d subscriptions, %d publications", name, covering,
                     len(workload.subscriptions), len(workload.publications))  # fmt: skip
            sims[covering], rows[covering] = simulate(scot, workload, covering, model)
        off, active = sims["off"], sims["active"]
        if off.ledger.received != active.ledger.received:
            raise SystemExit(f"{name}: covering changed the deliveries; that is a bug")
        sample = [p.publication for p in workload.publications[:500]]
        for covering, times in matching_times(sims, sample, rounds).items():
            rows[covering]["matching_us"] = times
        results[name] = rows
    return results


def table(results: dict[str, Any]) -> str:
    """The markdown table of :func:`run`'s results."""
    lines = [
        "| workload | covering | SBP msgs / subscription | entries / broker, mean (max) | "
        "subscription CPU s | matching µs, transit hop / publisher's broker | "
        "notification delay mean / p99 ms | notification msgs | delivered (lost, dup) |",
        "|" + "---|" * 9,
    ]
    for name in ("stock", "bands"):
        for covering in SETTINGS:
            r = results[name][covering]
            lines.append(
                f"| {name} | {covering} | {r['sbp_per_subscription']:.1f} | {row_cells(r)} |"
            )
    return "\n".join(lines) + "\n"


def row_cells(r: dict[str, Any]) -> str:
    """A result row's cells from its entries on: entries per broker, subscription CPU,
    matching time, notification delay, notification messages, deliveries."""
    delay, matching = r["notification_delay"], r["matching_us"]
    return (
        f"{r['entries_mean']:,.0f} ({r['entries_max']:,}) | "
        f"{r['subscription_cpu_s']:.1f} | "
        f"{matching['transit']:.1f} / {matching['host']:.1f} | "
        f"{delay['mean'] * 1e3:.2f} / {delay['p99'] * 1e3:.2f} | "
        f"{r['notification_messages']:,} | "
        f"{r['delivered']:,} ({r['lost']}, {r['duplicates']})"
    )


def workload_options(parser: argparse.ArgumentParser, results: str) -> None:
    """The options of a bench over stock workloads (this one, ``bench.advertisements``):
    ``--out`` (the directory of ``results``.json and .md and the workload),
    ``--subscribers``, ``--seed`` and ``--rounds``."""
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench" / "results",
        help=f"directory of {results}.{{json,md}} and the workload (default bench/results)",
    )
    parser.add_argument(
        "--subscribers",
        type=int,
        default=10_000,
        help="subscriptions per workload (default 10,000)",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the workloads and placements (default 1)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="matching-time rounds (default 5)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_options(parser, "covering")
    parser.add_argument(
        "--service",
        type=Path,
        default=SERVICE,
        help="the CPU cost model charged to the brokers (default bench/results/service.json)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results = run(args.out / "covering", args.subscribers, args.seed, args.rounds, args.service)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "covering.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    (args.out / "covering.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
