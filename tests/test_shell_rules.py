"""The shells hold no decision (issue 55, DESIGN §2): ``octopis/transport/`` and
``octopis/sim/`` read none of the node's failure state, use the node's public API only,
and keep no copy of the rules that moved into the node (the handshake and the routable
rule, replay and retention, client sessions, the peer codec and which frames are stale,
the silence boundary, backpressure's acknowledgements) or into the client policy (when a
fail-over's tries end).

Each check reads the shells' modules as source (AST) and lists what it finds; each has a
check of the checker that shows it failing on a module written with the copy.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from test_layers import PACKAGE

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
        "accepting",
        "TRANSITIONS",
        "orphans",
    }
)
"""The node's failure state (``octopis.core.node``, ``octopis.core.recovery``): who is owed
a share, what is held for whom, what a restart lost; a neighbour's session and word
(``octopis.core.neighbours``: read through its questions, never by phase); the client
sessions' orphans (``octopis.core.sessions``). The shells report events to the
node and carry out its actions; none reads or writes this state (DESIGN §2, §7)."""

SHELLS = ("transport", "sim")


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


def _in_shells(check: Callable[[Path], list[str]]) -> list[str]:
    """What ``check`` finds in every module of the shells."""
    return [
        hit
        for shell in SHELLS
        for path in sorted((PACKAGE / shell).glob("*.py"))
        for hit in check(path)
    ]


def test_the_shells_hold_no_failure_decision() -> None:
    """transport/ and sim/ neither import the recovery bookkeeping nor touch the node's
    failure state: a broker process and a simulated broker decide alike because only the
    node decides (read from the AST: attribute and variable names, imports)."""
    assert _in_shells(node_state_reads) == []


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
``core.answer``'s ``AnswerSelection`` and ``commit_now``. When replay rounds expire next:
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
    assert _in_shells(shell_copies) == []


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


def strings_holding(path: Path, words: tuple[str, ...]) -> list[str]:
    """Every string in ``path``'s code (docstrings aside) holding one of ``words``:
    ``file:line word``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented) and node.body and isinstance(node.body[0], ast.Expr)
    }
    return [
        f"{path.name}:{node.lineno} {word}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
        for word in words
        if word in node.value
    ]


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
    assert _in_shells(session_copies) == []


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


def writes(node: ast.AST, names: frozenset[str]) -> list[str]:
    """The attributes in ``names`` that ``node`` assigns, on anything but ``self`` (an
    object's own counters are its own)."""
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AugAssign | ast.AnnAssign)
        else []
    )
    return [
        target.attr
        for target in targets
        if isinstance(target, ast.Attribute)
        and target.attr in names
        and not (isinstance(target.value, ast.Name) and target.value.id == "self")
    ]


def test_the_shells_use_the_nodes_public_api_and_no_acknowledgement_rule() -> None:
    """transport/ and sim/ import only public names of ``octopis.core`` (no ``_``-names,
    no private module such as the records' Cython part) and never write a neighbour's
    acknowledgement counts: the custody rule is the node's, for both (read from the AST)."""
    assert _in_shells(private_node_uses) == []


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


@pytest.mark.parametrize("check", [replay_copies, shell_texts])
def test_the_shells_keep_no_copy_of_the_replay_and_retention_rules(
    check: Callable[[Path], list[str]],
) -> None:
    """Read from the AST, neither shell looks up whom a replay's answers go to (the
    rounds name the requester, the latest ``limit`` requests of a host remembered), nor
    offers a store's rows to the answer's selection one by one (what a page holds and
    when the reading stops are ``AnswerSelection.choose``'s), nor writes what the
    publisher of a failed commit is told (``commit_refused``)."""
    assert _in_shells(check) == []


CODEC = frozenset(
    {
        "decode_peer",
        "decode_sender",
        "decode_body",
        "decode_body_in_full",
        "decode_plain_notification",
        "encode_peer",
        "encode_body",
    }
)
"""The peer codec (``octopis.core.codec``): how a frame's bytes become the node's messages
and back, checked, a malformed one refused naming the problem. The broker process once
held it (``transport/codec.py``); a shell that defines one of these keeps a copy."""

TAKING = frozenset({"took", "reachable", "decode_peer_body", "plain_notification"})
"""What a shell that decides for itself which peer bodies it takes uses: ``took`` (the
count without the staleness rule) or a neighbour's ``reachable`` (the process's peer
input once dropped a routing body from a neighbour whose handshake had not named it
itself, and took the others with ``took``; both shells now ask ``core.custody.take``);
the wire's ``decode_peer_body`` or the compiled ``plain_notification`` (a body decoded
without the codec's conversions and checks)."""


ACKNOWLEDGEMENTS = frozenset({"ack", "message"})
"""What the shells call an acknowledgement they hear (the simulator's ``Acknowledged``, the
process's heartbeat): a shell comparing the incarnation it names itself decides which
acknowledgements are stale (both did; ``core.custody.counts_for`` now)."""


def _names_an_incarnation(node: ast.expr) -> bool:
    """``node`` reads the incarnation an acknowledgement names."""
    return isinstance(node, ast.Attribute) and (
        node.attr == "acked_incarnation"
        or (
            node.attr == "incarnation"
            and isinstance(node.value, ast.Name)
            and node.value.id in ACKNOWLEDGEMENTS
        )
    )


def codec_copies(path: Path) -> list[str]:
    """Every definition (function, class or assignment) of a :data:`CODEC` name in
    ``path``'s code, every use of a :data:`TAKING` name (a variable, an import, or an
    attribute: ``x.took`` aside, a client's record of what it took), and every comparison
    of the incarnation an acknowledgement names: ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(
            _names_an_incarnation(side) for side in [node.left, *node.comparators]
        ):
            found.append(f"{path.name}:{node.lineno} incarnation compared")
        defined = (
            [node.name]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            else [t.id for t in node.targets if isinstance(t, ast.Name)]
            if isinstance(node, ast.Assign)
            else []
        )
        found += [f"{path.name}:{node.lineno} def {name}" for name in defined if name in CODEC]
        if isinstance(node, ast.Name) and node.id in TAKING:
            found.append(f"{path.name}:{node.lineno} {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in TAKING - {"took"}:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            found += [
                f"{path.name}:{node.lineno} import {alias.name}"
                for alias in node.names
                if alias.name in TAKING
            ]
    return found


def test_the_shells_keep_no_copy_of_the_codec_or_of_which_frames_are_stale() -> None:
    """The node takes a peer frame as its event (DESIGN §2): neither shell defines the
    codec's conversions, decodes a body past it, or decides itself which routing bodies
    or acknowledgements from a neighbour are stale (``core.custody.take`` and
    ``counts_for`` do, for both; read from the AST)."""
    assert _in_shells(codec_copies) == []


def test_the_codec_copies_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "from octopis.core.custody import resent_taken, took\n"
        "from octopis.wire import decode_peer_body\n"
        "def decode_body(sender, body):\n"
        "    '''took and reachable in a docstring are fine'''\n"
        "    return decode_peer_body(body, sender)\n"
        "encode_body = pack\n"
        "def on_body(state, body, c):\n"
        "    if state.reachable:\n"
        "        took(state, 1)\n"
        "    c.progress.took(1)\n"
        "    if ack.incarnation != me or message.acked_incarnation == me:\n"
        "        counts_for(ack.incarnation, me) and state.incarnation == me\n"
        "    return decode_sender(c)\n"
    )
    assert sorted(codec_copies(path)) == [
        "shell.py:1 import took",
        "shell.py:11 incarnation compared",
        "shell.py:11 incarnation compared",
        "shell.py:2 import decode_peer_body",
        "shell.py:3 def decode_body",
        "shell.py:5 decode_peer_body",
        "shell.py:6 def encode_body",
        "shell.py:8 .reachable",
        "shell.py:9 took",
    ]


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


def heal_steps(path: Path) -> list[str]:
    """Every call in ``path``'s code of a :data:`HEAL_STEPS` step: a shell ordering a
    heal itself."""
    return [
        f"{path.name}:{node.lineno} {node.func.attr}()"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in HEAL_STEPS
    ]


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


DRIFT_CHECKS = (
    silence_copies,
    give_up_copies,
    unpressed_acknowledgements,
    record_writes,
    routed_then_held,
    heal_steps,
    unanswered_checks,
)
"""The checks of seven rules the shells once each wrote apart: when a silence is past
``links.down_after``, when a simulated client's fail-over ends, what count an
acknowledgement carries under backpressure, who moves a neighbour's record, how a copy
given back or a publication held is routed and its receipt counted, the order of a
heal, and whether a replay's answer goes to anyone."""


@pytest.mark.parametrize("check", DRIFT_CHECKS)
def test_the_shells_leave_silence_give_up_and_withholding_to_the_rules(
    check: Callable[[Path], list[str]],
) -> None:
    """Both shells ask ``Neighbour.silent_past`` whether a silence has lasted
    ``links.down_after``; the simulator's clients end their fail-over when
    ``client_policy.failover_tries`` ends, never asking whether every broker is dead; both
    shells take an acknowledgement's count from ``Backpressure.acknowledge`` (read from
    the AST)."""
    assert _in_shells(check) == []


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
    ],
)
def test_the_drift_checks_can_fail(
    tmp_path: Path, check: Callable[[Path], list[str]], found: list[str]
) -> None:
    path = tmp_path / "shell.py"
    path.write_text(DRIFT_COPIES)
    assert sorted(check(path)) == found
