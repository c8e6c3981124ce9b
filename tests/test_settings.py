"""Broker settings files (``octopis/transport/settings.py``): every key read back, limits
included, and every bad value refused naming its key."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from octopis.filters.limits import InputLimits
from octopis.transport.settings import (
    BrokerSettings,
    ConfigError,
    load_settings,
    settings_from_data,
)


def test_settings_round_trip_through_toml(tmp_path: Path) -> None:
    settings = BrokerSettings(
        queue_threshold=7,
        order="bluedove",
        covering="off" if BrokerSettings().covering == "active" else "active",
        custody_limit=0,
        frame_bytes=4096,
        limits=InputLimits(attributes=9, predicates=3, string_length=40, name_length=16),
        subscriptions_per_client=5,
        capacities={"a:0>b:0": 200.0},
        gc_young=5000,
    )
    path = tmp_path / "broker.toml"
    path.write_text(settings.to_toml())
    assert load_settings(path) == settings
    assert load_settings(None) == BrokerSettings()
    changed = settings.to_toml(changed_only=True)  # what a broker of another version reads
    assert "gc_young = 5000" in changed and "window" not in changed and "sndhwm" not in changed
    assert "[routing]\ncovering = " in changed
    path.write_text(changed)
    assert load_settings(path) == settings
    assert BrokerSettings().to_toml(changed_only=True) == ""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[limits]\npredicates = 0\n", "limits.predicates must be ≥ 1"),
        ("[limits]\nstring_length = 2.5\n", "limits.string_length must be an integer"),
        ("[limits]\nframe_bytes = 10\n", "limits.frame_bytes must be ≥ 1024"),
        ("[limits]\nwidth = 3\n", "unknown key limits.width"),
        ("[limit]\npredicates = 3\n", r"unknown table \[limit\]"),
        ('[lst]\norder = "fifo"\n', "lst.order must be one of 'ce', 'bluedove'"),
        ('[routing]\ncovering = "lazy"\n', "routing.covering must be one of 'off', 'active'"),
        ("[routing]\nmode = 3\n", "unknown key routing.mode"),
        ("[memory]\ngc_young = 0\n", "memory.gc_young must be ≥ 1"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        load_settings(path)


def test_the_settings_shown_in_the_docs_are_read_as_written() -> None:
    """Every TOML block of docs/covering.md is a broker settings file that loads, and sets
    what the page says it sets."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "covering.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", page, re.S)
    loaded = [settings_from_data(tomllib.loads(block), "docs/covering.md") for block in blocks]
    assert [(s.covering, s.advertisements) for s in loaded] == [("active", "off"), ("active", "on")]


@pytest.mark.parametrize(("sync", "level"), [("normal", 1), ("full", 2)])
def test_retention_sync_sets_when_a_confirm_is_durable(
    tmp_path: Path, sync: str, level: int
) -> None:
    """``[retention] sync``: ``full`` makes every commit of the retention store an fsync
    (SQLite's synchronous=FULL, 2), ``normal`` writes the log without it (1); anything
    else is refused naming the choices."""
    from octopis.transport.retention import RetentionStore

    path = tmp_path / "s.toml"
    path.write_text(f'[retention]\nsync = "{sync}"\n')
    settings = load_settings(path)
    assert settings.retention_sync == sync
    store = RetentionStore(tmp_path / "r.sqlite", 1 << 20, 60.0, bytes, settings.retention_sync)
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == level
    store.close()
    path.write_text('[retention]\nsync = "sometimes"\n')
    with pytest.raises(ConfigError, match="sync"):
        load_settings(path)
