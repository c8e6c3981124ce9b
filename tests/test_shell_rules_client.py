"""The simulator's clients see no more than a client does (issue 55, DESIGN §2): a move
across clusters withdraws as the client policy's steps say
(``client_policy.moves.move_across``: subscribe, linger, withdraw), never once every
broker's table holds the new subscription; a durable client coming back walks its list
(``client_policy.failover.connect_tries``), never picking the first live broker. The
SDK and the simulator's publishers send again, at a fail-over, what the client policy
says in its order (``client_policy.failover.Unanswered.resend``), and a historic answer
is taken each publication once by its rule (``client_policy.each_once``). Read from the
AST of every module of ``octopis/sim/`` (and ``octopis/client/``), with a module written
with a copy of each to show each check failing."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from test_layers import PACKAGE


def _calls_reading(
    path: Path, functions: tuple[str, ...], label: str, reads: Callable[[ast.AST], bool]
) -> list[str]:
    """Every call of one of ``functions`` (by name) in ``path``'s code with an argument
    holding a node that ``reads``: ``file:line function(label)``."""
    return [
        f"{path.name}:{call.lineno} {call.func.id}({label})"
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id in functions
        and any(reads(inner) for arg in call.args for inner in ast.walk(arg))
    ]


def _in_tables(node: ast.AST) -> bool:
    """``x in y.table`` or ``x not in y.table``, or a read of ``held_messages``."""
    if isinstance(node, ast.Compare):
        return any(
            isinstance(op, ast.In | ast.NotIn) and getattr(right, "attr", None) == "table"
            for op, right in zip(node.ops, node.comparators, strict=True)
        )
    return getattr(node, "attr", None) == "held_messages"


def spread_waits(path: Path) -> list[str]:
    """Every ``all(...)`` or ``any(...)`` asking whether brokers' tables hold an id, or
    reading their held messages: a simulated client waiting until its new subscription
    has spread, which no client can see (the simulator once polled ``any(new_id not in
    c.table for b, c in self.cores.items() ...)`` before it let the old one go)."""
    return _calls_reading(path, ("all", "any"), "spread", _in_tables)


def live_picks(path: Path) -> list[str]:
    """Every ``next(...)`` reading ``dead`` or ``_dead``: a simulated client picking the
    first live broker, which no client can see, where it tries its list and learns a
    broker is dead by its silence (a durable client coming back once took ``next(b for
    b in order if b not in state.dead)``)."""
    return _calls_reading(
        path,
        ("next",),
        "dead",
        lambda node: getattr(node, "attr", getattr(node, "id", None)) in ("dead", "_dead"),
    )


def resend_orders(path: Path) -> list[str]:
    """Every list display of two or more starred parts, one of them ``first``: what a
    fail-over sends again put in order outside the client policy
    (``client_policy.failover.Unanswered.resend``; the SDK once sent ``[*self.first,
    *self.requests.unanswered()]``)."""
    return [
        f"{path.name}:{node.lineno} resend order"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.List)
        and sum(isinstance(e, ast.Starred) for e in node.elts) >= 2
        and any(
            getattr(e.value, "attr", None) == "first"
            for e in node.elts
            if isinstance(e, ast.Starred)
        )
    ]


def answer_dedups(path: Path) -> list[str]:
    """Every ``setdefault(...)`` keyed by a publisher order: a historic answer taken each
    publication once outside the client policy (``client_policy.each_once``; the SDK
    once kept ``found.setdefault(policy_order(received), received)``)."""
    return _calls_reading_methods(path, "setdefault", ("publisher_order", "policy_order"))


def _calls_reading_methods(path: Path, method: str, keys: tuple[str, ...]) -> list[str]:
    """Every ``x.method(...)`` whose first argument calls one of ``keys``."""
    return [
        f"{path.name}:{call.lineno} {method}(order)"
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(call, ast.Call)
        and getattr(call.func, "attr", None) == method
        and call.args
        and isinstance(call.args[0], ast.Call)
        and getattr(call.args[0].func, "id", None) in keys
    ]


CHECKS = (spread_waits, live_picks)
CLIENT_CHECKS = (resend_orders, answer_dedups)
"""Checks of the SDK (``octopis/client/``) and the simulator's clients alike."""


@pytest.mark.parametrize("check", CHECKS)
def test_the_simulators_clients_move_and_come_back_by_the_client_policy(
    check: Callable[[Path], list[str]],
) -> None:
    assert [hit for path in sorted((PACKAGE / "sim").glob("*.py")) for hit in check(path)] == []


@pytest.mark.parametrize("check", CLIENT_CHECKS)
def test_the_sdk_and_the_simulator_send_again_and_take_answers_by_the_client_policy(
    check: Callable[[Path], list[str]],
) -> None:
    paths = [*(PACKAGE / "client").glob("*.py"), *(PACKAGE / "sim").glob("*.py")]
    assert [hit for path in sorted(paths) for hit in check(path)] == []


COPIES = (
    "def spread(self, new_id, order, state):\n"
    '    """any(new_id not in c.table) in a docstring is fine"""\n'
    "    if new_id in self.cores[self.home].table:\n"
    "        return any(new_id not in c.table for c in self.cores.values())\n"
    "    if any(map(self.names, (m for n in self.nodes for m in n.held_messages()))):\n"
    "        return next((b for b in order if state is None or b not in state.dead), None)\n"
    "    return next(filter(lambda b: not self._dead(b), order), next(iter(order)))\n"
    "for payload in [*self.first, *self.requests.unanswered()]:\n"
    "    found.setdefault(policy_order(received), received)\n"
)
"""A simulator module with a copy of each: the checks of :data:`CHECKS` find them."""


@pytest.mark.parametrize(
    ("check", "found"),
    [
        (spread_waits, ["sim.py:4 any(spread)", "sim.py:5 any(spread)"]),
        (live_picks, ["sim.py:6 next(dead)", "sim.py:7 next(dead)"]),
        (resend_orders, ["sim.py:8 resend order"]),
        (answer_dedups, ["sim.py:9 setdefault(order)"]),
    ],
)
def test_the_client_checks_can_fail(
    tmp_path: Path, check: Callable[[Path], list[str]], found: list[str]
) -> None:
    path = tmp_path / "sim.py"
    path.write_text(COPIES)
    assert sorted(check(path)) == found
