"""Broker settings files (``octopis/settings.py``): every key read back, limits
included, and every bad value refused naming its section and key."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from octopis.filters.limits import InputLimits
from octopis.settings import (
    BrokerSettings,
    ConfigError,
    Limits,
    Links,
    Lst,
    Memory,
    Routing,
    every_key,
    key_type,
    load_settings,
    settings_from_data,
)

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_settings_round_trip_through_toml(tmp_path: Path) -> None:
    settings = BrokerSettings(
        lst=Lst(queue_threshold=7, order="bluedove"),
        routing=Routing(
            covering="off" if BrokerSettings().routing.covering == "active" else "active"
        ),
        links=Links(custody_limit=0, capacities={"a:0>b:0": 200.0}),
        limits=Limits(
            attributes=9,
            predicates=3,
            string_length=40,
            name_length=16,
            frame_bytes=4096,
            subscriptions_per_client=5,
        ),
        memory=Memory(gc_young=5000),
    )
    path = tmp_path / "broker.toml"
    path.write_text(settings.to_toml())
    assert load_settings(path) == settings
    assert load_settings(None) == BrokerSettings()
    changed = settings.to_toml(changed_only=True)  # what a broker of another version reads
    assert "gc_young = 5000" in changed and "window" not in changed and "sndhwm" not in changed
    assert "[routing]\ncovering = " in changed
    assert '[links.capacities]\n"a:0>b:0" = 200.0\n' in changed
    path.write_text(changed)
    assert load_settings(path) == settings
    assert BrokerSettings().to_toml(changed_only=True) == ""
    assert isinstance(settings.limits, InputLimits)  # the section a broker puts in force


def test_every_section_is_a_type_whose_fields_are_its_keys() -> None:
    """A section's settings type has exactly the section's keys as fields, each with a
    kind (a number with a minimum, or one of a few words) and a default of that kind."""
    defaults = msgspec.to_builtins(BrokerSettings())
    keys = every_key()
    assert (
        {section for section, _ in keys} == set(defaults) == set(BrokerSettings.__struct_fields__)
    )
    assert len(keys) == len(set(keys)) == sum(len(section) for section in defaults.values())
    for section, key in keys:
        kind = key_type(section, key)
        default = defaults[section][key]
        if isinstance(kind, msgspec.inspect.LiteralType):
            assert default in kind.values, (section, key)
        elif isinstance(kind, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
            assert default >= kind.ge, (section, key)
        else:
            assert (section, key) == ("links", "capacities")


@pytest.mark.parametrize(("section", "key"), every_key())
def test_each_key_is_read_and_its_bad_values_refused(section: str, key: str) -> None:
    """Per key of each section: a good value other than the default is read into that
    section's field; a value of the wrong kind, or below the minimum, or outside the
    words, is refused with a message naming ``section.key``; an unknown key beside it is
    refused naming the section."""
    kind = key_type(section, key)
    if isinstance(kind, msgspec.inspect.DictType):
        good: object = {"a:0>b:0": 5.0}
        bad: list[object] = [{"a:0>b:0": -1.0}, {"a:0-b:0": 5.0}, 7]
    elif isinstance(kind, msgspec.inspect.LiteralType):
        good = next(w for w in kind.values if w != getattr(getattr(BrokerSettings(), section), key))
        bad = ["nonsense", 3]
    else:
        integer = isinstance(kind, msgspec.inspect.IntType)
        minimum = kind.ge  # type: ignore[attr-defined]
        good = minimum + 1 if integer else minimum + 0.5
        bad = ["5", True, minimum - 1 if integer else minimum - 0.5]
        if integer:
            bad.append(float(minimum) + 0.5)
    if (section, key) == ("links", "heartbeat"):
        data: dict[str, dict[str, object]] = {section: {key: good, "down_after": 10.0}}
    else:
        data = {section: {key: good}}
    read = getattr(getattr(settings_from_data(data), section), key)
    assert read == good and read != getattr(getattr(BrokerSettings(), section), key)
    for value in bad:
        with pytest.raises(ConfigError) as refused:
            settings_from_data({section: {key: value}}, "t.toml")
        assert str(refused.value).startswith("t.toml: ") and f"{section}." in str(refused.value)
        if not isinstance(kind, msgspec.inspect.DictType):
            assert f"{section}.{key} must be" in str(refused.value), str(refused.value)
    with pytest.raises(ConfigError, match=re.escape(f"unknown key {section}.{key}x")):
        settings_from_data({section: {f"{key}x": good}})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[limits]\npredicates = 0\n", "limits.predicates must be ≥ 1"),
        ("[limits]\nstring_length = 2.5\n", "limits.string_length must be an integer"),
        ("[limits]\nframe_bytes = 10\n", "limits.frame_bytes must be ≥ 1024"),
        ("[limits]\nwidth = 3\n", "unknown key limits.width"),
        ("[limit]\npredicates = 3\n", r"unknown table \[limit\]"),
        ("limits = 3\n", r"\[limits\] must be a table"),
        ('[lst]\norder = "fifo"\n', "lst.order must be one of 'ce', 'bluedove'"),
        ('[routing]\ncovering = "lazy"\n', "routing.covering must be one of 'off', 'active'"),
        ("[routing]\nmode = 3\n", "unknown key routing.mode"),
        ("[memory]\ngc_young = 0\n", "memory.gc_young must be ≥ 1"),
        ("[links]\nheartbeat = 0.6\n", "links.down_after .* must exceed two heartbeat"),
        ('[links.capacities]\n"a:0" = 3\n', "links.capacities key 'a:0' is not 'src>dst'"),
        ("[lst\n", "is not valid TOML"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        load_settings(path)


def test_changed_settings_are_checked_as_a_file_is() -> None:
    settings = BrokerSettings().changed({"lst": {"order": "bluedove"}, "load": {"window": 3}})
    assert (settings.lst.order, settings.load.window) == ("bluedove", 3)
    assert settings.changed({}) == settings
    with pytest.raises(ConfigError, match=r"lst\.window must be ≥"):
        settings.changed({"lst": {"window": 0}})


def test_a_link_capacity_falls_back_to_the_links_capacity() -> None:
    links = Links(capacity=50.0, capacities={"a:0>b:0": 200.0})
    assert (links.capacity_of("a:0", "b:0"), links.capacity_of("b:0", "a:0")) == (200.0, 50.0)


def test_the_settings_shown_in_the_docs_are_read_as_written() -> None:
    """Every TOML block of docs/covering.md is a broker settings file that loads, and sets
    what the page says it sets."""
    page = (DOCS / "covering.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", page, re.S)
    loaded = [settings_from_data(tomllib.loads(block), "docs/covering.md") for block in blocks]
    routing = [(s.routing.covering, s.routing.advertisements) for s in loaded]
    assert routing == [("active", "off"), ("active", "on")]


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
    assert settings.retention.sync == sync
    store = RetentionStore(tmp_path / "r.sqlite", settings.retention, bytes)
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == level
    store.close()
    path.write_text('[retention]\nsync = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"retention\.sync must be one of 'normal', 'full'"):
        load_settings(path)


STATED = re.compile(
    r"`\[(?P<section>[a-z_]+)\] (?P<key>[a-z_]+)`(?: \| | (?:[a-z]+ )?\((?:[A-Z], )?|, )"
    r"(?P<number>[0-9][0-9,.]*)(?: (?P<unit>MiB|KiB|s|ms|MB)\b)?"
)
"""A settings key the docs name with its default: a table row ``| `[s] k` | 10,000 |``
or prose ``[s] k` (5 s)``, ``[s] k` ms (10,000)``, ``[s] k` (T, 1 s)``, ``[s] k`, 0.2 s``."""
UNITS = {"MiB": 2**20, "KiB": 2**10, "ms": 1e-3}
"""Units the docs write a default in that the key does not count in (bytes, seconds)."""


def test_the_defaults_the_docs_state_are_the_declared_ones() -> None:
    """Every default a page of the docs states beside a ``[section] key`` is the default
    of that key's field: a default changes in one place, and a page that restates it
    fails here until it says the same."""
    defaults = msgspec.to_builtins(BrokerSettings())
    stated = [
        (page.relative_to(DOCS), m)
        for page in sorted(DOCS.rglob("*.md"))
        for m in STATED.finditer(page.read_text(encoding="utf-8"))
    ]
    assert len(stated) >= 20, [m.group() for _, m in stated]
    wrong = []
    for page, m in stated:
        value = float(m["number"].replace(",", "")) * UNITS.get(m["unit"] or "", 1)
        if not math.isclose(value, defaults[m["section"]][m["key"]]):
            wrong.append(
                f"{page}: {m.group()} but the default is {defaults[m['section']][m['key']]}"
            )
    assert not wrong, "\n".join(wrong)
