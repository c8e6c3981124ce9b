"""Exactly-once delivery accounting: expected, delivered, duplicated, lost (DESIGN §4).

The ledger is the oracle: it keeps the subscriptions active at each publication, matches
the publication against them with its own matcher and expects one delivery per
interested *subscriber*. Deliveries are then counted against that expectation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from octopis.filters.language import Publication, Subscription

DeliveryKey = tuple[str, str, int]
"""``(subscriber, publisher, seq)``."""


class DeliveryLedger:
    """Expected versus received deliveries, and delivery delays."""

    def __init__(self, matcher_factory: Callable[[], Any] | None = None) -> None:
        if matcher_factory is None:
            from octopis.matching import Matcher

            matcher_factory = Matcher
        self._oracle = matcher_factory()
        self._owner: dict[Any, str] = {}
        self._subscriptions: dict[Any, Subscription] = {}
        self.expected: set[DeliveryKey] = set()
        self.received: Counter[DeliveryKey] = Counter()
        self.delays: list[float] = []
        self.overlay_delays: list[float] = []
        """Per delivery whose broker stamped it: publishing → leaving the last broker."""
        self.client_delays: list[float] = []
        """The same deliveries: leaving the last broker → the SDK's callback."""
        self.notifications = 0

    def subscribed(self, subscriber: str, key: Any, subscription: Subscription) -> None:
        """``subscriber`` holds ``subscription`` (under a unique ``key``) from now on."""
        self._oracle.add(key, subscription)
        self._owner[key] = subscriber
        self._subscriptions[key] = subscription

    @property
    def subscription_keys(self) -> Collection[Any]:
        """The keys of the subscriptions held now."""
        return self._owner.keys()

    def subscription_of(self, key: Any) -> Subscription:
        """The subscription held under ``key``."""
        return self._subscriptions[key]

    def unsubscribed(self, key: Any) -> None:
        """The subscription ``key`` no longer counts for later publications."""
        self._oracle.remove(key)
        del self._owner[key]
        del self._subscriptions[key]

    def published(self, publisher: str, seq: int, publication: Publication) -> int:
        """Record a publication; returns how many subscribers should receive it."""
        self.notifications += 1
        interested = {self._owner[k] for k in self._oracle.match(publication)}
        self.expected.update((s, publisher, seq) for s in interested)
        return len(interested)

    def delivered(
        self,
        subscriber: str,
        publisher: str,
        seq: int,
        delay: float | None = None,
        overlay_delay: float | None = None,
    ) -> None:
        """``subscriber`` received ``(publisher, seq)``, ``delay`` seconds after publishing,
        ``overlay_delay`` of them before it left the last broker (if known)."""
        self.received[(subscriber, publisher, seq)] += 1
        if delay is not None:
            self.delays.append(delay)
            if overlay_delay is not None and overlay_delay == overlay_delay:  # not NaN
                self.overlay_delays.append(overlay_delay)
                self.client_delays.append(delay - overlay_delay)

    def summary(self, among: Callable[[DeliveryKey], bool] | None = None) -> dict[str, int]:
        """``expected_deliveries``, ``delivered``, ``duplicates``, ``lost``, ``unexpected``;
        only for the ``(subscriber, publisher, seq)`` keys ``among`` accepts, if given."""
        expected, received = self.expected, self.received
        if among is not None:
            expected = {key for key in expected if among(key)}
            received = Counter({key: n for key, n in received.items() if among(key)})
        got = set(received)
        return {
            "expected_deliveries": len(expected),
            "delivered": len(got & expected),
            "duplicates": sum(received.values()) - len(got),
            "lost": len(expected - got),
            "unexpected": len(got - expected),
        }

    def delay_summary(self) -> dict[str, float]:
        """Notification delay in seconds: mean, p50, p99, max, share under 1 s."""
        return delay_distribution(self.delays)

    def deliveries(self) -> Iterator[dict[str, Any]]:
        """One record per delivery (duplicates repeated): subscriber, publisher, seq."""
        for (subscriber, publisher, seq), count in sorted(self.received.items()):
            for _ in range(count):
                yield {"subscriber": subscriber, "publisher": publisher, "seq": seq}


def distribution(values: Iterable[float]) -> dict[str, float]:
    """Mean, p50, p99 and max of ``values`` (NaN when empty)."""
    ordered = sorted(values)
    if not ordered:
        return {"mean": math.nan, "p50": math.nan, "p99": math.nan, "max": math.nan}

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "mean": sum(ordered) / len(ordered),
        "p50": pct(0.50),
        "p99": pct(0.99),
        "max": ordered[-1],
    }


def delay_distribution(delays: Iterable[float]) -> dict[str, float]:
    """:func:`distribution` of delays in seconds plus the share under one second (§7.3)."""
    values = list(delays)
    under = sum(d < 1.0 for d in values) / len(values) if values else math.nan
    return {**distribution(values), "under_1s": under}


FAILURE_STATS = ("undeliverable", "held", "tunnel", "dedup", "custody", "dnr_detour")
"""Prefixes of the core counters a failure report shows (DESIGN §7)."""

DNR_CASES = ("dnr_case_1", "dnr_case_2", "dnr_case_3", "dnr_kept_off")


def run_report(
    mode: str,
    brokers: int,
    subscriptions: int,
    ledger: DeliveryLedger,
    core: Mapping[str, int],
    depths: Collection[int],
    subscription_delays: Iterable[float],
) -> dict[str, Any]:
    """The counts every run reports, simulated or real (paper §7): messages of each kind
    from the cores' ``sent.*`` counters, the subscriptions the brokers took from their
    subscribers (``subscriptions_made``: more than ``subscriptions`` when a client
    subscribed again after a fail-over or a move, each starting an SBP of its own),
    subscription tree lengths (``depths``, one per
    stored subscription), delays, and the ledger's expected/delivered/duplicates/lost."""
    report: dict[str, Any] = {
        "mode": mode,
        "brokers": brokers,
        "subscriptions": subscriptions,
        "notifications": ledger.notifications,
        "subscriptions_made": core.get("subscriptions_made", 0),
        "sbp_messages": core.get("sent.subscribe", 0),
        "sbp_duplicates": core.get("sbp_duplicates", 0),
        "sbp_quenched": core.get("covering.quenched", 0),
        "unsubscribe_messages": core.get("sent.unsubscribe", 0),
        "avg_subscription_tree_length": sum(depths) / len(depths) if depths else 0.0,
        "max_subscription_tree_length": max(depths, default=0),
        "notification_messages": core.get("sent.notification", 0),
        "matching_operations": core.get("matching", 0),
        **ledger.summary(),
        "subscription_delay": delay_distribution(subscription_delays),
        "notification_delay": ledger.delay_summary(),
    }
    if ledger.overlay_delays:  # processes: the overlay's share and the client side's
        report["overlay_delay"] = delay_distribution(ledger.overlay_delays)
        report["client_delay"] = delay_distribution(ledger.client_delays)
    if mode == "bid":
        report["bids_carried"] = core.get("bids_carried", 0)
    if mode == "dnr":
        report.update((key, core.get(key, 0)) for key in DNR_CASES)
    return report


def failure_counts(core: Mapping[str, int]) -> dict[str, int]:
    """The cores' failure counters (:data:`FAILURE_STATS`), sorted by name."""
    return {k: n for k, n in sorted(core.items()) if k.split(".")[0] in FAILURE_STATS}


def host_split(
    ledger: DeliveryLedger, host_of: Mapping[str, str], failed: Collection[str]
) -> dict[str, dict[str, int]]:
    """Deliveries split by whether the subscriber's host broker (``host_of``) failed."""
    return {
        "host_alive": ledger.summary(lambda key: host_of[key[0]] not in failed),
        "host_dead": ledger.summary(lambda key: host_of[key[0]] in failed),
    }


def replay_summary(
    counts: Mapping[str, int],
    failed_over: Collection[str],
    gaps: Mapping[str, Collection[str]],
    seam_gaps: Mapping[str, Collection[str]],
) -> dict[str, Any]:
    """The ``replays`` of a simulated run's failure report: the replays' ``counts``
    (requests, what they delivered, repeats dropped), the subscribers that failed over,
    and how many subscribers are left with a replay gap or a seam gap (``gaps`` and
    ``seam_gaps``: each subscriber's brokers still missing)."""
    return {
        **counts,
        "subscribers_failed_over": len(failed_over),
        "gaps": sum(1 for g in gaps.values() if g),
        "seam_gaps": sum(1 for g in seam_gaps.values() if g),
    }


def failure_report(
    counts: Mapping[str, int],
    held: int,
    core: Mapping[str, int],
    split: Mapping[str, dict[str, int]],
    replays: dict[str, Any],
) -> dict[str, Any]:
    """The ``failures`` part of a simulated run's report: the run's failure ``counts``
    (the simulator's, the nodes' and the links'), the copies still ``held`` at the end
    (if any), the cores' failure counters (``core``, :func:`failure_counts`), the
    deliveries ``split`` by host (:func:`host_split`) and the ``replays``
    (:func:`replay_summary`)."""
    return {
        **counts,
        **({"undeliverable.held_at_end": held} if held else {}),
        **failure_counts(core),
        **split,
        "replays": replays,
    }


def cpu_shares(
    busy: Mapping[str, float], end: float, brokers: int, idle: float
) -> dict[str, Any] | None:
    """The busiest of ``brokers`` CPUs (``busy``: seconds each was charged) and its share
    of the run (``end`` seconds), the mean share, and the ``idle`` share of a second the
    service model does not charge (None: nothing ran)."""
    if end <= 0:
        return None
    busiest = max(busy, key=busy.__getitem__, default=None)
    return {
        "busiest": busiest,
        "busiest_share": busy[busiest] / end if busiest else 0.0,
        "mean_share": sum(busy.values()) / brokers / end,
        "idle_not_charged": idle,
    }


def simulation_report(
    run: dict[str, Any],
    *,
    covering: str,
    moves: Mapping[str, int],
    balance: dict[str, Any] | None,
    times: tuple[float, float],
    cpu_busy: dict[str, Any] | None,
    target_queue: Collection[float],
    timeline: Sequence[tuple[float, int]],
    failures: dict[str, Any] | None,
) -> dict[str, Any]:
    """A simulated run's report: :func:`run_report`'s ``run`` and what only the simulator
    reports, each when there is something to: the ``covering`` mode (not under BID), the
    subscriber ``moves``, the balancer's rounds (``balance``), the simulated and the wall
    time (``times``), the CPUs' shares (:func:`cpu_shares`), the lengths of the target
    queues, the queue ``timeline`` sampled, and the ``failures`` (:func:`failure_report`)."""
    report = dict(run)
    if run["mode"] != "bid":
        report["covering"] = covering
    if moves:
        report["moves"] = dict(moves)
    if balance is not None:
        report["balance"] = balance
    report["sim_time"], report["wall_time"] = times
    if cpu_busy is not None:
        report["cpu_busy"] = cpu_busy
    if target_queue:
        report["target_queue_length"] = distribution(target_queue)
    if timeline:
        report["queue_timeline"] = [[round(t, 6), n] for t, n in timeline]
    if failures is not None:
        report["failures"] = failures
    return report


_EMPTY_BIN = {"published": 0, "delivered": 0, "lost": 0, "delay_mean": 0.0, "delay_max": 0.0}


def delivery_series(
    start: float,
    width: float,
    published: Iterable[float],
    arrivals: Iterable[tuple[float, float]],
    lost: Iterable[float],
) -> list[dict[str, float]]:
    """Bins of ``width`` seconds from ``start`` (all wall times): ``published`` (times of
    publication), ``delivered`` and their ``delay_mean``/``delay_max`` (``arrivals`` are
    (time, delay)), and ``lost`` (publication times of the expected deliveries that never
    came); ``t`` is the bin's start relative to ``start``."""
    bins: dict[int, dict[str, float]] = {}

    def at(t: float) -> dict[str, float]:
        i = max(0, int((t - start) / width))
        if i not in bins:
            bins[i] = dict(_EMPTY_BIN)
        return bins[i]

    for t in published:
        at(t)["published"] += 1
    for t, delay in arrivals:
        b = at(t)
        b["delivered"] += 1
        b["delay_mean"] += delay
        b["delay_max"] = max(b["delay_max"], delay)
    for t in lost:
        at(t)["lost"] += 1
    series = []
    for i in range(max(bins, default=-1) + 1):
        b = bins.get(i) or dict(_EMPTY_BIN)
        if b["delivered"]:
            b["delay_mean"] /= b["delivered"]
        series.append({"t": i * width, **b})
    return series
