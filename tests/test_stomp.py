"""STOMP clients of the brokers (octopis.gateway, DESIGN §13): stomp.py publishers and
subscribers with JMS selectors at several brokers of fig2 (keys on), beside SDK clients;
every message exactly once against an oracle computed from the selectors, its opaque
body unchanged; receipts; logins; bad input refused with an ERROR while the broker serves
everyone else; a durable stomp.py subscriber (``client-individual``) killed and
subscribing again at another broker gets what it had not acknowledged and what it
missed, each once; and on an insecure line, heart-beats that drive liveness."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import networkx as nx
import pytest
import stomp
from conditions import accounting, closing_control, tables_hold, until

from octopis.cli.cluster import format_status
from octopis.client.blocking import BlockingPublisher, BlockingSubscriber
from octopis.client.errors import BrokerError
from octopis.cluster.launcher import LocalCluster, find_free_base_port, prepare_topology
from octopis.filters.language import parse_subscription
from octopis.gateway.credentials import TLS_CERT, TLS_KEY, add_user
from octopis.gateway.headers import publication_of
from octopis.gateway.selector import selects, translate
from octopis.keys import KEYS_ENV, make_keys
from octopis.quotes import read_quote_dir
from octopis.settings import BrokerSettings, Clients, Routing, Stomp
from octopis.topology import (
    PORTS_PER_BROKER,
    STOMP_PORTS,
    Scot,
    build_scot,
    complete_factor,
    with_stomp,
)

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

USER, PASSCODE = "alice", "correct horse battery"
SUBSCRIBERS = [  # broker, selector, ack mode
    ("a:0", "symbol IN ('AAPL', 'MSFT', 'IBM') AND close > 20", "auto"),
    ("f:1", "close BETWEEN 10 AND 30 AND volume > 1000000", "client-individual"),
    ("c:2", "symbol LIKE 'A%' OR NOT (close <= 60)", "client"),
    ("d:0", "symbol = 'MSFT' OR symbol = 'AAPL' OR volume >= 5000000", "auto"),
]
SDK_FILTER = "[class,eq,'STOCK'],[close,>,40]"
STOMP_PUBLISHER, SDK_PUBLISHER, SDK_SUBSCRIBER = "b:1", "e:2", "c:0"
QUOTES = 120
"""Quotes each publisher sends."""


def _endpoint(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def _room(brokers: int) -> int:
    """Brokers' worth of ports the STOMP endpoints of ``brokers`` brokers take."""
    return -(-STOMP_PORTS * brokers // PORTS_PER_BROKER)


def _add_stomp(scot: Scot, path: Path) -> Scot:
    """``scot`` with STOMP endpoints right after its brokers' ports, written to ``path``."""
    first = min(int(b.endpoint.rsplit(":", 1)[1]) for b in scot.brokers.values())
    scot = with_stomp(scot, first + PORTS_PER_BROKER * len(scot.brokers))
    path.write_text(json.dumps(scot.to_json()))
    return scot


@pytest.fixture
def fig2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """fig2 (DNR, keys on, covering off so each table holds every subscription) with
    STOMP listeners and one STOMP login."""
    scot, path = prepare_topology(tmp_path, preset="fig2", room=_room(18))
    scot = _add_stomp(scot, path)
    keys = make_keys(tmp_path / "keys", scot.endpoints_by_broker())
    add_user(keys, USER, PASSCODE)
    settings = BrokerSettings(routing=Routing(covering="off"))
    cluster = LocalCluster(
        scot, path, "dnr", tmp_path, settings, keys=keys, stomp=True, forked=True
    )
    cluster.spawn()
    monkeypatch.setenv(KEYS_ENV, str(keys))
    try:
        asyncio.run(closing_control(cluster, cluster.wait_ready(120)))
        yield cluster
    finally:
        cluster.stop()


class Inbox(stomp.ConnectionListener):
    """What one stomp.py connection received: messages by ``n``, receipts, errors."""

    def __init__(self, conn: stomp.Connection | None = None, ack: str = "auto") -> None:
        self.conn, self.ack = conn, ack
        self.got: Counter[int] = Counter()
        self.bodies: dict[int, str] = {}
        self.receipts: set[str] = set()
        self.errors: list[str] = []
        self.silent: list[str] = []
        """Brokers a receipt named as not answering within the replay budget (on a loaded
        machine it happens; what it delivers is still counted, message by message)."""
        self.lock = threading.Lock()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.got[int(frame.headers["n"])] += 1
            self.bodies[int(frame.headers["n"])] = frame.body
        if self.ack != "auto" and self.conn is not None:
            self.conn.ack(frame.headers["ack"])

    def on_receipt(self, frame: Any) -> None:
        self.receipts.add(frame.headers["receipt-id"])
        if "octopis-silent" in frame.headers:  # brokers that did not answer in time
            self.silent.append(frame.headers["octopis-silent"])
            print(f"receipt {frame.headers['receipt-id']}: silent {self.silent[-1]}")

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame.headers.get("message", ""))


def _connect(
    scot: Scot, broker: str, ack: str = "auto", headers: dict | None = None, **login: str
) -> tuple[Any, Inbox]:
    conn = stomp.Connection12([_endpoint(scot.brokers[broker].stomp_endpoint)])
    inbox = Inbox(conn, ack)
    conn.set_listener("inbox", inbox)
    conn.connect(wait=True, headers=headers or {}, **login)
    return conn, inbox


def _body(n: int) -> str:
    """The opaque body of quote ``n`` (bytes a subscriber gets unchanged)."""
    return f"quote #{n}: \u00e9t\u00e9\nsecond line"


def _wait(check: Any, what: str, timeout: float = 60) -> None:
    asyncio.run(until(check, what, timeout))


def _quotes() -> list[dict]:
    """Real quotes of several symbols, each with a unique ``n``."""
    picked: list[dict] = []
    per_symbol: Counter[str] = Counter()
    for q in read_quote_dir():
        if per_symbol[q["symbol"]] < 6:
            per_symbol[q["symbol"]] += 1
            picked.append(q)
        if len(picked) == 2 * QUOTES:
            break
    return [{**q, "n": i} for i, q in enumerate(picked)]


@pytest.mark.timeout(600)
def test_stomp_and_sdk_clients_get_every_message_once(fig2: LocalCluster) -> None:
    scot = fig2.scot
    login = {"username": USER, "passcode": PASSCODE}
    subscribers = []
    for i, (broker, selector, ack) in enumerate(SUBSCRIBERS):
        conn, inbox = _connect(scot, broker, ack, **login)
        headers = {"selector": selector, "receipt": f"r{i}", "octopis.everywhere": "true"}
        conn.subscribe("/topic/STOCK", id=f"s{i}", ack=ack, headers=headers)
        subscribers.append((conn, inbox, selector))
    sdk_got: Counter[int] = Counter()
    sdk_bodies: dict[int, bytes] = {}
    padres = sum(len(translate(s, "STOCK")) for _, s, _ in SUBSCRIBERS) + 1

    def took(n: Any) -> None:
        sdk_got.update([n.publication["n"]])
        sdk_bodies[n.publication["n"]] = n.body

    reader = BlockingSubscriber.connect(
        SDK_SUBSCRIBER, "sdk-reader", topology=fig2.topology_path, on_notification=took
    )
    assert reader.subscribe(SDK_FILTER, everywhere=True).stream.unconfirmed == ()
    quotes = _quotes()
    stomp_quotes, sdk_quotes = quotes[:QUOTES], quotes[QUOTES:]
    _wait(lambda: all(f"r{i}" in s[1].receipts for i, s in enumerate(subscribers)), "receipts")
    # in place at every broker once the receipts (and subscribe()) said so: no wait
    assert asyncio.run(closing_control(fig2, tables_hold(fig2, padres)))
    live = asyncio.run(closing_control(fig2, fig2.call_all("stats")))
    stomp_at = Counter(broker for broker, _, _ in SUBSCRIBERS)
    assert {b: s["stomp_connections"] for b, s in live.items() if s["stomp_connections"]} == dict(
        stomp_at
    )
    table = format_status(sorted(live), live, {}, detailed=False).splitlines()
    columns = table[0].split()
    rows = {line.split()[0]: line.split() for line in table[1:]}
    for broker, stats in live.items():  # clients as the SDK's: in the same column
        row = rows[broker]
        assert int(row[columns.index("stomp")]) == stomp_at.get(broker, 0)
        assert (
            int(row[columns.index("clients")])
            == stats["client_connections"]
            >= stomp_at.get(broker, 0)
        )

    pub, pub_inbox = _connect(scot, STOMP_PUBLISHER, **login)
    sent = []
    for i, q in enumerate(stomp_quotes):
        if i == QUOTES // 2:  # the brokers of a subscriber and the publisher serve on
            assert_bad_input_refused(scot, STOMP_PUBLISHER)
            assert_bad_input_refused(scot, SUBSCRIBERS[0][0])
        headers = {k: str(v) for k, v in q.items() if k != "class"}
        pub.send("/topic/STOCK", _body(q["n"]), headers={**headers, "receipt": f"p{q['n']}"})
        sent.append(publication_of({"destination": "/topic/STOCK", **headers}))
    _wait(lambda: len(pub_inbox.receipts) == QUOTES, "a receipt for every SEND")

    with BlockingPublisher.connect(SDK_PUBLISHER, "sdk-pub", topology=fig2.topology_path) as p:
        with pytest.raises(BrokerError, match=r"65537 bytes is longer than clients.body_bytes"):
            p.publish(sdk_quotes[0], body=b"x" * 65_537)
        for q in sdk_quotes:
            p.publish(q, body=_body(q["n"]).encode())
    every = sent + sdk_quotes
    assert all(isinstance(p["close"], float) for p in sent)  # typed headers
    expected = {
        selector: {p["n"] for p in every if selects(selector, p)} for _, _, selector in subscribers
    }
    for _, inbox, selector in subscribers:
        _wait(lambda i=inbox, s=selector: set(i.got) >= expected[s], f"{selector!r} complete")
    sdk_expected = {p["n"] for p in every if parse_subscription(SDK_FILTER).matches(p)}
    _wait(lambda: set(sdk_got) >= sdk_expected, "the SDK subscriber complete")
    pub.disconnect()
    for conn, inbox, selector in subscribers:
        counts = accounting(selector, len(expected[selector]), inbox.got)
        assert set(inbox.got) == expected[selector]
        assert counts["duplicates"] == counts["lost"] == 0 and not inbox.errors
        assert inbox.bodies == {n: _body(n) for n in expected[selector]}
        conn.disconnect()
    assert all(expected.values()) and len({frozenset(v) for v in expected.values()}) == 4
    counts = accounting("sdk-reader", len(sdk_expected), sdk_got)
    assert set(sdk_got) == sdk_expected and counts["duplicates"] == 0
    assert sdk_bodies == {n: _body(n).encode() for n in sdk_expected}
    reader.close()
    stats = asyncio.run(closing_control(fig2, fig2.call_all("stats")))
    refused = sum(s.get("counters", {}).get("stomp.logins_refused", 0) for s in stats.values())
    assert refused == 4  # two bad logins at each of two brokers
    asyncio.run(closing_control(fig2, until(lambda: tables_hold(fig2, 0), "all withdrawn", 60)))
    durable_subscriber_killed_and_back(fig2, [{**q, "n": 1000 + q["n"]} for q in quotes])


DURABLE_SELECTOR = "close > 20 OR volume > 1000000"
DURABLE_FIRST, DURABLE_AGAIN = "f:1", "d:0"
"""Where the durable subscriber subscribes first, and again after it was killed."""
KILLED_SUBSCRIBER = """
import sys, threading, stomp
host, port, login, passcode, selector, keep = sys.argv[1:7]
taken = []
class Taker(stomp.ConnectionListener):
    def on_receipt(self, frame):
        print("receipt", frame.headers["receipt-id"], flush=True)
    def on_message(self, frame):
        taken.append(frame.headers["n"])
        if len(taken) <= int(keep):  # the rest stays unacknowledged
            conn.ack(frame.headers["ack"], receipt="ack-" + frame.headers["n"])
        print("got", frame.headers["n"], flush=True)
conn = stomp.Connection12([(host, int(port))])
conn.set_listener("taker", Taker())
conn.connect(login, passcode, wait=True, headers={"client-id": "audit-app"})
conn.subscribe("/topic/STOCK", id="audit", ack="client-individual", headers={
    "selector": selector, "activemq.subscriptionName": "audit", "receipt": "in-place"})
threading.Event().wait()
"""
"""A durable ``client-individual`` subscriber in a process of its own, to be killed: it
acknowledges the first ``keep`` messages it gets and prints what it gets."""


def _publish(scot: Scot, quotes: list[dict]) -> list[dict]:
    """Send ``quotes`` from a stomp.py publisher at the STOMP publisher's broker, each
    confirmed (its receipt); the publications they made."""
    pub, inbox = _connect(scot, STOMP_PUBLISHER, username=USER, passcode=PASSCODE)
    sent = []
    for q in quotes:
        headers = {k: str(v) for k, v in q.items() if k != "class"}
        pub.send("/topic/STOCK", _body(q["n"]), headers={**headers, "receipt": f"p{q['n']}"})
        sent.append(publication_of({"destination": "/topic/STOCK", **headers}))
    _wait(lambda: len(inbox.receipts) == len(quotes), "a receipt for every SEND")
    pub.disconnect()
    return sent


def durable_subscriber_killed_and_back(fig2: LocalCluster, quotes: list[dict]) -> None:
    """A durable subscriber takes part of what it gets, is killed (``kill -9``), misses
    more, and subscribes again at another broker: what it had not acknowledged and what
    it missed come, each once, then live messages."""
    scot = fig2.scot
    padres = len(translate(DURABLE_SELECTOR, "STOCK"))
    host, port = _endpoint(scot.brokers[DURABLE_FIRST].stomp_endpoint)
    first, away, live = quotes[:40], quotes[40:80], quotes[80:120]
    selected = [p["n"] for p in first if selects(DURABLE_SELECTOR, {**p, "class": "STOCK"})]
    keep = len(selected) // 2
    args = [host, str(port), USER, PASSCODE, DURABLE_SELECTOR, str(keep)]
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_SUBSCRIBER, *args], stdout=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    printed = (line.strip() for line in killed.stdout or ())
    reading = threading.Thread(target=lambda: lines.extend(printed), daemon=True)
    reading.start()
    try:
        _wait(lambda: "receipt in-place" in lines, "the durable subscription in place")
        asyncio.run(closing_control(fig2, until(lambda: tables_hold(fig2, padres), "spread", 60)))
        sent = _publish(scot, first)
        assert [p["n"] for p in sent if selects(DURABLE_SELECTOR, p)] == selected
        _wait(lambda: {f"got {n}" for n in selected} <= set(lines), "the first part delivered")
        taken = [int(line.split()[1]) for line in lines if line.startswith("got ")]
        acked = taken[:keep]
        _wait(lambda: {f"receipt ack-{n}" for n in acked} <= set(lines), "acks answered")
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
    assert sorted(taken) == sorted(selected) and keep > 0 and len(selected) > keep
    asyncio.run(closing_control(fig2, until(lambda: tables_hold(fig2, 0), "withdrawn", 60)))
    sent = _publish(scot, away)  # while the subscriber is away

    login = {"username": USER, "passcode": PASSCODE}
    conn, inbox = _connect(
        scot, DURABLE_AGAIN, "client-individual", {"client-id": "audit-app"}, **login
    )
    headers = {"selector": DURABLE_SELECTOR, "activemq.subscriptionName": "audit"}
    conn.subscribe(
        "/topic/STOCK", id="audit", ack="client-individual", headers={**headers, "receipt": "r"}
    )
    _wait(lambda: "r" in inbox.receipts, "the durable subscription in place again")
    asyncio.run(closing_control(fig2, until(lambda: tables_hold(fig2, padres), "spread", 60)))
    sent += _publish(scot, live)
    owed = set(selected) - set(acked)
    expected = owed | {p["n"] for p in sent if selects(DURABLE_SELECTOR, p)}
    _wait(lambda: set(inbox.got) >= expected, "the durable subscriber complete")
    counts = accounting("durable", len(expected), inbox.got)
    assert set(inbox.got) == expected and owed and set(acked).isdisjoint(inbox.got)
    assert counts["duplicates"] == counts["lost"] == 0 and not inbox.errors
    assert inbox.bodies == {n: _body(n) for n in expected}  # replayed bodies too
    conn.unsubscribe("audit", headers={"receipt": "ended"})
    _wait(lambda: "ended" in inbox.receipts, "the durable subscription ended")
    conn.disconnect()


def _raw(scot: Scot, broker: str, data: bytes) -> bytes:
    """Send ``data`` on a fresh TCP connection and read until the broker closes it."""
    with socket.create_connection(_endpoint(scot.brokers[broker].stomp_endpoint), 10) as s:
        s.sendall(data)
        s.settimeout(10)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


BAD_INPUT = [
    (b"CONNECT\naccept-version:1.2\n\n\0", b"message:this broker needs login and passcode"),
    (b"CONNECT\naccept-version:1.2\nlogin:alice\npasscode:nope\n\n\0", b"login refused"),
    (b"SEND\ndestination:/topic/X\n\n\0", b"expected CONNECT or STOMP as the first frame"),
    (b"HELLO\n\n\0", b"unknown command 'HELLO'"),
    (
        b"CONNECT\nlogin:alice\npasscode:correct horse battery\n\n\0SUBSCRIBE\nid:1\n"
        b"destination:/topic/STOCK\nselector:symbol LIKE '%A%B'\n\n\0",
        b"no exact form",
    ),
    (
        b"CONNECT\nlogin:alice\npasscode:correct horse battery\n\n\0SEND\n"
        + b"h:"
        + b"x" * 9000
        + b"\n\n\0",
        b"frame headers over 8192 bytes",
    ),
]
"""Bad input and the words its ERROR frame must carry."""


def assert_bad_input_refused(scot: Scot, broker: str) -> None:
    """Each of :data:`BAD_INPUT` gets an ERROR naming the problem and a close."""
    for data, problem in BAD_INPUT:
        answer = _raw(scot, broker, data)
        assert b"ERROR\n" in answer and problem in answer, (data[:60], answer[:300])


@pytest.fixture
def line(tmp_path: Path) -> Iterator[LocalCluster]:
    """The line a:0 – b:0 – c:0 (SNR, insecure) with STOMP listeners, heart-beats of
    0.5 s offered and a client timeout of 0.5 s."""
    scot = build_scot(
        nx.path_graph(["a", "b", "c"]),
        complete_factor(1),
        name="line",
        base_port=find_free_base_port(3 + _room(3)),
    )
    path = tmp_path / "line.json"
    scot = _add_stomp(scot, path)
    settings = BrokerSettings(
        stomp=Stomp(heartbeat=500), clients=Clients(timeout=0.5), routing=Routing(covering="off")
    )
    cluster = LocalCluster(
        scot, path, "snr", tmp_path, settings, secure=False, stomp=True, forked=True
    )
    cluster.spawn()
    try:
        asyncio.run(closing_control(cluster, cluster.wait_ready(60)))
        yield cluster
    finally:
        cluster.stop()


def _frames(data: bytes) -> list[bytes]:
    return [f.lstrip(b"\r\n") for f in data.split(b"\0") if f.strip(b"\r\n")]


async def _insecure_line(cluster: LocalCluster) -> None:
    scot = cluster.scot
    a, c = scot.brokers["a:0"], scot.brokers["c:0"]
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(a.stomp_ws_endpoint, protocols=("v12.stomp",))
    assert ws.protocol == "v12.stomp"
    await ws.send_str("CONNECT\naccept-version:1.2\nhost:line\n\n\0")  # no login: insecure
    assert (await ws.receive_str()).startswith("CONNECTED\nversion:1.2\n")
    await ws.send_str(
        "SUBSCRIBE\nid:w\ndestination:/topic/T\nselector:k > 2 AND s LIKE 'x%'\nreceipt:1\n\n\0"
    )
    assert "receipt-id:1" in await ws.receive_str()
    # a client that negotiated heart-beats and falls silent, and one that negotiated none
    beating = await asyncio.open_connection(*_endpoint(c.stomp_endpoint))
    idle = await asyncio.open_connection(*_endpoint(c.stomp_endpoint))
    for (_, writer), beat in ((beating, "500,500"), (idle, "0,0")):
        writer.write(
            f"CONNECT\naccept-version:1.2\nheart-beat:{beat}\n\n\0"
            "SUBSCRIBE\nid:1\ndestination:/topic/T\n\n\0".encode()
        )
    await until(lambda: tables_hold(cluster, 3), "three subscriptions in every table", 30)
    reader, _ = beating
    heard = await asyncio.wait_for(reader.read(), 30)  # until the broker closes it
    frames = _frames(heard)
    assert frames[0].startswith(b"CONNECTED") and b"heart-beat:500,500" in frames[0]
    assert frames[-1].startswith(b"ERROR") and b"no heart-beat for 1000 ms" in frames[-1]
    assert b"\0\n" in heard  # the broker's own heart-beats came meanwhile
    await until(lambda: tables_hold(cluster, 2), "the silent client's subscription withdrawn", 30)
    # the idle one, silent longer than clients.timeout, is kept alive by its open connection
    pub_reader, pub = await asyncio.open_connection(*_endpoint(c.stomp_endpoint))
    pub.write(b"CONNECT\naccept-version:1.2\n\n\0")
    for n, (k, s) in enumerate([(3, "xa"), (1, "xb"), (5, "yb"), (7, "x")]):
        pub.write(f"SEND\ndestination:/topic/T\nn:{n}\nk:{k}\ns:{s}\nreceipt:{n}\n\n\0".encode())
    receipts = await asyncio.wait_for(pub_reader.readuntil(b"receipt-id:3\n"), 10)
    assert receipts.count(b"RECEIPT") == 4
    got: list[bytes] = []
    while len(got) < 2:
        got += [f for f in _frames((await ws.receive_str()).encode()) if f.startswith(b"MESSAGE")]
    assert [b"n:0" in got[0], b"n:3" in got[1]] == [True, True]
    assert await asyncio.wait_for(idle[0].readuntil(b"n:3"), 10)
    await ws.send_str("UNSUBSCRIBE\nid:w\nreceipt:bye\n\n\0")
    assert "receipt-id:bye" in await ws.receive_str()
    await until(
        lambda: tables_hold(cluster, 1), "the WebSocket client's subscription withdrawn", 30
    )
    await ws.close()
    await session.close()
    for writer in (pub, idle[1]):
        writer.close()


def test_insecure_line_websocket_and_heart_beats(line: LocalCluster) -> None:
    asyncio.run(closing_control(line, _insecure_line(line)))


PAGE = Path(__file__).resolve().parent / "stomp-js" / "page.html"
PAGE_SELECTOR = "symbol IN ('AAPL', 'AMAT', 'ADBE') AND close > 15"


@pytest.mark.browser
def test_a_web_page_shows_live_notifications(line: LocalCluster) -> None:
    """tests/stomp-js/page.html (@stomp/stompjs from npm) in headless Chromium subscribes
    at a:0 over WebSocket with a selector; stomp.py publishes at c:0; the page shows each
    selected quote once."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from test_monitor import _browser

    if not (PAGE.parent / "node_modules" / "@stomp" / "stompjs").is_dir():
        pytest.fail("tests/stomp-js/node_modules is missing: run .ci/setup")
    scot = line.scot
    url = scot.brokers["a:0"].stomp_ws_endpoint
    query = urllib.parse.urlencode({"url": url, "selector": PAGE_SELECTOR})
    quotes = _quotes()[:60]
    driver = _browser()
    try:
        driver.get(f"{PAGE.as_uri()}?{query}")
        wait = WebDriverWait(driver, 60, poll_frequency=0.1)
        wait.until(lambda d: d.find_element(By.ID, "state").text == "subscribed")
        padres = len(translate(PAGE_SELECTOR, "STOCK"))
        asyncio.run(closing_control(line, until(lambda: tables_hold(line, padres), "spread", 30)))
        pub, inbox = _connect(scot, "c:0")
        sent = []
        for q in quotes:
            headers = {k: str(v) for k, v in q.items() if k != "class"}
            pub.send("/topic/STOCK", "", headers={**headers, "receipt": f"p{q['n']}"})
            sent.append(publication_of({"destination": "/topic/STOCK", **headers}))
        _wait(lambda: len(inbox.receipts) == len(quotes), "every SEND confirmed")
        expected = [p["n"] for p in sent if selects(PAGE_SELECTOR, p)]
        assert expected

        def shown(d: Any) -> list[int]:
            return [int(e.get_attribute("data-n")) for e in d.find_elements(By.TAG_NAME, "li")]

        wait.until(lambda d: len(shown(d)) >= len(expected))
        got = Counter(shown(driver))
        counts = accounting("page", len(expected), got)
        assert sorted(got) == expected and counts["duplicates"] == 0
        texts = [e.text for e in driver.find_elements(By.TAG_NAME, "li")]
        assert all(
            t.split()[0] in ("AAPL", "AMAT", "ADBE") and float(t.split()[1]) > 15 for t in texts
        )
        pub.disconnect()
    finally:
        driver.quit()


@pytest.fixture
def one_tls(tmp_path: Path) -> Iterator[LocalCluster]:
    """One broker with keys, a STOMP login and a self-signed TLS certificate for 127.0.0.1
    in its keys directory."""
    scot = build_scot(
        nx.path_graph(["a"]), complete_factor(1), name="one", base_port=find_free_base_port(2)
    )
    path = tmp_path / "one.json"
    scot = _add_stomp(scot, path)
    keys = make_keys(tmp_path / "keys", scot.endpoints_by_broker())
    add_user(keys, USER, PASSCODE)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(keys / TLS_KEY),
            "-out",
            str(keys / TLS_CERT),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    (keys / TLS_KEY).chmod(0o600)
    cluster = LocalCluster(
        scot, path, "snr", tmp_path, BrokerSettings(), keys=keys, stomp=True, forked=True
    )
    cluster.spawn()
    try:
        asyncio.run(closing_control(cluster, cluster.wait_ready(60)))
        yield cluster
    finally:
        cluster.stop()


def test_tls_on_tcp_and_websocket(one_tls: LocalCluster) -> None:
    broker = one_tls.scot.brokers["a:0"]
    cert = one_tls.keys_dir / TLS_CERT
    host, port = _endpoint(broker.stomp_endpoint)
    conn = stomp.Connection12([(host, port)])
    conn.set_ssl(for_hosts=[(host, port)], ca_certs=str(cert))
    inbox = Inbox(conn)
    conn.set_listener("inbox", inbox)
    conn.connect(USER, PASSCODE, wait=True)
    conn.subscribe("/topic/T", id="t", headers={"selector": "n > 1", "receipt": "in"})
    _wait(lambda: "in" in inbox.receipts, "the subscription's receipt over TLS")
    for n in range(4):
        conn.send("/topic/T", "", headers={"n": str(n), "receipt": f"p{n}"})
    _wait(lambda: set(inbox.got) == {2, 3} and len(inbox.receipts) == 5, "deliveries over TLS")
    conn.disconnect()
    assert b"CONNECTED" not in _raw_quietly(host, port, b"CONNECT\naccept-version:1.2\n\n\0")

    async def over_wss() -> str:
        context = ssl.create_default_context(cafile=str(cert))
        url = broker.stomp_ws_endpoint.replace("ws://", "wss://")
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(url, protocols=("v12.stomp",), ssl=context)
            await ws.send_str(
                f"CONNECT\naccept-version:1.2\nlogin:{USER}\npasscode:{PASSCODE}\n\n\0"
            )
            answer = await ws.receive_str()
            await ws.close()
            return answer

    assert asyncio.run(over_wss()).startswith("CONNECTED\nversion:1.2\n")


def _raw_quietly(host: str, port: int, data: bytes) -> bytes:
    """What a plain-text client gets from a TLS listener (until it closes)."""
    with socket.create_connection((host, port), 10) as s:
        s.sendall(data)
        s.settimeout(10)
        out = b""
        with contextlib.suppress(ConnectionError):
            while chunk := s.recv(65536):
                out += chunk
    return out
