"""Process-level test helpers: waiting on conditions (never a bare sleep, DESIGN §5), a
scenario that closes the cluster's control clients in its own loop, the exactly-once
accounting of one subscriber, the ``octopis`` command line as a process, and real quotes
to publish."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from octopis.client import Subscriber
from octopis.cluster.launcher import LocalCluster
from octopis.core.messages import Notification
from octopis.filters.language import Publication
from octopis.quotes import quotes_dir, read_quote_file

T = TypeVar("T")


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float) -> float:
    """Poll ``check`` (plain or async) every 50 ms until it holds; returns the seconds it
    took, or fails the test naming ``what`` after ``timeout`` seconds."""
    started = time.monotonic()
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)


async def closing_control(cluster: LocalCluster, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work``, then close ``cluster``'s control clients (in the same event loop)."""
    try:
        return await work
    finally:
        await cluster.close_control()


def accounting(name: str, expected: int, got: Counter[Any]) -> dict[str, int]:
    """Expected, delivered, duplicated and lost deliveries of subscriber ``name`` (printed);
    ``got`` counts each delivery by its key (publisher and sequence number)."""
    counts = {
        "expected": expected,
        "delivered": len(got),
        "duplicates": sum(n - 1 for n in got.values()),
        "lost": expected - len(got),
    }
    print(name, counts)
    return counts


async def tables_hold(cluster: LocalCluster, size: int) -> bool:
    """Every broker's routing table holds ``size`` subscriptions (a condition for
    :func:`until`: a subscription has spread)."""
    stats = await cluster.call_all("stats")
    return all(s["routing_table_size"] == size for s in stats.values())


async def reader_on(cluster: LocalCluster, broker: str, got: Counter[int]) -> Subscriber:
    """Once ``cluster`` is ready: subscriber "reader" on ``broker`` to every STOCK
    notification, counting deliveries by sequence number in ``got``."""
    await cluster.wait_ready(60)
    reader = await Subscriber.connect(
        cluster.scot.brokers[broker].client_endpoint,
        "reader",
        on_notification=lambda n: got.update([n.seq]),
    )
    await reader.subscribe("[class,eq,'STOCK']")
    return reader


def assert_one_sbp_each(report: dict[str, Any], per_subscription: int) -> None:
    """Every subscription the brokers took started one SBP of ``per_subscription``
    messages, or (covering, DESIGN §12: some were not passed on, ``sbp_quenched`` > 0)
    of at most that many. The brokers take more than the workload's subscriptions only
    when a client subscribed again at another broker after a fail-over (on a loaded
    machine a broker can be silent past a client's liveness), and then each one made
    again floods once too."""
    made = report["subscriptions_made"]
    assert made >= report["subscriptions"], report
    if report["sdk_failovers"] == 0:
        assert made == report["subscriptions"], report
    sent = report["sbp_messages"]
    if report["sbp_quenched"]:
        assert 0 < sent <= made * per_subscription, (made, sent, report["sbp_quenched"])
    else:
        assert sent == made * per_subscription, (made, sent)


def run_octopis(
    args: list[str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """``octopis ARGS`` in a process of its own (in ``cwd``: its default run directory
    is ``cwd/.octopis``), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "octopis.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def mixed_quotes(symbols: tuple[str, ...], count: int) -> list[Publication]:
    """``count`` real quotes, the symbols' files interleaved."""
    files = [read_quote_file(quotes_dir() / s) for s in symbols]
    mixed = (q for group in itertools.zip_longest(*files) for q in group if q is not None)
    return list(itertools.islice(mixed, count))


def stock_notification(
    publisher: str, seq: int, at: float = 200.0, price: float = 1.0
) -> Notification:
    """A notification of ``publisher``'s session 1, published ``at``, of class STOCK at
    ``price``: what the replay and store tests keep and answer."""
    return Notification(publisher, seq, at, {"class": "STOCK", "price": price}, session=1)
