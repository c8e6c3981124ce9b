"""Broker processes forked from a process that has imported the broker once (DESIGN §2).

A broker process spends nearly all of its start-up importing its modules (~0.15 CPU-s
here). A launcher that starts and stops many overlays in its own lifetime (``octopis
run``, the test suite, the benchmarks) may fork each broker instead from one *zygote*:
a process (``python -m octopis.cli.zygote``) that imported them once and forks a
child per request. Every broker is still its own OS process in its own session, logging
to its own file, running exactly what ``python -m octopis.cli.broker`` runs. The zygote
lives as long as its launcher: when the launcher exits, the zygote stops the brokers it
forked (SIGTERM). Brokers that must outlive the launcher (``octopis up``) are executed
afresh (:func:`~octopis.cluster.launcher.broker_command`).

The zygote's protocol, one line each way: a request is a JSON object (``argv``, ``log``,
``env``, ``cwd``) on its stdin; it answers ``pid <pid>`` on its stdout, or ``error <message>``,
and says ``exit <pid> <status>`` when a child ends (the status as
:attr:`subprocess.Popen.returncode` gives it: minus the signal that ended it).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

BROKER_MODULE = "octopis.cli.broker"
ZYGOTE_MODULE = "octopis.cli.zygote"
FORK_TIMEOUT = 30.0
"""Seconds a fork may take before the zygote is taken for stuck."""


class ZygoteError(RuntimeError):
    """The zygote could not fork a broker, or is gone."""


class Zygote:
    """The launcher's side of one zygote process, started on first use."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._buffer = b""
        self._answers: deque[tuple[str, str]] = deque()
        """The zygote's answers (``pid``/``error``) to forks, in order."""
        self._forking = threading.Lock()
        """One fork at a time: a request, then its answer."""
        self._lock = threading.Lock()
        """Held while the zygote is started, and while its output is read and parsed
        (threads may wait on brokers, :func:`~octopis.cluster.launcher.stop_pids`)."""
        self.ended: dict[int, int] = {}
        """Child pid → exit status, as the zygote reported them, until its
        :class:`ForkedBroker` reads it (:meth:`take_status`): at most one entry per
        child forked and not yet seen to end."""

    def _started(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", ZYGOTE_MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            assert self._process.stdout is not None
            os.set_blocking(self._process.stdout.fileno(), False)
            self._buffer = b""
        return self._process

    def fork(self, argv: list[str], log_path: Path) -> int:
        """Fork a broker running ``argv`` (its arguments after ``-m octopis.cli.broker``)
        with this process's environment, its output appended to ``log_path``: its pid."""
        request = {"argv": argv, "log": str(log_path), "env": dict(os.environ), "cwd": os.getcwd()}
        with self._forking:
            with self._lock:
                process = self._started()
            assert process.stdin is not None
            try:
                process.stdin.write(json.dumps(request).encode() + b"\n")
                process.stdin.flush()
            except BrokenPipeError as exc:
                raise ZygoteError("the zygote is gone") from exc
            deadline = time.monotonic() + FORK_TIMEOUT
            while not self._answers:  # another thread may take the answer in: look again
                if time.monotonic() > deadline:
                    raise ZygoteError(f"the zygote did not answer in {FORK_TIMEOUT:g} s")
                self.collect(0.1)
            word, rest = self._answers.popleft()
        if word == "error":
            raise ZygoteError(rest)
        return int(rest)

    def collect(self, timeout: float | None = 0.0) -> None:
        """Take the zygote's lines that arrived (or arrive within ``timeout`` seconds,
        None: until one comes): an ended child goes to :attr:`ended`, the answer to a
        fork to the forking thread."""
        process = self._process
        if process is None or process.stdout is None:
            return
        fd = process.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return
        with self._lock:  # another thread may have read it meanwhile: the fd never blocks
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                raise ZygoteError(f"the zygote exited (status {process.wait()})")
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                word, _, rest = line.decode().partition(" ")
                if word == "exit":
                    pid, status = rest.split()
                    self.ended[int(pid)] = int(status)
                else:
                    self._answers.append((word, rest))

    def take_status(self, pid: int) -> int | None:
        """The exit status of child ``pid`` if it has ended (then forgotten here: the
        caller keeps it), else None."""
        return self.ended.pop(pid, None)


_zygote = Zygote()


class ForkedBroker:
    """A broker process forked by :func:`fork_broker`, handled as a
    :class:`subprocess.Popen` is (``pid``, ``poll``, ``wait``, ``returncode``, signals)."""

    def __init__(self, pid: int, args: list[str], zygote: Zygote) -> None:
        self.pid = pid
        self.args = args
        self._zygote = zygote
        self._status: int | None = None

    @property
    def returncode(self) -> int | None:
        """The exit status (minus the signal that ended it), None while it runs."""
        if self._status is None:
            self._status = self._zygote.take_status(self.pid)
        return self._status

    def poll(self) -> int | None:
        """The exit status if the process has ended, else None."""
        self._zygote.collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, waiting up to ``timeout`` seconds (None: for ever);
        :class:`subprocess.TimeoutExpired` if it still runs then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._zygote.collect(left)
        return status

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process, unless it has ended."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as :meth:`subprocess.Popen.kill`."""
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM, as :meth:`subprocess.Popen.terminate`."""
        self.send_signal(signal.SIGTERM)


def fork_broker(command: list[str], log_path: Path) -> ForkedBroker:
    """Fork the broker of ``command`` (a :func:`~octopis.cluster.launcher.broker_command`
    through this interpreter) from this process's zygote, its output appended to
    ``log_path``; started, not waited for."""
    if command[:3] != [sys.executable, "-m", BROKER_MODULE]:
        raise ValueError(f"not a broker command line of this interpreter: {command[:3]}")
    return ForkedBroker(_zygote.fork(command[3:], log_path), command, _zygote)
