"""The shells keep no copy of the replay and retention rules (issue 55, DESIGN §2): neither
looks up whom a replay's answers go to, nor writes what the publisher of a failed commit
is told, nor decides when a confirm is awaited or how a commit settles it; each check
read from the AST, with a check of the checker that shows it failing."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from shell_checks import in_shells, strings_holding


def replay_copies(path: Path) -> list[str]:
    """In ``path``'s code: every call of a ``requester`` method and every read of a map
    whose name ends in ``requesters`` (``x[req_id]``, ``x.get(req_id)``), a shell looking
    up itself which client asked for a replay (the rounds name it in ``ReplayDeliver``
    and ``ReplayDone``, with whether it was a claim: ``action.requester``, an attribute
    read, is fine); every write of such a map, or of one named ``<...>_reqs``, a shell's
    own table of its requests to route their answers by (the simulator kept two, once);
    and every ``<...selection>.take``,
    a store offering its rows one by one to an ``AnswerSelection`` and deciding itself
    when to stop reading (both stores once wrote that loop; both now hand their rows to
    ``AnswerSelection.choose``): ``file:line name``."""

    def named(node: ast.AST) -> str:
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and named(node.func) == "requester":
            found.append(f"{path.name}:{node.lineno} requester()")
        read = ""
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            read = f"{named(node.value)}[]"
        elif isinstance(node, ast.Attribute):
            read = f"{named(node.value)}.{node.attr}"
        if read.endswith(("requesters[]", "requesters.get", "selection.take")):
            found.append(f"{path.name}:{node.lineno} {read}")
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            table = named(node.value)
            if table.endswith(("requesters", "_reqs")):
                found.append(f"{path.name}:{node.lineno} {table}[] =")
    return found


def test_the_replay_copies_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "def answer(self, rounds, action, req_id, subscriber, selection):\n"
        "    '''rounds.requester(req_id) in a docstring is fine'''\n"
        "    key = rounds.requester(action.req_id)\n"
        "    who = self._requesters[action.req_id]\n"
        "    self._requesters[req_id] = subscriber\n"
        "    notify(action.requester, who or self._requesters.get(req_id))\n"
        "    take = self.selection.take\n"
        "    found = [selection.take(*row) for row in rows] + selection.choose(rows)\n"
        "    self.take(rows)\n"
        "    self._durable_reqs[req_id] = (client, run, bool(request.claim))\n"
        "    self.seams[client] = action.claim\n"
    )
    assert sorted(replay_copies(path)) == [
        "shell.py:10 _durable_reqs[] =",
        "shell.py:3 requester()",
        "shell.py:4 _requesters[]",
        "shell.py:5 _requesters[] =",
        "shell.py:6 _requesters.get",
        "shell.py:7 selection.take",
        "shell.py:8 selection.take",
    ]


SHELL_TEXTS = ("routed before the disk refused", "publications_refused.not_kept")
"""Words the node says and the shells once wrote each: what the publisher of a
publication whose commit failed is told (now ``core.answer.commit_refused``); the count
of publications refused before routing because their store refuses now (the process's
``Broker.publish`` and the simulator's ``RetentionStores.refusal`` each counted it; now
``BrokerNode.publish``, which both call with the store's refusal)."""


def shell_texts(path: Path) -> list[str]:
    """Every string in ``path``'s code (docstrings aside) holding one of
    :data:`SHELL_TEXTS`: ``file:line text``."""
    return strings_holding(path, SHELL_TEXTS)


def test_the_shell_texts_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "'''routed before the disk refused, in a docstring, is fine'''\n"
        "def refuse(receipt, exc):\n"
        "    '''and here: routed before the disk refused'''\n"
        "    receipt.refuse(f'{exc} (routed before the disk refused: it may be delivered)')\n"
        "    counters['publications_refused.not_kept'] += 1\n"
    )
    assert sorted(shell_texts(path)) == [
        "shell.py:4 routed before the disk refused",
        "shell.py:5 publications_refused.not_kept",
    ]


AWAITED_RULES = frozenset({"alone", "commit_delay", "refuse"})
"""When a publication is awaited (``PublishReceipt.alone``, which a connection's
``Unanswered`` sets and clears), when a store commits for it (``commit_delay``, asked by
``CommitWaits.delay``) and what a commit does to the receipts that waited
(``PublishReceipt.committed``): the process once marked and read ``alone`` and asked
``commit_delay`` itself, and both shells chose between ``held`` and ``refuse``."""


def awaited_rules(path: Path) -> list[str]:
    """Every name, attribute or keyword in ``path``'s code that is one of
    :data:`AWAITED_RULES`: a shell deciding itself when a confirm is awaited or how a
    commit settles it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = getattr(node, "attr", getattr(node, "id", getattr(node, "arg", None)))
        if name in AWAITED_RULES:
            found.append(f"{path.name}:{node.lineno} {name}")
    return found


AWAITED_COPY = (
    "def publish(self, connection, receipt, store, idle, refusal):\n"
    "    '''connection.last_receipt.alone = False, in a docstring, is fine'''\n"
    "    if connection.unanswered:\n"
    "        connection.last_receipt.alone = False\n"
    "    receipt = PublishReceipt(answered, alone=not connection.unanswered)\n"
    "    delay = commit_delay(store.pending, idle, any(r.alone for r in self._alone))\n"
    "    receipt.held() if refusal is None else receipt.refuse(refusal)\n"
)
"""A shell with the process's old copy of the awaited rule, and the shells' old choice
between ``held`` and ``refuse`` at a commit."""


def test_the_awaited_rules_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "shell.py").write_text(AWAITED_COPY)
    found = ["4 alone", "5 alone", "6 alone", "6 commit_delay", "7 refuse"]
    assert sorted(awaited_rules(tmp_path / "shell.py")) == [f"shell.py:{f}" for f in found]


@pytest.mark.parametrize("check", [replay_copies, shell_texts, awaited_rules])
def test_the_shells_keep_no_copy_of_the_replay_and_retention_rules(
    check: Callable[[Path], list[str]],
) -> None:
    """Read from the AST, neither shell looks up whom a replay's answers go to (the
    rounds name the requester, the latest ``limit`` requests of a host remembered), nor
    offers a store's rows to the answer's selection one by one (what a page holds and
    when the reading stops are ``AnswerSelection.choose``'s), nor writes what the
    publisher of a failed commit is told (``commit_refused``), nor when a confirm is
    awaited, when the store commits for it and how its commit settles it."""
    assert in_shells(check) == []
