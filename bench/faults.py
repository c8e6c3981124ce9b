"""Faults on broker processes (DESIGN §7): fig2 over three network namespaces, one cluster
per host, and each fault the network, the processes and the disk can do, mid-stream.

    python -m bench.faults [--mode snr --mode dnr] [--fault cut ...] [--seconds 4]
                           [--out bench/results/faults.json]

Needs root and ``ip netns`` (:mod:`octopis.cluster.netns`). The overlay runs with keys
and covering on; host h0's data directory is a tmpfs of :data:`DISK_MB` MB; the link
``a:0`` – ``a:1`` (h0 – h1) goes through a TCP proxy in the client namespace
(:mod:`bench.toxic`) both ways. Each scenario (:data:`FAULTS`) is run from the client
namespace by :mod:`bench.fault_run`: a pipelined publisher at ``a:0``, subscribers live,
failed over, durable and historic, the fault injected :data:`FAULT_AT` s into publishing
and healed after ``--seconds``. The table counts, per scenario and subscriber, expected,
delivered, duplicated and lost deliveries, the gaps reported to it, and the seconds from
the heal until every broker was ready again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from octopis.cluster.launcher import find_free_base_port
from octopis.cluster.netns import CLIENT_ADDRESS, HOSTS, Namespaces, namespaces, why_no_namespaces
from octopis.keys import make_keys
from octopis.topology import build_preset

REPO = Path(__file__).resolve().parents[1]
OCTOPIS = [sys.executable, "-m", "octopis.cli.main"]
DISK_MB = 8
FAULT_AT = 2.5
FAULTS: dict[str, str] = {
    "crash": "kill -9 of a:1, restarted",
    "pause": "SIGSTOP of a:1, SIGCONT",
    "cut": "host h1 cut off both ways (veth down)",
    "one-way": "h0 → h1 dropped (blackhole route in h0)",
    "delay": "0.5 s added on a:0 ⇄ a:1 (proxy)",
    "stall": "a:0 ⇄ a:1 carries nothing, connections kept (proxy)",
    "reset": "a:0 ⇄ a:1 connections reset and refused (proxy)",
    "disk": "h0's data tmpfs full (ballast), then freed",
}
"""Each fault the scenarios inject, as the table names it."""
PROXIED = ("a:0", "a:1")


class Overlay:
    """fig2 in ``mode`` on the hosts of ``ns`` for as long as the context lasts, with the
    proxy on :data:`PROXIED` and h0's data on a tmpfs; :meth:`run` runs one scenario."""

    def __init__(self, ns: Namespaces, root: Path, mode: str) -> None:
        self.ns, self.root, self.mode = ns, root, mode
        self.run_dirs = {h: root / f"run-{h}" for h in HOSTS}
        self.disk = self.run_dirs["h0"] / "data"
        self.proxy: subprocess.Popen | None = None

    def _topologies(self) -> tuple[Path, dict[str, Path], list[str], int]:
        """The topology, each host's copy (the proxied link's far end at the proxy), the
        proxy's routes and its control port."""
        self.root.mkdir(parents=True, exist_ok=True)
        hosts = {h: self.ns.address(h) for h in HOSTS}
        scot = build_preset("fig2", hosts=hosts, base_port=find_free_base_port(18 + 2))
        path = self.root / "t.json"
        data = scot.to_json()
        path.write_text(json.dumps(data, indent=1))
        make_keys(self.root / "keys", scot.endpoints_by_broker())
        spare = int(scot.brokers["a:0"].endpoint.rsplit(":", 1)[1]) + 4 * 18
        routes, files = [], {}
        entries = {b["id"]: b for b in data["brokers"]}
        by_host: dict[str, dict[str, str]] = {h: {} for h in HOSTS}
        for i, (near, far) in enumerate((PROXIED, PROXIED[::-1])):
            real = entries[far]["endpoint"]
            proxied = f"tcp://{CLIENT_ADDRESS}:{spare + i}"
            routes.append(f"{CLIENT_ADDRESS}:{spare + i}={real.removeprefix('tcp://')}")
            by_host[scot.brokers[near].host][far] = proxied
        for host, moved in by_host.items():
            copy = json.loads(json.dumps(data))
            for entry in copy["brokers"]:
                entry["endpoint"] = moved.get(entry["id"], entry["endpoint"])
            files[host] = self.root / f"t-{host}.json"
            files[host].write_text(json.dumps(copy, indent=1))
        return path, files, routes, spare + 2

    def __enter__(self) -> Overlay:
        self.topology, files, routes, self.control = self._topologies()
        self.disk.mkdir(parents=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(self.disk)], check=True
        )
        try:
            self._start(files, routes)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, files: dict[str, Path], routes: list[str]) -> None:
        self.proxy = self.ns.popen(
            self.ns.client,
            [sys.executable, "-m", "bench.toxic", "--control", str(self.control), *routes],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.proxy.stdout is not None
        if self.proxy.stdout.readline().strip() != "ready":
            raise RuntimeError("the proxy did not start")
        keys = ["--keys", str(self.root / "keys"), "--mode", self.mode, "--timeout", "150"]
        ups = {
            h: self.ns.popen(
                self.ns.hosts[h],
                [
                    *OCTOPIS,
                    "up",
                    str(files[h]),
                    "--host",
                    h,
                    "--run-dir",
                    str(self.run_dirs[h]),
                    *keys,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for h in HOSTS
        }
        outputs = {h: p.communicate(timeout=200)[0] for h, p in ups.items()}
        for h, p in ups.items():
            if p.returncode:
                raise RuntimeError(f"octopis up --host {h} failed:\n{outputs[h][-3000:]}")

    def __exit__(self, *exc: object) -> None:
        for h, run_dir in self.run_dirs.items():
            if (run_dir / "cluster.json").exists():
                self.ns.run(self.ns.hosts[h], [*OCTOPIS, "down", "--run-dir", str(run_dir)])
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait()
        subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)

    def run(
        self, kind: str, seconds: float, count: int = 300, rate: float = 30.0
    ) -> dict[str, Any]:
        """Scenario ``kind`` (of :data:`FAULTS`) for ``seconds``: its report."""
        if kind not in FAULTS:
            raise ValueError(f"no fault {kind!r}: one of {', '.join(FAULTS)}")
        spec = {
            "mode": self.mode,
            "kind": kind,
            "seconds": seconds,
            "count": count,
            "rate": rate,
            "fault_at": FAULT_AT,
            "topology": str(self.topology),
            "keys": str(self.root / "keys"),
            "work": str(self.root / f"work-{kind}"),
            "run_dirs": {h: str(d) for h, d in self.run_dirs.items()},
            "namespaces": self.ns.hosts,
            "host_of": {f"{r}:{c}": HOSTS[c] for r in "abcdef" for c in range(3)},
            "switch": self.ns.switch,
            "cut_port": self.ns.port("h1"),
            "publisher_ns": self.ns.hosts["h0"],
            "cut_address": f"{self.ns.address('h1')}/32",
            "proxy_control": self.control,
            "disk": str(self.disk),
        }
        spec_path = self.root / f"spec-{kind}.json"
        spec_path.write_text(json.dumps(spec))
        done = self.ns.run(
            self.ns.client,
            ["env", f"PYTHONPATH={REPO}", sys.executable, "-m", "bench.fault_run", str(spec_path)],
            timeout=240,
        )
        if done.returncode:
            raise RuntimeError(
                f"scenario {kind} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
            )
        report = json.loads(done.stdout.strip().splitlines()[-1])
        report["fault"] = FAULTS[kind]
        report["passed"] = all(passes(row) for row in report["subscribers"])
        return report


def passes(row: dict[str, Any]) -> bool:
    """A subscriber's verdict: nothing duplicated, and nothing lost unless a gap was
    reported to it and is still open."""
    return row["duplicates"] == 0 and (row["lost"] == 0 or row["gaps_open"] > 0)


@contextmanager
def hosts() -> Iterator[Namespaces]:
    """The namespaces, or ``SystemExit`` naming why they cannot be made."""
    if reason := why_no_namespaces():
        raise SystemExit(f"bench.faults: {reason}")
    with namespaces(f"faults{os.getpid()}", HOSTS) as ns:
        yield ns


def markdown(reports: list[dict[str, Any]]) -> str:
    """The RESULTS table: one row per scenario, its subscribers' counts summed; gaps
    reported to them, filled later, and still open; link-down detections across the
    brokers; seconds from the heal until every broker was ready (and the machine's load
    average then: on two cores it moves them most), and then until every
    subscriber had every confirmed publication; publications refused (and of those, how
    many were delivered all the same)."""
    rows = [
        "| mode | fault | s | expected | delivered | duplicated | lost | gaps rep./filled/open "
        "| links down | heal s | load | caught up s | refused (delivered) | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in reports:
        subs = r["subscribers"]
        total = {
            k: sum(s[k] for s in subs)
            for k in ("expected_deliveries", "delivered", "duplicates", "lost")
        }
        gaps = "/".join(
            str(sum(s[k] for s in subs)) for k in ("gaps_reported", "gaps_filled", "gaps_open")
        )
        caught = "–" if r["caught_up_s"] is None else f"{r['caught_up_s']:.1f}"
        rows.append(
            f"| {r['mode'].upper()} | {r['fault']} | {r['seconds']:g} | "
            f"{total['expected_deliveries']:,} | {total['delivered']:,} | {total['duplicates']} | "
            f"{total['lost']} | {gaps} | {r.get('links_down', '–')} | {r['heal_s']:.1f} | "
            f"{r.get('load', '–')} | "
            f"{caught} | {r['refused']} ({r['refused_delivered']}) | "
            f"{'pass' if r['passed'] else 'FAIL'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mode",
        action="append",
        choices=("snr", "dnr"),
        help="routing mode of the overlay; repeat it for several (default both)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        choices=tuple(FAULTS),
        help="scenario to run; repeat it for several (default all)",
    )
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="seconds each fault lasts before it heals"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench/results/faults.json",
        help="where the reports go as JSON",
    )
    args = parser.parse_args(argv)
    reports = []
    with hosts() as ns, tempfile.TemporaryDirectory(prefix="octopis-faults-") as tmp:
        for mode in args.mode or ("snr", "dnr"):
            with Overlay(ns, Path(tmp) / mode, mode) as overlay:
                for kind in args.fault or FAULTS:
                    reports.append(overlay.run(kind, args.seconds))
                    print(markdown(reports[-1:]).splitlines()[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(reports, indent=1))
    print(markdown(reports))
    return 0 if all(r["passed"] for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
