"""Ten rules the shells once each wrote apart (issue 55, DESIGN §2): when a neighbour's
silence is past the liveness timeout (``Neighbour.silent_past``), when a client's
fail-over gives up (``client_policy.failover_tries``), which acknowledgements
backpressure withholds, who moves a neighbour's record, how a copy given back or a
publication held is routed again, the order of a heal, whether a replay's answer goes to
anyone, when a broker that starts serving tells its neighbours, how a new incarnation is
met, and what becomes of what a link gave back. Read from the AST, with a shell written
with a copy of each to show each check failing."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from shell_checks import in_shells, writes


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


NEIGHBOUR_RECORD = frozenset({"last_heard", "up", "down_since", "was_down"})
"""A neighbour's liveness (:class:`~octopis.core.neighbours.Neighbour`), moved only by the
node's rules (``Neighbours.heard``, ``silent``, ``stalled``); its counts are
:data:`ACK_COUNTS`."""


def record_writes(path: Path) -> list[str]:
    """Every assignment in ``path``'s code to a :data:`NEIGHBOUR_RECORD` attribute of
    anything but ``self``: a shell moving a neighbour's record past the node's rules (the
    process once wrote ``state.last_heard = now`` on a run of notifications, beside
    ``Neighbours.heard``)."""
    return [
        f"{path.name}:{node.lineno} {name}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        for name in writes(node, NEIGHBOUR_RECORD)
    ]


def routed_then_held(path: Path) -> list[str]:
    """Every loop in ``path``'s code that names a core's routing step (``reroute``,
    ``publish``) and calls ``held()``: a shell routing again what a link gave back, or
    what was held while not serving, and counting its receipt itself, where the node's
    steps do (:meth:`BrokerNode.route_again`, :meth:`BrokerNode.serve_if_ready`; both
    shells once wrote both loops)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.For):
            continue
        inner = [n for statement in node.body for n in ast.walk(statement)]
        steps = {n.attr for n in inner if isinstance(n, ast.Attribute)} & {"reroute", "publish"}
        held = any(
            isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "held" for n in inner
        )
        if steps and held:
            found.append(f"{path.name}:{node.lineno} {'+'.join(sorted(steps))}, held()")
    return found


HEAL_STEPS = frozenset({"said", "resumed", "link_back", "share", "neighbour_serving"})
"""The steps of a heal that only :meth:`BrokerNode.heard` orders: whether the neighbour
resumes its session, the hand-over, and its word. The process once heard the word
first (a heartbeat, the usual first frame) and released the held copies before the
hand-over; the simulator handed over first. And the steps of a share heard, which
:meth:`BrokerNode.share_heard` orders (both shells once asked ``Neighbours.share``,
then ``synced``, then ``neighbour_serving`` themselves)."""


def _steps_called(path: Path, steps: frozenset[str]) -> list[str]:
    """Every call in ``path``'s code of a method named in ``steps``."""
    return [
        f"{path.name}:{node.lineno} {node.func.attr}()"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in steps
    ]


def heal_steps(path: Path) -> list[str]:
    """Every call in ``path``'s code of a :data:`HEAL_STEPS` step: a shell ordering a
    heal itself."""
    return _steps_called(path, HEAL_STEPS)


def unanswered_checks(path: Path) -> list[str]:
    """Every comparison in ``path``'s code of a ``requester`` with None: a shell weighing
    itself whether a replay's answer goes to anyone, where the rounds make no
    ``ReplayDeliver`` or ``ReplayDone`` for a request nobody at the host is answered for
    (both shells once skipped those with ``requester is None``)."""
    return [
        f"{path.name}:{node.lineno} requester is None"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Compare)
        and any(getattr(n, "attr", None) == "requester" for n in (node.left, *node.comparators))
        and any(
            isinstance(n, ast.Constant) and n.value is None for n in (node.left, *node.comparators)
        )
    ]


SERVING_STEPS = ("now_serving", "_dispatch")
"""How each shell carries out the steps :meth:`BrokerNode.serve_if_ready` returns."""


def serving_told_first(path: Path) -> list[str]:
    """Every heartbeat call (``beat``, ``_beat``) in a function of ``path`` that asks
    ``serve_if_ready``, made before that function carries out the node's steps
    (:data:`SERVING_STEPS`): the node's contract is that neighbours hear a broker serves
    behind the held publications and shares it sends them (the process once beat first,
    the simulator after)."""
    found = []
    for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(function, ast.FunctionDef):
            continue
        calls = [
            (node.lineno, getattr(node.func, "attr", getattr(node.func, "id", "")))
            for node in ast.walk(function)
            if isinstance(node, ast.Call)
        ]
        if not any(name == "serve_if_ready" for _, name in calls):
            continue
        steps = [line for line, name in calls if name in SERVING_STEPS]
        found += [
            f"{path.name}:{line} {name}() before its steps"
            for line, name in calls
            if name in ("beat", "_beat") and (not steps or line < max(steps))
        ]
    return found


MEETING_STEPS = frozenset({"met", "neighbour_met"})
"""The steps of a new incarnation met that only :meth:`BrokerNode.meet` orders: its
session starts again, its link gives back (the shell's part), then the hand-over. Both
shells once asked ``Neighbours.met`` and then ``neighbour_met`` themselves, the process
around its HELLO, the simulator around its handshake."""


def meeting_steps(path: Path) -> list[str]:
    """Every call in ``path``'s code of a :data:`MEETING_STEPS` step: a shell ordering a
    handshake with a new incarnation itself."""
    return _steps_called(path, MEETING_STEPS)


def given_back_steps(path: Path) -> list[str]:
    """Every call in ``path``'s code of ``route_again``, or of ``link_down`` on a node
    (``node``, ``x.node``, ``nodes[...]``): a shell ordering itself what a link gave back,
    where :meth:`BrokerNode.given_back` holds it and routes the copies again (both shells
    once called ``link_down``, then ``route_again`` on what it returned). A replay
    round's or a broker's own ``link_down`` is not the node's."""

    def node(expr: ast.AST) -> bool:
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        name = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")
        return name in ("node", "nodes")

    return [
        f"{path.name}:{call.lineno} {call.func.attr}()"
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and (
            call.func.attr == "route_again"
            or (call.func.attr == "link_down" and node(call.func.value))
        )
    ]


DRIFT_CHECKS = (
    silence_copies,
    give_up_copies,
    unpressed_acknowledgements,
    record_writes,
    routed_then_held,
    heal_steps,
    unanswered_checks,
    serving_told_first,
    meeting_steps,
    given_back_steps,
)
"""The checks of ten rules the shells once each wrote apart: when a silence is past
``links.down_after``, when a simulated client's fail-over ends, what count an
acknowledgement carries under backpressure, who moves a neighbour's record, how a copy
given back or a publication held is routed and its receipt counted, the order of a
heal, whether a replay's answer goes to anyone, when neighbours hear a broker
serves, the steps of meeting a new incarnation and of what a link gave back."""


@pytest.mark.parametrize("check", DRIFT_CHECKS)
def test_the_shells_leave_silence_give_up_and_withholding_to_the_rules(
    check: Callable[[Path], list[str]],
) -> None:
    """Both shells ask ``Neighbour.silent_past`` whether a silence has lasted
    ``links.down_after``; the simulator's clients end their fail-over when
    ``client_policy.failover_tries`` ends, never asking whether every broker is dead; both
    shells take an acknowledgement's count from ``Backpressure.acknowledge``; both tell
    their neighbours a broker serves after carrying out the node's steps (read from the
    AST)."""
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
    "def heard(self, state, now):\n"
    "    self.up = True\n"
    "    state.last_heard = now\n"
    "    state.down_since += 1\n"
    "    for copy in node.link_down(dst, given_back):\n"
    "        self.execute(self.core.reroute(dst, copy), receipt=copy.receipt)\n"
    "        copy.receipt.held()\n"
    "    for copy, receipt in settled:\n"
    "        receipt.held()\n"
    "    if node.neighbours.said(dst, word) and node.neighbours.resumed(dst):\n"
    "        self.execute(node.link_back(dst))\n"
    "    if action.requester is not None and action.requester in clients:\n"
    "        return None is action.requester\n"
    "    if node.neighbours.share(src).now_serving:\n"
    "        self.execute(node.neighbour_serving(src))\n"
    "def check_serving(self, now):\n"
    "    served = self.node.serve_if_ready(now, self.lst)\n"
    "    for name, state in self.neighbours.items():\n"
    "        self.output.beat(name, state, now, behind_data=True)\n"
    "    self.events.now_serving(served)\n"
    "    if (restarted := node.neighbours.met(dst, incarnation)) is not None:\n"
    "        actions, handed = node.neighbour_met(dst, incarnation, restarted)\n"
    "    copies = self.nodes[src].link_down(dst, given_back, message_of, sent)\n"
    "    steps = self.node.route_again(dst, copies, view) + rounds.link_down(dst)\n"
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
        (record_writes, ["shell.py:15 last_heard", "shell.py:16 down_since"]),
        (routed_then_held, ["shell.py:17 reroute, held()"]),
        (
            heal_steps,
            [
                "shell.py:22 resumed()",
                "shell.py:22 said()",
                "shell.py:23 link_back()",
                "shell.py:26 share()",
                "shell.py:27 neighbour_serving()",
            ],
        ),
        (unanswered_checks, ["shell.py:24 requester is None", "shell.py:25 requester is None"]),
        (serving_told_first, ["shell.py:31 beat() before its steps"]),
        (meeting_steps, ["shell.py:33 met()", "shell.py:34 neighbour_met()"]),
        (
            given_back_steps,
            ["shell.py:17 link_down()", "shell.py:35 link_down()", "shell.py:36 route_again()"],
        ),
    ],
)
def test_the_drift_checks_can_fail(
    tmp_path: Path, check: Callable[[Path], list[str]], found: list[str]
) -> None:
    path = tmp_path / "shell.py"
    path.write_text(DRIFT_COPIES)
    assert sorted(check(path)) == found
