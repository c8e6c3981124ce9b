"""OctopiS beside Apache ActiveMQ Classic (issue 20): the same stock-quote workload on the
broker a user would pick instead, on the same shapes, counted against the same oracle.

    python -m bench.peers                         # both shapes, 3 rotating runs
    python -m bench.peers --shapes single --runs 1 --subscribers 50
    python -m bench.peers --from bench/results/peers.json   # tabulate again

ActiveMQ side: Debian's ``activemq`` package (5.17), non-persistent, one JVM per broker,
clients over STOMP (stomp.py). Each subscription is a JMS selector over message
properties (:func:`jms_selector`); each publication's attributes travel as properties
(:func:`stomp_headers`). Two networks shaped like a SCOT:

- ``activemq``: every pair of SCOT neighbours linked by one duplex network connector,
  ``networkTTL`` = the overlay's diameter (a message must be able to cross it),
  ActiveMQ's duplicate suppression at its defaults;
- ``activemq-tree``: links only along a breadth-first spanning tree of the SCOT, the
  acyclic shape ActiveMQ's topic forwarding is made for.

This script installs and configures nothing outside its temporary directory: without
ActiveMQ it says how to install it and exits 2.

OctopiS side: the same shape as broker processes (``LocalCluster``, in the clear as
ActiveMQ is, DNR unless ``--mode``), clients through the SDK.

Every system runs under the same harness in one client process: one connection per
broker for all subscribers there, one per publisher, and three phases on the same
subscriptions:

- *warmup*: the first ``--warmup`` publications as fast as accepted (a JVM's JIT and
  every cache warm; its counts are in the JSON, not the table);
- *fixed*: the publications at ``--rate`` per second in all → p50/p99 notification delay
  (time.time() at publishing to time.time() at the callback, in the same process);
- *flood*: every publisher sends its publications as fast as its broker accepts them (an
  OctopiS publisher's window; STOMP receipts every ``RECEIPT_EVERY`` messages, at most
  ``WINDOW`` of them outstanding) → accepted publications/s and delivered
  notifications/s (distinct expected deliveries; ``arrivals_per_s`` counts repeats too).

Each phase reports expected, delivered, duplicated, lost and unexpected deliveries
against :class:`DeliveryLedger` (the compiled matcher on the PADRES subscriptions), and
the brokers' CPU time per delivery and summed peak RSS (psutil). The systems' order
rotates run by run. Written: ``bench/results/peers.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import networkx as nx
import psutil

from octopis.accounting import DeliveryLedger, distribution
from octopis.client import Connection, ConnectionGroup, Publisher, Received, Subscriber
from octopis.cluster.launcher import LocalCluster, find_free_base_port
from octopis.filters.language import Predicate, Publication, Subscription
from octopis.quotes import quotes_dir
from octopis.settings import BrokerSettings
from octopis.topology import Scot, build_preset, build_scot
from octopis.workload import SubscriptionEvent, Workload, generate_workload

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ACTIVEMQ_HOME = Path(os.environ.get("ACTIVEMQ_HOME", "/usr/share/activemq"))
INSTALL_HINT = (
    "Apache ActiveMQ Classic is not installed (no {jar}). On Debian or Ubuntu: "
    "`sudo apt-get install activemq` (the service need not run: this script starts its own "
    "brokers); elsewhere unpack apache-activemq-5.x and set ACTIVEMQ_HOME to it. The "
    "Python side needs stomp.py: `pip install -e '.[experiments]'`."
)
TOPIC = "/topic/quotes"
RECEIPT_EVERY = 100
WINDOW = 10
PROBE = "probe"
"""Attribute of the probe publications and subscriptions that show a shape is settled."""
SHAPES = ("single", "fig2")
SYSTEMS = ("octopis", "octopis-plain", "activemq", "activemq-tree")
PLAIN = {"retention": {"max_age": 0.0}, "routing": {"covering": "off"}}
"""``octopis-plain``: the same brokers with retention and covering off (what a broker
was before they became the defaults), to measure what they cost side by side."""


class PeersError(RuntimeError):
    """A system did not start, settle or finish a phase."""


# -- the workload as JMS selectors and STOMP headers ----------------------------------------


def jms_name(attr: str) -> str:
    """The property name of attribute ``attr``: ``a_`` and the name with the characters a
    JMS identifier may not hold spelled out (``openClose%Diff`` → ``a_openClose_pct_Diff``)."""
    return "a_" + attr.replace("%", "_pct_").replace(".", "_dot_").replace("-", "_dash_")


def _jms_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _jms_like(value: str, *, before: bool, after: bool) -> str:
    escaped = re.sub(r"([%_!])", r"!\1", value)
    return _jms_string(("%" if before else "") + escaped + ("%" if after else "")) + " ESCAPE '!'"


def _jms_number(value: float) -> str:
    """A number as an approximate JMS literal: ActiveMQ compares a string property (all
    STOMP sends) with a floating literal numerically, and refuses some integer ones."""
    return repr(float(value))


_NUMERIC = {"=": "=", "<>": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _jms_predicate(p: Predicate) -> str:
    name = jms_name(p.attr)
    if p.op in _NUMERIC:
        return f"{name} {_NUMERIC[p.op]} {_jms_number(p.value)}"  # type: ignore[arg-type]
    if p.op == "eq":
        return f"{name} = {_jms_string(p.value)}"  # type: ignore[arg-type]
    if p.op == "neq":
        return f"{name} <> {_jms_string(p.value)}"  # type: ignore[arg-type]
    if p.op in ("str-prefix", "str-postfix", "str-contains"):
        before, after = p.op != "str-prefix", p.op != "str-postfix"
        return f"{name} LIKE {_jms_like(p.value, before=before, after=after)}"  # type: ignore[arg-type]
    if p.op == "isPresent":
        return f"{name} IS NOT NULL"
    raise ValueError(f"[{p.attr},{p.op},...]: JMS selectors have no {p.op} (string order)")


def jms_selector(subscription: Subscription) -> str:
    """The JMS selector of a PADRES subscription (a conjunction, as in PADRES). Raises
    ValueError for the string-order operators, which JMS selectors lack."""
    return " AND ".join(_jms_predicate(p) for p in subscription.predicates)


def stomp_headers(publication: Publication) -> dict[str, str]:
    """A publication's attributes as STOMP headers (ActiveMQ's string properties)."""
    return {
        jms_name(k): repr(float(v)) if isinstance(v, float) else str(v)
        for k, v in publication.items()
    }


# -- the harness both systems run under ----------------------------------------------------


Deliver = Callable[[str, str, int, float, float, float], None]
"""(subscriber, publisher, seq, published_at, received_at, left_broker_at) → None, the
last NaN when the system does not stamp it; any thread may call."""


class Pub(Protocol):
    """One publisher of a system: ``send`` returns once the publication is handed over
    (waiting for credit), ``drain`` once the broker accepted everything sent."""

    async def send(self, seq: int, publication: Publication) -> None: ...

    async def drain(self) -> None: ...

    async def close(self) -> None: ...


class System(Protocol):
    """A broker network under the harness: started on a shape, its clients subscribed
    (deliveries to ``deliver``, or to what :meth:`route_to` names last), its publishers
    made, its broker processes' pids for the CPU and memory figures."""

    name: str

    def start(self, scot: Scot, work: Path) -> None: ...

    def pids(self) -> list[int]: ...

    def route_to(self, deliver: Deliver) -> None: ...

    async def subscribe(self, events: list[SubscriptionEvent], deliver: Deliver | None) -> None: ...

    async def publisher(self, name: str, broker: str) -> Pub: ...

    async def close_clients(self) -> None: ...

    def stop(self) -> None: ...


class Tally:
    """Deliveries as they arrive (from any thread), taken into a ledger later; counts the
    distinct ``expected`` deliveries among them as they come."""

    def __init__(self, expected: set[tuple[str, str, int]]) -> None:
        self._lock = threading.Lock()
        self._arrived: list[tuple[str, str, int, float, float, float]] = []
        self._expected = expected
        self._got: set[tuple[str, str, int]] = set()

    def deliver(
        self, subscriber: str, publisher: str, seq: int, sent: float, got: float, left: float
    ) -> None:
        key = (subscriber, publisher, seq)
        with self._lock:
            self._arrived.append((subscriber, publisher, seq, sent, got, left))
            if key in self._expected:
                self._got.add(key)

    def __len__(self) -> int:
        return len(self._arrived)

    @property
    def distinct(self) -> int:
        """Expected deliveries that have arrived (each counted once)."""
        return len(self._got)

    def snapshot(self) -> list[tuple[str, str, int, float, float, float]]:
        """The deliveries so far."""
        with self._lock:
            return list(self._arrived)


class Usage:
    """CPU seconds and peak summed RSS of a system's broker processes over a phase."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.procs = [psutil.Process(pid) for pid in pids]
        self.cpu0 = self._cpu()
        self.peak_rss = 0
        self._task = asyncio.create_task(self._sample())

    def _cpu(self) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in self.procs)

    async def _sample(self) -> None:
        while True:
            self.peak_rss = max(self.peak_rss, sum(p.memory_info().rss for p in self.procs))
            await asyncio.sleep(0.5)

    async def finish(self) -> dict[str, float]:
        self._task.cancel()
        self.peak_rss = max(self.peak_rss, sum(p.memory_info().rss for p in self.procs))
        return {"cpu_s": self._cpu() - self.cpu0, "peak_rss_mb": self.peak_rss / 2**20}


async def _until(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise PeersError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.05)


async def settle(
    system: System, brokers: list[str], publishing: list[str], timeout: float
) -> float:
    """Subscribe a probe on every broker (after the workload's subscriptions, so that a
    probe reaching a broker's subscribers shows theirs have spread) and publish probes
    from every publishing broker until each probe has one from each; returns seconds."""
    started = time.monotonic()
    heard: dict[str, set[str]] = {b: set() for b in brokers}

    def got(subscriber: str, publisher: str, seq: int, sent: float, at: float, _: float) -> None:
        heard[subscriber.removeprefix(f"{PROBE}@")].add(publisher.removeprefix(f"{PROBE}@"))

    probe = Subscription((Predicate(PROBE, "eq", "on"),))
    await system.subscribe([SubscriptionEvent(f"{PROBE}@{b}", b, probe, 0.0) for b in brokers], got)
    senders = {b: await system.publisher(f"{PROBE}@{b}", b) for b in set(publishing)}
    seq = 0
    want = set(senders)
    while not all(want <= h for h in heard.values()):
        if time.monotonic() - started > timeout:
            missing = sorted(b for b, h in heard.items() if not want <= h)
            raise PeersError(f"probes not heard within {timeout:g} s on {', '.join(missing[:5])}")
        seq += 1
        for sender in senders.values():
            await sender.send(seq, {PROBE: "on"})
        await asyncio.sleep(0.25)
    for sender in senders.values():
        await sender.close()
    return time.monotonic() - started


async def run_phase(
    system: System,
    workload: Workload,
    phase: str,
    rate: float | None,
    quiet: float,
    timeout: float,
) -> dict[str, Any]:
    """Publish every publication of ``workload`` (at ``rate`` in all, or as fast as
    accepted when None) under publisher names ``<P>.<phase>``; wait until every expected
    delivery is in (and, when repeats came, until they stop), or nothing has arrived for
    ``quiet`` seconds; count against the oracle."""
    ledger = DeliveryLedger()
    for i, event in enumerate(workload.subscriptions):
        ledger.subscribed(event.subscriber, i, event.subscription)
    events = sorted(workload.publications, key=lambda e: e.time)
    for event in events:
        ledger.published(f"{event.publisher}.{phase}", event.seq, event.publication)
    tally = Tally(ledger.expected)
    system.route_to(tally.deliver)
    pubs: dict[str, Pub] = {}
    for event in events:
        if event.publisher not in pubs:
            pubs[event.publisher] = await system.publisher(
                f"{event.publisher}.{phase}", event.broker
            )
    usage = Usage(system.pids())
    started = time.monotonic()
    if rate is None:

        async def flood(publisher: str) -> None:
            for event in events:
                if event.publisher == publisher:
                    await pubs[publisher].send(event.seq, event.publication)
            await pubs[publisher].drain()

        await asyncio.gather(*(flood(p) for p in pubs))
    else:
        for i, event in enumerate(events):
            wait = started + i / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await pubs[event.publisher].send(event.seq, event.publication)
        for pub in pubs.values():
            await pub.drain()
    accepted_at = time.monotonic()
    expected = len(ledger.expected)
    last = [time.monotonic(), 0]

    def silent() -> bool:
        n = len(tally)
        if n != last[1]:
            last[:] = [time.monotonic(), n]
        return time.monotonic() - last[0] > quiet

    what = f"{system.name} {phase}: deliveries"
    await _until(lambda: silent() or tally.distinct >= expected, what, timeout)
    if len(tally) > tally.distinct:  # repeats: count them until they stop
        await _until(silent, what, timeout)
    arrived = tally.snapshot()
    finished = max((d[4] for d in arrived), default=time.time())
    usage_figures = await usage.finish()
    for pub in pubs.values():
        await pub.close()
    first_sent = time.time() - (time.monotonic() - started)
    for subscriber, publisher, seq, sent, got, left in arrived:
        ledger.delivered(subscriber, publisher, seq, got - sent, left - sent)
    counts = ledger.summary()
    publish_s = accepted_at - started
    cpu_us = usage_figures["cpu_s"] * 1e6 / max(1, counts["delivered"])
    deliver_s = max(finished - first_sent, 1e-9)
    return {
        **counts,
        "publications": len(events),
        "publish_s": publish_s,
        "accepted_per_s": len(events) / publish_s,
        "delivered_per_s": counts["delivered"] / deliver_s,
        "arrivals_per_s": len(arrived) / deliver_s,
        "delay_ms": {k: v * 1000 for k, v in distribution(ledger.delays).items()},
        "overlay_delay_ms": {k: v * 1000 for k, v in distribution(ledger.overlay_delays).items()},
        **usage_figures,
        "cpu_us_per_delivery": cpu_us,
    }


# -- OctopiS ---------------------------------------------------------------------------------


class _OctopisPub:
    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher

    async def send(self, seq: int, publication: Publication) -> None:
        await self.publisher.publish(publication, wait=False, seq=seq)

    async def drain(self) -> None:
        await self.publisher.flush(120)
        if self.publisher.refused:
            raise PeersError(f"OctopiS refused publications: {self.publisher.refused[0]}")

    async def close(self) -> None:
        await self.publisher.close()


class OctopisSystem:
    """The shape as OctopiS broker processes in ``mode``, in the clear, with the default
    settings or, ``plain``, with retention and covering off (:data:`PLAIN`)."""

    def __init__(self, mode: str, plain: bool = False) -> None:
        self.name = f"OctopiS ({mode.upper()}{', retention and covering off' if plain else ''})"
        self.mode = mode
        self.settings = BrokerSettings().changed(PLAIN) if plain else BrokerSettings()
        self.cluster: LocalCluster | None = None
        self.group = ConnectionGroup()
        self._deliver: Deliver = lambda *a: None

    def start(self, scot: Scot, work: Path) -> None:
        path = work / f"{scot.name}.json"
        path.write_text(json.dumps(scot.to_json()))
        self.scot = scot
        self.cluster = LocalCluster(
            scot, path, self.mode, work, self.settings, "WARNING", secure=False
        )
        self.cluster.spawn()

        async def ready() -> None:
            try:
                await self.cluster.wait_ready(180)
            finally:
                await self.cluster.close_control()

        asyncio.run(ready())

    def pids(self) -> list[int]:
        return [p.pid for p in self.cluster.processes.values()]

    def route_to(self, deliver: Deliver) -> None:
        self._deliver = deliver

    async def _connection(self, broker: str) -> Connection:
        endpoint = self.scot.client_endpoints(broker)[0]
        if endpoint not in self.group.connections:
            connection = Connection(endpoint, group=self.group)
            await connection.open()
        return self.group.connections[endpoint]

    async def subscribe(
        self, events: list[SubscriptionEvent], deliver: Deliver | None = None
    ) -> None:
        for event in events:
            connection = await self._connection(event.broker)

            def on(r: Received, fixed: Deliver | None = deliver) -> None:
                (fixed or self._deliver)(
                    r.subscriber,
                    r.publisher,
                    r.seq,
                    r.published_at,
                    r.received_at,
                    r.left_broker_at,
                )

            await Subscriber(event.subscriber, connection, on).subscribe(event.subscription)

    async def publisher(self, name: str, broker: str) -> Pub:
        return _OctopisPub(await Publisher.connect(self.scot.client_endpoints(broker)[:1], name))

    async def close_clients(self) -> None:
        for connection in list(self.group.connections.values()):
            await connection.close()
        self.group = ConnectionGroup()

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


# -- ActiveMQ Classic --------------------------------------------------------------------------


def activemq_jar() -> Path:
    """ActiveMQ's launcher jar; PeersError with how to install it when missing."""
    jar = ACTIVEMQ_HOME / "bin" / "activemq.jar"
    if not jar.is_file() or shutil.which("java") is None:
        raise PeersError(INSTALL_HINT.format(jar=jar))
    return jar


def activemq_config(
    name: str, openwire: int, stomp: int, links: list[int], ttl: int, data: Path
) -> str:
    """One broker's activemq.xml: non-persistent, OpenWire for the network, STOMP for
    clients, a duplex network connector to each port in ``links``."""
    connectors = "".join(
        f'\n      <networkConnector name="{name}-{port}" uri="static:(tcp://127.0.0.1:{port})" '
        f'duplex="true" networkTTL="{ttl}"/>'
        for port in links
    )
    network = f"\n    <networkConnectors>{connectors}\n    </networkConnectors>" if links else ""
    return f"""<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="{name}" persistent="false"
          useJmx="false" dataDirectory="{data}">{network}
    <transportConnectors>
      <transportConnector name="openwire" uri="tcp://127.0.0.1:{openwire}"/>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{stomp}"/>
    </transportConnectors>
  </broker>
</beans>
"""


LOG4J = """log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=%d %-5p %c{1} - %m%n
"""


class _StompListener:
    """Deliveries, receipts and errors of one STOMP connection (called on its thread)."""

    def __init__(self, system: ActiveMQSystem) -> None:
        self.system = system
        self.receipts: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self.errors: list[str] = []

    def on_message(self, frame: Any) -> None:
        h = frame.headers
        self.system._route(
            h["subscription"], h["opub"], int(h["oseq"]), float(h["osent"]), time.time(), math.nan
        )

    def on_receipt(self, frame: Any) -> None:
        waiting = self.receipts.pop(frame.headers["receipt-id"], None)
        if waiting is not None:
            loop, future = waiting
            loop.call_soon_threadsafe(future.set_result, None)

    def on_error(self, frame: Any) -> None:
        problem = frame.headers.get("message", "") or (frame.body or "").split("\n", 1)[0][:200]
        self.errors.append(problem)
        waiting = self.receipts.pop(frame.headers.get("receipt-id", ""), None)
        if waiting is not None:
            loop, future = waiting
            loop.call_soon_threadsafe(future.set_exception, PeersError(f"ActiveMQ: {problem}"))


class _ActiveMQPub:
    def __init__(
        self, system: ActiveMQSystem, connection: Any, listener: _StompListener, name: str
    ) -> None:
        self.system, self.connection, self.listener, self.name = system, connection, listener, name
        self.sent = 0
        self.outstanding: deque[asyncio.Future] = deque()

    async def send(self, seq: int, publication: Publication) -> None:
        headers = {
            **stomp_headers(publication),
            "opub": self.name,
            "oseq": str(seq),
            "osent": repr(time.time()),
        }
        self.sent += 1
        if self.sent % RECEIPT_EVERY == 0:
            receipt = f"{self.name}-{self.sent}"
            future = asyncio.get_running_loop().create_future()
            self.listener.receipts[receipt] = (asyncio.get_running_loop(), future)
            headers["receipt"] = receipt
            self.outstanding.append(future)
        self.connection.send(TOPIC, "", headers=headers)
        while len(self.outstanding) > WINDOW:
            await asyncio.wait_for(self.outstanding.popleft(), 60)

    async def drain(self) -> None:
        receipt = f"{self.name}-end-{self.sent}"
        future = asyncio.get_running_loop().create_future()
        self.listener.receipts[receipt] = (asyncio.get_running_loop(), future)
        self.connection.send(
            TOPIC, "", headers={"opub": "-", "oseq": "0", "osent": "0", "receipt": receipt}
        )
        await asyncio.wait_for(asyncio.gather(future, *self.outstanding), 120)
        self.outstanding.clear()
        if self.listener.errors:
            raise PeersError(f"ActiveMQ refused: {self.listener.errors[0]}")

    async def close(self) -> None:
        await asyncio.to_thread(self.connection.disconnect)


LINKS = ("scot", "tree")


class ActiveMQSystem:
    """The shape as ActiveMQ Classic brokers, one JVM each, linked along every edge of
    the SCOT (``links="scot"``) or only along a breadth-first spanning tree of it
    (``"tree"``: a network without cycles, where each message has one path)."""

    def __init__(self, heap_mb: int, links: str = "scot") -> None:
        if links not in LINKS:
            raise ValueError(f"links must be one of {LINKS}")
        self.heap_mb = heap_mb
        self.links = links
        self.name = "ActiveMQ 5.17" + (" (spanning tree)" if links == "tree" else "")
        self.processes: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, tuple[int, int]] = {}
        self.connections: dict[str, tuple[Any, _StompListener]] = {}
        self.handlers: dict[str, Deliver] = {}
        self._deliver: Deliver = lambda *a: None

    def start(self, scot: Scot, work: Path) -> None:
        jar = activemq_jar()
        brokers = list(scot.brokers)
        base = find_free_base_port(2 * len(brokers))
        self.ports = {b: (base + 2 * i, base + 2 * i + 1) for i, b in enumerate(brokers)}
        graph = scot.graph if self.links == "scot" else nx.bfs_tree(scot.graph, brokers[0])
        graph = graph.to_undirected()
        ttl = nx.diameter(graph) if len(brokers) > 1 else 1
        index = {b: i for i, b in enumerate(brokers)}
        for b in brokers:
            home = work / f"amq-{index[b]}"
            (home / "conf").mkdir(parents=True)
            links = [self.ports[n][0] for n in graph.neighbors(b) if index[n] > index[b]]
            config = activemq_config(f"b{index[b]}", *self.ports[b], links, ttl, home / "data")
            (home / "conf" / "activemq.xml").write_text(config)
            (home / "conf" / "log4j.properties").write_text(LOG4J)
            log = open(home / "broker.log", "wb")  # noqa: SIM115 (the process keeps it)
            self.processes[b] = subprocess.Popen(
                [
                    "java",
                    f"-Xms{self.heap_mb}m",
                    f"-Xmx{self.heap_mb}m",
                    f"-Dactivemq.classpath={home / 'conf'}:{ACTIVEMQ_HOME / 'lib'}/",
                    f"-Dactivemq.home={ACTIVEMQ_HOME}",
                    f"-Dactivemq.base={home}",
                    f"-Dactivemq.conf={home / 'conf'}",
                    f"-Dactivemq.data={home / 'data'}",
                    "-jar",
                    str(jar),
                    "start",
                    f"xbean:file:{home / 'conf' / 'activemq.xml'}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 180
        for b, (_, stomp) in self.ports.items():
            while not _listening(stomp):
                if self.processes[b].poll() is not None:
                    raise PeersError(
                        f"ActiveMQ broker {b} exited ({self.processes[b].returncode}); see {work}"
                    )
                if time.monotonic() > deadline:
                    raise PeersError(f"ActiveMQ broker {b} not listening after 180 s")
                time.sleep(0.2)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes.values()]

    def route_to(self, deliver: Deliver) -> None:
        self._deliver = deliver

    def _route(
        self, subscriber: str, publisher: str, seq: int, sent: float, got: float, left: float
    ) -> None:
        (self.handlers.get(subscriber) or self._deliver)(
            subscriber, publisher, seq, sent, got, left
        )

    async def _connection(self, key: str, broker: str) -> tuple[Any, _StompListener]:
        if key not in self.connections:
            import stomp

            connection = stomp.Connection([("127.0.0.1", self.ports[broker][1])], heartbeats=(0, 0))
            listener = _StompListener(self)
            connection.set_listener("peers", listener)
            await asyncio.to_thread(connection.connect, wait=True)
            self.connections[key] = (connection, listener)
        return self.connections[key]

    async def subscribe(
        self, events: list[SubscriptionEvent], deliver: Deliver | None = None
    ) -> None:
        """Subscribe each event's subscriber by its selector; returns once the brokers have
        answered every one (a refusal raises PeersError)."""
        answers = []
        loop = asyncio.get_running_loop()
        for event in events:
            connection, listener = await self._connection(event.broker, event.broker)
            if deliver is not None:
                self.handlers[event.subscriber] = deliver
            answers.append(future := loop.create_future())
            listener.receipts[f"sub:{event.subscriber}"] = (loop, future)
            connection.subscribe(
                TOPIC,
                id=event.subscriber,
                headers={
                    "selector": jms_selector(event.subscription),
                    "receipt": f"sub:{event.subscriber}",
                },
            )
        await asyncio.wait_for(asyncio.gather(*answers), 60)

    async def publisher(self, name: str, broker: str) -> Pub:
        connection, listener = await self._connection(f"pub:{name}", broker)
        self.connections.pop(f"pub:{name}")
        return _ActiveMQPub(self, connection, listener, name)

    async def close_clients(self) -> None:
        for connection, listener in self.connections.values():
            if listener.errors:
                raise PeersError(f"ActiveMQ refused a subscription: {listener.errors[0]}")
            await asyncio.to_thread(connection.disconnect)
        self.connections.clear()
        self.handlers.clear()

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


# -- runs, alternating, and the report ----------------------------------------------------------


def build_shape(name: str) -> Scot:
    """``single`` (one broker) or a preset (``fig2``), on free ports."""
    if name == "single":
        graph = nx.Graph()
        graph.add_node("a")
        return build_scot(graph, 1, name="single", base_port=find_free_base_port(4))
    size = len(build_preset(name).brokers)
    return build_preset(name, base_port=find_free_base_port(4 * size))


async def _measure(
    system: System, scot: Scot, workload: Workload, args: argparse.Namespace
) -> dict[str, Any]:
    await system.subscribe(workload.subscriptions, None)
    publishing = sorted({e.broker for e in workload.publications})
    settled = await settle(system, list(scot.brokers), publishing, 120)
    try:
        warm = Workload(workload.meta, workload.subscriptions, workload.publications[: args.warmup])
        warmup = await run_phase(system, warm, "warmup", None, args.quiet, 600)
        fixed = await run_phase(system, workload, "fixed", args.rate, args.quiet, 600)
        flood = await run_phase(system, workload, "flood", None, args.quiet, 600)
    finally:
        await system.close_clients()
    return {"settle_s": settled, "warmup": warmup, "fixed": fixed, "flood": flood}


def run_system(
    system: System, scot: Scot, workload: Workload, args: argparse.Namespace
) -> dict[str, Any]:
    """Start ``system`` on ``scot``, measure both phases, stop it."""
    with tempfile.TemporaryDirectory(prefix="octopis-peers-") as tmp:
        started = time.monotonic()
        try:
            system.start(scot, Path(tmp))
            ready = time.monotonic() - started
            return {"start_s": ready, **asyncio.run(_measure(system, scot, workload, args))}
        finally:
            system.stop()


def _median(runs: list[dict[str, Any]], *path: str) -> float:
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value[key]
        values.append(value)
    return statistics.median(values) if values else math.nan


COUNTS = ("expected_deliveries", "delivered", "duplicates", "lost", "unexpected")


COLUMNS = (
    ("accepted pubs/s (flood)", "accepted_per_s", "{:,.0f}"),
    ("delivered notif./s (flood)", "delivered_per_s", "{:,.0f}"),
    ("p50 ms (fixed)", "p50_ms", "{:.2f}"),
    ("p99 ms (fixed)", "p99_ms", "{:.2f}"),
    ("broker CPU µs/delivery (fixed)", "cpu_us_fixed", "{:,.0f}"),
    ("broker CPU µs/delivery (flood)", "cpu_us_flood", "{:,.0f}"),
    ("peak RSS MB", "peak_rss_mb", "{:,.0f}"),
)
"""The peer table's columns: heading, key of :func:`summarise`, format."""


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the figures over ``runs`` and the exactly-once counts summed."""
    return {
        "runs": len(runs),
        "accepted_per_s": _median(runs, "flood", "accepted_per_s"),
        "delivered_per_s": _median(runs, "flood", "delivered_per_s"),
        "p50_ms": _median(runs, "fixed", "delay_ms", "p50"),
        "p99_ms": _median(runs, "fixed", "delay_ms", "p99"),
        "cpu_us_fixed": _median(runs, "fixed", "cpu_us_per_delivery"),
        "cpu_us_flood": _median(runs, "flood", "cpu_us_per_delivery"),
        "peak_rss_mb": max(_median(runs, phase, "peak_rss_mb") for phase in ("fixed", "flood")),
        "start_s": _median(runs, "start_s"),
        **{
            phase: {c: sum(r[phase][c] for r in runs) for c in COUNTS}
            for phase in ("fixed", "flood")
        },
    }


def _counts(figures: dict[str, Any]) -> str:
    return " / ".join(f"{figures[c]:,}" for c in COUNTS)


def table(report: dict[str, Any]) -> str:
    """The peer table (medians), OctopiS over ActiveMQ, and the exactly-once counts."""
    a = report["args"]
    lines = [
        "# OctopiS beside ActiveMQ Classic",
        "",
        f"{a['subscribers']} subscribers, {a['publishers']} publishers × {a['notifications']} real "
        f"quotes; fixed phase at {a['rate']:g} publications/s, flood phase as fast as accepted; "
        f"medians of {a['runs']} runs, the systems in rotating order; OctopiS in "
        f"{a['mode'].upper()}.",
        "",
        "| shape | system | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]
    for shape, systems in report["shapes"].items():
        for name, s in systems.items():
            cells = [fmt.format(s[key]) for _, key, fmt in COLUMNS]
            lines.append(f"| {shape} | {name} | " + " | ".join(cells) + " |")
        defaults = [
            (n, s) for n, s in systems.items() if n.startswith("OctopiS") and "off" not in n
        ]
        for name, m in systems.items():
            if defaults and name != defaults[0][0]:
                base = defaults[0][1]
                cells = [f"{base[k] / m[k]:.3g}" if m[k] else "–" for _, k, _ in COLUMNS]
                lines.append(f"| {shape} | {defaults[0][0]} / {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Exactly once, summed over the runs "
        "(expected / delivered / duplicated / lost / unexpected):",
        "",
        "| shape | system | fixed phase | flood phase |",
        "|---|---|---|---|",
    ]
    for shape, systems in report["shapes"].items():
        for name, s in systems.items():
            lines.append(f"| {shape} | {name} | {_counts(s['fixed'])} | {_counts(s['flood'])} |")
    return "\n".join(lines) + "\n"


def _progress(shape: str, run: int, name: str, result: dict[str, Any]) -> str:
    flood, fixed = result["flood"], result["fixed"]
    return (
        f"{shape} run {run} {name}: flood {flood['accepted_per_s']:,.0f} pubs/s, "
        f"{flood['delivered_per_s']:,.0f} deliveries/s; fixed p50 {fixed['delay_ms']['p50']:.2f} "
        f"ms, p99 {fixed['delay_ms']['p99']:.2f} ms; exactly once: fixed {_counts(fixed)}, "
        f"flood {_counts(flood)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="OctopiS beside Apache ActiveMQ Classic on the same stock-quote workload "
        "and shapes; writes bench/results/peers.{json,md}.",
    )
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma-separated: single, fig2 (default: both)"
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated: octopis; octopis-plain (retention and covering off); activemq "
        "(brokers linked along every SCOT edge); activemq-tree (along a spanning tree of it; "
        "not on single). Default: all four",
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="alternating runs per system and shape (default 3)"
    )
    parser.add_argument(
        "--seeds",
        help="comma-separated workload seeds, one per run (default 0, 1, …): a seed whose "
        "publishers' symbols hold fewer quotes than --notifications is refused",
    )
    parser.add_argument("--subscribers", type=int, default=200, help="in all (default 200)")
    parser.add_argument("--publishers", type=int, default=10, help="in all (default 10)")
    parser.add_argument("--notifications", type=int, default=250, help="publications per publisher")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="fixed phase: publications/s in all"
    )
    parser.add_argument(
        "--mode", choices=("snr", "dnr", "bid"), default="dnr", help="OctopiS routing"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1000,
        help="publications sent as fast as accepted before the measured phases (JIT and "
        "caches warm; counted, not tabled; default 1000)",
    )
    parser.add_argument("--heap", type=int, default=256, help="ActiveMQ JVM heap per broker, MB")
    parser.add_argument(
        "--quiet",
        type=float,
        default=5.0,
        help="a phase ends after this many seconds without a delivery",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="directory of peers.{json,md} (default bench/results)",
    )
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="JSON",
        help="run nothing: tabulate the runs of an earlier peers.json again into --out",
    )
    args = parser.parse_args(argv)
    if args.source is not None:
        report = json.loads(args.source.read_text())
        return _write(report, args.out)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(shapes) - set(SHAPES)) + sorted(set(systems) - set(SYSTEMS))
    if unknown or args.runs < 1:
        parser.error(
            f"unknown shape(s) or system(s) {unknown}" if unknown else "--runs must be ≥ 1"
        )
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(range(args.runs))
    except ValueError:
        parser.error(f"--seeds must be integers separated by commas, not {args.seeds!r}")
    if len(seeds) != args.runs:
        parser.error(f"--seeds names {len(seeds)} seeds for {args.runs} runs")
    try:
        activemq_jar()
        import stomp  # noqa: F401
    except (PeersError, ImportError) as problem:
        hint = problem if isinstance(problem, PeersError) else INSTALL_HINT.format(jar="stomp.py")
        print(f"bench.peers: {hint}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "shapes": {},
        "runs": [],
    }
    for shape in shapes:
        for run in range(args.runs):
            scot = build_shape(shape)
            workload = generate_workload(
                scot,
                subscribers=args.subscribers,
                publishers=args.publishers,
                notifications=args.notifications,
                seed=seeds[run],
                quotes_from=quotes_dir(),
            )
            order = [
                OctopisSystem(args.mode, plain=name == "octopis-plain")
                if name.startswith("octopis")
                else ActiveMQSystem(args.heap, "tree" if name == "activemq-tree" else "scot")
                for name in systems
                if not (name == "activemq-tree" and shape == "single")  # the same as activemq
            ]
            for system in order[run % len(order) :] + order[: run % len(order)]:
                result = run_system(system, scot, workload, args)
                report["runs"].append(
                    {
                        "shape": shape,
                        "run": run,
                        "seed": seeds[run],
                        "system": system.name,
                        **result,
                    }
                )
                print(_progress(shape, run, system.name, result), flush=True)
    return _write(report, args.out)


def _write(report: dict[str, Any], out: Path) -> int:
    """Summarise the report's runs by shape and system (per-delivery CPU over distinct
    deliveries), write ``peers.json`` and ``peers.md`` under ``out``, print the table."""
    by: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in report["runs"]:
        for phase in ("fixed", "flood"):
            figures = run[phase]
            figures["cpu_us_per_delivery"] = figures["cpu_s"] * 1e6 / max(1, figures["delivered"])
        by.setdefault(run["shape"], {}).setdefault(run["system"], []).append(run)
    report["shapes"] = {
        shape: {name: summarise(runs) for name, runs in systems.items()}
        for shape, systems in by.items()
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.json").write_text(json.dumps(report, indent=1))
    (out / "peers.md").write_text(table(report))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
