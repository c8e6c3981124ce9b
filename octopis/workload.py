"""Workload directories: what the simulator, ``octopis run`` and the Spark jobs exchange.

A workload is a directory holding

- ``meta.json``: ``{"format": "octopis-workload/1", ...}`` plus free-form provenance
  (generator, seed, counts, target and measured selectivity, topology name);
- ``subscriptions.parquet``: ``subscriber`` (string), ``broker`` (string), ``filter``
  (string, PADRES syntax), ``time`` (float64, seconds from the start);
- ``publications.parquet``: ``publisher`` (string), ``broker`` (string), ``seq`` (int64),
  ``time`` (float64 seconds), ``publication`` (string, PADRES syntax).

It is readable with pyarrow alone. A subscriber or publisher is attached to exactly one
broker; ``(publisher, seq)`` is unique. :func:`generate_workload` writes small stock-like
workloads without Spark (paper §7.1: quotes with 10 attributes, 2% selectivity).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from octopis.filters.language import (
    FilterError,
    Publication,
    Subscription,
    format_publication,
    parse_publication,
    parse_subscription,
)
from octopis.topology import Scot

FORMAT = "octopis-workload/1"
SUBSCRIPTIONS = "subscriptions.parquet"
PUBLICATIONS = "publications.parquet"
META = "meta.json"

SUBSCRIPTION_SCHEMA = pa.schema(
    [
        ("subscriber", pa.string()),
        ("broker", pa.string()),
        ("filter", pa.string()),
        ("time", pa.float64()),
    ]
)
PUBLICATION_SCHEMA = pa.schema(
    [
        ("publisher", pa.string()),
        ("broker", pa.string()),
        ("seq", pa.int64()),
        ("time", pa.float64()),
        ("publication", pa.string()),
    ]
)


class WorkloadError(ValueError):
    """A workload directory is missing, malformed or does not fit the topology."""


@dataclass(frozen=True, slots=True)
class SubscriptionEvent:
    """Subscriber ``subscriber`` on ``broker`` subscribes to ``subscription`` at ``time``."""

    subscriber: str
    broker: str
    subscription: Subscription
    time: float


@dataclass(frozen=True, slots=True)
class PublicationEvent:
    """Publisher ``publisher`` on ``broker`` publishes number ``seq`` at ``time``."""

    publisher: str
    broker: str
    seq: int
    time: float
    publication: Publication


@dataclass
class Workload:
    """A parsed workload: metadata, subscriptions and publications in time order."""

    meta: dict[str, Any]
    subscriptions: list[SubscriptionEvent]
    publications: list[PublicationEvent] = field(default_factory=list)

    def check_topology(self, scot: Scot) -> None:
        """Every broker the workload names must exist in ``scot``."""
        named = {s.broker for s in self.subscriptions} | {p.broker for p in self.publications}
        unknown = sorted(named - set(scot.brokers))
        if unknown:
            shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise WorkloadError(
                f"workload names {len(unknown)} broker(s) the topology {scot.name} lacks: {shown}"
            )


def read_workload(path: str | Path) -> Workload:
    """Read and validate a workload directory; errors name the file and row."""
    path = Path(path)
    if not path.is_dir():
        raise WorkloadError(f"workload directory {path} does not exist")
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkloadError(f"workload {path}: cannot read {META}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"workload {path}: {META} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise WorkloadError(f"workload {path}: {META} format is not {FORMAT!r}")
    subs = _read_table(path / SUBSCRIPTIONS, SUBSCRIPTION_SCHEMA)
    pubs = _read_table(path / PUBLICATIONS, PUBLICATION_SCHEMA)
    subscriptions = [
        SubscriptionEvent(
            row["subscriber"],
            row["broker"],
            _parse(parse_subscription, row["filter"], SUBSCRIPTIONS, i),
            row["time"],
        )
        for i, row in enumerate(subs)
    ]
    publications = [
        PublicationEvent(
            row["publisher"],
            row["broker"],
            row["seq"],
            row["time"],
            _parse(parse_publication, row["publication"], PUBLICATIONS, i),
        )
        for i, row in enumerate(pubs)
    ]
    workload = Workload(
        meta,
        sorted(subscriptions, key=lambda s: s.time),
        sorted(publications, key=lambda p: (p.time, p.publisher, p.seq)),
    )
    _check_consistency(workload)
    return workload


def write_workload(path: str | Path, workload: Workload) -> None:
    """Write ``workload`` into directory ``path`` (created; replaced only if it is a workload).

    The files appear together: see :func:`write_workload_tables`.
    """
    _check_consistency(workload)
    subscriptions = pa.Table.from_pylist(
        [
            {
                "subscriber": s.subscriber,
                "broker": s.broker,
                "filter": s.subscription.to_text(),
                "time": float(s.time),
            }
            for s in workload.subscriptions
        ],
        schema=SUBSCRIPTION_SCHEMA,
    )
    publications = pa.Table.from_pylist(
        [
            {
                "publisher": p.publisher,
                "broker": p.broker,
                "seq": p.seq,
                "time": float(p.time),
                "publication": format_publication(p.publication),
            }
            for p in workload.publications
        ],
        schema=PUBLICATION_SCHEMA,
    )
    write_workload_tables(path, workload.meta, subscriptions, publications)


def write_workload_tables(
    path: str | Path, meta: dict[str, Any], subscriptions: pa.Table, publications: pa.Table
) -> None:
    """Write a workload given as Arrow tables of the two schemas (the Spark job's route).

    ``path`` is created, or replaced only if it already is a workload directory; the
    files are written into a temporary sibling that is renamed in one step, so a failure
    leaves nothing half-written.
    """
    path = Path(path)
    if path.exists() and not (path / META).is_file():
        raise WorkloadError(f"{path} exists and is not a workload directory; not replacing it")
    for table, schema, name in (
        (subscriptions, SUBSCRIPTION_SCHEMA, SUBSCRIPTIONS),
        (publications, PUBLICATION_SCHEMA, PUBLICATIONS),
    ):
        if not table.schema.equals(schema):
            raise WorkloadError(f"{name}: table schema {table.schema} is not {schema}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        pq.write_table(subscriptions, tmp / SUBSCRIPTIONS)
        pq.write_table(publications, tmp / PUBLICATIONS)
        (tmp / META).write_text(
            json.dumps({**meta, "format": FORMAT}, indent=1) + "\n", encoding="utf-8"
        )
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


RATE_PER_MINUTE = 60.0
"""Notifications per minute of each publisher of a generated workload, by default."""


def generate_workload(
    scot: Scot,
    *,
    subscribers: int,
    publishers: int,
    notifications: int,
    seed: int = 0,
    rate_per_minute: float = RATE_PER_MINUTE,
    selectivity: float = 0.02,
    start_window: float = 5.0,
    hrp: HighRatePublisher | None = None,
    quotes_from: Path | None = None,
) -> Workload:
    """A small stock-quote workload without Spark, placed uniformly at random on ``scot``.

    Publisher p publishes ``notifications`` synthetic quotes at ``rate_per_minute``,
    starting within the first ``start_window`` seconds (paper §7.3); each subscriber holds
    one subscription of about ``selectivity`` over the publications. ``hrp`` adds the
    burst scenario's high-rate publisher (§7.3, stability analysis). With ``quotes_from``
    (a directory of PADRES quote files) the publications are real quotes: each publisher
    is one symbol's feed in date order (:func:`real_quote_feeds`); otherwise synthetic.
    """
    from octopis.quotes import measure_selectivity, random_quotes, stock_subscriptions

    for name, value in (
        ("subscribers", subscribers),
        ("publishers", publishers),
        ("notifications", notifications),
    ):
        if value < 0:
            raise WorkloadError(f"{name} must be ≥ 0, got {value}")
    if rate_per_minute <= 0:
        raise WorkloadError(f"rate must be positive, got {rate_per_minute}")
    rng = random.Random(seed)
    brokers = list(scot.brokers)
    if quotes_from is None:
        quotes = random_quotes(
            max(1, publishers * notifications), seed=seed, symbols=max(1, publishers)
        )
    else:
        quotes = real_quote_feeds(quotes_from, publishers, notifications, seed)
    audience = hrp.audience(subscribers) if hrp else 0
    filters = stock_subscriptions(
        quotes, subscribers - audience, seed=seed, selectivity=selectivity
    )
    interval = 60.0 / rate_per_minute
    publications = []
    for p in range(publishers):
        broker, phase = rng.choice(brokers), rng.uniform(0, start_window)
        for s in range(notifications):
            publications.append(
                PublicationEvent(
                    f"P{p}", broker, s + 1, phase + s * interval, quotes[p * notifications + s]
                )
            )
    subscriptions = [
        SubscriptionEvent(f"S{i}", rng.choice(brokers), f, 0.0) for i, f in enumerate(filters)
    ]
    measured = measure_selectivity(filters, quotes) if filters else []
    meta = {
        "format": FORMAT,
        "generator": "octopis.workload.generate_workload",
        "seed": seed,
        "topology": {"name": scot.name, "brokers": len(scot.brokers)},
        "subscribers": subscribers,
        "publishers": publishers,
        "notifications_per_publisher": notifications,
        "rate_per_minute": rate_per_minute,
        "selectivity": {"target": selectivity, **_spread(measured)},
        "synthetic_quotes": quotes_from is None,
        "quotes": str(quotes_from) if quotes_from is not None else None,
    }
    if hrp is not None:
        extra_subs, extra_pubs = hrp.events(
            scot, rng, first=len(subscriptions), audience=audience, seed=seed
        )
        subscriptions += extra_subs
        publications += extra_pubs
        meta["hrp"] = {
            "notifications": hrp.notifications,
            "rate_per_minute": hrp.rate_per_minute,
            "interest": hrp.interest,
            "subscribers": audience,
            "start": hrp.start,
            "burst_placement": hrp.burst_placement,
            "inside": hrp.inside,
            "broker": extra_pubs[0].broker if extra_pubs else None,
        }
    return Workload(
        meta, subscriptions, sorted(publications, key=lambda e: (e.time, e.publisher, e.seq))
    )


@dataclass(frozen=True)
class HighRatePublisher:
    """The burst scenario's high-rate publisher "HRP" (paper §7.3, stability analysis).

    It publishes ``notifications`` quotes of class ``'HRP'`` at ``rate_per_minute`` from
    ``start`` seconds on. A fraction ``interest`` of the subscribers (at least one)
    subscribe to exactly those, with ``[class,eq,'HRP']``, so the HRP's audience is known
    exactly. With ``burst_placement`` the audience sits in clusters other than the HRP's,
    spread over all of them, so that every one of the HRP's iCOLs is a target link;
    ``inside`` of it (a fraction) sits instead on other brokers of the HRP's own cluster
    (the mixed regime: part of the burst crosses iCOLs, part stays on the tree).
    """

    notifications: int
    rate_per_minute: float = 6000.0
    interest: float = 0.002
    start: float = 5.0
    burst_placement: bool = True
    inside: float = 0.0

    def audience(self, subscribers: int) -> int:
        """How many of ``subscribers`` follow the HRP."""
        if not 0 < self.interest <= 1:
            raise WorkloadError(f"HRP interest must be within (0, 1], got {self.interest}")
        if self.notifications < 1 or self.rate_per_minute <= 0:
            raise WorkloadError("the HRP needs ≥ 1 notification and a positive rate")
        if subscribers < 1:
            raise WorkloadError("the HRP needs at least one subscriber")
        if not 0 <= self.inside <= 1 or (self.inside and not self.burst_placement):
            raise WorkloadError(
                f"the HRP's inside share must be within 0..1 and needs burst placement, "
                f"got {self.inside}"
            )
        return max(1, round(self.interest * subscribers))

    def events(
        self, scot: Scot, rng: random.Random, *, first: int, audience: int, seed: int
    ) -> tuple[list[SubscriptionEvent], list[PublicationEvent]]:
        """The HRP's followers and publications."""
        from octopis.filters.language import parse_subscription
        from octopis.quotes import random_quotes

        home = rng.choice(list(scot.brokers))
        interest = parse_subscription("[class,eq,'HRP']")
        brokers = follower_brokers(
            scot, home, audience, burst=self.burst_placement, pick=rng.choice, inside=self.inside
        )
        subs = [
            SubscriptionEvent(f"S{first + i}", broker, interest, 0.0)
            for i, broker in enumerate(brokers)
        ]
        interval = 60.0 / self.rate_per_minute
        quotes = random_quotes(self.notifications, seed=seed + 1, symbols=1)
        pubs = [
            PublicationEvent(
                "HRP",
                home,
                k + 1,
                self.start + k * interval,
                {**q, "class": "HRP", "symbol": "HRP"},
            )
            for k, q in enumerate(quotes)
        ]
        return subs, pubs


def follower_brokers(
    scot: Scot,
    home: str,
    audience: int,
    *,
    burst: bool,
    pick: Callable[[list[str]], str],
    inside: float = 0.0,
) -> list[str]:
    """Brokers of the ``audience`` followers of an HRP on ``home`` (paper §7.3). With
    ``burst`` follower i sits in the i-th, in turn, of the clusters other than ``home``'s
    (``home``'s own when it is the only one), so that every one of the HRP's iCOLs is a
    target link; otherwise anywhere. The first ``round(inside × audience)`` followers sit
    instead on brokers of ``home``'s cluster other than ``home`` (the mixed regime).
    ``pick`` chooses one broker of a list (the caller's seeded random source)."""
    everywhere = list(scot.brokers)
    if not burst:
        return [pick(everywhere) for _ in range(audience)]
    cluster = scot.brokers[home].cluster
    others = [c for c in range(scot.clusters) if c != cluster] or [cluster]
    pools = {c: [b for b in everywhere if scot.brokers[b].cluster == c] for c in others}
    near = round(inside * audience)
    own = [b for b in everywhere if scot.brokers[b].cluster == cluster and b != home] or [home]
    return [pick(own) for _ in range(near)] + [
        pick(pools[others[i % len(others)]]) for i in range(audience - near)
    ]


def real_quote_feeds(
    directory: Path, publishers: int, notifications: int, seed: int
) -> list[Publication]:
    """``publishers`` real symbols drawn with ``seed``, each one's first ``notifications``
    quotes in date order, enriched to the paper's 10 attributes; publisher p's feed is
    ``result[p * notifications:(p + 1) * notifications]``."""
    from octopis.quotes import enrich, read_quote_file

    try:
        files = sorted(p for p in Path(directory).iterdir() if p.is_file())
    except OSError as exc:
        raise WorkloadError(f"cannot read quote directory {directory}: {exc.strerror}") from None
    if len(files) < publishers:
        raise WorkloadError(
            f"{directory} holds {len(files)} quote files; {publishers} publishers need one each"
        )
    feeds: list[Publication] = []
    for path in random.Random(seed).sample(files, publishers):
        try:
            series = list(read_quote_file(path))
        except FilterError as exc:
            raise WorkloadError(str(exc)) from None
        series.reverse()  # the files run newest first
        if len(series) < notifications:
            raise WorkloadError(
                f"{path.name} has {len(series)} quotes; {notifications} notifications asked"
            )
        feeds += [enrich(q) for q in series[:notifications]]
    return feeds


def _spread(values: list[float]) -> dict[str, float]:

    if not values:
        return {"mean": 0.0, "std": 0.0}
    mean = sum(values) / len(values)
    return {"mean": mean, "std": math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))}


def _read_table(path: Path, schema: pa.Schema) -> list[dict[str, Any]]:
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise WorkloadError(f"workload file {path} is missing") from None
    except (OSError, pa.ArrowException) as exc:
        raise WorkloadError(f"workload file {path} is not readable Parquet: {exc}") from None
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise WorkloadError(f"{path.name} lacks column(s) {', '.join(missing)}")
    try:
        table = table.select(schema.names).cast(schema)
    except (pa.ArrowException, ValueError) as exc:
        raise WorkloadError(f"{path.name} has columns of the wrong type: {exc}") from None
    for name in schema.names:
        nulls = table.column(name).null_count
        if nulls:
            raise WorkloadError(f"{path.name}: column {name} has {nulls} empty value(s)")
    return table.to_pylist()


def _parse(parser: Any, text: str, file: str, row: int) -> Any:
    try:
        return parser(text)
    except FilterError as exc:
        raise WorkloadError(f"{file} row {row}: {exc}") from None


def _check_consistency(workload: Workload) -> None:
    _one_broker_each(((s.subscriber, s.broker) for s in workload.subscriptions), "subscriber")
    _one_broker_each(((p.publisher, p.broker) for p in workload.publications), "publisher")
    seen: set[tuple[str, int]] = set()
    for p in workload.publications:
        if (p.publisher, p.seq) in seen:
            raise WorkloadError(f"publication {p.publisher}/{p.seq} appears twice")
        seen.add((p.publisher, p.seq))
    for event in (*workload.subscriptions, *workload.publications):
        if not math.isfinite(event.time) or event.time < 0:
            raise WorkloadError(f"event time {event.time} is not a finite time ≥ 0")


def _one_broker_each(pairs: Iterable[tuple[str, str]], what: str) -> None:
    home: dict[str, str] = {}
    for client, broker in pairs:
        if home.setdefault(client, broker) != broker:
            raise WorkloadError(
                f"{what} {client} is placed on two brokers: {home[client]} and {broker}"
            )
