"""The shells hold no decision (issue 55, DESIGN §2): ``octopis/transport/`` and
``octopis/sim/`` read none of the node's failure state, use the node's public API only,
and keep no copy of the handshake and the routable rule. The other rules that moved into
the node or the client policy, one module each: replay and retention
(``test_shell_rules_replay.py``), client sessions (``test_shell_rules_sessions.py``), the
peer codec and which frames are stale (``test_shell_rules_codec.py``), the silence
boundary, backpressure's acknowledgements and when a fail-over's tries end
(``test_shell_rules_drift.py``).

Each check reads the shells' modules as source (AST) and lists what it finds; each has a
check of the checker that shows it failing on a module written with the copy.
"""

from __future__ import annotations

import ast
from pathlib import Path

from shell_checks import in_shells, writes

NODE_STATE = frozenset(
    {
        "recovery",
        "owed_shares",
        "missing_shares",
        "share_complete",
        "share_received",
        "expect_shares",
        "withdraw_when_serving",
        "unshared",
        "take_subscriptions",
        "release_copies",
        "hold_subscriptions",
        "hold_copy",
        "table_lost",
        "payable",
        "held_copies_for",
        "phase",
        "word",
        "down_since",
        "interrupted",
        "TRANSITIONS",
        "orphans",
    }
)
"""The node's failure state (``octopis.core.node``, ``octopis.core.recovery``): who is owed
a share, what is held for whom, what a restart lost; a neighbour's session and word
(``octopis.core.neighbours``: read through its questions, never by phase); the client
sessions' orphans (``octopis.core.sessions``). The shells report events to the
node and carry out its actions; none reads or writes this state (DESIGN §2, §7)."""


def node_state_reads(path: Path) -> list[str]:
    """Every name or attribute of :data:`NODE_STATE` in ``path``'s code (its docstrings
    and comments aside), and every import of ``octopis.core.recovery``: ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = (
            node.attr
            if isinstance(node, ast.Attribute)
            else node.id
            if isinstance(node, ast.Name)
            else node.module
            if isinstance(node, ast.ImportFrom)
            else None
        )
        if name in NODE_STATE or name == "octopis.core.recovery":
            found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_the_shells_hold_no_failure_decision() -> None:
    """transport/ and sim/ neither import the recovery bookkeeping nor touch the node's
    failure state: a broker process and a simulated broker decide alike because only the
    node decides (read from the AST: attribute and variable names, imports)."""
    assert in_shells(node_state_reads) == []


def test_the_node_state_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "from octopis.core.recovery import Recovery\n"
        "def pay(core, node):\n"
        "    '''owed_shares in a docstring is fine'''\n"
        "    if node.owed_shares and core.share_complete('b:0'):\n"
        "        return 1\n"
    )
    assert node_state_reads(path) == [
        "shell.py:1 octopis.core.recovery",
        "shell.py:4 owed_shares",
        "shell.py:4 share_complete",
    ]


SHELL_COPIES = frozenset(
    {
        "detected",
        "adopts",
        "moves_by_adoption",
        "movable_problem",
        "requesters",
        "CLOCK_SLACK",
        "COMMIT_ROWS",
        "next_deadline",
        "dirty",
    }
)
"""Rules the shells once kept copies of. Which links a broker routes through: a set of
the simulator's own of the links each broker had detected down, where the broker
process asks ``Neighbours.routable`` (its LST rows; the simulator now routes by
``Neighbours.view``). Whether a move goes by adoption: both shells read
``ClusteredBroker.adopts`` (the process with the order's ``inside``, the simulator with
the new host's cluster), then both asked ``sessions.moves_by_adoption`` and handed its
answer to the order themselves; both now call ``sessions.order_move``, which asks it and
marks the order; and the process refused a hosted composite's adoption itself
(``movable_problem``), which ``sessions.adopt`` now does. Who asked for a
replay: the process kept its own map, bounded as the rounds are; the rounds now say
(``ReplayRounds.requester``). Which stored rows a replay reads (``CLOCK_SLACK``, the
process's store only) and when a store commits (``COMMIT_ROWS``): now
``core.answer``'s ``AnswerSelection`` and ``commit_delay``. When replay rounds expire next:
each shell asked ``ReplayRounds.next_deadline`` after an expiry and set its own timer (the
simulator only if later than now); ``ReplayRounds.expire`` now asks with an ``ExpireAt``.
What a write of the durable records holds: the process took ``Durables.dirty`` itself, the
simulator copied every record; both now write ``Durables.written``."""

NEIGHBOUR_COPIES = frozenset({"hello"})
"""The neighbour table's calls that took a shell's verdict. A neighbour's HELLO: the
simulator took every one as naming us (``neighbours.hello(dst, True)``), where the
process compared the incarnation it names; both now call ``Neighbours.handshake`` with
that incarnation (a shell's own ``hello``, the frame it sends, is no such call)."""

WORD_QUESTIONS = frozenset({"said", "handshake"})
"""The neighbour table's questions a shell asks with what a frame carries, never with a
verdict of its own: a literal ``said(n, True)`` is a shell deciding the word."""


def shell_copies(path: Path) -> list[str]:
    """Every attribute or name of :data:`SHELL_COPIES` in ``path``'s code, every
    ``neighbours.<name>`` of :data:`NEIGHBOUR_COPIES`, and every call of
    :data:`WORD_QUESTIONS` given a literal truth value: ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if name in SHELL_COPIES:
            found.append(f"{path.name}:{node.lineno} {name}")
        if isinstance(node, ast.Attribute) and name in NEIGHBOUR_COPIES:
            owner = node.value
            owner_name = (
                owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            )
            if owner_name == "neighbours":
                found.append(f"{path.name}:{node.lineno} {name}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WORD_QUESTIONS
            and any(
                isinstance(arg, ast.Constant) and isinstance(arg.value, bool)
                for arg in [*node.args, *(k.value for k in node.keywords)]
            )
        ):
            found.append(f"{path.name}:{node.lineno} {node.func.attr}(literal)")
    return found


def test_the_shells_keep_no_copy_of_the_handshake_or_the_routable_rule() -> None:
    """Both shells hear a HELLO and a heartbeat's word through the neighbour table with
    the frame's facts, and route by ``Neighbours.routable`` (read from the AST)."""
    assert in_shells(shell_copies) == []


def test_the_shell_copies_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "def meet(state, node, dst, serving):\n"
        "    '''detected in a docstring is fine'''\n"
        "    if dst in state.detected.get('a', ()):\n"
        "        node.neighbours.hello(dst, True)\n"
        "    node.neighbours.said(dst, serving=True)\n"
        "    node.neighbours.said(dst, serving)\n"
        "    hello = output.hello(dst)\n"
        "    inside = inside and node.core.adopts\n"
        "    inside = moves_by_adoption(core, inside) and not node.movable_problem(s)\n"
        "    key = self.requesters.get(req_id)\n"
        "CLOCK_SLACK = 60.0\n"
        "if len(store.pending) >= COMMIT_ROWS:\n"
        "    commit()\n"
        "timer(rounds.next_deadline())\n"
        "changed, durables.dirty = durables.dirty, set()\n"
    )
    assert sorted(shell_copies(path)) == [
        "shell.py:10 requesters",
        "shell.py:11 CLOCK_SLACK",
        "shell.py:12 COMMIT_ROWS",
        "shell.py:14 next_deadline",
        "shell.py:15 dirty",
        "shell.py:15 dirty",
        "shell.py:3 detected",
        "shell.py:4 hello",
        "shell.py:5 said(literal)",
        "shell.py:8 adopts",
        "shell.py:9 movable_problem",
        "shell.py:9 moves_by_adoption",
    ]


ACK_COUNTS = frozenset({"received", "acked"})
"""A neighbour's acknowledgement counts (:class:`~octopis.core.neighbours.Neighbour`):
what was taken from it and what was acknowledged. Only the node's custody rule
(:func:`~octopis.core.custody.took`, :func:`~octopis.core.custody.acknowledgement`)
changes them; a shell that wrote them would hold its own acknowledgement rule."""


def private_node_uses(path: Path) -> list[str]:
    """What ``path`` takes from the node beyond its public API: an import of a name or a
    module of ``octopis.core`` that begins with ``_``, and every write of a neighbour's
    :data:`ACK_COUNTS` (an object's own counters, ``self.received``, are its own):
    ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("octopis.core"):
            module = node.module or ""
            if any(part.startswith("_") for part in module.split(".")):
                found.append(f"{path.name}:{node.lineno} {module}")
            found += [
                f"{path.name}:{node.lineno} {alias.name}"
                for alias in node.names
                if alias.name.startswith("_")
            ]
        found += [f"{path.name}:{node.lineno} {name}=" for name in writes(node, ACK_COUNTS)]
    return found


def test_the_shells_use_the_nodes_public_api_and_no_acknowledgement_rule() -> None:
    """transport/ and sim/ import only public names of ``octopis.core`` (no ``_``-names,
    no private module such as the records' Cython part) and never write a neighbour's
    acknowledgement counts: the custody rule is the node's, for both (read from the AST)."""
    assert in_shells(private_node_uses) == []


def test_the_public_api_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "from octopis.core.custody import _settle, owed\n"
        "from octopis.core._records import Record\n"
        "state.acked = state.received\n"
        "state.received += 1\n"
        "link.acked_count = 3\n"
        "self.received = Counter()\n"
    )
    assert sorted(private_node_uses(path)) == [
        "shell.py:1 _settle",
        "shell.py:2 octopis.core._records",
        "shell.py:3 acked=",
        "shell.py:4 received=",
    ]
