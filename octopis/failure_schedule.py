"""Failure schedules (DESIGN §7): which brokers die and which links are cut, and when.

Given as ``BROKER@T[:RESTART_T]``, ``A-B@T[:UP_T]`` and ``BROKER@T:RESUME_T`` (a stall:
the process is stopped, SIGSTOP, and resumed as the same process, as a long GC pause or a
VM hiccup would), times in seconds from the first publication, or as a schedule file with
one such item per line, prefixed ``broker``, ``link`` or ``stall`` (``#`` starts a
comment). The simulator (``octopis sim``, a stall as :mod:`octopis.sim.pauses` says) and
the process runner (``octopis run``: brokers and stalls) read the same schedules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


class FailureSpecError(ValueError):
    """A failure that cannot be read, naming the problem."""


@dataclass(frozen=True)
class Failure:
    """A broker (``ends`` of one) or a link (``ends`` of two) fails at ``at`` and comes
    back at ``until`` (None: never); a ``stall`` is a broker stopped and resumed as the
    same process; a ``one_way`` link failure loses only what ``ends[0]`` sends
    ``ends[1]`` (the simulator's model: see :mod:`octopis.sim.failures`)."""

    ends: tuple[str, ...]
    at: float
    until: float | None = None
    stall: bool = False
    one_way: bool = False

    @property
    def is_broker(self) -> bool:
        """A dead broker rather than a down link or a stall."""
        return len(self.ends) == 1 and not self.stall


def parse_failure(text: str, *, link: bool, stall: bool = False) -> Failure:
    """Read ``BROKER@T[:RESTART_T]`` (``link=False``), ``A-B@T[:UP_T]`` or, with
    ``stall``, ``BROKER@T:RESUME_T``."""
    form = "BROKER@T:RESUME_T" if stall else "A-B@T[:UP_T]" if link else "BROKER@T[:RESTART_T]"
    what, sep, when = text.strip().partition("@")
    if not sep or not what:
        raise FailureSpecError(f"failure {text!r}: expected {form}")
    ends = tuple(what.split("-")) if link else (what,)
    if link and (len(ends) != 2 or not all(ends) or ends[0] == ends[1]):
        raise FailureSpecError(f"link failure {text!r}: name two different brokers as A-B")
    start, _, end = when.partition(":")
    try:
        at = float(start)
        until = float(end) if end else None
    except ValueError:
        raise FailureSpecError(f"failure {text!r}: times must be numbers of seconds") from None
    if not math.isfinite(at) or at < 0 or (until is not None and not until > at):
        raise FailureSpecError(f"failure {text!r}: need 0 <= T < RESTART_T (finite)")
    if stall and until is None:
        raise FailureSpecError(f"stall {text!r}: give the time it resumes, {form}")
    return Failure(ends, at, until, stall)


def read_schedule(path: Path) -> list[Failure]:
    """The failures of a schedule file: ``broker SPEC`` or ``link SPEC`` per line."""
    failures = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, spec = line.partition(" ")
        if kind not in ("broker", "link", "stall"):
            raise FailureSpecError(
                f"{path}:{number}: start with 'broker', 'link' or 'stall', not {kind!r}"
            )
        try:
            failures.append(parse_failure(spec, link=kind == "link", stall=kind == "stall"))
        except FailureSpecError as exc:
            raise FailureSpecError(f"{path}:{number}: {exc}") from None
    return failures
