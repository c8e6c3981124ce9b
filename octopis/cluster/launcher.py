"""Start one broker process per SCOT node on this machine, and stop them all (DESIGN §2).

Every broker is a separate OS process in its own session, logging to
``<run_dir>/logs/<id>.log``: executed (``python -m octopis.cli.broker``), or forked from
a zygote that imported it once (``forked``, :mod:`octopis.cluster.forked`).
:class:`LocalCluster` waits until every broker has handshaken all its inbound links,
talks to them over the control RPC, and on :meth:`stop` (also on errors and Ctrl-C
through the context manager) terminates every process it started, killing any that do
not exit in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import aiozmq.rpc
import psutil

from octopis.cluster.forked import BROKER_MODULE, ForkedBroker, fork_broker
from octopis.keys import Keys, connect_securely, make_keys
from octopis.overlay import STATE_FILE, read_state
from octopis.settings import BrokerSettings, load_settings
from octopis.topology import PORTS_PER_BROKER, Scot, build_preset, load_topology

PORT_BLOCK = 128
"""Ports are reserved in aligned blocks of this many ports (fig2's 18 brokers fit one)."""
PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "octopis-ports"
"""One lock file per port block; a process holds the ``flock`` of the blocks it was given."""
_LOWEST_PORT = 10000
_RESERVED: dict[Path, IO[bytes]] = {}
_RELEASED: set[int] = set()
"""Blocks this process still holds whose cluster stopped (:func:`release_ports`): handed
out again by this process before any new block is locked."""


class ClusterError(RuntimeError):
    """Brokers did not start, did not connect, or died."""


def find_free_base_port(brokers: int, host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A base port whose ``PORTS_PER_BROKER × brokers`` consecutive ports are free on
    ``host`` now and reserved for this process until it exits.

    Ports are drawn below the kernel's ephemeral range, so that the brokers' own outgoing
    connections cannot take a port another broker is about to bind. The range is made of
    aligned blocks of :data:`PORT_BLOCK` ports, each reserved by an exclusive ``flock`` on
    its file in :data:`PORT_LOCK_DIR`, so OctopiS processes on this machine never get
    overlapping ranges; other programs are caught by binding every port. Blocks this
    process holds whose cluster stopped (:func:`release_ports`) are handed out first.
    """
    span = PORTS_PER_BROKER * brokers
    count = -(-span // PORT_BLOCK)
    first = -(-_LOWEST_PORT // PORT_BLOCK)
    last = (_ephemeral_start() - span) // PORT_BLOCK
    if last < first:
        raise ClusterError(f"no room for {span} ports below the ephemeral port range")
    for start in sorted(_RELEASED):
        blocks = range(start, start + count)
        if _RELEASED.issuperset(blocks) and all(
            _port_free(host, port) for port in range(start * PORT_BLOCK, start * PORT_BLOCK + span)
        ):
            _RELEASED.difference_update(blocks)
            return start * PORT_BLOCK
    starts = list(range(first, last + 1))
    random.Random().shuffle(starts)
    for start in starts[:attempts]:
        blocks = range(start, start + count)
        if not _reserve(blocks):
            continue
        base = start * PORT_BLOCK
        if all(_port_free(host, port) for port in range(base, base + span)):
            return base
        for block in blocks:
            _RESERVED.pop(_block_path(block)).close()
    raise ClusterError(f"found no {span} consecutive free ports on {host}")


def release_ports(ports: Iterable[int]) -> None:
    """The ranges holding ``ports`` are free again for this process (their brokers
    stopped): it keeps the blocks' locks, so no other process takes them, and hands them
    out again before it locks new ones. A worker running many clusters in turn thus holds
    the blocks of its largest overlays, not of every overlay it ever ran."""
    for block in {port // PORT_BLOCK for port in ports}:
        if _block_path(block) in _RESERVED:
            _RELEASED.add(block)


def _block_path(block: int) -> Path:
    start = block * PORT_BLOCK
    return PORT_LOCK_DIR / f"{start}-{start + PORT_BLOCK - 1}.lock"


def _reserve(blocks: range) -> bool:
    """Lock every block's file (and keep it open), or none of them."""
    PORT_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    taken: dict[Path, IO[bytes]] = {}
    for block in blocks:
        path = _block_path(block)
        if path in _RESERVED:
            break
        lock = open(path, "ab")  # noqa: SIM115 -- held open for the process's lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            break
        taken[path] = lock
    else:
        _RESERVED.update(taken)
        return True
    for lock in taken.values():
        lock.close()
    return False


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_free(host: str, port: int) -> bool:
    return _bind_error(host, port, reuse=False) is None


def _bind_error(host: str, port: int, *, reuse: bool) -> int | None:
    """The errno of binding ``port`` on ``host`` now (with ``SO_REUSEADDR`` if
    ``reuse``), None when it binds."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno or -1
    return None


def broker_command(
    topology: Path,
    broker_id: str,
    mode: str | None = None,
    config: Path | None = None,
    log_level: str | None = None,
    keys: Path | None = None,
    log_format: str | None = None,
    python: str = sys.executable,
    data_dir: Path | None = None,
    stomp: bool = False,
) -> list[str]:
    """The command line that runs broker ``broker_id`` of ``topology`` as its own process
    (``octopis-broker`` through the interpreter ``python``, this one by default); unset
    options keep the CLI's defaults; without ``keys`` the broker runs ``--insecure``;
    ``stomp`` turns its STOMP listener on (DESIGN §13)."""
    command = [python, "-m", BROKER_MODULE, "--topology", str(topology)]
    command += ["--id", broker_id]
    command += ["--keys", str(keys)] if keys is not None else ["--insecure"]
    for option, value in (
        ("--mode", mode),
        ("--config", config),
        ("--log-level", log_level),
        ("--log-format", log_format),
        ("--data-dir", data_dir),
    ):
        if value is not None:
            command += [option, str(value)]
    return [*command, "--stomp"] if stomp else command


def prepare_topology(
    run_dir: Path, *, topology: Path | None = None, preset: str | None = None, room: int = 0
) -> tuple[Scot, Path]:
    """The topology to launch and its file: a given file, or a preset on free ports (with
    ports for ``room`` brokers more after them: an overlay that will grow)."""
    if topology is not None:
        return load_topology(topology), topology
    scot = build_preset(preset or "fig2")
    base_port = find_free_base_port(len(scot.brokers) + room)
    scot = build_preset(preset or "fig2", base_port=base_port)
    path = run_dir / f"{scot.name}.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(scot.to_json(), indent=1))
    return scot, path


class LocalCluster:
    """The broker processes of one topology on this machine: every broker, or those the
    topology places on one host (DESIGN §10: several machines, one topology file)."""

    def __init__(
        self,
        scot: Scot,
        topology_path: Path,
        mode: str,
        run_dir: Path,
        settings: BrokerSettings | None = None,
        log_level: str = "INFO",
        *,
        secure: bool = True,
        log_format: str = "text",
        keys: Path | None = None,
        host: str | None = None,
        stomp: bool = False,
        forked: bool = False,
    ) -> None:
        if keys is not None and not secure:
            raise ClusterError("a keys directory and insecure brokers exclude each other")
        self.scot = scot
        self.given_keys = keys is not None
        """The keys directory was handed in (a deployment's, made by ``octopis-topology
        keys``); otherwise :meth:`spawn` makes the pairs in ``<run-dir>/keys``."""
        self.keys_dir = keys if keys is not None else (run_dir / "keys" if secure else None)
        """The keys the brokers and this cluster's clients use; None: insecure."""
        self.host = host
        self.stomp = stomp
        """The brokers serve STOMP clients too (their topology entries' endpoints)."""
        self.forked = forked
        """Brokers are forked from a zygote that imported them once
        (:mod:`octopis.cluster.forked`), not executed afresh: for a launcher that stops
        them before it exits (the zygote stops them when the launcher is gone)."""
        self.local = scot.brokers_on(host) if host is not None else list(scot.brokers)
        """The brokers :meth:`spawn` starts: all, or those placed on ``host``."""
        self.topology_path = topology_path
        self.mode = mode
        self.run_dir = run_dir
        self.settings = settings or BrokerSettings()
        self.log_level = log_level
        self.log_format = log_format
        self.processes: dict[str, subprocess.Popen | ForkedBroker] = {}
        self.killed: set[str] = set()
        self._rpc: dict[str, Any] = {}
        self._rpc_loop: asyncio.AbstractEventLoop | None = None
        self._rpc_lock: asyncio.Lock | None = None

    # -- processes -----------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the process of every broker of :attr:`local` (does not wait for them)."""
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "broker.toml").write_text(self.settings.to_toml())
        if self.keys_dir is not None and not self.given_keys:
            make_keys(self.keys_dir, self.scot.endpoints_by_broker())
        for broker_id in self.local:
            self.spawn_one(broker_id)

    def spawn_one(self, broker_id: str) -> subprocess.Popen | ForkedBroker:
        """Start broker ``broker_id`` with the run's settings, appending to its log."""
        self.killed.discard(broker_id)
        log_path = self.run_dir / "logs" / f"{broker_id.replace(':', '_')}.log"
        command = broker_command(
            self.topology_path,
            broker_id,
            self.mode,
            self.run_dir / "broker.toml",
            self.log_level,
            self.keys_dir,
            self.log_format,
            data_dir=self.run_dir / "data",
            stomp=self.stomp,
        )
        if self.forked:
            process: subprocess.Popen | ForkedBroker = fork_broker(command, log_path)
        else:
            with open(log_path, "ab") as log_file:
                process = subprocess.Popen(
                    command,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        self.processes[broker_id] = process
        return process

    @classmethod
    def from_state(cls, run_dir: Path) -> tuple[LocalCluster, dict[str, int]]:
        """The cluster ``octopis up`` recorded in ``run_dir`` (its settings included) and
        the pids it recorded; :class:`octopis.overlay.OverlayError` if there is none."""
        state = read_state(run_dir)
        topology = Path(state["topology"])
        settings = BrokerSettings()
        config = run_dir / "broker.toml"
        if config.exists():
            settings = load_settings(config)
        cluster = cls(
            load_topology(topology),
            topology,
            state["mode"],
            run_dir,
            settings,
            secure=state.get("secure", True),
            log_format=state.get("log_format", "text"),
            keys=Path(state["keys"]) if state.get("keys") else None,
            host=state.get("host"),
        )
        return cluster, {b: int(p) for b, p in state["pids"].items()}

    def write_state(self, pids: dict[str, int] | None = None) -> Path:
        """Record pids (those started here, over ``pids``) and endpoints so ``octopis
        down``, ``status`` and ``restart`` can find the processes."""
        state = {
            "topology": str(self.topology_path),
            "mode": self.mode,
            "secure": self.keys_dir is not None,
            "keys": str(self.keys_dir.resolve()) if self.given_keys else None,
            "host": self.host,
            "log_format": self.log_format,
            "pids": {**(pids or {}), **{b: p.pid for b, p in self.processes.items()}},
            "control": {b: i.control_endpoint for b, i in self.scot.brokers.items()},
            "clients": {b: i.client_endpoint for b, i in self.scot.brokers.items()},
        }
        path = self.run_dir / STATE_FILE
        path.write_text(json.dumps(state, indent=1))
        return path

    def kill(self, broker_id: str) -> None:
        """``kill -9`` broker ``broker_id`` (a failure on purpose: :meth:`dead` leaves it
        out until :meth:`spawn_one` starts it again)."""
        process = self.processes[broker_id]
        self.killed.add(broker_id)
        process.kill()
        process.wait()

    def pause(self, broker_id: str, stopped: bool) -> None:
        """Stop (SIGSTOP) or resume (SIGCONT) ``broker_id``'s process: a stall, the same
        process before and after (DESIGN §7)."""
        _signal(self.processes[broker_id].pid, signal.SIGSTOP if stopped else signal.SIGCONT)

    def dead(self) -> dict[str, int]:
        """Brokers whose process has exited (not killed on purpose), with their status."""
        return {
            b: p.returncode
            for b, p in self.processes.items()
            if p.poll() is not None and b not in self.killed
        }

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate every process started here; kill those still alive after ``timeout``.
        The brokers' port blocks, if this process reserved them, are handed out again
        (:func:`release_ports`)."""
        stop_pids(
            {b: p.pid for b, p in self.processes.items()},
            timeout,
            reap={p.pid: p for p in self.processes.values()},
        )
        release_ports(
            urlsplit(endpoint).port or 0
            for info in self.scot.brokers.values()
            for endpoint in dataclasses.astuple(info)
            if isinstance(endpoint, str) and "://" in endpoint
        )

    # -- control RPC ---------------------------------------------------------------------

    async def connect_control(self) -> None:
        """Open one RPC client per broker (again, if the event loop changed). Safe for
        concurrent callers: one opens the missing clients while the others wait, so no
        broker gets two clients (the first of which would leak)."""
        loop = asyncio.get_running_loop()
        if self._rpc_loop is not loop or self._rpc_lock is None:
            self._rpc.clear()
            self._rpc_loop = loop
            self._rpc_lock = asyncio.Lock()
        if all(b in self._rpc for b in self.scot.brokers):
            return
        async with self._rpc_lock:
            for broker_id, info in self.scot.brokers.items():
                if broker_id not in self._rpc:
                    self._rpc[broker_id] = await self._control_client(info.control_endpoint, 5)

    async def _control_client(self, endpoint: str, timeout: float) -> aiozmq.rpc.RPCClient:
        """An RPC client of the control socket at ``endpoint``, with the admin key unless
        the cluster runs insecure."""
        client = await aiozmq.rpc.connect_rpc(timeout=timeout)
        if self.keys_dir is not None:
            keys = Keys(self.keys_dir)
            sock = client.transport.get_extra_info("zmq_socket")
            connect_securely(sock, keys.admin(), keys.server_key(endpoint))
        await client.transport.connect(endpoint)
        return client

    def forget(self, broker_id: str) -> Any:
        """Drop broker ``broker_id``'s kept RPC client (it left the overlay); returns it
        (for the caller to close) or None."""
        return self._rpc.pop(broker_id, None)

    async def call_all(self, method: str) -> dict[str, Any]:
        """Call ``method`` on every broker's control RPC."""
        await self.connect_control()
        ids = list(self._rpc)
        results = await asyncio.gather(*(getattr(self._rpc[b].call, method)() for b in ids))
        return dict(zip(ids, results, strict=True))

    async def call(self, broker_id: str, method: str, *args: Any) -> Any:
        """Call ``method(*args)`` on ``broker_id``'s control RPC."""
        await self.connect_control()
        return await getattr(self._rpc[broker_id].call, method)(*args)

    async def wait_ready(
        self, timeout: float = 120.0, ids: list[str] | None = None, *, state: str = "ready"
    ) -> float:
        """Wait until every broker of :attr:`local` (or of ``ids``) is ``ready`` (up with
        all links handshaken and every share in) or, with ``state="serving"``, serving
        (resynced from every live neighbour: a neighbour may be dead); returns the
        seconds."""
        started = time.monotonic()
        await self.connect_control()
        pending = set(ids or self.local)
        while pending:
            if dead := self.dead():
                raise ClusterError(
                    f"broker process(es) exited while starting: "
                    f"{_describe_dead(dead, self.run_dir)}"
                )
            if time.monotonic() - started > timeout:
                raise ClusterError(
                    f"{len(pending)} broker(s) not {state} after {timeout:.0f} s: "
                    f"{', '.join(sorted(pending)[:5])}"
                )
            for broker_id in list(pending):
                with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                    status = await asyncio.wait_for(self._rpc[broker_id].call.status(), 2.0)
                    if status[state]:
                        pending.discard(broker_id)
            if pending:
                await asyncio.sleep(0.2)
        return time.monotonic() - started

    async def ask(self, ids: list[str], method: str, timeout: float, *args: Any) -> dict[str, Any]:
        """``method(*args)`` of each broker of ``ids`` over its control RPC; None for a
        broker that does not answer within ``timeout`` seconds (dead, or not started)."""

        async def one(broker_id: str) -> Any:
            endpoint = self.scot.brokers[broker_id].control_endpoint
            try:
                client = await self._control_client(endpoint, timeout)
            except (OSError, TimeoutError):
                return None
            try:
                return await asyncio.wait_for(getattr(client.call, method)(*args), timeout)
            except TimeoutError:
                return None
            finally:
                client.close()

        answers = await asyncio.gather(*(one(b) for b in ids))
        return dict(zip(ids, answers, strict=True))

    async def close_control(self) -> None:
        """Close the RPC clients."""
        for client in self._rpc.values():
            client.close()
        for client in self._rpc.values():
            with contextlib.suppress(Exception):
                await client.wait_closed()
        self._rpc.clear()


def stop_pids(
    pids: dict[str, int],
    timeout: float = 10.0,
    reap: dict[int, subprocess.Popen | ForkedBroker] | None = None,
) -> list[str]:
    """SIGTERM every live pid, wait up to ``timeout``, SIGKILL the rest; returns killed ids."""
    reap = reap or {}
    for pid in pids.values():
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    alive = dict(pids)
    while alive and time.monotonic() < deadline:
        alive = {b: pid for b, pid in alive.items() if _alive(pid, reap.get(pid))}
        if alive:
            time.sleep(0.05)
    for pid in alive.values():
        _signal(pid, signal.SIGKILL)
    for pid in alive.values():
        _alive(pid, reap.get(pid), wait=2.0)
    return sorted(alive)


PORT_ROLES = (
    ("endpoint", "peer"),
    ("client_endpoint", "client"),
    ("control_endpoint", "control"),
    ("metrics_endpoint", "metrics"),
)
"""A broker's TCP endpoints (topology fields) and what each serves."""


def held_ports(scot: Scot, ids: list[str]) -> list[str]:
    """The TCP ports of brokers ``ids`` that cannot be bound on this machine now, each
    described with its broker, its role and the process that holds it (its pid and
    command line) when this user may see it; empty when every port is free.

    A port is tried as the brokers bind it (``SO_REUSEADDR``, as ZeroMQ and the metrics
    server set it), so a closed connection's ``TIME_WAIT`` does not count as held; an
    address this machine does not have is not a held port (the broker says so itself)."""
    wanted: dict[tuple[str, int], str] = {}
    for broker_id in ids:
        info = scot.brokers[broker_id]
        for field, role in PORT_ROLES:
            url = urlsplit(getattr(info, field) or "")
            if url.scheme in ("tcp", "http") and url.hostname and url.port:
                wanted[(url.hostname, url.port)] = f"{broker_id} {role}"
    held = [
        (host, port)
        for host, port in wanted
        if _bind_error(host, port, reuse=True) == errno.EADDRINUSE
    ]
    holders = _listeners({port for _, port in held}) if held else {}
    unseen = "a process this user cannot see"
    return [
        f"{host}:{port} ({wanted[(host, port)]}) held by {holders.get(port, unseen)}"
        for host, port in held
    ]


def _listeners(ports: set[int]) -> dict[int, str]:
    """``pid N (command line)`` of the process listening on each of ``ports``, as far
    as this user may see."""
    found: dict[int, str] = {}
    with contextlib.suppress(psutil.Error):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port in ports and conn.pid:
                with contextlib.suppress(psutil.Error):
                    command = " ".join(psutil.Process(conn.pid).cmdline())[:120]
                    found.setdefault(conn.laddr.port, f"pid {conn.pid} ({command})")
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _alive(pid: int, process: subprocess.Popen | ForkedBroker | None, wait: float = 0.0) -> bool:
    if process is not None:
        try:
            process.wait(timeout=wait or 0.001)
        except subprocess.TimeoutExpired:
            return True
        return False
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe_dead(dead: dict[str, int], run_dir: Path) -> str:
    parts = []
    for broker_id, code in sorted(dead.items())[:3]:
        log_path = run_dir / "logs" / f"{broker_id.replace(':', '_')}.log"
        last = ""
        with contextlib.suppress(OSError):
            lines = log_path.read_text(errors="replace").strip().splitlines()
            last = lines[-1] if lines else ""
        parts.append(f"{broker_id} (status {code}: {last})")
    return "; ".join(parts)
