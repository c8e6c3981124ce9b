"""The same stomp.py program against Debian's ActiveMQ Classic and against OctopiS's STOMP
listener: one subscription per JMS selector (every operator of the subset), the same
real quotes published to each, and per selector the messages each system delivered.

    .venv/bin/python -m bench.stomp_conformance [--quotes 300]

Deliberate differences (:data:`DIFFERENT`): OctopiS refuses, with an ERROR naming the
part, what its overlay cannot route exactly (``IS NULL``, ``LIKE`` with ``_``), which
ActiveMQ evaluates. Numbers are written as floating literals: ActiveMQ compares a
STOMP header (a string) with a floating literal numerically; OctopiS types the header.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import networkx as nx
import stomp

from bench.peers import ActiveMQSystem
from octopis.cluster.launcher import LocalCluster, find_free_base_port
from octopis.gateway.headers import publication_of
from octopis.gateway.selector import SelectorError, parse, selects
from octopis.quotes import read_quote_dir
from octopis.settings import BrokerSettings
from octopis.topology import PORTS_PER_BROKER, build_scot, complete_factor, with_stomp

TOPIC = "/topic/STOCK"
SAME = [
    "symbol = 'MSFT'",
    "symbol <> 'MSFT' AND close > 100.0",
    "close < 5.0",
    "close <= 5.0 OR close >= 150.0",
    "high > 30.0 AND low < 30.0",
    "close BETWEEN 20.0 AND 25.0",
    "close NOT BETWEEN 1.0 AND 100.0",
    "symbol IN ('AAPL', 'AMZN', 'IBM')",
    "symbol NOT IN ('AAPL', 'AMZN', 'IBM') AND volume > 5000000.0",
    "symbol LIKE 'A%'",
    "symbol LIKE '%T'",
    "symbol LIKE '%MZ%'",
    "symbol LIKE 'A%L'",
    "sector LIKE '%!%%' ESCAPE '!' OR date LIKE '2%'",
    "symbol NOT LIKE 'A%'",
    "sector IS NOT NULL",
    "sector = 'tech' OR close > 140.0",
    "NOT (sector = 'tech')",
    "sector <> 'tech'",
    "NOT (close > 50.0 OR symbol = 'MSFT')",
    "(symbol = 'AAPL' OR symbol = 'MSFT') AND NOT (volume < 10000000.0)",
    "symbol LIKE 'AMZ%' AND open > 40.0",
]
"""Selectors both systems serve; each gets the same messages."""
DIFFERENT = [
    "sector IS NULL",
    "symbol LIKE 'A_PL'",
    "open > close",
]
"""Selectors OctopiS refuses (no exact form in its overlay's language)."""


def messages(count: int) -> list[dict[str, str]]:
    """``count`` real quotes as STOMP headers, numbered ``n``; some carry ``sector``."""
    out = []
    per_symbol: dict[str, int] = {}
    for q in read_quote_dir():
        if per_symbol.get(q["symbol"], 0) >= 4:
            continue
        per_symbol[q["symbol"]] = per_symbol.get(q["symbol"], 0) + 1
        n = len(out)
        headers = {k: str(v) for k, v in q.items() if k != "class"}
        if n % 3 == 0:
            headers["sector"] = "tech" if n % 2 else "energy"
        elif n % 10 == 1:
            headers["sector"] = "50%-off"
        out.append({**headers, "n": str(n)})
        if len(out) == count:
            break
    return out


def oracle(selector: str, sent: list[dict[str, str]]) -> list[int] | str:
    """The ``n`` of the messages ``selector`` selects, headers typed as OctopiS types them
    (``"-"`` for a selector OctopiS cannot parse)."""
    try:
        parse(selector)
    except SelectorError:
        return "-"
    typed = [publication_of({"destination": TOPIC, **h}) for h in sent]
    return sorted(p["n"] for p in typed if selects(selector, p))


class _Inbox(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.got: list[int] = []
        self.receipts: set[str] = set()
        self.error: str | None = None
        self.lock = threading.Lock()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.got.append(int(frame.headers["n"]))

    def on_receipt(self, frame: Any) -> None:
        self.receipts.add(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.error = frame.headers.get("message", "error")


def _until(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def run(
    port: int,
    selectors: list[str],
    sent: list[dict[str, str]],
    done: Callable[[dict[str, list[int] | str]], bool],
    timeout: float = 60,
) -> dict[str, list[int] | str]:
    """Per selector, the ``n`` delivered (sorted) or ``"refused: <message>"``: one
    stomp.py connection per selector at ``127.0.0.1:port``, then ``sent`` published with
    receipts; returns once ``done(results)`` holds (or after ``timeout`` seconds)."""
    inboxes = {}
    for i, selector in enumerate(selectors):
        conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
        inbox = _Inbox()
        conn.set_listener("inbox", inbox)
        conn.connect(wait=True)
        conn.subscribe(TOPIC, id=str(i), headers={"selector": selector, "receipt": "in"})
        inboxes[selector] = (conn, inbox)
    _until(lambda: all(b.receipts or b.error for _, b in inboxes.values()), "subscribed", 30)
    pub = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    confirmed = _Inbox()
    pub.set_listener("inbox", confirmed)
    pub.connect(wait=True)
    for headers in sent:
        pub.send(TOPIC, "", headers={**headers, "receipt": headers["n"]})
    _until(lambda: len(confirmed.receipts) == len(sent), "every SEND confirmed", timeout)

    def results() -> dict[str, list[int] | str]:
        return {
            s: f"refused: {b.error}" if b.error else sorted(b.got) for s, (_, b) in inboxes.items()
        }

    deadline = time.monotonic() + timeout
    while not done(results()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for conn, _ in [*inboxes.values(), (pub, confirmed)]:
        if conn.is_connected():
            conn.disconnect()
    return results()


def settled(seconds: float) -> Callable[[dict[str, list[int] | str]], bool]:
    """A ``done`` for :func:`run`: nothing new arrived for ``seconds``."""
    last: list[Any] = [None, time.monotonic()]

    def check(results: dict[str, list[int] | str]) -> bool:
        if results != last[0]:
            last[0], last[1] = results, time.monotonic()
        return time.monotonic() - last[1] >= seconds

    return check


@contextmanager
def octopis_broker(work: Path) -> Iterator[tuple[int, list[int], str]]:
    """One OctopiS broker (insecure) with its STOMP listener; yields the STOMP port, the
    broker's process id and its client endpoint (for the SDK)."""
    base = find_free_base_port(2)
    scot = build_scot(nx.path_graph(["a"]), complete_factor(1), name="one", base_port=base)
    scot = with_stomp(scot, base + PORTS_PER_BROKER)
    work.mkdir(parents=True, exist_ok=True)
    path = work / "one.json"
    path.write_text(json.dumps(scot.to_json()))
    cluster = LocalCluster(scot, path, "snr", work, BrokerSettings(), secure=False, stomp=True)
    cluster.spawn()
    try:
        asyncio.run(_ready(cluster))
        pids = [p.pid for p in cluster.processes.values()]
        yield base + PORTS_PER_BROKER, pids, scot.brokers["a:0"].client_endpoint
    finally:
        cluster.stop()


async def _ready(cluster: LocalCluster) -> None:
    try:
        await cluster.wait_ready(60)
    finally:
        await cluster.close_control()


@contextmanager
def activemq_broker(work: Path) -> Iterator[tuple[int, list[int]]]:
    """One ActiveMQ Classic broker (Debian's); yields its STOMP port and its JVM's
    process id."""
    system = ActiveMQSystem(heap_mb=256)
    scot = build_scot(nx.path_graph(["a"]), complete_factor(1), name="one")
    system.start(scot, work)
    try:
        yield system.ports["a:0"][1], system.pids()
    finally:
        system.stop()


def reached_oracle(sent: list[dict[str, str]]) -> Callable[[dict[str, list[int] | str]], bool]:
    """A ``done`` for :func:`run`: every selector got what the oracle says (or was refused)."""
    expected = {s: oracle(s, sent) for s in SAME + DIFFERENT}

    def check(results: dict[str, list[int] | str]) -> bool:
        return all(
            isinstance(got, str) or got == expected[s] or expected[s] == "-"
            for s, got in results.items()
        )

    return check


def compare(quotes: int, work: Path, exact: bool = False) -> list[tuple[str, Any, Any, Any]]:
    """(selector, oracle, ActiveMQ's, OctopiS's) per selector of SAME and DIFFERENT. Each
    system's run ends when nothing arrived for 3 s, or with ``exact`` once every selector
    got what the oracle says (a test's condition)."""
    sent = messages(quotes)
    selectors = SAME + DIFFERENT
    with activemq_broker(work / "activemq") as (port, _):
        amq = run(port, selectors, sent, reached_oracle(sent) if exact else settled(3.0))
    with octopis_broker(work / "octopis") as (port, *_):
        ours = run(port, selectors, sent, reached_oracle(sent) if exact else settled(3.0))
    return [(s, oracle(s, sent), amq[s], ours[s]) for s in selectors]


def _count(result: list[int] | str) -> str:
    return result if isinstance(result, str) else str(len(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quotes", type=int, default=300, help="real quotes published to each system"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rows = compare(args.quotes, Path(work))
    print("| selector | oracle | ActiveMQ | OctopiS | same |")
    print("|---|---|---|---|---|")
    for selector, expected, amq, ours in rows:
        print(
            f"| `{selector}` | {_count(expected)} | {_count(amq)} | {_count(ours)} | "
            f"{'yes' if amq == ours else 'no (deliberate)' if selector in DIFFERENT else 'NO'} |"
        )


if __name__ == "__main__":
    main()
