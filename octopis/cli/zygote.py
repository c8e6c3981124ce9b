"""``python -m octopis.cli.zygote``: import the broker once, then fork a broker process per
request (:mod:`octopis.cluster.forked` says the protocol and who starts it)."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import traceback
from typing import Any

from octopis.cli import broker

PRELOAD = ("octopis.transport.broker", "octopis.transport.serving")
"""What a broker imports besides its CLI, imported once by the zygote for every child."""


def main() -> int:
    """Fork a child per request line on stdin, say ``pid``, ``error`` and ``exit`` lines
    on stdout; at the end of stdin (the launcher is gone) SIGTERM the children still
    running."""
    for module in PRELOAD:
        importlib.import_module(module)
    out = sys.stdout.fileno()
    children: set[int] = set()

    def say(text: str) -> None:
        with contextlib.suppress(BrokenPipeError):  # the launcher is gone: stdin ends next
            os.write(out, f"{text}\n".encode())

    def reap(_signum: int, _frame: Any) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")

    signal.signal(signal.SIGCHLD, reap)
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            argv, log, env, cwd = request["argv"], request["log"], request["env"], request["cwd"]
        except (ValueError, KeyError, TypeError) as exc:
            say(f"error malformed request: {exc}")
            continue
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
            if pid == 0:
                _child(argv, log, env, cwd)
            children.add(pid)
            say(f"pid {pid}")
        except OSError as exc:
            say(f"error cannot fork: {exc}")
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return 0


def _child(argv: list[str], log: str, env: dict[str, str], cwd: str) -> None:
    """The forked broker: its own session, stdout and stderr appended to ``log``, stdin
    from ``/dev/null``, the launcher's environment and directory, then the broker's
    :func:`~octopis.cli.broker.main`, as ``python -m octopis.cli.broker`` runs it; never
    returns (exits with the broker's status)."""
    status = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.setsid()
        log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = [broker.__name__, *argv]
        status = broker.main(argv)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:
        traceback.print_exc()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
