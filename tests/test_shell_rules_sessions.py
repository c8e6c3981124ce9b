"""The shells keep no copy of the client sessions' rules (issue 55, DESIGN §2): no shell
withdraws what a gone client held by itself, steps the client table, writes a slow
consumer's notice, or decides itself whether a client's going or a move's release writes
the durable records; read from the AST, with a check of the checker that shows it
failing."""

from __future__ import annotations

import ast
from pathlib import Path

from shell_checks import in_shells

SESSION_RULES = frozenset({"gone"})
"""The client sessions' rules a shell once applied itself: each called
``ClientTable.gone`` and then withdrew the subscriptions in a loop of its own (and the
two shells' loops differed: the simulator withdrew no advertisement and detached no
durable record). Both now call ``BrokerNode.client_gone``."""

TABLE_STEPS = frozenset({"room", "attach", "detach", "owned"})
"""The client table's single steps. A shell that called them kept its own copy of what a
client's request does with the table: the process checked the limit, subscribed and
held the subscription, the simulator the same in its own code (and its composite
clients skipped the table); the process checked ownership, withdrew and then forgot,
the simulator forgot and withdrew, each withdrawal for a client counted by the
process only. Both now call ``ClientTable.subscribe``, ``unsubscribe`` and
``withdraw`` (and :func:`~octopis.core.sessions.adopt`)."""

CLIENT_TABLES = frozenset({"sessions", "table"})
"""What a shell calls its client table (``node.sessions``; the process's ``self.table``).
A shell that reads a subscription's ``interests()`` itself keeps a copy of what a
client's interests are: the process's ``clients`` RPC and the simulator's balancer each
gathered them their own way; both now call ``sessions.interests``."""

FLOW_NOTICES = frozenset({"dropped", "overflow"})
"""What a slow consumer is told (``core.client_flow``): a shell that wrote such a notice
decided itself when it is due (the process's outbox and request loop did:
``ClientFlow.overflow``, ``refusal`` and ``drained`` say so now)."""

WITHDRAWING = frozenset({"unsubscribe", "unadvertise", "detached"})
"""Calls that withdraw what a client held: a shell's loop over a session rule's answer
making them is a copy of the node's rule."""


def session_copies(path: Path) -> list[str]:
    """Every call of :data:`SESSION_RULES` in ``path``'s code, every call of
    :data:`TABLE_STEPS` on a client table (:data:`CLIENT_TABLES`), every notice of
    :data:`FLOW_NOTICES` written, and every ``for`` loop over a call's answer whose body
    calls one of :data:`WITHDRAWING`: ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SESSION_RULES
        ):
            found.append(f"{path.name}:{node.lineno} {node.func.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in TABLE_STEPS
        ):
            owner = node.func.value
            owner_name = (
                owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            )
            if owner_name in CLIENT_TABLES:
                found.append(f"{path.name}:{node.lineno} {owner_name}.{node.func.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "interests"
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "subscription"
        ):
            found.append(f"{path.name}:{node.lineno} subscription.interests")
        if isinstance(node, ast.Dict):
            found += [
                f"{path.name}:{node.lineno} op={value.value}"
                for key, value in zip(node.keys, node.values, strict=True)
                if isinstance(key, ast.Constant)
                and key.value == "op"
                and isinstance(value, ast.Constant)
                and value.value in FLOW_NOTICES
            ]
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
            calls = {
                inner.func.attr
                for statement in node.body
                for inner in ast.walk(statement)
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
            }
            for name in sorted(calls & WITHDRAWING):
                found.append(f"{path.name}:{node.lineno} for-{name}")
    return found


def test_the_shells_keep_no_copy_of_the_client_withdrawal() -> None:
    """Neither shell asks the client table which subscriptions a client that is gone
    loses and withdraws them itself: the node decides it (``BrokerNode.client_gone``:
    subscriptions, advertisements, durable attachments), both shells carry it out."""
    assert in_shells(session_copies) == []


def test_the_session_copies_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "def drop(node, core, table, key):\n"
        "    '''table.gone in a docstring is fine'''\n"
        "    for sub_id in table.gone(key):\n"
        "        core.unsubscribe(key, sub_id)\n"
        "    for key, sub_id in table.expire(1.0):\n"
        "        execute(core.unsubscribe(key, sub_id))\n"
        "    for adv_id in core.advertisements_of(key):\n"
        "        core.unadvertise(key, adv_id)\n"
        "    for sub_id in sorted(held):\n"
        "        print(sub_id)\n"
        "    node.client_gone(key, 0.0, None)\n"
        "    node.sessions.room(key, key)\n"
        "    self.table.attach(key, 's1')\n"
        "    if sessions.detach(key, 's1'):\n"
        "        self.table.owned(key, key, 's1')\n"
        "    durables.attach('a', 'd', key, 's1', (), 0.0)\n"
        "    self.durable_records[b].attach('a', 'd', key, 's1', (), 0.0)\n"
        "    node.sessions.subscribe(key, key, make)\n"
        "    seen = entry.subscription.interests() | interests(core, table, key)\n"
        "    backlog.append([pack({'op': 'overflow', 'dropped': n}), {'op': 'bye'}])\n"
    )
    assert session_copies(path) == [
        "shell.py:3 for-unsubscribe",
        "shell.py:5 for-unsubscribe",
        "shell.py:7 for-unadvertise",
        "shell.py:3 gone",
        "shell.py:12 sessions.room",
        "shell.py:13 table.attach",
        "shell.py:14 sessions.detach",
        "shell.py:15 table.owned",
        "shell.py:19 subscription.interests",
        "shell.py:20 op=overflow",
    ]


NODE_ANSWERS = frozenset({"client_gone", "released"})
"""The node's answers to a client's going and a move's release, which say whether the
durable records are written at once (``save``, as ``Durables.answer_claim``'s does)."""

RECORD_WRITES = frozenset({"save_durables", "_durable_write"})
"""How each shell writes its durable records now (the process's store, the simulator's
copy a restart reads back)."""


def _reads_save(tree: ast.AST) -> bool:
    """Whether ``tree`` reads a name or an attribute ``save``."""
    return any(getattr(n, "attr", getattr(n, "id", None)) == "save" for n in ast.walk(tree))


def unasked_writes(path: Path) -> list[str]:
    """Every function of ``path`` that asks a node (an owner named ``node`` or
    ``nodes[…]``) one of :data:`NODE_ANSWERS` and never reads a ``save``, and every
    write of :data:`RECORD_WRITES` in such a function outside an ``if`` on a ``save``: a
    shell deciding itself whether a going or a release writes the records (the process
    wrote at every one, the simulator at none but a durable client's leaving)."""
    found: list[tuple[int, str]] = []
    for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(function, ast.FunctionDef):
            continue
        asked = [
            node
            for node in ast.walk(function)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in NODE_ANSWERS
            and ast.unparse(node.func.value).split(".")[-1].startswith(("node", "nodes["))
        ]
        if not asked:
            continue
        if not _reads_save(function):
            found.append((asked[0].lineno, f"{function.name} reads no save"))
        guarded = {
            id(inner)
            for test in ast.walk(function)
            if isinstance(test, ast.If) and _reads_save(test.test)
            for statement in test.body
            for inner in ast.walk(statement)
        }
        found += [
            (node.lineno, node.func.attr)
            for node in ast.walk(function)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in RECORD_WRITES
            and id(node) not in guarded
        ]
    return [f"{path.name}:{line} {what}" for line, what in sorted(found)]


def test_the_shells_write_the_durable_records_when_the_node_says() -> None:
    """Both shells write the records after a client's going or a move's release exactly
    when the node's answer says ``save`` (``BrokerNode.client_gone``, ``released``)."""
    assert in_shells(unasked_writes) == []


def test_the_unasked_writes_check_can_fail(tmp_path: Path) -> None:
    """The process's drop and release and the simulator's release, as they were."""
    path = tmp_path / "shell.py"
    path.write_text(
        "def drop(self, key, heard, router):\n"
        "    gone, actions = router.node.client_gone(key, heard, durables)\n"
        "    router.replaying.save_durables()\n"
        "def released(self, key, sub_id, replaying):\n"
        "    tell = self.router.node.released(key, sub_id, replaying.durables)\n"
        "    replaying.save_durables()\n"
        "def dispatch(self, broker, subscriber, sub_id):\n"
        "    self.nodes[broker].released(subscriber, sub_id, self._durables(broker))\n"
        "def release(self, key, sub_id):\n"
        "    if self.nodes[broker].released(key, sub_id, None).save:\n"
        "        self._durable_write(broker)\n"
        "def told(self, key, sub_id):\n"
        "    self.clients.sessions.released(key, sub_id)\n"
    )
    assert unasked_writes(path) == [
        "shell.py:2 drop reads no save",
        "shell.py:3 save_durables",
        "shell.py:5 released reads no save",
        "shell.py:6 save_durables",
        "shell.py:8 dispatch reads no save",
    ]
