"""Deliveries per second through one broker's STOMP listener, OctopiS against ActiveMQ
Classic side by side in one run, the same workload for both: ``--subscribers`` stomp.py
subscribers (spread over ``--processes`` client processes), each with the JMS selector of
one stock subscription (bench.peers' workload: 2% selectivity), and one stomp.py
publisher sending ``--quotes`` real quotes as fast as its receipts allow. Every delivery
is checked exactly once against the selectors' oracle. ``--sdk`` adds the same workload
through the SDK on the same OctopiS broker (the STOMP path against the SDK path).

Everything shares the machine's cores, so deliveries/s is about cores / (broker CPU +
client CPU per delivery): both are measured (the clients: the subscriber processes and
the publisher's), and the highest OctopiS/ActiveMQ ratio the clients' cost allows is
printed beside the measured one.

    .venv/bin/python -m bench.stomp_throughput --subscribers 1000 --quotes 2000 --sdk
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import stomp

from bench.peers import RECEIPT_EVERY, TOPIC, WINDOW, jms_selector, stomp_headers
from bench.stomp_conformance import activemq_broker, octopis_broker
from octopis.client import Publisher, Subscriber
from octopis.gateway.headers import publication_of
from octopis.gateway.selector import evaluate, parse, translate
from octopis.quotes import enrich, read_quote_dir, stock_subscriptions


def workload(subscribers: int, quotes: int) -> tuple[list[str], list[dict[str, str]]]:
    """Selectors and the quotes' STOMP headers (each with its number ``n``)."""
    sample = [enrich(q) for q in read_quote_dir()]
    step = max(1, len(sample) // quotes)
    published = sample[::step][:quotes]
    subs = stock_subscriptions(sample[::50], subscribers, seed=7)
    selectors = [jms_selector(s) for s in subs]
    return selectors, [{**stomp_headers(q), "n": str(i)} for i, q in enumerate(published)]


def oracle(selectors: list[str], sent: list[dict[str, str]]) -> int:
    """Deliveries the selectors call for (headers typed as OctopiS types them)."""
    typed = [publication_of({"destination": TOPIC, **h}) for h in sent]
    trees = [parse(s) for s in selectors]
    return sum(evaluate(t, p) is True for t in trees for p in typed)


def _subscriber_process(
    port: int,
    selectors: list[tuple[int, str]],
    count: tuple[Any, int],
    ready: Any,
    stop: Any,
    out: Any,
) -> None:
    """Open one stomp.py connection per selector, count deliveries by (id, n) (and in
    ``count``: this process's slot of a shared array)."""
    got: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()
    receipts = threading.Semaphore(0)
    counts, slot = count

    class Inbox(stomp.ConnectionListener):
        def __init__(self, sub: int) -> None:
            self.sub = sub

        def on_message(self, frame: Any) -> None:
            with lock:
                got[(self.sub, int(frame.headers["n"]))] += 1
                counts[slot] += 1

        def on_receipt(self, frame: Any) -> None:
            receipts.release()

    conns = []
    for sub, selector in selectors:
        conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
        conn.set_listener("inbox", Inbox(sub))
        conn.connect(wait=True)
        conn.subscribe(TOPIC, id=str(sub), headers={"selector": selector, "receipt": "in"})
        conns.append(conn)
    for _ in selectors:
        receipts.acquire(timeout=60)
    with ready.get_lock():
        ready.value += 1
    stop.wait()
    out.put((len(got), sum(n - 1 for n in got.values())))
    for conn in conns:
        conn.disconnect()


class _Publisher(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.receipts = 0
        self.cond = threading.Condition()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts += 1
            self.cond.notify_all()


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` and their children used."""
    total = 0.0
    for pid in pids:
        p = psutil.Process(pid)
        for q in (p, *p.children(recursive=True)):
            t = q.cpu_times()
            total += t.user + t.system
    return total


def _own_cpu() -> float:
    """CPU seconds this process used (the publisher's), its children left out."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


def stomp_run(
    broker: tuple[int, list[int]],
    selectors: list[str],
    sent: list[dict[str, str]],
    processes: int,
    expected: int,
) -> dict[str, float]:
    """One system's run: subscribers up, then the quotes; deliveries/s, the broker's CPU
    per delivery, and the checks."""
    port, pids = broker
    clients = _Clients(_subscriber_process, port, selectors, processes)
    pub = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    listener = _Publisher()
    pub.set_listener("pub", listener)
    pub.connect(wait=True)
    started, cpu, client_cpu = time.perf_counter(), _cpu(pids), clients.cpu()
    for i, headers in enumerate(sent, 1):
        extra = {"receipt": str(i)} if i % RECEIPT_EVERY == 0 or i == len(sent) else {}
        pub.send(TOPIC, "", headers={**headers, **extra})
        if extra:
            with listener.cond:
                owed = i // RECEIPT_EVERY - WINDOW
                listener.cond.wait_for(lambda owed=owed: listener.receipts >= owed, 60)
    _wait(lambda: clients.total() >= expected, "every delivery", 600)
    elapsed, cpu = time.perf_counter() - started, _cpu(pids) - cpu
    client_cpu = clients.cpu() - client_cpu
    pub.disconnect()
    return clients.finish(expected, elapsed, cpu, client_cpu)


def _sdk_subscriber_process(
    endpoint: str,
    filters: list[tuple[int, str]],
    count: tuple[Any, int],
    ready: Any,
    stop: Any,
    out: Any,
) -> None:
    """One SDK subscriber (its own connection) per filter, counting deliveries by (id, n)
    (and in ``count``: this process's slot of a shared array)."""
    got: Counter[tuple[int, int]] = Counter()
    counts, slot = count

    async def main() -> None:
        clients = []
        for sub, text in filters:

            def on(r: Any, sub: int = sub) -> None:
                got[(sub, r.publication["n"])] += 1
                counts[slot] += 1

            client = await Subscriber.connect(endpoint, f"s{sub}", keys=False, on_notification=on)
            await client.subscribe(text)
            clients.append(client)
        with ready.get_lock():
            ready.value += 1
        await asyncio.to_thread(stop.wait)
        out.put((len(got), sum(n - 1 for n in got.values())))
        for client in clients:
            await client.close()

    asyncio.run(main())


def sdk_run(
    broker: tuple[int, list[int], str],
    selectors: list[str],
    sent: list[dict[str, str]],
    processes: int,
    expected: int,
) -> dict[str, float]:
    """The same workload through the SDK on the same broker: each selector's PADRES
    subscription, the quotes as the publications STOMP makes of them."""
    _, pids, endpoint = broker
    filters = [translate(s, TOPIC.removeprefix("/topic/"))[0].to_text() for s in selectors]
    publications = [publication_of({"destination": TOPIC, **h}) for h in sent]
    clients = _Clients(_sdk_subscriber_process, endpoint, filters, processes)

    async def publish() -> tuple[float, float, float]:
        pub = await Publisher.connect(endpoint, "pub", keys=False)
        started, cpu, client_cpu = time.perf_counter(), _cpu(pids), clients.cpu()
        for p in publications:
            await pub.publish(p, wait=False)
        await pub.flush()
        await asyncio.to_thread(_wait, lambda: clients.total() >= expected, "every delivery", 600)
        elapsed, cpu = time.perf_counter() - started, _cpu(pids) - cpu
        client_cpu = clients.cpu() - client_cpu
        await pub.close()
        return elapsed, cpu, client_cpu

    return clients.finish(expected, *asyncio.run(publish()))


class _Clients:
    """Subscriber processes (``target`` run on a share of ``items`` each), ready when
    made; :meth:`finish` stops them and checks every delivery exactly once."""

    def __init__(self, target: Any, address: Any, items: list[str], processes: int) -> None:
        ctx = mp.get_context("spawn")
        self.counts, self.ready = ctx.RawArray("q", processes), ctx.Value("i", 0)
        self.stop, self.out = ctx.Event(), ctx.Queue()
        shares = [
            [(i, x) for i, x in enumerate(items) if i % processes == k] for k in range(processes)
        ]
        self.workers = [
            ctx.Process(
                target=target,
                args=(address, share, (self.counts, k), self.ready, self.stop, self.out),
            )
            for k, share in enumerate(shares)
        ]
        for w in self.workers:
            w.start()
        _wait(lambda: self.ready.value == processes, "subscribers ready", 600)

    def total(self) -> int:
        """Deliveries received so far, in every process."""
        return sum(self.counts)

    def cpu(self) -> float:
        """CPU seconds the subscriber processes and this one (the publisher) used."""
        return _cpu([w.pid for w in self.workers if w.pid is not None]) + _own_cpu()

    def finish(
        self, expected: int, elapsed: float, cpu: float, client_cpu: float
    ) -> dict[str, float]:
        """Deliveries/s and the broker's and the clients' CPU per delivery of a run, with
        its exactly-once counts."""
        time.sleep(1.0)  # duplicates, if any, would arrive now
        self.stop.set()
        distinct = duplicates = 0
        for _ in self.workers:
            d, dup = self.out.get(timeout=120)
            distinct, duplicates = distinct + d, duplicates + dup
        for w in self.workers:
            w.join(timeout=60)
        return {
            "deliveries_per_s": expected / elapsed,
            "seconds": elapsed,
            "cpu_us_per_delivery": 1e6 * cpu / expected,
            "client_us_per_delivery": 1e6 * client_cpu / expected,
            "expected": expected,
            "delivered": distinct,
            "duplicates": duplicates,
            "lost": expected - distinct,
        }


def _wait(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--subscribers", type=int, default=1000, help="subscribers, one selector each"
    )
    parser.add_argument("--quotes", type=int, default=2000, help="real quotes published")
    parser.add_argument(
        "--processes", type=int, default=4, help="subscriber processes (the same for both)"
    )
    parser.add_argument(
        "--sdk", action="store_true", help="also run the workload through the SDK on OctopiS"
    )
    args = parser.parse_args()
    selectors, sent = workload(args.subscribers, args.quotes)
    expected = oracle(selectors, sent)
    print(f"{len(selectors)} subscribers, {len(sent)} quotes, {expected} deliveries expected")
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        with octopis_broker(Path(work) / "octopis") as broker:
            rows["OctopiS (STOMP)"] = stomp_run(
                broker[:2], selectors, sent, args.processes, expected
            )
            if args.sdk:
                rows["OctopiS (SDK)"] = sdk_run(broker, selectors, sent, args.processes, expected)
        with activemq_broker(Path(work) / "activemq") as amq:
            rows["ActiveMQ 5.17 (STOMP)"] = stomp_run(
                amq, selectors, sent, args.processes, expected
            )
    print(table(rows))


def table(rows: dict[str, dict[str, float]]) -> str:
    """The runs' table, then the OctopiS/ActiveMQ ratios: measured, the one the CPU costs
    predict, and the highest the clients' cost allows (the broker's taken as free)."""
    lines = [
        "| system | deliveries/s | s | broker CPU µs per delivery | client CPU µs per delivery "
        "| expected | delivered | duplicates | lost |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['deliveries_per_s']:.0f} | {r['seconds']:.1f} | "
            f"{r['cpu_us_per_delivery']:.0f} | {r['client_us_per_delivery']:.0f} | "
            f"{r['expected']} | {r['delivered']} | {r['duplicates']} | {r['lost']} |"
        )
    a, b = rows["OctopiS (STOMP)"], rows["ActiveMQ 5.17 (STOMP)"]
    ours = a["cpu_us_per_delivery"] + a["client_us_per_delivery"]
    theirs = b["cpu_us_per_delivery"] + b["client_us_per_delivery"]
    lines.append(
        f"OctopiS / ActiveMQ: deliveries/s {a['deliveries_per_s'] / b['deliveries_per_s']:.2f}, "
        f"broker CPU per delivery {a['cpu_us_per_delivery'] / b['cpu_us_per_delivery']:.2f}; "
        f"the CPU costs predict {theirs / ours:.2f} (on {psutil.cpu_count()} cores: "
        f"deliveries/s ~ cores / (broker + client µs)), at most "
        f"{theirs / a['client_us_per_delivery']:.2f} with OctopiS's broker free"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
