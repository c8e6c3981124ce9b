"""Broker settings, read from a TOML file (``octopis-broker --config``).

```toml
[lst]
window = 0.05            # Δt of the Link Status Table, seconds (paper §6.3)
queue_threshold = 10     # Q: a queue this long marks its link overloaded

[links]
sndhwm = 64              # ZeroMQ send high-water mark per peer link (messages)
heartbeat = 0.2          # seconds of silence on a link before it carries a heartbeat
down_after = 1.0         # T: a neighbour silent this long is down (DESIGN §7)
ack_interval = 0.05      # a receiver acknowledges the frames it took at least this often
custody_limit = 10000    # unacknowledged notifications kept per link; full = link waits;
                         # 0 = no custody (a failure loses what was in flight)
capacity = 0             # messages/s on every outgoing peer link; 0 = unlimited
broker_capacity = 0      # messages/s over all of a broker's links together; 0 = unlimited
[links.capacities]       # per directed link "src>dst" = messages/s
"b:2>b:0" = 200

[clients]
sndhwm = 100000          # per client connection before deliveries queue in the broker
timeout = 10.0           # a connection silent this long is dropped, its subscriptions withdrawn

[logs]
interval = 5.0           # a repeated warning is written at most once per interval per kind
```
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octopis.core.lst import DEFAULT_QUEUE_THRESHOLD, DEFAULT_WINDOW


class ConfigError(ValueError):
    """A settings file that cannot be used; the message names the key."""


@dataclass(frozen=True)
class BrokerSettings:
    """Everything a broker process can be tuned with."""

    window: float = DEFAULT_WINDOW
    queue_threshold: int = DEFAULT_QUEUE_THRESHOLD
    sndhwm: int = 64
    capacity: float = 0.0
    capacities: dict[str, float] = field(default_factory=dict)
    broker_capacity: float = 0.0
    client_sndhwm: int = 100_000
    heartbeat: float = 0.2
    down_after: float = 1.0
    ack_interval: float = 0.05
    custody_limit: int = 10_000
    client_timeout: float = 10.0
    log_interval: float = 5.0

    def capacity_of(self, src: str, dst: str) -> float:
        """Messages/s allowed on ``src → dst``; 0 means unlimited."""
        return self.capacities.get(f"{src}>{dst}", self.capacity)

    def to_toml(self) -> str:
        """The settings as a TOML document :func:`load_settings` reads back."""
        lines = [
            "[lst]",
            f"window = {self.window!r}",
            f"queue_threshold = {self.queue_threshold}",
            "",
            "[links]",
            f"sndhwm = {self.sndhwm}",
            f"heartbeat = {self.heartbeat!r}",
            f"down_after = {self.down_after!r}",
            f"ack_interval = {self.ack_interval!r}",
            f"custody_limit = {self.custody_limit}",
            f"capacity = {self.capacity!r}",
            f"broker_capacity = {self.broker_capacity!r}",
            "",
            "[clients]",
            f"sndhwm = {self.client_sndhwm}",
            f"timeout = {self.client_timeout!r}",
            "",
            "[logs]",
            f"interval = {self.log_interval!r}",
        ]
        if self.capacities:
            lines += ["", "[links.capacities]"]
            lines += [f'"{link}" = {rate!r}' for link, rate in sorted(self.capacities.items())]
        return "\n".join(lines) + "\n"


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
    """Validate a parsed settings document."""
    known = {
        "lst": {"window", "queue_threshold"},
        "links": {
            "sndhwm",
            "heartbeat",
            "down_after",
            "ack_interval",
            "custody_limit",
            "capacity",
            "capacities",
            "broker_capacity",
        },
        "clients": {"sndhwm", "timeout"},
        "logs": {"interval"},
    }
    for table, keys in data.items():
        if table not in known or not isinstance(keys, dict):
            raise ConfigError(f"{source}: unknown table [{table}]")
        for key in keys:
            if key not in known[table]:
                raise ConfigError(f"{source}: unknown key {table}.{key}")
    lst, links, clients, logs = (data.get(t, {}) for t in ("lst", "links", "clients", "logs"))
    default = BrokerSettings()
    capacities = links.get("capacities", {})
    for link, rate in capacities.items():
        if ">" not in link:
            raise ConfigError(f"{source}: links.capacities key {link!r} is not 'src>dst'")
        _number(rate, f"links.capacities.{link}", source, minimum=0.0)
    heartbeat = _number(
        links.get("heartbeat", default.heartbeat), "links.heartbeat", source, minimum=0.01
    )
    down_after = _number(
        links.get("down_after", default.down_after), "links.down_after", source, minimum=0.05
    )
    if down_after <= 2 * heartbeat:
        raise ConfigError(
            f"{source}: links.down_after ({down_after} s) must exceed two heartbeat "
            f"intervals ({heartbeat} s each), or idle links would be declared down"
        )
    return BrokerSettings(
        window=_number(lst.get("window", default.window), "lst.window", source, minimum=1e-4),
        queue_threshold=int(
            _number(
                lst.get("queue_threshold", default.queue_threshold),
                "lst.queue_threshold",
                source,
                minimum=1,
                integer=True,
            )
        ),
        sndhwm=int(
            _number(
                links.get("sndhwm", default.sndhwm), "links.sndhwm", source, minimum=1, integer=True
            )
        ),
        capacity=_number(
            links.get("capacity", default.capacity), "links.capacity", source, minimum=0.0
        ),
        capacities={k: float(v) for k, v in capacities.items()},
        broker_capacity=_number(
            links.get("broker_capacity", default.broker_capacity),
            "links.broker_capacity",
            source,
            minimum=0.0,
        ),
        client_sndhwm=int(
            _number(
                clients.get("sndhwm", default.client_sndhwm),
                "clients.sndhwm",
                source,
                minimum=1,
                integer=True,
            )
        ),
        heartbeat=heartbeat,
        down_after=down_after,
        ack_interval=_number(
            links.get("ack_interval", default.ack_interval),
            "links.ack_interval",
            source,
            minimum=0.001,
        ),
        custody_limit=int(
            _number(
                links.get("custody_limit", default.custody_limit),
                "links.custody_limit",
                source,
                minimum=0,
                integer=True,
            )
        ),
        client_timeout=_number(
            clients.get("timeout", default.client_timeout), "clients.timeout", source, minimum=0.1
        ),
        log_interval=_number(
            logs.get("interval", default.log_interval), "logs.interval", source, minimum=0.0
        ),
    )


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
