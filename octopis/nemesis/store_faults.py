"""Faults of the brokers' retention stores in the nemesis (DESIGN §7, §11): a disk that
fills for a while, and a machine that loses power with its store's last commits not yet
on disk (:mod:`octopis.sim.stores` models both as the broker process's store lives
them), drawn from a seed apart from the other faults, and the check of what the stores
confirmed.

A store's contract is read publication by publication: one confirmed to its publisher
is still in its broker's store at the end, or the store says it lost it and why (a power
failure with ``[retention] sync = "normal"``, or its bound trimmed it); one its disk
refused was refused to its publisher, by name, and is counted refused, not lost.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from octopis.failure_schedule import Failure
from octopis.sim.engine import Simulator

STORE_KINDS = ("disk-full", "power-loss")
SYNCS = ("normal", "full")
"""``[retention] sync``: a confirm waits for the commit to be in the operating system's
cache (``normal``) or on disk (``full``)."""
UNSYNCED = 2.0
"""The longest tail a store loses at a power failure with ``sync = "normal"``: the
seconds of commits the operating system had not written yet."""


@dataclass(frozen=True)
class DiskFull:
    """From ``at`` to ``until`` ``broker``'s disk is full: its store refuses commits."""

    broker: str
    at: float
    until: float


@dataclass(frozen=True)
class PowerLoss:
    """At ``at`` ``broker``'s machine loses power (the broker dies, as in a crash) and it
    starts again at ``until``; its store, run with ``sync``, loses the commits of the
    last ``unsynced`` seconds if ``sync`` is ``normal``."""

    broker: str
    at: float
    until: float
    sync: str
    unsynced: float


StoreFault = DiskFull | PowerLoss


def draw_store_faults(
    seed: int,
    publishers: list[str],
    duration: float,
    busy: list[Failure],
) -> tuple[StoreFault, ...]:
    """One store fault in three seeds (drawn apart, as the nemesis's other late
    additions: earlier draws stay what they were), at a broker whose publishers publish
    (``publishers``: their brokers), within the first ``duration`` less a second: a disk
    full for 0.5-3 s, or a power failure of 0.2-3 s, the store run with either ``sync``,
    losing up to :data:`UNSYNCED` seconds of commits with ``normal``. None where a
    pause of that broker (in ``busy``) overlaps the power failure (a process is not
    paused while its machine is off)."""
    rng = random.Random(f"{seed}/store")
    if not publishers or rng.random() >= 1 / 3:
        return ()
    kind = rng.choice(STORE_KINDS)
    broker = rng.choice(publishers)
    at = round(rng.uniform(0, duration - 1), 6)
    if kind == "disk-full":
        return (DiskFull(broker, at, round(at + rng.uniform(0.5, 3.0), 6)),)
    until = round(at + rng.uniform(0.2, 3.0), 6)
    sync = rng.choice(SYNCS)
    unsynced = round(rng.uniform(0.05, UNSYNCED), 6)
    if any(
        f.stall and f.ends == (broker,) and f.at < until and at < (f.until or duration)
        for f in busy
    ):
        return ()
    return (PowerLoss(broker, at, until, sync, unsynced),)


def store_fault_kind(fault: StoreFault) -> str:
    """One of :data:`STORE_KINDS`."""
    return "disk-full" if isinstance(fault, DiskFull) else "power-loss"


def store_fault_text(fault: StoreFault) -> str:
    """The fault as a line of a history."""
    if isinstance(fault, DiskFull):
        return f"disk-full {fault.broker} @{fault.at:.3f} until {fault.until:.3f}"
    tail = f", the last {fault.unsynced:.3f} s unsynced" if fault.sync == "normal" else ""
    return (f"power-loss {fault.broker} @{fault.at:.3f} until {fault.until:.3f} "
            f"(sync {fault.sync}{tail})")  # fmt: skip


def schedule_store_fault(sim: Simulator, fault: StoreFault, start: float) -> None:
    """Schedule ``fault`` on ``sim`` (times from ``start``)."""
    if isinstance(fault, DiskFull):
        sim._failure_state()  # the stores keep what is published from the first fault on
        sim.at(start + fault.at, sim.retention.fill, fault.broker)
        sim.at(start + fault.until, sim.retention.free, fault.broker)
        return
    sim.fail(Failure((fault.broker,), fault.at, fault.until), start)
    sim.at(start + fault.at, _power_loss, sim, fault)


def _power_loss(sim: Simulator, fault: PowerLoss) -> None:
    sim.power_loss(fault.broker, fault.sync, fault.unsynced)


def check_stores(sim: Simulator) -> tuple[list[str], dict[str, int], list[str]]:
    """What the stores confirmed against what they hold: the problems (a publication
    confirmed to its publisher and gone from its store, no loss said), the counts
    (``confirmed``, ``refused``: before routing or after, ``store_lost``: losses the
    stores named), and the losses named, one line per store and reason."""
    retention = sim.retention
    held = {n.key for store in retention.kept.values() for n in store}
    vanished = sorted(
        key for key in retention.confirmed if key not in held and key not in retention.lost
    )
    problems = []
    if vanished:
        problems.append(f"{len(vanished)} confirmed to their publishers, gone from their "
                        f"stores, no loss said: {vanished[:3]}")  # fmt: skip
    losses = [f"{n} confirmed publications: {reason}"
              for reason, n in sorted(Counter(retention.lost.values()).items())]  # fmt: skip
    counts: dict[str, Any] = {
        "confirmed": len(retention.confirmed),
        "refused": len(retention.refused) + sim.failure_totals()["publications_refused.not_kept"],
        "store_lost": len(retention.lost),
    }
    return problems, counts, losses
