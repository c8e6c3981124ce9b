"""systemd units for brokers on several hosts (DESIGN §10): one template unit runs the
command line ``octopis up --host`` runs, one target per host wants exactly its brokers."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from octopis.cli.topology import main as topology_main
from octopis.cluster.deploy import BROKER_UNIT, systemd_escape, systemd_units, target_name
from octopis.cluster.launcher import broker_command
from octopis.topology import build_preset

HOSTS = {"alpha": "192.0.2.1", "beta": "192.0.2.2"}


def _unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(text)
    return parser


@pytest.mark.parametrize("keys", [Path("/etc/octopis/keys"), None])
def test_a_host_gets_a_target_of_its_brokers_and_the_broker_command_line(
    keys: Path | None,
) -> None:
    scot = build_preset("fig2", hosts=HOSTS)
    topology = Path("/etc/octopis/my topology.json")
    config = Path("/etc/octopis/100%.toml")
    units = systemd_units(
        scot, "beta", topology, mode="snr", keys=keys, config=config, python="/opt/py/bin/python"
    )
    assert sorted(units) == sorted([BROKER_UNIT, "octopis-beta.target"])
    target = _unit(units["octopis-beta.target"])
    wanted = target["Unit"]["Wants"].split()
    assert wanted == [f"octopis-broker@{b}.service" for b in scot.brokers_on("beta")]
    assert all(scot.brokers[b].host == "beta" for b in scot.brokers_on("beta"))
    service = _unit(units[BROKER_UNIT])
    assert service["Install"]["WantedBy"] == "octopis-beta.target"
    assert service["Service"]["Restart"] == "on-failure"
    # systemd unescapes %% and substitutes %I; the rest is shell-like quoting
    exec_start = service["Service"]["ExecStart"].replace("%I", "b:1").replace("%%", "%")
    expected = broker_command(
        topology, "b:1", "snr", config, keys=keys, python="/opt/py/bin/python"
    )
    assert shlex.split(exec_start) == expected
    assert ("--insecure" in expected) == (keys is None)


@pytest.mark.parametrize("text", ["a:0", "viii:12", ".hidden", "x/y z", "Zürich-1"])
def test_instance_names_are_escaped_as_systemd_escape_does(text: str) -> None:
    tool = shutil.which("systemd-escape")
    if tool is None:
        pytest.skip("no systemd-escape to compare with")
    expected = subprocess.run([tool, text], capture_output=True, text=True, check=True).stdout
    assert systemd_escape(text) == expected.strip()


def test_the_cli_writes_the_units_and_names_a_host_it_does_not_know(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "t.json"
    pairs = ",".join(f"{h}={a}" for h, a in HOSTS.items())
    assert topology_main(["build", "--preset", "fig2", "--hosts", pairs, "-o", str(out)]) == 0
    units = tmp_path / "units"
    args = ["systemd", str(out), "--host", "alpha", "--insecure", "-o", str(units)]
    assert topology_main(args) == 0
    assert sorted(p.name for p in units.iterdir()) == sorted([BROKER_UNIT, target_name("alpha")])
    assert "systemctl enable --now octopis-alpha.target" in capsys.readouterr().out
    assert topology_main([*args[:3], "gamma", *args[4:-1], str(tmp_path / "other")]) == 2
    assert "places no broker on host 'gamma' (hosts: alpha, beta)" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
