"""Broker settings, read from a TOML file (``octopis-broker --config``, ``octopis up
--config``).

```toml
[lst]
window = 0.05            # Δt of the Link Status Table, seconds
queue_threshold = 10     # Q

[links.capacities]       # per directed link "src>dst" = messages/s
"b:2>b:0" = 200
```

Every ``[table] key`` is a row of :data:`_KEYS` or :data:`_CHOICES`; its default and
meaning are the :class:`BrokerSettings` field it sets and that field's docstring. The
settings reference of the documentation is generated from them.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octopis.core import COVERING, DEFAULT_COVERING
from octopis.core.dedup import DEFAULT_DEDUP_PUBLISHERS, DEFAULT_DEDUP_WINDOW
from octopis.core.lst import DEFAULT_LST_WINDOW, DEFAULT_ORDER, DEFAULT_QUEUE_THRESHOLD, ORDERS
from octopis.defaults import CLIENT_TIMEOUT, CUSTODY_LIMIT, PUBLICATION_HOLD, REPLAY_BUDGET
from octopis.filters.limits import InputLimits

RETENTION_SYNC = ("normal", "full")
"""``[retention] sync``: SQLite's ``synchronous`` for the retention store."""

SLOW_POLICIES = ("disconnect", "drop_oldest")
"""What a broker does with a client connection whose backlog reaches its limit (DESIGN §8)."""


class ConfigError(ValueError):
    """A settings file that cannot be used; the message names the key."""


@dataclass(frozen=True)
class BrokerSettings:
    """Everything a broker process can be tuned with."""

    window: float = DEFAULT_LST_WINDOW
    """Δt of the Link Status Table, seconds: each link's congestion element CE = n_in /
    n_out is taken over windows this long (paper §6.3)."""
    queue_threshold: int = DEFAULT_QUEUE_THRESHOLD
    """Q: an output queue this long marks its link overloaded (as does a non-empty queue
    whose CE is above 1)."""
    order: str = DEFAULT_ORDER
    """DNR's "least loaded" among candidate links: ``"ce"`` (CE, then queue length: the
    paper's) or ``"bluedove"`` (BlueDove's estimated processing time (q̂ + 1)/μ)."""
    covering: str = DEFAULT_COVERING
    """``"active"`` (the default): a broker passes a subscription on over a link only if no
    subscription it sent over that link covers it (every publication matching it
    matches the other), and when it withdraws one it first sends over each link the
    ones it covered there; who receives what is unchanged, SBP sends fewer messages and
    tables hold fewer entries. ``"off"``: every subscription reaches every broker (the
    paper's SBP). SNR and DNR; BID always floods. Set it alike on every broker of an
    overlay. With advertisements on too, a subscription goes over a link only if an
    advertisement draws it there and nothing sent there covers it. With it, a subscriber
    moving inside its
    cluster subscribes afresh at its new broker rather than have its subscriptions
    adopted there."""
    advertisements: str = "off"
    """``"on"``: publishers advertise what they will publish (a filter) before they
    publish, advertisements reach every broker, and a subscription travels only toward
    brokers whose advertisements may match what it wants; a publication outside its
    publisher's advertisements is refused. ``"off"``: every subscription reaches every
    broker and publishers need not advertise. SNR and DNR, with covering active or off;
    set it alike on every broker of an overlay. A restarted broker is handed the advertisements
    its neighbours hold; an SDK publisher whose connection fails over to another broker
    advertises there again before its publications."""
    sndhwm: int = 8
    """ZeroMQ messages waiting per peer link (each a batch of up to 64 frames) before the
    output queue, which the LST measures, grows."""
    capacity: float = 0.0
    """Messages per second on every outgoing peer link; 0 = unlimited."""
    capacities: dict[str, float] = field(default_factory=dict)
    """Messages per second on single directed links, ``"src>dst" = rate`` in
    ``[links.capacities]``; a link not named takes :attr:`capacity`."""
    broker_capacity: float = 0.0
    """Messages per second over all of the broker's outgoing links together; 0 =
    unlimited."""
    client_sndhwm: int = 1_000
    """ZeroMQ messages (each of at most 16 deliveries) waiting per client connection
    before deliveries queue in the broker."""
    client_backlog_limit: int = 10_000
    """Deliveries queued in the broker for one connection beyond ``sndhwm``; at the limit
    ``slow_policy`` applies."""
    slow_policy: str = "disconnect"
    """What a connection at its backlog limit gets: ``"disconnect"`` (its subscriptions
    are withdrawn and the client is told why) or ``"drop_oldest"`` (the oldest queued
    deliveries are dropped, and the client is told how many)."""
    publish_window: int = 1000
    """Unanswered publications per client connection; more are refused, so a publisher
    waits for credit."""
    queue_limit: int = 10_000
    """Frames waiting on one peer link; beyond it the broker withholds its
    acknowledgements from its other neighbours (hop-by-hop backpressure)."""
    heartbeat: float = 0.2
    """Seconds of silence on a link before it carries a heartbeat."""
    down_after: float = 1.0
    """T: a neighbour silent this long is down (more than two heartbeats)."""
    ack_interval: float = 0.05
    """Seconds between looks at acknowledgements withheld by backpressure; frames taken
    are acknowledged at the end of each input pass."""
    custody_limit: int = CUSTODY_LIMIT
    """Unacknowledged notifications kept per link for a neighbour that may fail; full,
    the link waits. 0 = no custody (a failure loses what was in flight, and there is no
    backpressure)."""
    retain: float = 1.0
    """Seconds acknowledged notifications are kept after sending, in case the neighbour
    dies before passing them on; 0 = not kept."""
    retain_limit: int = 10_000
    """Acknowledged notifications kept per link at most (the oldest go first, counted)."""
    client_timeout: float = CLIENT_TIMEOUT
    """Seconds of silence after which a client connection is dropped and its
    subscriptions are withdrawn."""
    client_move_timeout: float = 30.0
    """Seconds a client told to move a subscription away has to move it; the order lapses
    after that and the client stays subscribed here."""
    hold_limit: int = PUBLICATION_HOLD
    """Publications held while a restarted broker resyncs; when it is full, more are
    refused."""
    delivery_capacity: float = 0.0
    """Deliveries per second to all of the broker's clients together; 0 = unlimited."""
    delivery_queue_limit: int = 10_000
    """Deliveries waiting for :attr:`delivery_capacity`; beyond it the broker holds its
    neighbours back, as for a full link, and refuses local publications."""
    dedup_window: int = DEFAULT_DEDUP_WINDOW
    """(publisher, sequence number) pairs remembered per publisher by edge dedup, which
    delivers each publication at most once per host."""
    dedup_publishers: int = DEFAULT_DEDUP_PUBLISHERS
    """Publishers edge dedup remembers; the one seen first is forgotten first."""
    log_interval: float = 5.0
    """Seconds between two lines of a repeated warning of one kind (the count of those
    left out is logged with the next)."""
    frame_bytes: int = 1 << 20
    """Largest ZeroMQ message on any of the broker's sockets, bytes; a sender of a larger
    one is disconnected."""
    limits: InputLimits = field(default_factory=InputLimits)
    """Sizes of filters and publications accepted from clients and peers alike."""
    subscriptions_per_client: int = 10_000
    """Subscriptions one client may hold at the broker."""
    memory_budget_mb: int = 256
    """RSS, in MB, above which the broker holds its neighbours back (75 brokers of 256 MB
    fit a 24 GiB machine; an idle broker uses about 45 MB)."""
    gc_young: int = 100_000
    """Net allocations between Python's young-generation collections (Python's default is
    700). A forwarded notification allocates a dozen short-lived containers; at 700 the
    collector would run every ~50 notifications and walk what custody keeps alive.
    Memory stays bounded: only reference cycles wait for a pass, and the broker makes
    few."""
    gc_idle: int = 10_000
    """Young objects at which an input loop that has run dry runs the collector's next
    pass at once (:class:`~octopis.transport.collector.IdleCollector`; 0: never), so the
    pass over what a subscription flood leaves falls in a moment with nothing to do
    rather than in the traffic after it."""
    load_window: int = 10
    """Seconds of the load analysis's sliding window."""
    load_capacity: float = 0.0
    """Output (copies + deliveries) per second the broker can carry, the denominator of
    its load ratio; 0: measured (what one CPU second carried in the window)."""
    stomp_heartbeat: int = 10_000
    """STOMP heart-beats (DESIGN §13), ms: what the listener offers in CONNECTED, both
    ways; a client that negotiated heart-beats and is silent for two periods is dropped."""
    stomp_header_bytes: int = 8192
    """Bytes of one STOMP frame's command and headers."""
    stomp_headers: int = 64
    """Headers in one STOMP frame."""
    stomp_body_bytes: int = 65_536
    """Bytes of one STOMP frame's body."""
    stomp_write_buffer: int = 1 << 20
    """Bytes waiting to be written to one STOMP connection before it counts as full (the
    broker then queues for it, up to ``clients.backlog_limit``)."""
    stomp_subscriptions: int = 256
    """STOMP subscriptions one connection may hold."""
    stomp_selector_subscriptions: int = 16
    """PADRES subscriptions one selector may become (its disjunctive form)."""
    stomp_unacked: int = 10_000
    """Messages delivered to one connection and not acknowledged (client ack modes)."""
    retention_bytes: int = 256 * 2**20
    """Bytes of publication bodies the retention store keeps; the oldest go first past
    it."""
    retention_age: float = 3600.0
    """Seconds a publication is kept in the retention store; 0 turns retention off."""
    retention_sync: str = "normal"
    """When a publication's confirm may leave: ``normal`` once the retention store's
    transaction is in its write-ahead log (it survives a ``kill -9`` of the broker, not a
    power failure of the machine: the operating system may not have written it yet);
    ``full`` once the log is on disk (fsync per commit: survives a power failure, costs a
    disk flush per input pass)."""
    replay_budget: float = REPLAY_BUDGET
    """Seconds the host of a replay waits for every broker's answer; a neighbour silent
    past its share of it is reported, with what only it reached, as a gap."""
    replay_rounds: int = 1000
    """Replay requests one broker takes part in at once (the oldest ends early past it)."""
    historic_budget: float = 30.0
    """Seconds the host of a historic, hybrid or durable subscription's answer waits for
    every broker's answer (stores answer page by page, so a large answer takes longer)."""
    answer_max: int = 100_000
    """Publications one store answers to one request at most (the answer says it was
    cut, and where to ask again from)."""
    answer_bytes: int = 64 * 2**20
    """Encoded bytes one store answers to one request at most."""
    durable_keep: float = 3600.0
    """Seconds a durable subscription's record waits for its client (DESIGN §11)."""
    durable_max: int = 10_000
    """Durable subscription records one broker keeps."""
    composite_held: int = 10_000
    """Publications the join of one composite subscription keeps at most (DESIGN §12);
    past it the earliest published goes first, counted as ``composite.dropped`` and told
    to the client."""
    composite_lateness: float = 5.0
    """Seconds a publication may take from its publisher to a composite's host and still
    be joined with everything published within the composite's window: the join keeps
    each publication for ``window + lateness`` seconds after its publication time."""

    def capacity_of(self, src: str, dst: str) -> float:
        """Messages/s allowed on ``src → dst``; 0 means unlimited."""
        return self.capacities.get(f"{src}>{dst}", self.capacity)

    def to_toml(self, changed_only: bool = False) -> str:
        """The settings as a TOML document :func:`load_settings` reads back; with
        ``changed_only`` just what differs from the defaults (readable by a broker of
        another version, as long as it knows those keys)."""
        default = BrokerSettings()
        sections: dict[str, list[str]] = {section: [] for section, _ in [*_KEYS, *_CHOICES]}
        for (section, key), (name, _) in _CHOICES.items():
            value = getattr(self, name)
            if not changed_only or value != getattr(default, name):
                sections[section].append(f'{key} = "{value}"')
        for (section, key), (name, _, _) in _KEYS.items():
            in_limits = name.startswith("limits.")
            attribute = name.removeprefix("limits.")
            value = getattr(self.limits if in_limits else self, attribute)
            if not changed_only or value != getattr(
                default.limits if in_limits else default, attribute
            ):
                sections[section].append(f"{key} = {value!r}")
        if self.capacities:
            sections["links.capacities"] = [
                f'"{link}" = {rate!r}' for link, rate in sorted(self.capacities.items())
            ]
        return "\n".join(
            f"[{section}]\n" + "".join(f"{line}\n" for line in lines)
            for section, lines in sections.items()
            if lines
        )


def load_settings(path: str | Path | None) -> BrokerSettings:
    """Settings from a TOML file (defaults for anything it leaves out)."""
    if path is None:
        return BrokerSettings()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read settings file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"settings file {path} is not valid TOML: {exc}") from None
    return settings_from_data(data, path.name)


_CHOICES: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("lst", "order"): ("order", ORDERS),
    ("routing", "covering"): ("covering", COVERING),
    ("routing", "advertisements"): ("advertisements", ("off", "on")),
    ("clients", "slow_policy"): ("slow_policy", SLOW_POLICIES),
    ("retention", "sync"): ("retention_sync", RETENTION_SYNC),
}
"""Settings that take one of a few words: (table, key) → (field, the words)."""

_KEYS: dict[tuple[str, str], tuple[str, float, bool]] = {
    ("lst", "window"): ("window", 1e-4, False),
    ("lst", "queue_threshold"): ("queue_threshold", 1, True),
    ("links", "sndhwm"): ("sndhwm", 1, True),
    ("links", "heartbeat"): ("heartbeat", 0.01, False),
    ("links", "down_after"): ("down_after", 0.05, False),
    ("links", "ack_interval"): ("ack_interval", 0.001, False),
    ("links", "custody_limit"): ("custody_limit", 0, True),
    ("links", "retain"): ("retain", 0.0, False),
    ("links", "retain_limit"): ("retain_limit", 0, True),
    ("links", "queue_limit"): ("queue_limit", 1, True),
    ("links", "capacity"): ("capacity", 0.0, False),
    ("links", "broker_capacity"): ("broker_capacity", 0.0, False),
    ("clients", "sndhwm"): ("client_sndhwm", 1, True),
    ("clients", "backlog_limit"): ("client_backlog_limit", 1, True),
    ("clients", "publish_window"): ("publish_window", 1, True),
    ("clients", "timeout"): ("client_timeout", 0.1, False),
    ("clients", "move_timeout"): ("client_move_timeout", 0.1, False),
    ("clients", "hold_limit"): ("hold_limit", 0, True),
    ("clients", "capacity"): ("delivery_capacity", 0.0, False),
    ("clients", "queue_limit"): ("delivery_queue_limit", 1, True),
    ("dedup", "window"): ("dedup_window", 1, True),
    ("dedup", "publishers"): ("dedup_publishers", 1, True),
    ("retention", "max_bytes"): ("retention_bytes", 1024, True),
    ("retention", "max_age"): ("retention_age", 0.0, False),
    ("retention", "replay_budget"): ("replay_budget", 0.01, False),
    ("retention", "replay_rounds"): ("replay_rounds", 1, True),
    ("retention", "historic_budget"): ("historic_budget", 0.01, False),
    ("retention", "answer_max"): ("answer_max", 1, True),
    ("retention", "answer_bytes"): ("answer_bytes", 1024, True),
    ("durable", "keep"): ("durable_keep", 0.01, False),
    ("durable", "max"): ("durable_max", 1, True),
    ("composite", "max_held"): ("composite_held", 1, True),
    ("composite", "lateness"): ("composite_lateness", 0.0, False),
    ("logs", "interval"): ("log_interval", 0.0, False),
    ("limits", "frame_bytes"): ("frame_bytes", 1024, True),
    ("limits", "attributes"): ("limits.attributes", 1, True),
    ("limits", "predicates"): ("limits.predicates", 1, True),
    ("limits", "string_length"): ("limits.string_length", 1, True),
    ("limits", "name_length"): ("limits.name_length", 1, True),
    ("limits", "subscriptions_per_client"): ("subscriptions_per_client", 1, True),
    ("memory", "budget_mb"): ("memory_budget_mb", 1, True),
    ("memory", "gc_young"): ("gc_young", 1, True),
    ("memory", "gc_idle"): ("gc_idle", 0, True),
    ("load", "window"): ("load_window", 1, True),
    ("load", "capacity"): ("load_capacity", 0.0, False),
    ("stomp", "heartbeat"): ("stomp_heartbeat", 0, True),
    ("stomp", "header_bytes"): ("stomp_header_bytes", 256, True),
    ("stomp", "headers"): ("stomp_headers", 4, True),
    ("stomp", "body_bytes"): ("stomp_body_bytes", 0, True),
    ("stomp", "write_buffer"): ("stomp_write_buffer", 1024, True),
    ("stomp", "subscriptions"): ("stomp_subscriptions", 1, True),
    ("stomp", "selector_subscriptions"): ("stomp_selector_subscriptions", 1, True),
    ("stomp", "unacked"): ("stomp_unacked", 1, True),
}
"""Each ``[table] key``: the :class:`BrokerSettings` field it sets, its minimum, and
whether it must be an integer."""


def settings_from_data(data: dict[str, Any], source: str = "settings") -> BrokerSettings:
    """Validate a parsed settings document; every error names the key."""
    values: dict[str, Any] = {}
    for table, keys in data.items():
        if not isinstance(keys, dict) or not any(t == table for t, _ in [*_KEYS, *_CHOICES]):
            raise ConfigError(f"{source}: unknown table [{table}]")
        for key, value in keys.items():
            if (table, key) == ("links", "capacities"):
                values["capacities"] = _capacities(value, source)
                continue
            choices = _CHOICES.get((table, key))
            if choices is not None:
                if value not in choices[1]:
                    raise ConfigError(
                        f"{source}: {table}.{key} must be one of "
                        f"{', '.join(map(repr, choices[1]))}, got {value!r}"
                    )
                values[choices[0]] = value
                continue
            spec = _KEYS.get((table, key))
            if spec is None:
                raise ConfigError(f"{source}: unknown key {table}.{key}")
            name, minimum, integer = spec
            number = _number(value, f"{table}.{key}", source, minimum=minimum, integer=integer)
            values[name] = int(number) if integer else number
    limits = {k.split(".", 1)[1]: values.pop(k) for k in list(values) if k.startswith("limits.")}
    try:
        settings = BrokerSettings(**values, limits=InputLimits(**limits))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if settings.down_after <= 2 * settings.heartbeat:
        raise ConfigError(
            f"{source}: links.down_after ({settings.down_after} s) must exceed two heartbeat "
            f"intervals ({settings.heartbeat} s each), or idle links would be declared down"
        )
    return settings


def _capacities(value: Any, source: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [links.capacities] must be a table of 'src>dst' = rate")
    for link, rate in value.items():
        if ">" not in link:
            raise ConfigError(f"{source}: links.capacities key {link!r} is not 'src>dst'")
        _number(rate, f"links.capacities.{link}", source, minimum=0.0)
    return {k: float(v) for k, v in value.items()}


def _number(value: Any, key: str, source: str, *, minimum: float, integer: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (integer and not isinstance(value, int))
    ):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{source}: {key} must be {kind}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{source}: {key} must be ≥ {minimum}, got {value!r}")
    return float(value)
