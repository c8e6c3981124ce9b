"""Broker settings, read from a TOML file (``octopis-broker --config``, ``octopis up
--config``).

```toml
[lst]
window = 0.1             # Δt of the Link Status Table, seconds
queue_threshold = 20     # Q

[links.capacities]       # per directed link "src>dst" = messages/s
"b:2>b:0" = 200
```

Each ``[section]`` of the file is one settings type below (:class:`Lst` for ``[lst]``, …)
whose field names are the section's keys: a key's default and meaning are its field's
default and docstring, its kind and minimum the field's annotation. A component is
handed the sections it reads (the retention store its ``[retention]``, the STOMP
listener its ``[stomp]`` and ``[clients]``, replaying ``[retention]`` and
``[durable]``). msgspec checks a document
against these types (unknown sections and keys included); :func:`settings_from_data`
words what it refuses by section and key. The settings reference of the documentation
is generated from the same types.
"""

from __future__ import annotations

import json
import re
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from octopis.core import COVERING, DEFAULT_COVERING
from octopis.core.client_flow import SLOW_POLICIES
from octopis.core.dedup import DEFAULT_DEDUP_PUBLISHERS, DEFAULT_DEDUP_WINDOW
from octopis.core.lst import DEFAULT_LST_WINDOW, DEFAULT_ORDER, DEFAULT_QUEUE_THRESHOLD, ORDERS
from octopis.defaults import (
    ACK_DELAY,
    ACK_EVERY,
    ACK_INTERVAL,
    ANSWER_BYTES,
    ANSWER_MAX,
    BODY_BYTES,
    CLIENT_TIMEOUT,
    COMPOSITE_HELD,
    COMPOSITE_LATENESS,
    CUSTODY_LIMIT,
    DELIVERIES_LIMIT,
    DOWN_AFTER,
    DURABLE_KEEP,
    DURABLE_MAX,
    HEARTBEAT,
    HISTORIC_BUDGET,
    LOAD_WINDOW,
    MEMORY_BUDGET_MB,
    MOVE_TIMEOUT,
    PUBLICATION_HOLD,
    QUEUE_LIMIT,
    REPLAY_BUDGET,
    REPLAY_ROUNDS,
    RETAIN,
    RETAIN_LIMIT,
    SELECTOR_SUBSCRIPTIONS,
    SUBSCRIPTIONS_PER_CLIENT,
)
from octopis.filters.limits import InputLimits

RETENTION_SYNC = ("normal", "full")
"""``[retention] sync``: SQLite's ``synchronous`` for the retention store."""

SWITCH = ("off", "on")
"""A setting that is on or off."""


def _at_least(minimum: float) -> msgspec.Meta:
    return msgspec.Meta(ge=minimum)


class ConfigError(ValueError):
    """A settings file that cannot be used; the message names the section and key."""


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[section]`` of a settings file: its fields are the section's keys."""


class Lst(Section):
    """``[lst]``: the Link Status Table (paper §6.3)."""

    window: Annotated[float, _at_least(1e-4)] = DEFAULT_LST_WINDOW
    """Δt of the Link Status Table, seconds: each link's congestion element CE = n_in /
    n_out is taken over windows this long (paper §6.3)."""
    queue_threshold: Annotated[int, _at_least(1)] = DEFAULT_QUEUE_THRESHOLD
    """Q: an output queue this long marks its link overloaded (as does a non-empty queue
    whose CE is above 1)."""
    order: Literal[ORDERS] = DEFAULT_ORDER  # type: ignore[valid-type]
    """DNR's "least loaded" among candidate links: ``"ce"`` (CE, then queue length: the
    paper's) or ``"bluedove"`` (BlueDove's estimated processing time (q̂ + 1)/μ)."""


class Routing(Section):
    """``[routing]``: how subscriptions travel."""

    covering: Literal[COVERING] = DEFAULT_COVERING  # type: ignore[valid-type]
    """``"active"`` (the default): a broker passes a subscription on over a link only if no
    subscription it sent over that link covers it (every publication matching it
    matches the other), and when it withdraws one it first sends over each link the
    ones it covered there; who receives what is unchanged, SBP sends fewer messages and
    tables hold fewer entries. ``"off"``: every subscription reaches every broker (the
    paper's SBP). SNR and DNR; BID always floods. Set it alike on every broker of an
    overlay. With advertisements on too, a subscription goes over a link only if an
    advertisement draws it there and nothing sent there covers it. With it, a subscriber
    moving inside its cluster subscribes afresh at its new broker rather than have its
    subscriptions adopted there."""
    advertisements: Literal[SWITCH] = "off"  # type: ignore[valid-type]
    """``"on"``: publishers advertise what they will publish (a filter) before they
    publish, advertisements reach every broker, and a subscription travels only toward
    brokers whose advertisements may match what it wants; a publication outside its
    publisher's advertisements is refused. ``"off"``: every subscription reaches every
    broker and publishers need not advertise. SNR and DNR, with covering active or off;
    set it alike on every broker of an overlay. A restarted broker is handed the
    advertisements its neighbours hold; an SDK publisher whose connection fails over to
    another broker advertises there again before its publications."""


class Links(Section):
    """``[links]``: the links to neighbouring brokers."""

    sndhwm: Annotated[int, _at_least(1)] = 8
    """ZeroMQ messages waiting per peer link (each a batch of up to 64 frames) before the
    output queue, which the LST measures, grows."""
    heartbeat: Annotated[float, _at_least(0.01)] = HEARTBEAT
    """Seconds of silence on a link before it carries a heartbeat."""
    down_after: Annotated[float, _at_least(0.05)] = DOWN_AFTER
    """T: a neighbour silent this long is down (more than two heartbeats)."""
    ack_interval: Annotated[float, _at_least(0.001)] = ACK_INTERVAL
    """Seconds between looks at acknowledgements withheld by backpressure."""
    ack_delay: Annotated[float, _at_least(0.001)] = ACK_DELAY
    """Seconds within which notifications taken from a neighbour are acknowledged when it
    asked for no acknowledgement at once (one covers all it sent meanwhile); a neighbour
    asks ahead of a copy a publisher's confirm waits for, which is acknowledged before it
    is routed, and other routing messages are acknowledged at once."""
    ack_every: Annotated[int, _at_least(1)] = ACK_EVERY
    """Frames taken from a neighbour past which they are acknowledged at once, not
    within ``ack_delay`` (1: every run at once, as each arrives); at most half of
    ``custody_limit``, so a neighbour never stops for room only to wait out the delay."""
    custody_limit: Annotated[int, _at_least(0)] = CUSTODY_LIMIT
    """Unacknowledged notifications kept per link for a neighbour that may fail; full,
    the link waits. 0 = no custody (a failure loses what was in flight, and there is no
    backpressure)."""
    retain: Annotated[float, _at_least(0.0)] = RETAIN
    """Seconds acknowledged notifications are kept after sending, in case the neighbour
    dies before passing them on; 0 = not kept."""
    retain_limit: Annotated[int, _at_least(0)] = RETAIN_LIMIT
    """Acknowledged notifications kept per link at most (the oldest go first, counted)."""
    queue_limit: Annotated[int, _at_least(1)] = QUEUE_LIMIT
    """Frames waiting on one peer link; beyond it the broker withholds its
    acknowledgements from its other neighbours (hop-by-hop backpressure)."""
    capacity: Annotated[float, _at_least(0.0)] = 0.0
    """Messages per second on every outgoing peer link; 0 = unlimited."""
    broker_capacity: Annotated[float, _at_least(0.0)] = 0.0
    """Messages per second over all of the broker's outgoing links together; 0 =
    unlimited."""
    capacities: dict[str, Annotated[float, _at_least(0.0)]] = {}
    """Messages per second on single directed links, ``"src>dst" = rate`` in
    ``[links.capacities]``; a link not named takes ``capacity``."""

    def __post_init__(self) -> None:
        for link in self.capacities:
            if ">" not in link:
                raise ValueError(f"links.capacities key {link!r} is not 'src>dst'")
        if self.down_after <= 2 * self.heartbeat:
            raise ValueError(
                f"links.down_after ({self.down_after} s) must exceed two heartbeat "
                f"intervals ({self.heartbeat} s each), or idle links would be declared down"
            )

    def capacity_of(self, src: str, dst: str) -> float:
        """Messages/s allowed on ``src → dst``; 0 means unlimited."""
        return self.capacities.get(f"{src}>{dst}", self.capacity)


class Clients(Section):
    """``[clients]``: client connections and sessions."""

    sndhwm: Annotated[int, _at_least(1)] = 1_000
    """ZeroMQ messages (each of at most 16 deliveries) waiting per client connection
    before deliveries queue in the broker."""
    backlog_limit: Annotated[int, _at_least(1)] = 10_000
    """Deliveries queued in the broker for one connection beyond ``sndhwm``; at the limit
    ``slow_policy`` applies."""
    slow_policy: Literal[SLOW_POLICIES] = "disconnect"  # type: ignore[valid-type]
    """What a connection at its backlog limit gets: ``"disconnect"`` (its subscriptions
    are withdrawn and the client is told why) or ``"drop_oldest"`` (the oldest queued
    deliveries are dropped, and the client is told how many)."""
    publish_window: Annotated[int, _at_least(1)] = 1000
    """Unanswered publications per client connection; more are refused, so a publisher
    waits for credit."""
    timeout: Annotated[float, _at_least(0.1)] = CLIENT_TIMEOUT
    """Seconds of silence after which a client connection is dropped and its
    subscriptions are withdrawn."""
    move_timeout: Annotated[float, _at_least(0.1)] = MOVE_TIMEOUT
    """Seconds a client told to move a subscription away has to move it; the order lapses
    after that and the client stays subscribed here."""
    hold_limit: Annotated[int, _at_least(0)] = PUBLICATION_HOLD
    """Publications held while a restarted broker resyncs; when it is full, more are
    refused."""
    capacity: Annotated[float, _at_least(0.0)] = 0.0
    """Deliveries per second to all of the broker's clients together; 0 = unlimited."""
    queue_limit: Annotated[int, _at_least(1)] = DELIVERIES_LIMIT
    """Deliveries waiting for ``capacity``; beyond it the broker holds its neighbours
    back, as for a full link, and refuses local publications."""
    body_bytes: Annotated[int, _at_least(0)] = BODY_BYTES
    """Bytes of one publication's opaque body; a longer one is refused, naming this
    limit."""


class Dedup(Section):
    """``[dedup]``: edge dedup."""

    window: Annotated[int, _at_least(1)] = DEFAULT_DEDUP_WINDOW
    """(publisher, sequence number) pairs remembered per publisher by edge dedup, which
    delivers each publication at most once per host."""
    publishers: Annotated[int, _at_least(1)] = DEFAULT_DEDUP_PUBLISHERS
    """Publishers edge dedup remembers; the one seen first is forgotten first."""


class Retention(Section):
    """``[retention]``: the retention store and the replays it answers (DESIGN §11)."""

    max_bytes: Annotated[int, _at_least(1024)] = 256 * 2**20
    """Bytes of publication bodies the retention store keeps; the oldest go first past
    it."""
    max_age: Annotated[float, _at_least(0.0)] = 3600.0
    """Seconds a publication is kept in the retention store; 0 turns retention off."""
    sync: Literal[RETENTION_SYNC] = "normal"  # type: ignore[valid-type]
    """When a publication's confirm may leave: ``normal`` once the retention store's
    transaction is in its write-ahead log (it survives a ``kill -9`` of the broker, not a
    power failure of the machine: the operating system may not have written it yet);
    ``full`` once the log is on disk (fsync per commit: survives a power failure, costs a
    disk flush per input pass)."""
    replay_budget: Annotated[float, _at_least(0.01)] = REPLAY_BUDGET
    """Seconds the host of a replay waits for every broker's answer; a neighbour silent
    past its share of it is reported, with what only it reached, as a gap."""
    replay_rounds: Annotated[int, _at_least(1)] = REPLAY_ROUNDS
    """Replay requests one broker takes part in at once (the oldest ends early past it)."""
    historic_budget: Annotated[float, _at_least(0.01)] = HISTORIC_BUDGET
    """Seconds the host of a historic, hybrid or durable subscription's answer waits for
    every broker's answer (stores answer page by page, so a large answer takes longer)."""
    answer_max: Annotated[int, _at_least(1)] = ANSWER_MAX
    """Publications one store answers to one request at most (the answer says it was
    cut, and where to ask again from)."""
    answer_bytes: Annotated[int, _at_least(1024)] = ANSWER_BYTES
    """Encoded bytes one store answers to one request at most."""


class Durable(Section):
    """``[durable]``: durable subscriptions' records (DESIGN §11)."""

    keep: Annotated[float, _at_least(0.01)] = DURABLE_KEEP
    """Seconds a durable subscription's record waits for its client (DESIGN §11)."""
    max: Annotated[int, _at_least(1)] = DURABLE_MAX
    """Durable subscription records one broker keeps."""


class Composite(Section):
    """``[composite]``: the joins of composite subscriptions (DESIGN §12)."""

    max_held: Annotated[int, _at_least(1)] = COMPOSITE_HELD
    """Publications the join of one composite subscription keeps at most (DESIGN §12);
    past it the earliest published goes first, counted as ``composite.dropped`` and told
    to the client."""
    lateness: Annotated[float, _at_least(0.0)] = COMPOSITE_LATENESS
    """Seconds a publication may take from its publisher to a composite's host and still
    be joined with everything published within the composite's window: the join keeps
    each publication for ``window + lateness`` seconds after its publication time."""


class Logs(Section):
    """``[logs]``: the broker's log."""

    interval: Annotated[float, _at_least(0.0)] = 5.0
    """Seconds between two lines of a repeated warning of one kind (the count of those
    left out is logged with the next)."""


class Limits(InputLimits, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[limits]``: sizes accepted from clients and peers alike; the filter and
    publication sizes are :class:`~octopis.filters.limits.InputLimits`' (a broker puts
    this section in force as such)."""

    frame_bytes: Annotated[int, _at_least(1024)] = 1 << 20
    """Largest ZeroMQ message on any of the broker's sockets, bytes; a sender of a larger
    one is disconnected."""
    subscriptions_per_client: Annotated[int, _at_least(1)] = SUBSCRIPTIONS_PER_CLIENT
    """Subscriptions one client may hold at the broker."""


class Memory(Section):
    """``[memory]``: the broker's memory and Python's collector."""

    budget_mb: Annotated[int, _at_least(1)] = MEMORY_BUDGET_MB
    """RSS, in MB, above which the broker holds its neighbours back (75 brokers of 256 MB
    fit a 24 GiB machine; an idle broker uses about 45 MB)."""
    gc_young: Annotated[int, _at_least(1)] = 100_000
    """Net allocations between Python's young-generation collections (Python's default is
    700). A forwarded notification allocates a dozen short-lived containers; at 700 the
    collector would run every ~50 notifications and walk what custody keeps alive.
    Memory stays bounded: only reference cycles wait for a pass, and the broker makes
    few."""
    gc_idle: Annotated[int, _at_least(0)] = 10_000
    """Young objects at which an input loop that has run dry runs the collector's next
    pass at once (:class:`~octopis.transport.collector.IdleCollector`; 0: never), so the
    pass over what a subscription flood leaves falls in a moment with nothing to do
    rather than in the traffic after it."""


class Load(Section):
    """``[load]``: the load analysis (DESIGN §9)."""

    window: Annotated[int, _at_least(1)] = LOAD_WINDOW
    """Seconds of the load analysis's sliding window."""
    capacity: Annotated[float, _at_least(0.0)] = 0.0
    """Output (copies + deliveries) per second the broker can carry, the denominator of
    its load ratio; 0: measured (what one CPU second carried in the window)."""


class Stomp(Section):
    """``[stomp]``: the STOMP gateway (DESIGN §13)."""

    heartbeat: Annotated[int, _at_least(0)] = 10_000
    """STOMP heart-beats (DESIGN §13), ms: what the listener offers in CONNECTED, both
    ways; a client that negotiated heart-beats and is silent for two periods is dropped."""
    header_bytes: Annotated[int, _at_least(256)] = 8192
    """Bytes of one STOMP frame's command and headers."""
    headers: Annotated[int, _at_least(4)] = 64
    """Headers in one STOMP frame."""
    body_bytes: Annotated[int, _at_least(0)] = 65_536
    """Bytes of one STOMP frame's body."""
    write_buffer: Annotated[int, _at_least(1024)] = 1 << 20
    """Bytes waiting to be written to one STOMP connection before it counts as full (the
    broker then queues for it, up to ``clients.backlog_limit``)."""
    subscriptions: Annotated[int, _at_least(1)] = 256
    """STOMP subscriptions one connection may hold."""
    selector_subscriptions: Annotated[int, _at_least(1)] = SELECTOR_SUBSCRIPTIONS
    """PADRES subscriptions one selector may become (its disjunctive form)."""
    unacked: Annotated[int, _at_least(1)] = 10_000
    """Messages delivered to one connection and not acknowledged (client ack modes)."""


def _section(kind: type[msgspec.Struct]) -> Any:
    return msgspec.field(default_factory=kind)


class BrokerSettings(Section):
    """Everything a broker process can be tuned with: one field per ``[section]``."""

    lst: Lst = _section(Lst)
    routing: Routing = _section(Routing)
    links: Links = _section(Links)
    clients: Clients = _section(Clients)
    dedup: Dedup = _section(Dedup)
    retention: Retention = _section(Retention)
    durable: Durable = _section(Durable)
    composite: Composite = _section(Composite)
    logs: Logs = _section(Logs)
    limits: Limits = _section(Limits)
    memory: Memory = _section(Memory)
    load: Load = _section(Load)
    stomp: Stomp = _section(Stomp)

    def changed(self, changes: dict[str, dict[str, Any]]) -> BrokerSettings:
        """These settings with ``changes`` (``{section: {key: value}}``) in place, checked
        as a file's are (:class:`ConfigError` names a bad key)."""
        data = msgspec.to_builtins(self)
        for section, keys in changes.items():
            data.setdefault(section, {}).update(keys)
        return settings_from_data(data, "changes")

    def to_toml(self, changed_only: bool = False) -> str:
        """The settings as a TOML document :func:`load_settings` reads back; with
        ``changed_only`` just what differs from the defaults (readable by a broker of
        another version, as long as it knows those keys)."""
        tables = []
        for name in self.__struct_fields__:
            section = getattr(self, name)
            default = type(section)()
            changed = {
                key: getattr(section, key)
                for key in section.__struct_fields__
                if not changed_only or getattr(section, key) != getattr(default, key)
            }
            plain = [f"{key} = {_toml(value)}" for key, value in changed.items()]
            nested = {key: value for key, value in changed.items() if isinstance(value, dict)}
            plain = [line for key, line in zip(changed, plain, strict=True) if key not in nested]
            if plain:
                tables.append(f"[{name}]\n" + "".join(f"{line}\n" for line in plain))
            tables += [
                f"[{name}.{key}]\n" + "".join(f"{_toml(k)} = {_toml(v)}\n" for k, v in table)
                for key, value in nested.items()
                if (table := sorted(value.items()))
            ]
        return "\n".join(tables)


def _toml(value: object) -> str:
    """One TOML value (a string, an integer or a float) as written in a document."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


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


def settings_from_data(data: dict[str, Any], source: str = "settings") -> BrokerSettings:
    """Validate a parsed settings document; every error names the section and key."""
    try:
        return msgspec.convert(data, BrokerSettings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_worded(str(exc), data)}") from None


AT = re.compile(r"^(?P<problem>.*) - at `\$(?P<path>[^`]*)`$", re.S)
UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>[^`]*)`")


def _worded(message: str, data: dict[str, Any]) -> str:
    """msgspec's ``message`` about ``data`` said by section and key, with what a key
    takes: a kind, a minimum or one of a few words."""
    found = AT.match(message)
    problem, at = (found["problem"], found["path"]) if found else (message, "")
    path = at.lstrip(".").split(".")
    unknown = UNKNOWN.match(problem)
    if unknown is not None:
        if path == [""]:
            return f"unknown table [{unknown['key']}]"
        return f"unknown key {'.'.join([*path, unknown['key']])}"
    if len(path) == 1:
        if not isinstance(data.get(path[0]), dict):
            return f"[{path[0]}] must be a table of keys"
        return problem
    if len(path) != 2 or not re.fullmatch(r"\w+", path[1]):  # inside a table's key
        return f"{'.'.join(path).split('[')[0]}: {problem}"
    section, key = path
    value = data[section][key]
    return f"{section}.{key} must be {_takes(key_type(section, key), value)}, got {value!r}"


def every_key() -> list[tuple[str, str]]:
    """Every ``(section, key)`` a settings file may hold, in the order of the types."""
    sections = msgspec.inspect.type_info(BrokerSettings).fields  # type: ignore[attr-defined]
    return [(section.name, key.name) for section in sections for key in section.type.fields]


def key_type(section: str, key: str) -> msgspec.inspect.Type:
    """What ``[section] key`` takes (msgspec's description of its field's type; the words
    of a :class:`~msgspec.inspect.LiteralType` in the order they are declared)."""
    sections = msgspec.inspect.type_info(BrokerSettings).fields  # type: ignore[attr-defined]
    owner = next(field.type for field in sections if field.name == section)
    kind = next(field.type for field in owner.fields if field.name == key)
    if isinstance(kind, msgspec.inspect.LiteralType):
        declared = typing.get_type_hints(owner.cls)[key]
        return msgspec.inspect.LiteralType(typing.get_args(declared))
    return kind


def _takes(kind: msgspec.inspect.Type, value: object) -> str:
    """What a value of ``kind`` must be, for one that is not: the kind, or its minimum
    when ``value`` is of the kind."""
    if isinstance(kind, msgspec.inspect.LiteralType):
        return "one of " + ", ".join(map(repr, kind.values))
    if isinstance(kind, msgspec.inspect.DictType):
        return f"a table of numbers ≥ {kind.value_type.ge}"  # type: ignore[attr-defined]
    integer = isinstance(kind, msgspec.inspect.IntType)
    number = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if not number:
        return "an integer" if integer else "a number"
    return f"≥ {kind.ge}"  # type: ignore[attr-defined]
