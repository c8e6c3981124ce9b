"""Deploying brokers on several machines with systemd (DESIGN §10).

:func:`systemd_units` writes, for one host of a topology that names hosts, a template
unit that runs one broker (``octopis-broker@<id>.service``, the same command line
``octopis up --host`` runs) and a target that wants every broker placed on that host, so
``systemctl enable --now octopis-<host>.target`` starts the host's share of the overlay
and restarts a broker that dies.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from octopis.cluster.launcher import broker_command
from octopis.topology import Scot

BROKER_UNIT = "octopis-broker@.service"
_INSTANCE = "%I"
"""systemd's unescaped instance name: the broker id of ``octopis-broker@<id>.service``."""
_PLAIN = re.compile(r"[A-Za-z0-9:_.]")


def systemd_escape(text: str) -> str:
    """``text`` as a unit-name instance, as ``systemd-escape`` writes it: ``/`` becomes
    ``-``, a leading ``.`` and every byte outside ``[A-Za-z0-9:_.]`` become ``\\xNN``."""
    out = []
    for i, char in enumerate(text):
        if char == "/":
            out.append("-")
        elif _PLAIN.fullmatch(char) and not (i == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode())
    return "".join(out)


def target_name(host: str) -> str:
    """The systemd target of ``host``'s brokers."""
    return f"octopis-{systemd_escape(host)}.target"


def systemd_units(
    scot: Scot,
    host: str,
    topology: Path,
    *,
    mode: str,
    keys: Path | None,
    config: Path | None = None,
    python: str = sys.executable,
    user: str | None = None,
) -> dict[str, str]:
    """The unit files (name → text) that run ``host``'s brokers of ``scot``.

    ``topology``, ``keys`` and ``config`` are paths on that host; ``keys`` None runs the
    brokers ``--insecure``. The command line is :func:`broker_command`'s, with the broker
    id taken from the unit's instance name."""
    ids = scot.brokers_on(host)
    argv = broker_command(topology, _INSTANCE, mode, config, keys=keys, python=python)
    exec_start = " ".join(
        arg if arg == _INSTANCE else shlex.quote(arg).replace("%", "%%") for arg in argv
    )
    target = target_name(host)
    service = [
        "[Unit]",
        f"Description=OctopiS broker %I of {scot.name}",
        "Wants=network-online.target",
        "After=network-online.target",
        f"PartOf={target}",
        "",
        "[Service]",
        f"ExecStart={exec_start}",
        "Restart=on-failure",
        "RestartSec=2",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=15",
        *([f"User={user}"] if user else []),
        "",
        "[Install]",
        f"WantedBy={target}",
    ]
    wants = " ".join(f"octopis-broker@{systemd_escape(b)}.service" for b in ids)
    target_unit = [
        "[Unit]",
        f"Description=OctopiS brokers of {scot.name} on host {host} ({len(ids)})",
        f"Wants={wants}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return {BROKER_UNIT: "\n".join(service) + "\n", target: "\n".join(target_unit) + "\n"}
