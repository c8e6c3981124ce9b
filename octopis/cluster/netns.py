"""Hosts on one machine: network namespaces joined by a bridge (DESIGN §10), for tests and
benchmarks that run brokers "on several hosts" and cut, pause or slow them for real.

Every host is a namespace with one address on a bridge; the bridge sits in a namespace
of its own, so the machine's own network is never touched and no address outside them is
ever reached. A client namespace holds the programs that act as clients. It needs root
and ``ip netns``; :func:`why_no_namespaces` says why not when they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SUBNET = "198.18.7"
"""Addresses of the hosts (RFC 2544's range for network tests), inside the namespaces
only: the bridge's namespace has no route anywhere else."""
CLIENT_ADDRESS = f"{SUBNET}.100"
HOSTS = ("h0", "h1", "h2")
"""The hosts of the tests' runs: fig2's three clusters, one per host."""


@dataclass
class Namespaces:
    """The namespaces of one run: ``hosts`` (name → namespace), ``client``, ``switch``."""

    hosts: dict[str, str]
    client: str
    switch: str

    def address(self, host: str) -> str:
        """``host``'s address on the bridge."""
        return f"{SUBNET}.{list(self.hosts).index(host) + 1}"

    def port(self, host: str) -> str:
        """The bridge's port (a veth end in the switch's namespace) toward ``host``."""
        return f"port{list(self.hosts).index(host)}"

    def run(
        self, namespace: str, argv: list[str], timeout: float = 240
    ) -> subprocess.CompletedProcess:
        """``argv`` inside ``namespace``, output captured, bounded in time."""
        return subprocess.run(
            ["ip", "netns", "exec", namespace, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, namespace: str, argv: list[str], **kwargs: object) -> subprocess.Popen:
        """``argv`` started inside ``namespace`` (``subprocess.Popen``'s ``kwargs``)."""
        return subprocess.Popen(["ip", "netns", "exec", namespace, *argv], **kwargs)  # type: ignore[call-overload]


def ip(*args: str) -> None:
    """``ip ARGS``; ``CalledProcessError`` (with its output) if it fails."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def why_no_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"octopis-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@contextmanager
def namespaces(tag: str, hosts: tuple[str, ...]) -> Iterator[Namespaces]:
    """A namespace per host of ``hosts`` and one for clients, named after ``tag``, on one
    bridge; all deleted on exit."""
    ns = Namespaces(
        hosts={h: f"{tag}-{h}" for h in hosts}, client=f"{tag}-client", switch=f"{tag}-sw"
    )
    made: list[str] = []
    try:
        for name in (ns.switch, *ns.hosts.values(), ns.client):
            ip("netns", "add", name)
            made.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        ip("-n", ns.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", ns.switch, "link", "set", "br0", "up")
        members = [*((ns.hosts[h], ns.address(h)) for h in hosts), (ns.client, CLIENT_ADDRESS)]
        for i, (name, address) in enumerate(members):
            port = f"port{i}"
            ip("-n", ns.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0")
            ip("-n", ns.switch, "link", "set", "eth0", "netns", name)
            ip("-n", ns.switch, "link", "set", port, "master", "br0", "up")
            ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", name, "link", "set", "eth0", "up")
        yield ns
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
