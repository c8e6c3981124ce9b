"""Suite-wide setup: the hypothesis profile (``HYPOTHESIS_PROFILE``, see ``laws.py``), the
test tiers, the ``line_of`` fixture (three broker processes a:0 – b:0 – c:0 in the clear)
and :func:`secure_fig2` (fig2's 18 broker processes with keys on; one a module's tests
share: :func:`shared_secure_fig2`, :func:`ready_again`), and the ``namespaces``
fixture (three hosts and a client host in network namespaces on one bridge).

Tiers: a test that starts broker processes (or any OctopiS command as a process) is marked
``processes``; one that runs Spark ``spark``, one that drives Chromium ``browser``, one that
reads the documentation site built by ``mkdocs build --strict`` ``site``; those count as
``processes`` too. ``pytest -m "not processes"`` is the quick tier. The
marks are kept honest by :func:`child_processes_follow_the_marks`: an unmarked test that
starts such a process fails, naming the mark it needs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import laws  # noqa: F401  (registers and loads the profile)
import networkx as nx
import pytest
from conditions import closing_control, tables_hold, until

from octopis.cluster.forked import Zygote
from octopis.cluster.launcher import LocalCluster, find_free_base_port, prepare_topology
from octopis.cluster.netns import HOSTS, Namespaces, why_no_namespaces
from octopis.cluster.netns import namespaces as made_namespaces
from octopis.keys import KEYS_ENV
from octopis.settings import BrokerSettings
from octopis.topology import build_scot, complete_factor

SERVER_WORDS: dict[str, tuple[str, ...]] = {
    "processes": ("octopis", "activemq", "netns"),
    "spark": ("java", "spark"),
    "browser": ("chrom",),
}
"""A mark → words of a child process's command line that need it (``octopis`` covers the
broker processes, the CLI and its commands run as processes)."""
PROCESS_MARKS = ("spark", "browser", "site")
"""Marks that imply ``processes``: the quick tier leaves their tests out too."""


QUICK_GROUP = "quick"
"""The xdist group the quick tier's tests join in a run that has process tests too."""


def _with_process_tier(config: pytest.Config) -> bool:
    """Whether the run may hold process tests: ``-m`` does not leave them out."""
    return "not processes" not in (config.getoption("markexpr") or "")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker per core, and one more for the quick tier's group in a run
    of the whole suite (:func:`pytest_collection_modifyitems`); a run of chosen modules
    may hold process tests alone, which three workers on two cores would overload."""
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    return len(os.sched_getaffinity(0)) + (whole and _with_process_tier(config))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Spark, browser and site tests are process tests too; process tests run first (grouped
    ones first of all), so the parallel workers start on the long ones and end on short
    ones (no lone long tail).

    Beside process tests, the quick tier's tests join one xdist group, :data:`QUICK_GROUP`,
    taken by the extra worker from the start: process tests wait on sockets, timers and
    child processes (a fifth to a half of two cores idle with two workers), and the
    simulator's laws fill that time. Tests marked ``spread`` (a sweep's chunks) stay out
    of the group and go to whichever worker is free, which evens out the ends. The group
    keeps the heavy process runs at two side by side (three process workers put the
    paper75 runs, ActiveMQ's JVM, Chromium and the up/down cycles beside one another:
    loads of 45–67 and nine process tests past their timeouts in one run)."""
    for item in items:
        if any(item.get_closest_marker(m) for m in PROCESS_MARKS):
            item.add_marker(pytest.mark.processes)
    items.sort(
        key=lambda item: (
            item.get_closest_marker("processes") is None,
            item.get_closest_marker("xdist_group") is None,
        )
    )
    if not (_with_process_tier(config) and items and items[0].get_closest_marker("processes")):
        return
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("processes", "xdist_group", "spread")):
            item.add_marker(pytest.mark.xdist_group(QUICK_GROUP))


def _mark_needed(args: object) -> str | None:
    """The mark a child process with these arguments needs, if any."""
    words = [args] if isinstance(args, str | bytes) else list(args)  # type: ignore[call-overload]
    line = " ".join(str(w) for w in words).lower()
    for mark, needles in SERVER_WORDS.items():
        if any(needle in line for needle in needles):
            return mark
    return None


@pytest.fixture(autouse=True)
def child_processes_follow_the_marks(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unmarked test may start no broker, Spark, browser or other server process: it
    would make the quick tier slow and the marks untrue."""
    marks = {m for m in SERVER_WORDS if request.node.get_closest_marker(m)}
    if "processes" in marks:
        return
    popen_init = subprocess.Popen.__init__

    def checked_init(self: subprocess.Popen, args: object, *rest: object, **kw: object) -> None:
        needed = _mark_needed(args)
        if needed and needed not in marks and args[:2] != [sys.executable, "-c"]:  # type: ignore[index]
            pytest.fail(f"{request.node.nodeid} starts {args!r}: mark it {needed}", False)
        popen_init(self, args, *rest, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess.Popen, "__init__", checked_init)

    def checked_fork(self: Zygote, argv: list[str], log_path: Path) -> int:
        pytest.fail(f"{request.node.nodeid} forks a broker ({argv!r}): mark it processes", False)

    monkeypatch.setattr(Zygote, "fork", checked_fork)


def secure_fig2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: BrokerSettings,
    mode: str = "dnr",
    room: int = 0,
) -> Iterator[LocalCluster]:
    """For a fixture to yield from: fig2 in ``mode`` with keys on and ``settings``, ready
    (on ports with room for ``room`` brokers more: the overlay may grow); the SDK finds
    the keys through $OCTOPIS_KEYS. Stopped when the fixture ends."""
    scot, path = prepare_topology(tmp_path, preset="fig2", room=room)
    cluster = LocalCluster(scot, path, mode, tmp_path, settings, forked=True)
    cluster.spawn()
    monkeypatch.setenv(KEYS_ENV, str(cluster.keys_dir))
    try:
        asyncio.run(closing_control(cluster, cluster.wait_ready(120)))
        yield cluster
    finally:
        cluster.stop()


def shared_secure_fig2(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    settings: BrokerSettings,
    room: int = 0,
) -> Iterator[LocalCluster]:
    """For a module-scoped fixture to yield from: :func:`secure_fig2` (DNR) in a folder
    ``name`` of its own, shared by the module's tests that take it (in one
    ``xdist_group``); $OCTOPIS_KEYS stays unset outside them (:func:`ready_again` sets
    it for a test). Stopped when the module ends."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        started = secure_fig2(tmp_path_factory.mktemp(name), monkeypatch, settings, room=room)
        cluster = next(started)
        monkeypatch.delenv(KEYS_ENV)
        try:
            yield cluster
        finally:
            started.close()


def ready_again(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, *, empty: bool = True
) -> LocalCluster:
    """A shared fig2 (:func:`shared_secure_fig2`) made ready for the next test: its keys
    reach the SDK ($OCTOPIS_KEYS), a broker an earlier test killed is started again, and
    it is returned once every broker is ready and (``empty``) no table holds a
    subscription of an earlier test."""
    monkeypatch.setenv(KEYS_ENV, str(cluster.keys_dir))
    for broker, process in cluster.processes.items():
        if process.poll() is not None:
            cluster.spawn_one(broker)

    async def ready() -> None:
        await cluster.wait_ready(60)
        if empty:
            await until(lambda: tables_hold(cluster, 0), "empty tables", 30)

    asyncio.run(closing_control(cluster, ready()))
    return cluster


@pytest.fixture(scope="module")
def namespaces() -> Iterator[Namespaces]:
    """Hosts ``h0``–``h2`` and a client host in network namespaces on one bridge, for the
    module. They need root and ``ip netns``: without them the test is skipped with the
    reason, unless ``OCTOPIS_REQUIRE_NETNS`` is set (CI sets it), where it fails instead."""
    if reason := why_no_namespaces():
        if os.environ.get("OCTOPIS_REQUIRE_NETNS"):
            pytest.fail(f"OCTOPIS_REQUIRE_NETNS is set but {reason}")
        pytest.skip(reason)
    with made_namespaces(f"octopis{os.getpid()}", HOSTS) as ns:
        yield ns


@pytest.fixture
def line_of(tmp_path: Path) -> Iterator[Callable[[BrokerSettings], LocalCluster]]:
    """Starts the line a:0 – b:0 – c:0 (SNR, keys off) with the given settings; stops it
    after the test."""
    started: list[LocalCluster] = []

    def start(settings: BrokerSettings) -> LocalCluster:
        line = nx.path_graph(["a", "b", "c"])
        scot = build_scot(line, complete_factor(1), name="line", base_port=find_free_base_port(3))
        path = tmp_path / "line.json"
        path.write_text(json.dumps(scot.to_json()))
        cluster = LocalCluster(scot, path, "snr", tmp_path, settings, secure=False, forked=True)
        started.append(cluster)
        cluster.spawn()
        return cluster

    yield start
    for cluster in started:
        cluster.stop()
