"""The simulator's clients see no more than a client does (issue 55, DESIGN §2): a move
across clusters withdraws as the client policy's steps say
(``client_policy.moves.move_across``: subscribe, linger, withdraw), never once every
broker's table holds the new subscription; a durable client coming back walks its list
(``client_policy.failover.connect_tries``), never picking the first live broker. Read
from the AST of every module of ``octopis/sim/``, with a module written with both
copies to show each check failing."""

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


CHECKS = (spread_waits, live_picks)


@pytest.mark.parametrize("check", CHECKS)
def test_the_simulators_clients_move_and_come_back_by_the_client_policy(
    check: Callable[[Path], list[str]],
) -> None:
    assert [hit for path in sorted((PACKAGE / "sim").glob("*.py")) for hit in check(path)] == []


COPIES = (
    "def spread(self, new_id, order, state):\n"
    '    """any(new_id not in c.table) in a docstring is fine"""\n'
    "    if new_id in self.cores[self.home].table:\n"
    "        return any(new_id not in c.table for c in self.cores.values())\n"
    "    if any(map(self.names, (m for n in self.nodes for m in n.held_messages()))):\n"
    "        return next((b for b in order if state is None or b not in state.dead), None)\n"
    "    return next(filter(lambda b: not self._dead(b), order), next(iter(order)))\n"
)
"""A simulator module with a copy of each: the checks of :data:`CHECKS` find them."""


@pytest.mark.parametrize(
    ("check", "found"),
    [
        (spread_waits, ["sim.py:4 any(spread)", "sim.py:5 any(spread)"]),
        (live_picks, ["sim.py:6 next(dead)", "sim.py:7 next(dead)"]),
    ],
)
def test_the_client_checks_can_fail(
    tmp_path: Path, check: Callable[[Path], list[str]], found: list[str]
) -> None:
    path = tmp_path / "sim.py"
    path.write_text(COPIES)
    assert sorted(check(path)) == found
