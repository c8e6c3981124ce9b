"""Three rules the shells once each wrote apart and that drifted (issue 55, DESIGN §2): when a
neighbour's silence is past the liveness timeout (``Neighbour.silent_past``), when a
client's fail-over gives up (``client_policy.failover_tries``), and which acknowledgements
backpressure withholds. Read from the AST, with a shell written with all three copies to
show each check failing."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from shell_checks import in_shells


def silence_copies(path: Path) -> list[str]:
    """Every comparison in ``path``'s code that reads a ``last_heard``: a shell weighing
    itself whether a neighbour's silence has lasted the liveness timeout, where
    ``Neighbour.silent_past`` does (the simulator once compared ``last_heard <= since``
    at its timer, a bound of its own beside the process's ``Neighbours.overdue``)."""
    return [
        f"{path.name}:{node.lineno} last_heard"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Compare)
        for inner in ast.walk(node)
        if isinstance(inner, ast.Attribute) and inner.attr == "last_heard"
    ]


def give_up_copies(path: Path) -> list[str]:
    """Every ``all(...)`` or ``any(...)`` in ``path``'s code that reads ``_dead``: a
    shell weighing itself whether every broker is dead, where a simulated client's
    fail-over ends as the SDK's tries say (``client_policy.failover_tries``, over the
    client's own list; the simulator once gave up when ``all(map(self._dead,
    self.cores))``, every broker of the run)."""
    return [
        f"{path.name}:{node.lineno} {node.func.id}(_dead)"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("all", "any")
        and any(
            getattr(inner, "attr", getattr(inner, "id", None)) == "_dead"
            for arg in node.args
            for inner in ast.walk(arg)
        )
    ]


def unpressed_acknowledgements(path: Path) -> list[str]:
    """Every import or call of ``acknowledgement`` in ``path``'s code: a shell counting an
    acknowledgement itself, with no word from the backpressure rule
    (``Backpressure.acknowledge`` asks it with its verdict; the simulator once called
    ``acknowledgement(record, False)``, never withholding)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            found += [
                f"{path.name}:{node.lineno} import acknowledgement"
                for alias in node.names
                if alias.name == "acknowledgement"
            ]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "acknowledgement":
                found.append(f"{path.name}:{node.lineno} acknowledgement()")
    return found


DRIFT_CHECKS = (silence_copies, give_up_copies, unpressed_acknowledgements)
"""The checks of three rules the shells once each wrote apart: when a silence is past
``links.down_after``, when a simulated client's fail-over ends, and what count an
acknowledgement carries under backpressure."""


@pytest.mark.parametrize("check", DRIFT_CHECKS)
def test_the_shells_leave_silence_give_up_and_withholding_to_the_rules(
    check: Callable[[Path], list[str]],
) -> None:
    """Both shells ask ``Neighbour.silent_past`` whether a silence has lasted
    ``links.down_after``; the simulator's clients end their fail-over when
    ``client_policy.failover_tries`` ends, never asking whether every broker is dead; both
    shells take an acknowledgement's count from ``Backpressure.acknowledge`` (read from
    the AST)."""
    assert in_shells(check) == []


DRIFT_COPIES = (
    "from octopis.core.custody import acknowledgement, owed\n"
    "def step(self, node, dst, since, now, record, custody, dead):\n"
    '    """last_heard <= since, all(map(self._dead, self.cores)) and\n'
    '    acknowledgement(record, False) in a docstring are fine"""\n'
    "    silent = now - node.neighbours[dst].last_heard\n"
    "    if node.neighbours[dst].last_heard <= since:\n"
    "        return now - node.neighbours[dst].last_heard > 1.0\n"
    "    if not self.restarts_pending and all(map(self._dead, self.cores)):\n"
    "        return any(self._dead(b) for b in self.cores)\n"
    "    if all(b in dead for b in self.cores):\n"
    "        return acknowledgement(record, False)\n"
    "    return custody.acknowledgement(record, True) + self.pressure.acknowledge(dst, record)\n"
)
"""A shell with a copy of each: the checks of :data:`DRIFT_CHECKS` find them."""


@pytest.mark.parametrize(
    ("check", "found"),
    [
        (silence_copies, ["shell.py:6 last_heard", "shell.py:7 last_heard"]),
        (give_up_copies, ["shell.py:8 all(_dead)", "shell.py:9 any(_dead)"]),
        (
            unpressed_acknowledgements,
            [
                "shell.py:1 import acknowledgement",
                "shell.py:11 acknowledgement()",
                "shell.py:12 acknowledgement()",
            ],
        ),
    ],
)
def test_the_drift_checks_can_fail(
    tmp_path: Path, check: Callable[[Path], list[str]], found: list[str]
) -> None:
    path = tmp_path / "shell.py"
    path.write_text(DRIFT_COPIES)
    assert sorted(check(path)) == found
