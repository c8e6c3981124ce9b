"""The balancer's view of a running overlay (DESIGN §9): every broker's load analysis,
read over the control RPC, as the :class:`~octopis.balance.plans.LoadState` the plans
take. A subscriber is one client of one connection at one broker (``name@connection``,
as the broker's load analysis names it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from octopis.balance.plans import BrokerLoad, LoadState
from octopis.topology import Scot

CLIENTS_READ = 10_000
"""Clients each broker reports, busiest first (the control RPC's bound)."""

Ask = Callable[..., Awaitable[dict[str, Any]]]
"""``ask(ids, method, timeout, *args)``: each broker's answer over its control RPC, None
for one that did not answer (``LocalCluster.ask``)."""


class BalanceError(RuntimeError):
    """The overlay cannot be observed or changed as a plan needs."""


MEASURED = {"deliveries": "deliveries_per_s", "output": "output_per_s"}
"""Each load measure (:data:`octopis.balance.policy.MEASURES`): its key in a load report."""


def load_state(
    reports: Mapping[str, Mapping[str, Any]],
    scot: Scot,
    measure: str,
    name: Callable[[str, str], str],
) -> LoadState:
    """The load state each broker's load ``reports`` say, once for ``octopis balance`` and
    the simulator's balancer: a broker's load is its ``measure`` per second; one without
    a configured capacity whose own is not measurable yet (idle: no CPU time in the
    window) is given the largest capacity measured on the others (brokers of one overlay
    run the same code on alike machines); each client a report lists is a subscriber,
    named ``name(client, broker)``, at that broker, with the rate reported."""
    fallback = max((r["capacity_per_s"] for r in reports.values()), default=0.0)
    brokers, loads, hosts = {}, {}, {}
    for broker, report in reports.items():
        capacity = report["capacity_per_s"] or fallback
        brokers[broker] = BrokerLoad(
            report[MEASURED[measure]], capacity, scot.brokers[broker].cluster
        )
        for client, rate in report["busiest_clients"].items():
            key = name(client, broker)
            loads[key] = rate
            hosts[key] = broker
    return LoadState(brokers, loads, hosts)


async def observe(
    scot: Scot, ask: Ask, timeout: float = 5.0, measure: str = "output", interests: bool = False
) -> tuple[LoadState, dict[str, dict[str, Any]]]:
    """The overlay's load state, a broker's load being its ``measure`` per second, and
    each broker's load report (:func:`load_state`); with ``interests``, each subscriber's
    interests too (the ``clients`` RPC, for SDM). :class:`BalanceError` if a broker does not
    answer: a plan made without it would be wrong."""
    reports = await ask(list(scot.brokers), "load", timeout, CLIENTS_READ)
    silent = sorted(b for b, r in reports.items() if r is None)
    if silent:
        raise BalanceError(f"no load report from {', '.join(silent[:5])} within {timeout:g} s")
    state = load_state(reports, scot, measure, lambda client, broker: f"{client}@{broker}")
    held: dict[str, frozenset[str]] = {}
    if interests:
        attached = await ask(list(scot.brokers), "clients", timeout)
        silent = sorted(b for b, r in attached.items() if r is None)
        if silent:
            raise BalanceError(f"no client list from {', '.join(silent[:5])} within {timeout:g} s")
        held = {
            f"{client}@{broker}": frozenset(info["interests"])
            for broker, clients in attached.items()
            for client, info in clients.items()
            if f"{client}@{broker}" in state.loads
        }
    return replace(state, interests=held), reports
