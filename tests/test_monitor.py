"""``octopis monitor`` in a real browser (Debian's headless Chromium through Selenium)
against a running fig2: the page draws 18 brokers and 33 links, and a link whose capacity
is limited turns from up to overloaded when a burst queues on it; a screenshot is saved.
Also the monitor's JSON views, and its bad input."""

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
from conditions import accounting, closing_control, until
from conftest import secure_fig2

from octopis.client import Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster, find_free_base_port
from octopis.transport.settings import BrokerSettings

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("monitor-fig2")]
"""One fig2 and one monitor for the module's tests, on one worker."""

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
SLOW_LINK = ("a:0", "b:0")
"""The link that congests: a:0 → b:0 carries 30 messages/s (SNR: no detour)."""


@pytest.fixture(scope="module")
def slow_fig2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    settings = BrokerSettings(capacities={f"{SLOW_LINK[0]}>{SLOW_LINK[1]}": 30})
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_dir = tmp_path_factory.mktemp("monitor")
        yield from secure_fig2(run_dir, monkeypatch, settings, mode="snr")


@pytest.fixture(scope="module")
def monitor(slow_fig2: LocalCluster) -> Iterator[str]:
    """``octopis monitor`` of the running fig2 as its own process; yields its URL."""
    port = find_free_base_port(1)
    options = ["--topology", str(slow_fig2.topology_path), "--port", str(port)]
    process = subprocess.Popen(
        [sys.executable, "-m", "octopis.cli.main", "monitor", *options, "--interval", "0.25"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
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
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _browser():  # -> selenium WebDriver
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
        "--window-size=1400,700",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.mark.browser
def test_the_page_draws_the_overlay_and_a_congested_link_changes_colour(
    slow_fig2: LocalCluster, monitor: str, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    scot = slow_fig2.scot
    link_id = f"link-{min(SLOW_LINK)}-{max(SLOW_LINK)}"
    got: Counter[int] = Counter()
    driver = _browser()
    try:
        driver.get(monitor)
        wait = WebDriverWait(driver, 30, poll_frequency=0.1)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "path.link")) == 33)
        assert len(driver.find_elements(By.CSS_SELECTOR, "g.broker")) == 18
        assert len(driver.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")) in (0, 18)
        wait.until(
            lambda d: (
                {
                    p.get_attribute("data-state")
                    for p in d.find_elements(By.CSS_SELECTOR, "path.link")
                }
                == {"up"}
            )
        )
        slow = driver.find_element(By.ID, link_id)
        calm = slow.value_of_css_property("stroke")

        async def burst() -> int:
            sub = await Subscriber.connect(
                scot.client_endpoints("c:0"), "s", on_notification=lambda n: got.update([n.seq])
            )
            await sub.subscribe("[class,eq,'STOCK']")
            pub = await Publisher.connect(scot.client_endpoints("a:0"), "p")
            await until(lambda: _get_json(monitor + "snapshot")["brokers"]["a:0"]["table"] == 1,
                        "subscription at a:0", 20)  # fmt: skip
            # state and colour read in one script: the overload may pass between two reads
            read = (
                "const e = document.getElementById(arguments[0]);"
                "return [e.getAttribute('data-state'), getComputedStyle(e).stroke];"
            )
            seen = asyncio.create_task(
                asyncio.to_thread(
                    wait.until,
                    lambda d: (
                        (state := d.execute_script(read, link_id))[0] == "overloaded" and state
                    ),
                )
            )
            published = 0
            while not seen.done():  # 60/s into a 30/s link until the page shows it (≤ 30 s)
                await asyncio.gather(
                    *[pub.publish({"class": "STOCK", "price": 1.0}, wait=False) for _ in range(30)]
                )
                published += 30
                await asyncio.wait({seen}, timeout=0.5)
            _, busy = await seen
            driver.save_screenshot(str(tmp_path / "monitor.png"))
            assert busy != calm, (busy, calm)
            await until(lambda: len(got) >= published, "every notification through the link", 90)
            await pub.close()
            await sub.close()
            return published

        expected = asyncio.run(closing_control(slow_fig2, burst()))
        wait.until(lambda d: d.find_element(By.ID, link_id).get_attribute("data-state") == "up")
    finally:
        driver.quit()
    shot = tmp_path / "monitor.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {shot}")
    counts = accounting("s", expected, got)
    assert counts["lost"] == counts["duplicates"] == 0


@pytest.mark.processes
def test_the_json_views_and_bad_input(slow_fig2: LocalCluster, monitor: str) -> None:
    """/topology lists every broker and link; /snapshot every broker up with its links;
    a monitor of a topology without metrics endpoints is refused with a reason."""
    view = _get_json(monitor + "topology")
    assert len(view["brokers"]) == 18 and len(view["links"]) == 33
    assert sum(link["kind"] == "iCOL" for link in view["links"]) == 18

    def complete() -> bool:
        snapshot = _get_json(monitor + "snapshot")
        return len(snapshot["brokers"]) == 18 and all(b["up"] for b in snapshot["brokers"].values())

    asyncio.run(until(complete, "a snapshot of every broker", 20))
    snapshot = _get_json(monitor + "snapshot")
    assert len(snapshot["links"]) == 66  # both directions of each link
    assert time.time() - snapshot["time"] < 60
    data = json.loads(slow_fig2.topology_path.read_text())
    for broker in data["brokers"]:
        del broker["metrics_endpoint"]
    bare = slow_fig2.run_dir / "bare.json"
    bare.write_text(json.dumps(data))
    refused = subprocess.run(
        [sys.executable, "-m", "octopis.cli.main", "monitor", "--topology", str(bare)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "names no metrics endpoint" in refused.stderr
