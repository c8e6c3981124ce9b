"""Broker processes over ZeroMQ on 127.0.0.1: end-to-end runs, joins and leaves, bad input.

Every test that starts brokers stops them itself; the ``no_leftover_brokers`` fixture
fails a test that leaves a broker process behind, passing or failing.

What differs between routing modes is a routing law the simulator proves on the brokers'
own node (tests/test_sim.py ``test_snr_laws``, ``test_dnr_laws_under_any_congestion``,
``test_dnr_without_congestion_equals_snr``, ``test_bid_laws``; with failures,
tests/test_failures.py ``test_every_single_failure_while_publishing_loses_nothing``
[fig2|paper75 × snr|dnr], ``test_up_to_three_failures_while_publishing`` and
``test_subscribers_that_fail_over_get_what_was_published_while_they_were_away``
[snr|dnr]). So each process-level property here runs in one mode, and a run that only
scales one up is a law: DNR on fig2 (:func:`test_octopis_run_command`, keys on, with
the delay split and one SBP each, and :func:`test_dnr_reacts_to_real_output_queues`);
BID's flood is ``test_generated_workload_json_report`` (tests/test_cli_sim.py) and BID's
exactly once ``test_bid_laws``; SNR for the killed hosts (their clients in worker
processes; the stall is DNR). A kill -9 on paper75's 75 processes is not run here: every
broker of paper75 killed and restarted mid-stream in DNR, viii:2 among them, is
``test_every_single_failure_while_publishing_loses_nothing[paper75-dnr]``, the restarted
table against its neighbours' view ``test_restarted_broker_is_resynced_to_its_neighbours_view``
(paper75, DNR), and what kill -9 itself does to processes (sockets gone, a new incarnation
resynced through the control RPC, clients failing over) the killed hosts' run here,
tests/test_client.py ``test_a_subscriber_fails_over_when_its_broker_is_killed`` (DNR) and
tests/test_faults.py ``[snr-crash]``. Adjacent brokers killed and restarted one by one (a
restart beside a dead neighbour) is a recovery law on the node (tests/test_failures.py
``test_adjacent_restarts_end_with_every_share`` [tree-line, in SNR and DNR]).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiozmq.rpc
import msgpack
import psutil
import pytest
import zmq
from conditions import assert_one_sbp_each, until
from conditions import run_octopis as _octopis

from octopis.cli.report import summarize
from octopis.client import BrokerError, Connection, Publisher, Subscriber
from octopis.cluster.launcher import LocalCluster, broker_command, prepare_topology
from octopis.cluster.runner import RunOptions, WorkloadRun
from octopis.core import Notification
from octopis.core.codec import encode_peer
from octopis.failure_schedule import Failure
from octopis.filters.language import parse_subscription
from octopis.settings import BrokerSettings, Links
from octopis.topology import Scot, build_preset
from octopis.workload import HighRatePublisher, Workload, generate_workload

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]
RAMP = 1.0
"""Seconds every generated publisher starts within (default 5): a failure meets them all."""


def _broker_pids(marker: bytes) -> set[int]:
    """Live broker processes that write to a broker log under ``marker`` (this run's
    temporary folder: brokers of another test run beside this one are not counted), be
    they executed (``python -m octopis.cli.broker``) or forked from a zygote."""
    pids = set()
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError):
            out = os.readlink(f"/proc/{process.pid}/fd/1").encode()
            if (
                marker in out
                and b"/logs/" in out
                and out.endswith(b".log")
                and process.info["status"] != psutil.STATUS_ZOMBIE
            ):
                pids.add(process.pid)
    return pids


@pytest.fixture(autouse=True)
def no_leftover_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    marker = str(tmp_path_factory.getbasetemp()).encode()
    before = _broker_pids(marker)
    yield
    deadline = time.monotonic() + 5
    while (left := _broker_pids(marker) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"broker processes left behind: {sorted(left)}"


def _exactly_once(report: dict) -> None:
    assert report["expected_deliveries"] > 0
    assert report["delivered"] == report["expected_deliveries"]
    assert report["duplicates"] == report["lost"] == report["unexpected"] == 0
    assert not any(report["errors"].values())
    assert not any(report["failures"].values()), "a failure was detected where none happened"


def _delay_split(report: dict) -> None:
    """Every delivery's delay splits at the broker's stamp into the overlay's share and
    the client side's: both present, the overlay's positive, the means adding up."""
    total, overlay, client = (
        report[k] for k in ("notification_delay", "overlay_delay", "client_delay")
    )
    assert overlay["p50"] > 0 and client["p50"] >= 0
    assert overlay["max"] <= total["max"]
    assert abs(overlay["mean"] + client["mean"] - total["mean"]) < 1e-6, (overlay, client, total)


def test_dnr_reacts_to_real_output_queues(tmp_path: Path) -> None:
    """With every broker limited to 250 sends/s and a high-rate publisher whose followers
    sit in other clusters, the HRP's host sees its iCOL queues grow in its LST and DNR
    detours copies (Cases I–III fire), still delivering exactly once."""
    run_dir = tmp_path / "burst"
    scot, path = prepare_topology(run_dir, preset="fig2")
    workload = generate_workload(
        scot,
        subscribers=100,
        publishers=3,
        notifications=5,
        seed=4,
        rate_per_minute=600,
        hrp=HighRatePublisher(600, rate_per_minute=30000, interest=0.05, start=1.0),
    )
    options = RunOptions(
        mode="dnr",
        run_dir=run_dir,
        progress=False,
        drain_timeout=30,
        settings=BrokerSettings(links=Links(broker_capacity=250.0)),
        sample_every=0.5,
    )
    report = WorkloadRun(scot, path, workload, options).run()
    _exactly_once(report)
    assert report["dnr_case_1"] + report["dnr_case_2"] + report["dnr_case_3"] > 0
    assert report["dnr_kept_off"] > 0
    assert report["target_queue_length"]["max"] >= 10  # Q: queues really grew
    assert max(s["max"] for s in report["timeline"]) > 0
    assert len(report["max_delay_per_1000"]) >= 1


def test_octopis_run_command(tmp_path: Path) -> None:
    """A generated workload on fig2's processes (DNR, keys on), its subscribers placed
    least loaded inside their cluster (BAD §5.1): every broker of a cluster gets as many
    newcomers as any other, give or take one; every delivery exactly once, each written
    out; every delivery's delay split at the broker's stamp; one SBP of N − 1 messages a
    subscription. (BID's flood of 2|E| − (N − 1) is a routing law:
    tests/test_cli_sim.py ``test_sim_runs_a_workload_in_every_mode`` counts it.)"""
    out = tmp_path / "deliveries.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "octopis.cli.main",
            "run",
            "--preset",
            "fig2",
            "--mode",
            "dnr",
            "--subscribers",
            "40",
            "--publishers",
            "3",
            "--notifications",
            "5",
            "--rate",
            "600",
            "--run-dir",
            str(tmp_path / "run"),
            "--json",
            "--deliveries",
            str(out),
            "--placement",
            "least_loaded",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    _exactly_once(report)
    _delay_split(report)
    assert_one_sbp_each(report, 17)
    assert len(out.read_text().splitlines()) == report["delivered"]
    assert (tmp_path / "run" / "report.json").is_file()
    placement = report["placement"]
    assert placement["policy"] == "least_loaded" and placement["subscribers"] == 40
    for cluster in range(3):
        counts = [placement["per_broker"].get(f"{r}:{cluster}", 0) for r in "abcdef"]
        assert max(counts) - min(counts) <= 1, (cluster, counts)


FIG2_UP = pytest.mark.xdist_group("fig2-up")
"""The tests on :func:`fig2_cluster` run on one worker, one after the other, so that the
module's fig2 starts once (between other modules' tests pytest would stop it and start
it again)."""


@pytest.fixture(scope="module")
def fig2_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """fig2 with keys off: the tests on it speak raw ZeroMQ to its sockets."""
    run_dir = tmp_path_factory.mktemp("fig2-up")
    scot, path = prepare_topology(run_dir, preset="fig2")
    cluster = LocalCluster(scot, path, "snr", run_dir, secure=False, forked=True)
    cluster.spawn()
    try:
        asyncio.run(_ready(cluster))
        yield cluster
    finally:
        cluster.stop()


async def _ready(cluster: LocalCluster) -> None:
    try:
        await cluster.wait_ready(120)
    finally:
        await cluster.close_control()


async def _settled(cluster: LocalCluster, size: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = await cluster.call_all("stats")
        if {s["routing_table_size"] for s in stats.values()} == {size} and not any(
            sum(s["queue_lengths"].values()) for s in stats.values()
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"routing tables did not settle at {size} entries")


TRANSIT = 0.2
"""Seconds a notification may take from a:0 to f:2 on an idle fig2 (measured: ~10 ms)."""


@FIG2_UP
def test_join_and_leave_mid_stream(fig2_cluster: LocalCluster) -> None:
    """A subscriber gets exactly the matching notifications published while it is
    subscribed (after its broadcast settled, and more than a transit time before its
    unsubscribe), never one twice, and none published after its withdrawal settled.
    Notifications still in flight when the unsubscribe reaches the host may go either way."""
    scot = fig2_cluster.scot
    even = parse_subscription("[class,eq,'STOCK'],[n,<,1000000]")

    async def scenario() -> None:
        published: dict[int, float] = {}
        got: Counter[int] = Counter()
        sub = await Subscriber.connect(
            scot.brokers["f:2"].client_endpoint,
            "late",
            on_notification=lambda r: got.update([r.seq]),
        )
        pub = await Publisher.connect(scot.brokers["a:0"].client_endpoint, "feed")
        stop = asyncio.Event()

        async def stream() -> None:
            while not stop.is_set():
                seq = await pub.publish({"class": "STOCK", "n": len(published)}, wait=False)
                published[seq] = time.time()
                await asyncio.sleep(0.01)

        def published_more(count: int) -> Callable[[], bool]:
            target = len(published) + count
            return lambda: len(published) >= target

        task = asyncio.create_task(stream())
        try:
            await until(published_more(20), "publisher running", 10)
            handle = await sub.subscribe(even)
            await _settled(fig2_cluster, 1)
            joined = time.time()
            await until(published_more(50), "publications while subscribed", 10)
            left = time.time()
            await sub.unsubscribe(handle)
            await _settled(fig2_cluster, 0)
            gone = time.time()
            await until(published_more(30), "publications after leaving", 10)
        finally:
            stop.set()
            await task
        await pub.flush()
        await _settled(fig2_cluster, 0)  # every queue empty: nothing left in flight
        await fig2_cluster.close_control()
        await sub.close()
        await pub.close()
        must = {s for s, t in published.items() if joined <= t <= left - TRANSIT}
        never = {s for s, t in published.items() if t >= gone}
        assert len(must) > 20
        assert must <= set(got)
        assert not never & set(got)
        assert all(count == 1 for count in got.values())

    asyncio.run(scenario())


@FIG2_UP
def test_bad_filter_and_frames_are_rejected_and_broker_keeps_serving(
    fig2_cluster: LocalCluster,
) -> None:
    scot = fig2_cluster.scot
    target = scot.brokers["c:1"]

    async def scenario() -> None:
        sub = await Subscriber.connect(target.client_endpoint, "victim")
        with pytest.raises(BrokerError, match=r"position \d+: unknown operator 'eqq'"):
            await sub.connection.request(
                {"op": "subscribe", "client": "victim", "filter": "[class,eqq,'STOCK']"}
            )
        conn = sub.connection
        with pytest.raises(BrokerError, match="unknown op 'explode'"):
            await conn.request({"op": "explode"})
        refused_publications = [
            ("one", {"a": 1}, r"Expected `int`, got `str` - at `\$\.seq`"),
            (1, {"a": [1, 2]}, r"attribute .a.: value \[1, 2\] is not a string"),
            (1, {"a": "x" * 5000}, r"over limits.string_length \(1024\)"),
        ]
        for seq, publication, problem in refused_publications:
            request = {"op": "publish", "client": "x", "seq": seq, "published_at": 0}
            with pytest.raises(BrokerError, match=problem):
                await conn.request({**request, "publication": publication})
        many = ",".join(f"[a{i},>,1]" for i in range(65))
        with pytest.raises(BrokerError, match=r"65 predicates is over limits.predicates \(64\)"):
            await conn.request({"op": "subscribe", "client": "x", "filter": many})
        raw = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        raw.connect(target.client_endpoint)
        await raw.send(b"\xc1 not msgpack")
        reply = msgpack.unpackb(await asyncio.wait_for(raw.recv(), 5))
        assert reply["op"] == "error" and "not msgpack" in reply["message"]
        raw.close()
        huge = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        huge.connect(target.client_endpoint)
        await huge.send(msgpack.packb({"op": "hello", "client": "h", "req": 1, "x": "y" * 2**21}))
        assert await huge.poll(1000) == 0  # over limits.frame_bytes: disconnected, unread
        huge.close(linger=0)

        peer = zmq.asyncio.Context.instance().socket(zmq.PUSH)
        peer.connect(target.endpoint)
        await peer.send(b"garbage")
        await peer.send_multipart([b"b:1", msgpack.packb([9])])
        await peer.send_multipart(encode_peer("f:0", Notification("P", 1, 0.0, {"a": 1})))
        await peer.send_multipart(
            [b"b:1", msgpack.packb([3, "P", "one", 0.0, {"a": 1}, None, None])]
        )

        async def all_four_refused() -> bool:
            counters = (await fig2_cluster.call_all("stats"))[target.id]["counters"]
            return counters.get("wire_errors", 0) + counters.get("protocol_errors", 0) >= 4

        await until(all_four_refused, "the four bad peer frames counted", 10)
        peer.close(linger=0)

        stream = await sub.subscribe("[class,eq,'STOCK']")
        await _settled(fig2_cluster, 1)
        pub = await Publisher.connect(scot.brokers["a:2"].client_endpoint, "good")
        await pub.publish({"class": "STOCK", "symbol": "OK"})
        got = await stream.get(timeout=10)
        assert got.publication["symbol"] == "OK"
        await stream.unsubscribe()
        await _settled(fig2_cluster, 0)
        stats = (await fig2_cluster.call_all("stats"))[target.id]
        await fig2_cluster.close_control()
        assert stats["counters"]["wire_errors"] == 3
        assert stats["counters"]["protocol_errors"] == 1
        assert stats["counters"]["client_errors"] >= 7
        assert stats["counters"].get("internal_errors", 0) == 0
        await pub.close()
        await sub.close()

    asyncio.run(scenario())


def test_broker_exits_cleanly_on_sigterm_and_rejects_bad_arguments(tmp_path: Path) -> None:
    scot, path = prepare_topology(tmp_path, preset="fig2")
    bad = subprocess.run(
        broker_command(path, "zz:9"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "has no broker 'zz:9'" in bad.stderr
    config = tmp_path / "bad.toml"
    config.write_text("[lst]\nwindow = -1\n")
    bad = subprocess.run(
        broker_command(path, "a:0", config=config),
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "lst.window must be ≥" in bad.stderr
    proc = subprocess.Popen(
        broker_command(path, "a:0"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        asyncio.run(_wait_serving(scot.brokers["a:0"].client_endpoint))
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped" in proc.stderr.read()


def test_control_rpc_reports_and_shuts_down(tmp_path: Path) -> None:
    scot, path = prepare_topology(tmp_path, preset="fig2")
    info = scot.brokers["c:1"]
    proc = subprocess.Popen(
        broker_command(path, "c:1", "dnr"),
        stderr=subprocess.DEVNULL,
    )

    async def scenario() -> None:
        control = await aiozmq.rpc.connect_rpc(connect=info.control_endpoint, timeout=20)
        try:
            status = await control.call.status()
            assert status["id"] == "c:1" and status["mode"] == "dnr"
            assert status["neighbours"] == 5 and not status["ready"]  # no neighbour runs
            stats = await control.call.stats()
            assert stats["routing_table_size"] == 0
            assert set(stats["lst"]) == {n.id for n in info.neighbours}
            assert await control.call.shutdown() is True
        finally:
            control.close()

    try:
        asyncio.run(scenario())
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def _wait_serving(endpoint: str) -> None:
    connection = Connection(endpoint)
    try:
        welcome = await connection.open(timeout=20)
        assert welcome.broker == "a:0" and welcome.mode == "snr"
    finally:
        await connection.close()


def test_overlay_commands_on_several_hosts_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    """`up --host` needs the deployment's shared keys and a topology that names hosts;
    `run --attach` needs the overlay's topology. Each refusal says why and starts nothing."""
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(build_preset("fig2").to_json()))
    placed = tmp_path / "placed.json"
    placed.write_text(json.dumps(build_preset("fig2", hosts={"h0": "192.0.2.1"}).to_json()))
    run_dir = str(tmp_path / "run")
    for args, message in (
        (["up", str(placed), "--host", "h0"], "share one set of keys"),
        (["up", str(placed), "--keys", str(tmp_path), "--insecure"], "exclude each other"),
        (["up", str(plain), "--host", "h0", "--insecure"], "places no broker on host 'h0'"),
        (["run", "--attach", "--preset", "fig2", "--subscribers", "5"], "needs the running"),
    ):
        refused = _octopis([*args, "--run-dir", run_dir], timeout=60)
        assert refused.returncode == 2, (args, refused.stderr)
        assert message in refused.stderr, (args, refused.stderr)
    assert not (tmp_path / "run").exists()


def _dnr_run_with_failures(
    run_dir: Path,
    preset: str,
    failures: list[Failure],
    spare: set[str],
    client_workers: int = 0,
    mode: str = "dnr",
    settings: BrokerSettings | None = None,
    **sizes: Any,
) -> tuple[dict, Scot, Workload]:
    """A run of ``preset`` (DNR unless ``mode`` says, default settings unless
    ``settings``) with ``failures``, no client on the brokers of ``spare``; prints the
    failure report."""
    scot, path = prepare_topology(run_dir, preset=preset)
    workload = generate_workload(scot, start_window=RAMP, **sizes)
    workload.subscriptions = [s for s in workload.subscriptions if s.broker not in spare]
    workload.publications = [p for p in workload.publications if p.broker not in spare]
    options = RunOptions(
        mode=mode,
        run_dir=run_dir,
        settings=settings or BrokerSettings(),
        progress=False,
        drain_timeout=20,
        failures=failures,
        client_workers=client_workers,
    )
    report = WorkloadRun(scot, path, workload, options).run()
    print(json.dumps(report["failures"], indent=1))
    print("timings", report["timings"])
    return report, scot, workload


def _check_survivors(report: dict, restarted: set[str], minimum: int) -> None:
    """Subscribers on brokers that never died got more than ``minimum`` deliveries, each
    exactly once; every restarted broker's table equals its neighbours' view of it, or
    with covering (DESIGN §12) holds all of it, with the same last hops: the view is the
    least share that covers what the neighbours hold, and SBP may since have brought the
    restarted broker subscriptions that share would leave out (entries no delivery
    depends on)."""
    failures = report["failures"]
    alive = failures["host_alive"]
    assert alive["expected_deliveries"] > minimum
    assert alive["lost"] == alive["duplicates"] == alive["unexpected"] == 0, (
        alive,
        failures["host_alive_lost_samples"],
    )
    for broker in restarted:
        restart = failures[f"restart.{broker}"]
        assert restart["entries"] > 0
        assert restart["missing"] == restart["changed"] == 0, broker
        if report.get("covering") != "active":
            assert restart["extra"] == 0, broker


def test_killed_hosts_lose_no_subscriber_anything(tmp_path: Path) -> None:
    """fig2, SNR, the clients in two worker processes (by broker): kill -9 of c:0 (an inner
    broker) 2 s into publishing and of f:1 (an edge broker of another cluster) at 3 s,
    restarted at 6 s and 8 s; both host subscribers and publishers. The killed hosts'
    subscribers fail over along their broker list from inside their worker, subscribe
    again and replay what the overlay retained for them; the publishers fail over and
    send again what was not confirmed. Every subscriber, on a live broker or a killed one,
    gets every matching publication exactly once; the outage the workers' subscribers
    report reaches the run's failure report; each restarted broker's table is its
    neighbours' view of it. The same kills in DNR are a routing law on the node
    (tests/test_failures.py ``test_every_single_failure_while_publishing_loses_nothing``,
    ``test_subscribers_that_fail_over_get_what_was_published_while_they_were_away``);
    DNR's kill on processes is tests/test_client.py
    ``test_a_subscriber_fails_over_when_its_broker_is_killed``; DNR's stall is below."""
    report, _, workload = _dnr_run_with_failures(
        tmp_path / "fig2-snr",
        "fig2",
        [Failure(("c:0",), 2.0, 6.0), Failure(("f:1",), 3.0, 8.0)],
        set(),
        client_workers=2,
        mode="snr",
        subscribers=150,
        publishers=12,
        notifications=100,
        rate_per_minute=600,
        seed=4,
    )
    failures = report["failures"]
    print(json.dumps(report["failures"]["replays"], indent=1))
    hosts = {p.broker for p in workload.publications} & {s.broker for s in workload.subscriptions}
    assert "c:0" in hosts  # the killed inner broker hosts a publisher and subscribers
    assert failures["host_dead"]["expected_deliveries"] > 100
    for group in ("host_alive", "host_dead"):
        counts = failures[group]
        assert counts["lost"] == counts["duplicates"] == counts["unexpected"] == 0, (
            group,
            counts,
            failures[f"{group}_lost_samples"],
            failures["replays"],
        )
    assert failures["replays"]["requests"] > 0
    for broker in ("c:0", "f:1"):
        assert failures.get(f"failover.{broker}.away_s") is not None, broker
    _check_survivors(report, {"c:0", "f:1"}, 350)


def test_stalled_broker_and_its_clients_lose_nothing(tmp_path: Path) -> None:
    """fig2, DNR: c:0's process is stopped (SIGSTOP) for 2.5 s mid-stream and resumed, as
    a long GC pause or a VM hiccup would do. Its neighbours declare it down and route
    around it, holding the copies meant for it; its clients fail over and keep reading
    the connection they left. Everyone gets every notification exactly once: the held
    copies go out when c:0 comes back, what it routes late is absorbed by dedup. The
    subscriptions c:0's clients made again elsewhere flood one SBP each, like the rest."""
    stalled = "c:0"
    report, scot, _ = _dnr_run_with_failures(
        tmp_path / "fig2-stall",
        "fig2",
        [Failure((stalled,), 3.0, 5.5, stall=True)],
        set(),
        subscribers=300,
        publishers=10,
        notifications=80,
        rate_per_minute=600,
        selectivity=0.01,
        seed=3,
    )
    failures = report["failures"]
    assert failures[f"stall.{stalled}"]["declared_down_by"] == len(scot.brokers[stalled].neighbours)
    assert failures["host_alive"]["expected_deliveries"] == report["expected_deliveries"] > 1200
    assert report["delivered"] == report["expected_deliveries"]
    assert report["duplicates"] == report["lost"] == report["unexpected"] == 0
    assert failures["held.released"] > 0
    assert stalled in failures["failovers_from_live_brokers"]
    again = report["subscriptions_made"] - report["subscriptions"]  # c:0's, made again
    assert again > 0
    assert_one_sbp_each(report, 17)
    line = f"clients: fail-overs from a silent broker {report['sdk_failovers']}, "
    assert f"{line}subscriptions made again at another broker {again} " in summarize(report)
