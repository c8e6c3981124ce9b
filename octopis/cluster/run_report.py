"""What ``octopis run`` adds up for its report (DESIGN §4, §9): the brokers' counters
since the run began, how far and how deep each subscription spread, the balancer's
effect on delays, and deliveries over time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from octopis.accounting import DeliveryLedger, delay_distribution, delivery_series
from octopis.balance.loop import Balancer
from octopis.cluster.harness import ShareStats


@dataclass
class RunCounts:
    """The brokers' counters over a run: core and shell counters (zeros dropped),
    seconds spent matching, copies put on links, their queue lengths summed, and the
    longest queue a copy found."""

    core: Counter[str] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    match_seconds: float = 0.0
    copies: int = 0
    queued: int = 0
    longest: int = 0

    @classmethod
    def since(
        cls, baseline: dict[str, dict[str, Any]], stats: dict[str, dict[str, Any]]
    ) -> RunCounts:
        """What each broker counted from its ``baseline`` stats to ``stats`` (a broker
        restarted meanwhile counts from zero)."""
        counts = cls()
        for broker, s in stats.items():
            before = baseline.get(broker)
            if before is not None and before["incarnation"] == s["incarnation"]:
                counts.core.subtract(before["core"])
                counts.counters.subtract(before["counters"])
                counts.match_seconds -= before["matching"]["seconds"]
                counts.copies -= before["queue_seen"]["copies"]
                counts.queued -= before["queue_seen"]["total"]
            counts.copies += s["queue_seen"]["copies"]
            counts.queued += s["queue_seen"]["total"]
            counts.longest = max(counts.longest, s["queue_seen"]["max"])
            counts.core.update(s["core"])
            counts.counters.update(s["counters"])
            counts.match_seconds += s["matching"]["seconds"]
        counts.core, counts.counters = +counts.core, +counts.counters
        return counts


def subscription_spread(
    subscriptions: dict[str, dict[str, Any]], ours: Collection[str]
) -> tuple[dict[str, float], dict[str, int]]:
    """Per subscription of ``ours``: the longest any broker of ``subscriptions`` (broker
    → sub id → (seconds, hops)) took to store it, and the most hops it travelled."""
    delay: dict[str, float] = {}
    depth: dict[str, int] = {}
    for per_broker in subscriptions.values():
        for sub_id, (seconds, hops) in per_broker.items():
            if sub_id in ours:
                delay[sub_id] = max(delay.get(sub_id, 0.0), seconds)
                depth[sub_id] = max(depth.get(sub_id, 0), hops)
    return delay, depth


def balance_report(
    balancer: Balancer,
    stopped_early: str,
    arrivals: list[tuple[float, float]],
    client_stats: ShareStats,
) -> dict[str, Any]:
    """The ``balancer``'s report (``stopped_early``: why it stopped before publishing
    ended), with the notification delay of the deliveries made in the last quarter of
    the run (the balanced state, if it got there; the moves ordered in it are counted)
    and, if it moved anyone, of those made before its first move was ordered
    (``arrivals``: the wall time and delay of each delivery); and what the clients'
    connections saw of moves (``client_stats``)."""
    report = balancer.report()
    report["stopped_early"] = stopped_early
    ordered = [m["wall"] for m in report["decisions"] if not m["error"]]
    if arrivals:
        times = [t for t, _ in arrivals]
        start, end = min(times), max(times)
        tail = end - (end - start) / 4
        after = [d for t, d in arrivals if t >= tail]
        report["delay_after"] = delay_distribution(after)
        report["deliveries_after"] = len(after)
        report["moves_in_last_quarter"] = sum(w >= tail for w in ordered)
        if ordered:
            before = [d for t, d in arrivals if t < ordered[0]]
            report["delay_before"] = delay_distribution(before)
            report["deliveries_before"] = len(before)
    report["moves_made"] = client_stats.moves
    report["stale_move_orders_ignored"] = client_stats.stale_moves
    report["sdk_duplicates_absorbed"] = client_stats.duplicates_absorbed
    report["sdk_failovers"] = client_stats.failovers
    report["sdk_unclaimed_deliveries"] = client_stats.unclaimed
    report["sdk_repeats_forgotten_early"] = client_stats.repeats_forgotten_early
    return report


def series(
    published_at: dict[tuple[str, int], float],
    ledger: DeliveryLedger,
    arrivals: list[tuple[float, float]],
    width: float,
) -> list[dict[str, float]]:
    """Per ``width`` seconds since the first publication (``published_at``: when each was
    sent): notifications published,
    deliveries made (and their delay) and deliveries lost, the lost ones counted in
    the interval their notification was published in."""
    if not published_at:
        return []
    start = min(published_at.values())
    lost_at = [published_at[key[1:]] for key in ledger.expected - ledger.received.keys()]
    return delivery_series(start, width, published_at.values(), arrivals, lost_at)
