"""Rendering run reports (``octopis sim`` and ``octopis run`` share the keys): a short
human summary (a verdict line, then delays and messages with units), every figure as a
flat table (``--details``), or JSON for tools (``--json``)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from octopis.cli.topology import write_atomically


def render_report(report: dict[str, Any], *, as_json: bool, details: bool) -> str:
    """JSON for tools; else the summary, with every figure after it if ``details``."""
    if as_json:
        return json.dumps(report, indent=1)
    if details:
        return summarize(report) + "\n\n" + print_report(report)
    return summarize(report)


def summarize(report: dict[str, Any]) -> str:
    """A verdict line on exactly-once delivery, then a small table of delays and the
    message counts, with units; failures and errors only where there were any."""
    lines = [_verdict(report)]
    failures = report.get("failures") or {}
    for scope, who in (
        ("host_alive", "subscribers on brokers that stayed up"),
        ("host_dead", "subscribers on brokers that were killed"),
        ("host_dead_after_back", "  … after they were back elsewhere"),
    ):
        if scope in failures:
            lines.append(f"  {who}: {_counts(failures[scope])}")
    lines += ["", f"{'delay':<14}{'mean':>10}{'p50':>10}{'p99':>10}{'max':>10}"]
    for key, label in (
        ("notification_delay", "notification"),
        ("overlay_delay", "  overlay"),
        ("client_delay", "  client"),
        ("subscription_delay", "subscription"),
    ):
        if key not in report and key in ("overlay_delay", "client_delay"):
            continue  # a simulation: no split
        figures = report.get(key) or {}
        lines.append(
            f"{label:<14}"
            + "".join(f"{_ms(figures.get(q)):>10}" for q in ("mean", "p50", "p99", "max"))
        )
    sbp = f"{report['sbp_messages']:,} subscription (SBP"
    if report.get("covering") == "active":
        made = report.get("subscriptions_made") or report.get("subscriptions") or 0
        brokers = report.get("brokers") or 0
        sbp += ", covering: " + (
            f"{report['sbp_messages'] / made:.1f} per subscription against N-1 = {brokers - 1}"
            if made and brokers
            else "active"
        )
    lines += [
        "",
        f"messages: {report['notification_messages']:,} notification, {sbp}), "
        f"{report.get('unsubscribe_messages', 0):,} unsubscribe; "
        f"{report['matching_operations']:,} matching operations",
    ]
    if "run_time" in report:
        lines.append(
            f"run: {report['run_time']:.1f} s, {report.get('wall_time', 0.0):.1f} s of them "
            f"simulating {report.get('sim_time', 0.0):.1f} s; peak memory "
            f"{report.get('peak_memory', 0) / 2**20:,.0f} MiB"
        )
    if report.get("mode") == "dnr":
        lines.append(
            "DNR cases: "
            + ", ".join(
                f"{n} {report.get(f'dnr_case_{i}', 0):,}"
                for i, n in ((1, "I"), (2, "II"), (3, "III"))
            )
            + f"; kept off overloaded links {report.get('dnr_kept_off', 0):,}"
        )
    errors = {k: v for k, v in (report.get("errors") or {}).items() if v}
    if errors:
        lines.append("errors: " + ", ".join(f"{k} {v:,}" for k, v in errors.items()))
    down = failures.get("links_down")
    if down:
        lines.append(
            f"failures: {down} links declared down, {failures.get('peer_restarts', 0)} restarts "
            f"seen, {failures.get('clients_dropped', 0)} client connections dropped"
        )
    again = report.get("subscriptions_made", 0) - report.get("subscriptions", 0)
    if report.get("sdk_failovers") or again > 0:
        lines.append(
            f"clients: fail-overs from a silent broker {report.get('sdk_failovers', 0):,}, "
            f"subscriptions made again at another broker {max(again, 0):,} (an SBP each)"
        )
    return "\n".join(lines)


def _verdict(report: dict[str, Any]) -> str:
    name = f"{report.get('topology', '?')}, {str(report.get('mode', '?')).upper()}, "
    name += f"{report.get('brokers', '?')} brokers: "
    scope = (report.get("failures") or {}).get("host_alive", report)
    ok = scope["lost"] == scope["duplicates"] == scope.get("unexpected", 0) == 0
    return ("OK  " if ok else "FAILED  ") + name + _counts(report)


def _counts(counts: dict[str, Any]) -> str:
    once = " exactly once" if counts["duplicates"] == counts.get("unexpected", 0) == 0 else ""
    return (
        f"{counts['delivered']:,} of {counts['expected_deliveries']:,} delivered{once}, "
        f"{counts['lost']:,} lost, {counts['duplicates']:,} duplicated, "
        f"{counts.get('unexpected', 0):,} unexpected"
    )


def _ms(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def print_report(report: dict[str, Any]) -> str:
    """The report as an aligned two-column table; nested figures are flattened."""
    rows = list(_flatten(report, ""))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _flatten(report: dict[str, Any], prefix: str) -> Iterable[tuple[str, str]]:
    for key, value in report.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", _fmt(value)


def write_deliveries(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """One JSON object per line, written atomically."""
    write_atomically(path, "".join(json.dumps(r) + "\n" for r in records))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.6g}"
    return str(value)
