"""Advertisements (DESIGN §12) off, on, and on with covering active, in the simulator on
paper75 (SNR and DNR), on the paper's workload and on one where every publisher may
publish anything: SBP messages per subscription and routing entries per broker,
notification delay and matching time.

    python -m bench.advertisements                     # bench/results/advertisements.{json,md}
    python -m bench.advertisements --subscribers 2000  # a smaller run

The workload is the paper's subscriber-scalability one as :mod:`bench.covering` builds
it (10,000 stock subscriptions at random brokers, 100 publishers of real quotes, one
symbol each; built once by Spark under ``<out>/advertisements/workload`` and reused).
The other workload is :func:`bench.covering.bands` (``uniform_bands`` subscriptions, each
publisher's values spread over nearly all of [0, 1)), where advertisements find little to
prune. Each publisher advertises what it will publish: ``eq`` on the string attributes
whose value never changes across its publications (``[class,eq,'STOCK'],[symbol,eq,…]``)
and the range of each numeric attribute over them. The
subscriptions are made first and the advertisements after them, so every subscription
that reaches a publisher is one held back and sent when the advertisement arrived (the
case that costs the most bookkeeping). Then the publications, at their workload times;
deliveries must be the same in all three settings, or the run fails. Advertisements
off means covering off too (the paper's SBP, which the other two prune).
Advertisement messages are counted apart (each costs N − 1, as a subscription does).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.covering import bands, matching_times, row_cells, stock, workload_options
from octopis.filters.language import Predicate, Subscription
from octopis.sim import LatencyModel, Simulator
from octopis.topology import Scot, build_preset
from octopis.workload import Workload

log = logging.getLogger("bench.advertisements")
LATENCY, JITTER = 1e-4, 2e-4
"""Link latency, as in the other simulations (:mod:`bench.sim_experiments`)."""
MODES = ("snr", "dnr")
SETTINGS = {"off": (False, "off"), "on": (True, "off"), "on, covering": (True, "active")}
"""Label → (advertisements, covering) of each setting measured."""
WORKLOADS = ("stock", "bands")


def advertisements(workload: Workload) -> dict[str, tuple[str, Subscription]]:
    """Publisher → (its broker, its advertisement): ``eq`` on each string attribute
    whose value is the same in every publication it makes, ``>=`` and ``<=`` on each
    numeric attribute every publication carries (its least and greatest value)."""
    by_publisher: dict[str, list] = defaultdict(list)
    for p in workload.publications:
        by_publisher[p.publisher].append(p)
    out = {}
    for publisher, events in sorted(by_publisher.items()):
        first = events[0].publication
        fixed = [
            Predicate(attr, "eq", value)
            for attr, value in first.items()
            if isinstance(value, str) and all(e.publication.get(attr) == value for e in events)
        ]
        for attr, value in first.items():
            values = [e.publication.get(attr) for e in events]
            if isinstance(value, int | float) and all(isinstance(v, int | float) for v in values):
                fixed += [Predicate(attr, ">=", min(values)), Predicate(attr, "<=", max(values))]
        out[publisher] = (events[0].broker, Subscription(tuple(fixed)))
    return out


def simulate(
    scot: Scot, workload: Workload, mode: str, on: bool, covering: str
) -> tuple[Simulator, dict]:
    sim = Simulator(
        scot,
        mode,
        seed=1,
        latency=LatencyModel(LATENCY, JITTER),
        advertisements=on,
        covering=covering,
    )
    for s in workload.subscriptions:
        sim.at(s.time, sim.subscribe, s.subscriber, s.broker, s.subscription)
    cpu = time.process_time()
    sim.run()
    if on:
        for publisher, (broker, advertisement) in advertisements(workload).items():
            sim.advertise(publisher, broker, advertisement)
        sim.run()
    cpu = time.process_time() - cpu
    sizes = [len(core.table) for core in sim.cores.values()]
    counts = [core.counts() for core in sim.cores.values()]
    start = sim.now
    for p in workload.publications:
        sim.at(start + p.time, sim.publish, p.publisher, p.broker, p.publication, p.seq)
    sim.run()
    report = sim.report()
    subscriptions = len(workload.subscriptions)
    sent = sum(c["sent.subscribe"] for c in counts)
    return sim, {
        "mode": mode,
        "advertisements": "on" if on else "off",
        "covering": covering,
        "subscriptions": subscriptions,
        "sbp_messages": sent,
        "sbp_per_subscription": sent / subscriptions,
        "released": sum(c["advertising.released"] for c in counts),
        "advertisement_messages": sum(c["sent.advertise"] for c in counts),
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


def run(out: Path, subscribers: int, seed: int, rounds: int) -> dict[str, Any]:
    scot = build_preset("paper75")
    results: dict[str, Any] = {"subscribers": subscribers, "seed": seed, "rows": []}
    for name in WORKLOADS:
        workload = (
            stock(scot, subscribers, out, seed)
            if name == "stock"
            else bands(scot, subscribers, seed)
        )
        sample = [p.publication for p in workload.publications[:500]]
        for mode in MODES:
            sims, rows = {}, {}
            for label, (on, covering) in SETTINGS.items():
                log.info("%s, %s, advertisements %s", name, mode, label)
                sims[label], rows[label] = simulate(scot, workload, mode, on, covering)
            for label, sim in sims.items():
                if sim.ledger.received != sims["off"].ledger.received:
                    raise SystemExit(
                        f"{name}, {mode}: advertisements {label} changed the deliveries; "
                        "that is a bug"
                    )
            for label, times in matching_times(sims, sample, rounds).items():
                rows[label]["matching_us"] = times
            results["rows"] += [{"workload": name, **rows[label]} for label in SETTINGS]
    return results


def table(results: dict[str, Any]) -> str:
    """The markdown table of :func:`run`'s results."""
    lines = [
        "| workload | mode | advertisements | covering | SBP msgs / subscription | "
        "sent when advertised | "
        "advertisement msgs | entries / broker, mean (max) | subscription CPU s | "
        "matching µs, transit hop / publisher's broker | notification delay mean / p99 ms | "
        "notification msgs | delivered (lost, dup) |",
        "|" + "---|" * 13,
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['workload']} | {r['mode']} | {r['advertisements']} | {r['covering']} | "
            f"{r['sbp_per_subscription']:.1f} | "
            f"{r['released']:,} | {r['advertisement_messages']:,} | {row_cells(r)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_options(parser, "advertisements")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results = run(args.out / "advertisements", args.subscribers, args.seed, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "advertisements.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    (args.out / "advertisements.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
