"""Key pairs of a deployment (``octopis.keys``, ``octopis-topology keys``, DESIGN §8)."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from octopis.keys import KEYS_ENV, Keys, KeysError, make_keys
from octopis.topology import build_preset


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keys_cover_every_broker_endpoint_and_keep_secrets_private(tmp_path: Path) -> None:
    """Every endpoint maps to its broker's public key; secrets and folders are private;
    a second run keeps the pairs it finds."""
    scot = build_preset("fig2")
    root = make_keys(tmp_path / "keys", scot.endpoints_by_broker(), ["alice", "bob"])
    keys = Keys(root)
    for broker in scot.brokers.values():
        public = keys.broker(broker.id).public
        assert keys.broker_public(broker.id) == public
        for endpoint in scot.endpoints_by_broker()[broker.id]:
            assert keys.server_key(endpoint) == public
    assert keys.allowed_clients() == {keys.client("alice").public, keys.client("bob").public}
    assert keys.admin().public == keys.admin_public() not in keys.allowed_clients()
    secrets = list(root.rglob("*.key_secret"))
    assert len(secrets) == 18 + 2 + 1
    assert {_mode(p) for p in secrets} == {0o600}
    assert {_mode(p) for p in (root, root / "brokers", root / "clients", root / "admin")} == {0o700}
    before = keys.broker("a:0")
    make_keys(root, scot.endpoints_by_broker(), ["alice"])
    assert Keys(root).broker("a:0") == before


def test_missing_keys_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing directory, key file or endpoint raises KeysError naming it; the SDK's
    default comes from $OCTOPIS_KEYS."""
    with pytest.raises(KeysError, match="no keys directory"):
        Keys(tmp_path / "none")
    root = make_keys(tmp_path / "keys", {"a:0": ("tcp://127.0.0.1:1",)})
    with pytest.raises(KeysError, match=r"b:0\.key_secret"):
        Keys(root).broker("b:0")
    with pytest.raises(KeysError, match=r"names no broker at tcp://127\.0\.0\.1:2"):
        Keys(root).server_key("tcp://127.0.0.1:2")
    monkeypatch.delenv(KEYS_ENV, raising=False)
    assert Keys.find(None) is None
    monkeypatch.setenv(KEYS_ENV, str(root))
    found = Keys.find(None)
    assert found is not None and found.directory == root


@pytest.mark.processes
def test_keys_command_and_a_broker_without_its_key(tmp_path: Path) -> None:
    """``octopis-topology keys`` writes a deployment's keys; a broker given a keys
    directory without its own pair exits 2 naming the file; one given neither ``--keys``
    nor ``--insecure`` exits 2 saying so."""
    topology = tmp_path / "fig2.json"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", *args], capture_output=True, text=True, timeout=60
        )

    built = run("octopis.cli.topology", "build", "--preset", "fig2", "-o", str(topology))
    assert built.returncode == 0, built.stderr
    made = run("octopis.cli.topology", "keys", str(topology), "-o", str(tmp_path / "keys"))
    assert made.returncode == 0, made.stderr
    assert "18 brokers, 1 client(s)" in made.stdout
    (tmp_path / "keys" / "brokers" / "a:0.key_secret").unlink()
    broker = ("octopis.cli.broker", "--topology", str(topology), "--id", "a:0")
    without = run(*broker, "--keys", str(tmp_path / "keys"))
    assert without.returncode == 2 and "a:0.key_secret" in without.stderr
    neither = run(*broker)
    assert neither.returncode == 2 and "--keys --insecure is required" in neither.stderr
