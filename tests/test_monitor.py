"""``octopis monitor`` on a running paper75 (75 brokers, 5 clusters × 15 regions, DNR) in
a real browser (Debian's headless Chromium through Selenium) 1,500 pixels wide: every
region and broker inside the window, no two iCOLs of a region on top of each other; a
burst into the capacity-limited iCOL i:0 → i:1 shows that link overloaded, DNR cases at
i:0 as they happen and i:0's retention; the table has the overlay's totals on top, the
busiest brokers first, and sorts by a column on a click. Its screenshot is the docs'
picture: ``OCTOPIS_SCREENSHOT=docs/monitor.png pytest tests/test_monitor.py`` writes it
there, and the 900-pixel one beside it as ``monitor-900.png`` (otherwise they go to the
run directory and the tracked pictures are left alone). With a publisher running, the
page draws each link as wide as the brokers' own counters say it carries, marks the
brokers that host clients, shows each one's matching delay and recent output, filters its
table, and at 900 pixels draws the regions as rows, readable and uncut; a viewer that
leaves leaves no traceback. Also the monitor's JSON views, its bad input, and how it
turns counters into totals and events (no process)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conditions import accounting, until
from prometheus_client.parser import text_string_to_metric_families

from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster, find_free_base_port, prepare_topology
from octopis.monitor import ROUTING_EVENTS, Monitor, overlay_totals
from octopis.settings import BrokerSettings, Links
from octopis.topology import Scot, build_preset

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
"""The picture of the monitor in the docs, taken by the browser test."""
WIDTH, NARROW = 1500, 900
"""The browser window's widths in pixels: a desktop's, and a laptop's half screen."""
READABLE = 9
"""Pixels a broker's label is high at least, at any window width."""
PUBLISHER, READERS = "i:0", ("i:1", "i:2")
SLOW_LINK = ("i:0", "i:1")
"""The iCOL that congests: i:0 → i:1 carries 30 messages/s; DNR sends round it (Case I
through i:2 while i:0 → i:2 is free, Case III when both are loaded)."""
LINK_ID = f"link-{min(SLOW_LINK)}-{max(SLOW_LINK)}"

pytestmark = pytest.mark.timeout(300)
HEAVY = pytest.mark.xdist_group("heavy")
"""The paper75 tests share one overlay and one monitor, on the worker of the 75-process
runs (``--dist loadgroup``)."""


@pytest.fixture(scope="module")
def paper75(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """paper75 in DNR with the slow link; heartbeats at 0.5 s (on 75 idle brokers the
    default's cost half a core) and without CurveZMQ (75 encrypting brokers starve this
    2-core machine; the monitor reads only the metrics endpoints, which need no keys)."""
    run_dir = tmp_path_factory.mktemp("monitor75")
    scot, path = prepare_topology(run_dir, preset="paper75")
    settings = BrokerSettings(
        links=Links(
            heartbeat=0.5, down_after=2.5, capacities={f"{SLOW_LINK[0]}>{SLOW_LINK[1]}": 30}
        )
    )
    cluster = LocalCluster(scot, path, "dnr", run_dir, settings, secure=False, forked=True)
    cluster.spawn()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def monitor(paper75: LocalCluster) -> Iterator[str]:
    """``octopis monitor`` of the running paper75 as its own process, logging at INFO to
    ``monitor.log`` in the run directory; yields its URL."""
    port = find_free_base_port(1)
    options = ["--topology", str(paper75.topology_path), "--port", str(port)]
    command = [sys.executable, "-m", "octopis.cli.main", "--log-level", "INFO", "monitor"]
    with open(paper75.run_dir / "monitor.log", "w") as log:
        process = subprocess.Popen(
            [*command, *options, "--interval", "0.5"], stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        asyncio.run(until(lambda: _answers(url + "topology"), "monitor up", 30))
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def _get_json(url: str) -> dict:
    """A JSON answer of the monitor (30 s: at paper75 on a loaded CI run its /topology
    took more than 5 s while it scraped 75 brokers)."""
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _all_up(url: str) -> bool:
    """Every broker answers the monitor and every link is up (the overlay is ready)."""
    totals = _get_json(url + "snapshot")["totals"]
    return totals["brokers_up"] == 75 and totals["links"]["up"] == 220


def _browser(width: int = WIDTH):  # -> selenium WebDriver
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("OCTOPIS_REQUIRE_BROWSER"):
            pytest.fail("chromium/chromedriver missing although CI installs them (.ci/setup)")
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--window-size={width},1000",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


PLACES = """
const box = e => {
  const r = e.getBoundingClientRect();
  return [r.left, r.right, r.top, r.bottom];
};
const all = selector => [...document.querySelectorAll(selector)];
return {
  width: document.documentElement.clientWidth,
  scroll: document.documentElement.scrollWidth,
  regions: all("text.region").map(e => [e.textContent, ...box(e)]),
  brokers: all("g.broker").map(e => [e.id.slice(7), ...box(e.querySelector("circle"))]),
};
"""
"""Where the page put each region's label and each broker's circle, in window pixels."""

SHARED_STRETCHES = """
// Pairs of one region's iCOLs that run on top of each other: sampled every 2 units, a
// point of one path within 1.5 units of the other outside the brokers' circles is shared;
// more than 3 shared points in a pair is a common stretch (a crossing shares 1 or 2).
const centres = [...document.querySelectorAll("g.broker circle")]
  .map(c => ["cx", "cy", "r"].map(name => +c.getAttribute(name)));
const inside = ([x, y]) => centres.some(([cx, cy, r]) => Math.hypot(x - cx, y - cy) < r + 3);
const points = (path, step) => {
  const out = [], length = path.getTotalLength();
  for (let s = 0; s <= length; s += step) {
    const p = path.getPointAtLength(s);
    out.push([p.x, p.y]);
  }
  return out;
};
const near = (x, y, line) => line.some(([u, v]) => Math.hypot(x - u, y - v) < 1.5);
const byRegion = {};
document.querySelectorAll("path.icol").forEach(p => (byRegion[p.dataset.region] ||= []).push(p));
const shared = [];
let pairs = 0;
for (const paths of Object.values(byRegion)) {
  const coarse = paths.map(p => points(p, 2).filter(q => !inside(q)));
  const fine = paths.map(p => points(p, 1));
  for (let i = 0; i < paths.length; i++) for (let j = i + 1; j < paths.length; j++) {
    pairs++;
    const n = coarse[i].filter(([x, y]) => near(x, y, fine[j])).length;
    if (n > 3) shared.push([paths[i].id, paths[j].id, n]);
  }
}
return {pairs, shared};
"""

SHOWN = """
const [linkId, broker] = arguments;
const link = document.getElementById(linkId);
const halo = document.getElementById(`halo-${broker}`);
const events = [...document.querySelectorAll(`#events li[data-broker="${broker}"]`)];
return [
  link.getAttribute("data-state"),
  getComputedStyle(link).stroke,
  halo.classList.contains("on"),
  events.map(e => e.dataset.event),
  [...document.querySelectorAll('#brokers tbody td[data-key="output"]')].map(td => td.textContent),
];
"""
"""The slow link's state and colour, whether ``broker`` is ringed, the routing events the
feed lists at it and the rows' outputs: read in one script (an overload may pass
between two reads)."""

KEPT_HEADING = '#columns th[data-key="kept"]'
"""The heading that sorts the brokers by what they keep."""

TABLE = """
const cells = row => Object.fromEntries(
  [...row.querySelectorAll("td")].map(td => [td.dataset.key, td.textContent]));
return {
  totals: cells(document.getElementById("total-row")),
  rows: [...document.querySelectorAll("#brokers tbody tr")].map(cells),
  sorted: document.querySelector("#columns th[aria-sort]").dataset.key,
};
"""
"""The table's cells by column: the totals row, the brokers' rows in the page's order,
and the column it is sorted by."""


async def _clients(
    scot: Scot,
    monitor: str,
    publisher: str,
    readers: tuple[str, ...],
    kind: str,
    got: Counter[tuple[str, int]],
) -> tuple[list[Subscriber], Publisher]:
    """A subscriber to ``[class,eq,KIND]`` at each broker of ``readers`` (each
    notification counted in ``got`` by broker and seq) and a publisher at ``publisher``,
    once the monitor shows every subscription in ``publisher``'s table."""
    subscribers = [
        await Subscriber.connect(
            scot.client_endpoints(b),
            f"{kind}-{b}",
            on_notification=lambda n, b=b: got.update([(b, n.seq)]),
        )
        for b in readers
    ]
    for subscriber in subscribers:
        await subscriber.subscribe(f"[class,eq,'{kind}']")
    pub = await Publisher.connect(scot.client_endpoints(publisher), f"{kind}-pub")
    await until(
        # a broker whose last scrape did not answer in time has no table in the snapshot yet
        lambda: (
            _get_json(monitor + "snapshot")["brokers"][publisher].get("table", 0) >= len(readers)
        ),
        f"every subscription at {publisher}",
        30,
    )
    return subscribers, pub


def _overload_shown(driver) -> str | bool:  # driver: selenium WebDriver
    """The slow link's colour once the page shows it overloaded, the publisher's host
    ringed, DNR cases at that host in the feed and the output of the three brokers the burst
    goes through measured (their load windows have two samples); False until then."""
    state, colour, ringed, events, outputs = driver.execute_script(SHOWN, LINK_ID, PUBLISHER)
    dnr_case = sum(event.startswith("dnr_case") for event in events) >= 2
    busy = sum(_number(output) > 0 for output in outputs) >= 1 + len(READERS)
    return colour if state == "overloaded" and ringed and dnr_case and busy else False


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text not in ("–", "") else float("-inf")


@HEAVY
@pytest.mark.browser
def test_the_page_fits_paper75_and_shows_an_overload_dnr_cases_and_retention(
    paper75: LocalCluster, monitor: str
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    scot = paper75.scot
    got: Counter[tuple[str, int]] = Counter()
    started = time.monotonic()
    driver = _browser()
    try:
        driver.get(monitor)
        wait = WebDriverWait(driver, 60, poll_frequency=0.1)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "path.link")) == 220)
        assert len(driver.find_elements(By.CSS_SELECTOR, "g.broker")) == 75
        assert len(driver.find_elements(By.CSS_SELECTOR, "path.icol")) == 150

        places = driver.execute_script(PLACES)
        assert places["width"] <= WIDTH and places["scroll"] <= places["width"], places
        regions = places["regions"]
        assert [r[0] for r in regions] == _get_json(monitor + "topology")["regions"]
        assert len(regions) == 15
        for name, left, right, *_ in regions + places["brokers"]:
            assert left >= 0 and right <= places["width"], (name, left, right, places["width"])
        lefts = [r[1] for r in regions]
        assert lefts == sorted(lefts) and len(set(lefts)) == 15  # one column each, in order
        column = {r[0]: (r[1] + r[2]) / 2 for r in regions}
        rows: dict[int, list[float]] = {}
        for broker_id, left, right, top, bottom in places["brokers"]:
            assert abs((left + right) / 2 - column[scot.brokers[broker_id].region]) < 2
            rows.setdefault(scot.brokers[broker_id].cluster, []).append((top + bottom) / 2)
        centres = [sum(ys) / len(ys) for _, ys in sorted(rows.items())]
        assert all(max(ys) - min(ys) < 2 for ys in rows.values())
        assert centres == sorted(centres) and len(rows) == 5  # one row per cluster

        stretches = driver.execute_script(SHARED_STRETCHES)
        assert stretches["pairs"] == 15 * 45 and stretches["shared"] == [], stretches

        asyncio.run(until(lambda: _all_up(monitor), "every broker and link up", 90))
        wait.until(lambda d: d.find_element(By.ID, "total-row").text.startswith("overlay 75/75"))
        print(f"paper75 ready and drawn in {time.monotonic() - started:.1f} s")

        async def burst() -> int:
            readers, pub = await _clients(scot, monitor, PUBLISHER, READERS, "STOCK", got)
            seen = asyncio.create_task(asyncio.to_thread(wait.until, _overload_shown))
            published = 0
            while not seen.done():  # 60/s into a 30/s iCOL until the page shows it all
                await asyncio.gather(
                    *[pub.publish({"class": "STOCK", "price": 1.0}, wait=False) for _ in range(30)]
                )
                published += 30
                await asyncio.wait({seen}, timeout=0.5)
            colour = await seen
            screenshot = Path(os.environ.get("OCTOPIS_SCREENSHOT") or paper75.run_dir / "shot.png")
            driver.save_screenshot(str(screenshot))
            assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            calm = driver.execute_script(
                "return getComputedStyle(document.getElementById(arguments[0])).stroke;",
                f"link-{min(READERS)}-{max(READERS)}",
            )
            assert colour != calm, (colour, calm)
            await until(lambda: len(got) >= 2 * published, "every notification to both", 60)
            await pub.close()
            for reader in readers:
                await reader.close()
            return published

        published = asyncio.run(burst())
        print(f"overload, DNR cases and screenshot {time.monotonic() - started:.1f} s in")

        def table_shows_the_burst(d) -> dict | bool:  # -> the table, once it shows it
            table = d.execute_script(TABLE)
            by_id = {row["id"]: row for row in table["rows"]}
            kept = _number(by_id[PUBLISHER]["kept"])
            return kept >= published and _number(table["totals"]["kept"]) >= kept and table

        table = wait.until(table_shows_the_burst)
        assert table["sorted"] == "output"
        oldest = next(row["oldest"] for row in table["rows"] if row["id"] == PUBLISHER)
        assert oldest.endswith((" s", " min")), oldest  # the age of its oldest publication
        outputs = [_number(row["output"]) for row in table["rows"]]
        assert outputs == sorted(outputs, reverse=True)  # the busiest first
        assert outputs[0] > 0 and table["rows"][0]["id"] in (PUBLISHER, *READERS), table["rows"][:3]
        assert table["totals"]["up"] == "75/75" and _number(table["totals"]["dnr"]) > 0
        assert _number(table["totals"]["output"]) >= outputs[0]

        # a click on the heading itself: a pointer click lands where the heading was when
        # its place was read, and a redraw between (the numbers widen the columns) can put
        # the "bytes" heading there instead (a soak run clicked it)
        driver.execute_script(f"document.querySelector('{KEPT_HEADING}').click();")
        by_kept = driver.execute_script(TABLE)
        assert by_kept["sorted"] == "kept" and by_kept["rows"][0]["id"] == PUBLISHER
        assert all(_number(row["kept"]) == 0 for row in by_kept["rows"][1:])
    finally:
        driver.quit()
    for reader in READERS:
        counts = accounting(
            reader, published, Counter({s: n for (b, s), n in got.items() if b == reader})
        )
        assert counts["lost"] == counts["duplicates"] == 0
    print(f"test body {time.monotonic() - started:.1f} s")


TRAFFIC = """
const legend = Object.fromEntries([...document.querySelectorAll("#rate-legend [data-rate-class]")]
  .map(e => [e.dataset.rateClass, +e.dataset.width]));
return {
  legend,
  links: Object.fromEntries([...document.querySelectorAll("path.link")].map(p => [p.id.slice(5), [
    +p.dataset.rate, +p.dataset.rateClass, parseFloat(getComputedStyle(p).strokeWidth)]])),
  hosts: [...document.querySelectorAll("g.broker.hosts")].map(g => g.id.slice(7)),
  rows: Object.fromEntries([...document.querySelectorAll("#brokers tbody tr")].map(tr => [
    tr.dataset.broker, {
      delay: tr.querySelector('td[data-key="delay"]').textContent,
      points: (tr.querySelector('td[data-key="history"] polyline')?.getAttribute("points") || "")
        .split(" ").filter(Boolean).map(xy => +xy.split(",")[1]),
      shown: !tr.classList.contains("hidden"),
    }])),
};
"""
"""What the page draws: each link's rate (copies/s), rate class and drawn width by id
(``a-b``), the legend's width of each class, the brokers marked as hosting clients, and
each table row's matching delay, sparkline heights and whether the filter shows it."""

FITS = """
const box = e => e.getBoundingClientRect();
const table = document.getElementById("table-box");
return {
  width: document.documentElement.clientWidth,
  scroll: document.documentElement.scrollWidth,
  labels: [...document.querySelectorAll("g.broker text.label")].map(e => box(e).height),
  brokers: [...document.querySelectorAll("g.broker circle")].map(e => [box(e).left, box(e).right]),
  table: [table.scrollWidth, table.clientWidth],
  transposed: [...document.querySelectorAll("text.region")].map(e => box(e).top),
};
"""
"""How the page fits the window: its width and scroll width, each broker label's height,
each broker's left and right edge, the table's scroll and client width, and the regions'
label tops (rows: increasing)."""

TRAFFIC_PUBLISHER, TRAFFIC_READERS = "x:2", ("iii:3", "xv:1")
RATE_BOUNDS = (0, 1, 10, 100, 1000, float("inf"))
"""The page's link-width classes: the first bound a link's copies/s is below (0: idle)."""


def _brokers_own_counts(scot: Scot) -> tuple[dict[str, float], set[str]]:
    """Every link's copies/s (both directions, from each sender's own
    ``octopis_link_copies_out_per_second``) by ``a-b`` id, and the brokers with a client
    connection open, read from the brokers' metrics endpoints."""
    rates: Counter[str] = Counter()
    hosts = set()
    for broker_id, info in scot.brokers.items():
        with urllib.request.urlopen(info.metrics_endpoint, timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "octopis_link_copies_out_per_second":
                    other = sample.labels["link"]
                    rates[f"{min(broker_id, other)}-{max(broker_id, other)}"] += sample.value
                elif sample.name == "octopis_client_connections" and sample.value > 0:
                    hosts.add(broker_id)
    return dict(rates), hosts


def _rate_class(copies: float) -> int:
    return next(i for i, bound in enumerate(RATE_BOUNDS) if copies < bound) if copies > 0 else 0


def _drawn_as_counted(driver, scot: Scot) -> dict | bool:  # driver: selenium WebDriver
    """The page's drawing once it follows the brokers' counts: the links it draws busy are
    those the brokers count copies on, each within a fifth of their rate and in their
    rate's class (a class drawn at the legend's width), and the brokers it marks as hosting
    clients are those with a client connection; False until then."""
    page = driver.execute_script(TRAFFIC)
    rates, hosts = _brokers_own_counts(scot)
    busy = {link for link, rate in rates.items() if rate > 0}
    drawn = {link for link, (rate, _, _) in page["links"].items() if rate > 0}
    if drawn != busy or set(page["hosts"]) != hosts or not busy:
        return False
    for link, (rate, level, width) in page["links"].items():
        assert width == page["legend"][str(level)], (link, width, page["legend"])
        if link in busy and (
            abs(rate - rates[link]) > max(0.2 * rates[link], 0.5) or level != _rate_class(rate)
        ):
            return False
    return {**page, "counted": rates}


def _type_filter(driver, text: str) -> None:  # driver: selenium WebDriver
    """Empty the table's filter, then type ``text`` into it."""
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "filter")
    driver.execute_script(
        "arguments[0].value = ''; arguments[0].dispatchEvent(new Event('input'));", box
    )
    if text:
        box.send_keys(text)


@HEAVY
@pytest.mark.browser
def test_the_page_draws_the_traffic_the_brokers_count(paper75: LocalCluster, monitor: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    scot = paper75.scot
    got: Counter[tuple[str, int]] = Counter()
    driver = _browser()
    try:
        driver.get(monitor)
        wait = WebDriverWait(driver, 90, poll_frequency=0.5)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "path.link")) == 220)
        asyncio.run(until(lambda: _all_up(monitor), "every broker and link up", 90))

        async def traffic() -> tuple[int, dict]:
            readers, pub = await _clients(
                scot, monitor, TRAFFIC_PUBLISHER, TRAFFIC_READERS, "TRADE", got
            )
            drawn = asyncio.create_task(
                asyncio.to_thread(wait.until, lambda d: _drawn_as_counted(d, scot))
            )
            published = 0
            while not drawn.done():  # 40 a second, steadily, until the page follows
                await pub.publish({"class": "TRADE", "price": 2.0}, wait=False)
                published += 1
                await asyncio.sleep(0.025)
            page = await drawn
            await until(lambda: len(got) >= 2 * published, "every notification to both", 60)
            await pub.close()
            for reader in readers:
                await reader.close()
            return published, page

        published, page = asyncio.run(traffic())
        busy = sorted(link for link, (rate, _, _) in page["links"].items() if rate > 0)
        print(f"{len(busy)} links drawn busy as counted: {busy}")
        assert {TRAFFIC_PUBLISHER, *TRAFFIC_READERS} <= set(page["hosts"])
        assert any(TRAFFIC_PUBLISHER in link for link in busy)
        assert all(page["links"][link][2] > page["legend"]["0"] for link in busy)  # wider
        row = page["rows"][TRAFFIC_PUBLISHER]
        assert float(row["delay"]) > 0, row  # its mean matching time, in µs
        assert len(row["points"]) >= 2 and len(set(row["points"])) > 1, row  # it rose

        _type_filter(driver, "x:")
        shown = lambda d: set(  # noqa: E731  the rows the filter shows, read at once
            d.execute_script(
                "return [...document.querySelectorAll('#brokers tbody tr:not(.hidden)')]"
                ".map(tr => tr.dataset.broker);"
            )
        )
        wait.until(lambda d: shown(d) == {f"x:{k}" for k in range(5)})
        _type_filter(driver, "vi:2")
        wait.until(lambda d: shown(d) == {"vi:2"})
        driver.set_window_size(NARROW, 1000)

        def as_rows(d) -> bool:  # the regions drawn one under another
            tops = d.execute_script(FITS)["transposed"]
            return tops == sorted(tops) and len(set(tops)) == len(tops) == 15

        wait.until(as_rows)
        fits = driver.execute_script(FITS)
        assert fits["scroll"] <= fits["width"] <= NARROW, fits["scroll"]
        assert min(fits["labels"]) >= READABLE, min(fits["labels"])
        assert all(left >= 0 and right <= fits["width"] for left, right in fits["brokers"])
        assert fits["table"][0] <= fits["table"][1], fits["table"]  # the table is not cut
        _type_filter(driver, "")
        wait.until(lambda d: len(shown(d)) == 75)
        wanted = os.environ.get("OCTOPIS_SCREENSHOT")
        narrow = Path(wanted).with_stem(Path(wanted).stem + f"-{NARROW}") if wanted else None
        screenshot = narrow or paper75.run_dir / f"shot-{NARROW}.png"
        driver.save_screenshot(str(screenshot))
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        driver.quit()
    log = paper75.run_dir / "monitor.log"
    asyncio.run(until(lambda: "a viewer left" in log.read_text(), "the viewer gone", 30))
    assert "Traceback" not in log.read_text() and "ERROR" not in log.read_text(), log.read_text()
    for reader in TRAFFIC_READERS:
        counts = accounting(
            reader, published, Counter({s: n for (b, s), n in got.items() if b == reader})
        )
        assert counts["lost"] == counts["duplicates"] == 0


@HEAVY
@pytest.mark.processes
def test_the_json_views_and_bad_input(paper75: LocalCluster, monitor: str) -> None:
    """/topology lists every broker, region and link; /snapshot every broker up with its
    links, the totals and retention; a monitor of a topology without metrics endpoints is
    refused with a reason."""
    view = _get_json(monitor + "topology")
    assert len(view["brokers"]) == 75 and len(view["links"]) == 220
    assert len(view["regions"]) == 15 and view["clusters"] == 5
    assert sum(link["kind"] == "iCOL" for link in view["links"]) == 150
    asyncio.run(until(lambda: _all_up(monitor), "every broker and link up", 90))
    snapshot = _get_json(monitor + "snapshot")
    assert len(snapshot["links"]) == 440  # both directions of each link
    assert time.time() - snapshot["time"] < 60
    brokers = snapshot["brokers"]
    assert set(brokers) == set(paper75.scot.brokers) and all(b["up"] for b in brokers.values())
    assert all({"rows", "bytes"} <= set(b["retention"]) for b in brokers.values())
    assert all("oldest" in b["retention"] for b in brokers.values() if b["retention"]["rows"])
    totals = snapshot["totals"]
    assert totals["retention"]["rows"] == sum(b["retention"]["rows"] for b in brokers.values())
    assert totals["table"] == sum(b["table"] for b in brokers.values())
    assert set(totals["routing"]) == set(ROUTING_EVENTS)
    data = json.loads(paper75.topology_path.read_text())
    for broker in data["brokers"]:
        del broker["metrics_endpoint"]
    bare = paper75.run_dir / "bare.json"
    bare.write_text(json.dumps(data))
    refused = subprocess.run(
        [sys.executable, "-m", "octopis.cli.main", "monitor", "--topology", str(bare)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "names no metrics endpoint" in refused.stderr


def _broker(routing: dict[str, int], **figures: float) -> dict:
    return {"up": True, "routing": routing, "retention": {}, **figures}


def test_routing_events_as_they_happen_and_the_totals() -> None:
    """Between two snapshots a broker's DNR and tunnel counters that grew become events
    (counted by how much they grew; a counter that went down is a restarted broker's, all
    of it new); the totals add the answering brokers' figures, take the oldest retained
    publication overall, and count each link once, in the worse state of its two
    directions that a broker reported."""
    monitor = Monitor(build_preset("fig2"))
    monitor._follow("a:0", _broker({"dnr_case_1": 5, "tunnel.started": 2}, deliveries=10), 100.0)
    assert not monitor.recent  # the first figures of a broker are its past, not events
    later = _broker({"dnr_case_1": 9, "dnr_case_3": 1, "tunnel.started": 1}, deliveries=30)
    monitor._follow("a:0", later, 102.0)
    assert later["deliveries_per_s"] == 10.0
    assert sorted((e["event"], e["count"]) for e in monitor.recent) == [
        ("dnr_case_1", 4), ("dnr_case_3", 1), ("tunnel.started", 1)
    ]  # fmt: skip
    assert {e["broker"] for e in monitor.recent} == {"a:0"} and monitor.recent[0]["time"] == 102.0

    brokers = {
        "a:0": {**later, "table": 3, "output_per_s": 2.5,
                "retention": {"rows": 4, "bytes": 400, "oldest": 50.0}},
        "b:0": {**_broker({"dnr_case_1": 1}), "table": 1, "output_per_s": 1.0,
                "retention": {"rows": 1, "bytes": 100, "oldest": 70.0}},
        "c:0": {"up": False, "routing": {}, "retention": {}},
    }  # fmt: skip
    links = {
        "a:0>b:0": {"state": "up"},
        "b:0>a:0": {"state": "overloaded"},
        "b:0>c:0": {"state": "down"},
    }
    undirected = [{"a": "a:0", "b": "b:0"}, {"a": "b:0", "b": "c:0"}, {"a": "c:0", "b": "d:0"}]
    totals = overlay_totals(brokers, links, undirected)
    assert totals["brokers"] == 3 and totals["brokers_up"] == 2
    assert totals["links"] == {"up": 0, "overloaded": 1, "down": 1, "unknown": 1}
    assert totals["table"] == 4 and totals["output_per_s"] == 3.5
    assert totals["routing"]["dnr_case_1"] == 10 and totals["routing"]["tunnel.started"] == 1
    assert totals["retention"] == {"rows": 5, "bytes": 500, "oldest": 50.0}


def test_a_snapshot_asked_while_the_monitor_starts_lists_every_broker() -> None:
    """``/snapshot`` asked before the first scrape has ended waits for it: the answer names
    every broker (here none answers, and one keeps the scrape waiting to its timeout: all
    down), never an empty overlay."""
    import socket
    from urllib.parse import urlsplit

    from aiohttp.test_utils import TestClient, TestServer

    from octopis.monitor import make_app

    scot = build_preset("fig2", base_port=find_free_base_port(18))  # nobody answers there
    silent = socket.create_server(
        ("127.0.0.1", urlsplit(scot.brokers["a:0"].metrics_endpoint).port)
    )

    async def ask() -> dict:
        async with TestClient(TestServer(make_app(Monitor(scot, interval=0.2)))) as client:
            response = await client.get("/snapshot")
            return await response.json()

    with silent:  # listens, never accepts: a:0's scrape waits for its timeout
        snapshot = asyncio.run(ask())
    assert snapshot["time"] > 0
    assert sorted(snapshot["brokers"]) == sorted(scot.brokers)
    assert not any(b["up"] for b in snapshot["brokers"].values())
