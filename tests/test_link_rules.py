"""The neighbour lifecycle's rules that both shells ask of the node (DESIGN §7, §9), and
the checks, read from the shells' AST as ``test_layers.py`` reads the others, that
neither keeps a copy: whether a neighbour heard again resumes its session
(``Neighbours.resumed``, asked by ``BrokerNode.heard``, which both shells call; neither
asks it, ``test_shell_rules.heal_steps``), what a RESENT's receiver takes
(``resent_taken``, tested in ``test_custody.py``), whether a relink may drop a link that
still carries (``core.relinking``), when a silent neighbour is declared down
(``Neighbours.overdue``), when a local publication's confirm is answered
(``core.custody.PublishReceipt``, through which the simulator's stores confirm too),
and that no shell branches on a broker's or a heartbeat's word that it serves."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from shell_checks import SHELLS, in_shells, strings_holding
from test_layers import PACKAGE

from octopis.core import NoCongestion, Notification, SubState, Unsubscribe, make_broker
from octopis.core.answer import COMMIT_DELAY, PIPELINE_DELAY, CommitWaits, commit_refused
from octopis.core.custody import Custody, PublishReceipt, Unanswered
from octopis.core.neighbours import Neighbours
from octopis.core.node import BrokerNode
from octopis.core.relinking import carried, leaving_busy
from octopis.defaults import HEARTBEAT
from octopis.sim import Simulator
from octopis.sim.custody import Acknowledged
from octopis.topology import build_preset
from octopis.topology_change import remove_region

FIG2 = build_preset("fig2")


def test_a_heal_resumes_the_session_once_unless_a_new_incarnation_came_or_none_was_met() -> None:
    """The node asks the table whether a neighbour heard again resumes its session
    (``BrokerNode.heard``: its link then gives back, resends and hands over): once
    per silence, not when a new incarnation was met instead, and never for a neighbour
    that was declared down before it was ever met."""
    table = Neighbours(["n", "m", "never"])
    table.built("n", 5, 0.0)
    table.built("m", 7, 0.0)
    assert not table.resumed("n")  # never silent
    for name in ("n", "m", "never"):
        table.silent(name, 3.0)
    table.heard("n", 4.0)
    assert table.resumed("n") and not table.resumed("n")  # once per silence
    table.heard("m", 4.0)
    assert table.met("m", 8) is True and not table.resumed("m")  # a restart: a handshake
    table.heard("never", 4.0)
    assert not table.resumed("never")


def test_a_relink_is_refused_while_a_leaving_link_carries_then_taken_once_it_drained() -> None:
    """Both shells relink through the node with what each link still carries (the
    process's queue and custody, the simulator's links in flight and custody): a link
    that leaves while it carries anything refuses the whole view, naming it, and nothing
    changes; a link that stays may carry; once the leaving one drained, the view is
    taken, and what was held for the neighbour that left is dropped and counted."""
    smaller = remove_region(FIG2, "f")  # fig2's f is a leaf next to e
    node = BrokerNode(make_broker(FIG2, "e:0", "snr", covering="off"), 100)
    view, clusters = smaller.brokers["e:0"], smaller.clusters
    carried = {"f:0": 2, "c:0": 5}
    assert leaving_busy({"f:0"}, lambda n: carried.get(n, 0)) == {"f:0": 2}
    with pytest.raises(ValueError, match="the links to f:0 still carry 2 unacknowledged"):
        node.relink(view, clusters, 1.0, lambda n: carried.get(n, 0))
    assert "f:0" in node.neighbours and "f:0" in node.core.neighbour_ids
    carried["f:0"] = 0
    node.link_down("f:0", [Unsubscribe("s#1", SubState.PRIMARY)])  # held while it was down
    assert node.relink(view, clusters, 1.0, lambda n: carried.get(n, 0)) == 1
    assert node.counts()["relink.held_dropped"] == 1
    assert "f:0" not in node.neighbours and "f:0" not in node.core.neighbour_ids


def test_both_shells_count_what_a_link_carries_alike() -> None:
    """The simulator counts what a link carries as the process does
    (``relinking.carried``: routing messages waiting, and custody's unacknowledged): an
    acknowledgement in flight carries nothing, and a kept copy in flight counts once
    (the simulator refused a relink for the one and counted the other twice)."""
    sim = Simulator(FIG2, "snr", seed=1)
    custody = sim._failure_state().custody.of("a:0", "b:0")
    sim.events.send("a:0", "b:0", 1.0, Acknowledged(3, 1))
    assert sim._carrying("a:0", "b:0") == 0
    copy = Notification("P", 1, 0.0, {"x": 1})
    custody.sent(copy, 0.0, True)
    sim.events.send("a:0", "b:0", 1.0, copy)
    assert sim._carrying("a:0", "b:0") == carried(0, custody) == 1


def test_a_receiver_beats_while_its_count_would_settle_what_its_sender_keeps() -> None:
    """A receiver whose acknowledgement was lost (its connection aborted) while its
    sender retains nothing (``retain`` 0) heartbeats the count again, as the process's
    heartbeat does, so the sender's custody settles: the simulator's heartbeat timer runs
    while the sender keeps anything a heartbeat would settle, not only while it retains
    (with only the latter, the copy stayed unacknowledged and its confirm never came)."""
    sim = Simulator(FIG2, "snr", seed=1)
    state = sim._failure_state(retain=0.0)
    sim.run(until=1.0)
    custody = state.custody.of("a:0", "b:0")
    record = sim.nodes["b:0"].neighbours["a:0"]
    custody.sent(Notification("P", 1, 0.0, {"x": 1}), sim.now, True)
    record.received += 1
    record.acked = record.received  # acknowledged, and the acknowledgement lost
    state.custody.last_sent[("b:0", "a:0")] = sim.now
    state.custody.beating.add(("b:0", "a:0"))
    sim.at(sim.now + HEARTBEAT, sim._heartbeat, "b:0", "a:0")
    assert len(custody) == 1
    sim.run(until=sim.now + 3 * HEARTBEAT)
    assert len(custody) == 0 and not custody.retained


LINK_RULES = frozenset({"resent_taken", "relink", "at_once", "timer_fired"})
"""The neighbour lifecycle's rules each shell once wrote its own way, now asked of the
node by both: what a RESENT's receiver takes, stale from a sender that is not reachable
(the process alone checked that), and whether it acknowledges at once (each shell
tested ``owed`` itself); what becomes of an acknowledgement wanted at once (sent, left
to the timer while deliveries wait, or to the look again while backpressure holds the
neighbour back: each shell once asked backpressure in its own steps) and whom a broker's
acknowledgement timer acknowledges (one timer per broker, every neighbour owed and not
held back: the simulator once armed one per link and acknowledged that link alone),
both :class:`~octopis.core.acknowledging.Acknowledgements`'; whether a relink may drop
a link that still carries (each shell refused with its own data). Whether a neighbour
heard again resumes its session (the process once read its link's greeting, the
simulator ``declared_down``) is now asked by the node's heal itself
(``BrokerNode.heard``)."""

REFUSAL_WORDS = ("still carry", "links.resent_dropped", "stale_frames", "relink.held_dropped")
"""Words of the node's relink refusal (``octopis.core.relinking``): a shell that writes
them refuses on its own; and the counts of routing messages dropped as taken before or
stale, which ``resent_taken`` and ``take`` keep, and of those a relink drops, which
``BrokerNode.relink`` keeps (both shells once counted them from the rules' verdicts)."""


def link_rule_calls(path: Path) -> set[str]:
    """The :data:`LINK_RULES` that ``path`` calls as ``x.rule(...)``, or as ``rule(...)``
    but for ``relink`` (the broker process's RPC of that name is its own)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in LINK_RULES and (isinstance(func, ast.Attribute) or name != "relink"):
            found.add(name)
    return found


def refusal_copies(path: Path) -> list[str]:
    """Every string in ``path``'s code (docstrings aside) with :data:`REFUSAL_WORDS`."""
    return strings_holding(path, REFUSAL_WORDS)


def test_both_shells_take_the_link_rules_from_the_node() -> None:
    """Each shell calls every rule of :data:`LINK_RULES`, words no relink refusal of its
    own and counts no stale or resent messages itself (read from the AST)."""
    for shell in SHELLS:
        calls = set().union(*map(link_rule_calls, (PACKAGE / shell).glob("*.py")))
        assert calls == LINK_RULES, shell
    assert in_shells(refusal_copies) == []


def test_the_link_rule_checks_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "def heal(table, link, broker, data):\n"
        '    """a link that still carries, in a docstring, is fine"""\n'
        "    if link.incarnation and not link.greeted:\n"
        "        resent_taken(table, 'n')\n"
        "    relink(broker, data)\n"
        "    raise ValueError(f'{broker}: the links still carry {data}')\n"
        "    counts['links.resent_dropped'] += dropped\n"
        "    self.failure_counts['stale_frames'] += 1\n"
        "    broker.counters['relink.held_dropped'] += dropped\n"
    )
    assert link_rule_calls(path) == {"resent_taken"}
    assert sorted(refusal_copies(path)) == [
        "shell.py:6 still carry",
        "shell.py:7 links.resent_dropped",
        "shell.py:8 stale_frames",
        "shell.py:9 relink.held_dropped",
    ]


def condition_reads(path: Path) -> Iterator[ast.AST]:
    """Every node inside a condition (``if``, ``while``, a conditional expression or a
    comprehension's ``if``) of ``path``'s code."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.If | ast.While | ast.IfExp):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        else:
            continue
        for test in tests:
            yield from ast.walk(test)


def serving_conditions(path: Path) -> list[str]:
    """Every condition in ``path`` (:func:`condition_reads`) that reads an attribute
    ``serving``: whether a broker serves, or what a heartbeat says of it, is for the node
    to weigh (``serve_if_ready``, ``Neighbours.said``); a shell carries the word, never
    branches on it."""
    return [
        f"{path.name}:{inner.lineno} serving"
        for inner in condition_reads(path)
        if isinstance(inner, ast.Attribute) and inner.attr == "serving"
    ]


def test_the_shells_never_branch_on_serving() -> None:
    """The simulator sent a heartbeat after a heal only if the broker served and dropped
    one on arrival unless it still served; the process rewrote its LST row only if a
    heartbeat said it did not serve. Now both carry the word and the node decides."""
    assert in_shells(serving_conditions) == []


def test_the_serving_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "def heal(nodes, src, dst, message):\n"
        "    if nodes[src].serving:\n"
        "        tell(src, dst)\n"
        "    word = nodes[dst].serving\n"
        "    beat = [n for n in nodes if not n.serving]\n"
        "    return 1 if message.serving else 0\n"
    )
    assert sorted(serving_conditions(path)) == [
        "shell.py:2 serving",
        "shell.py:5 serving",
        "shell.py:6 serving",
    ]


def test_a_publication_is_awaited_only_while_its_connection_waits_for_no_other() -> None:
    """A connection's publication taken while none of it is unanswered is alone (awaited)
    until another comes before its answer (its publisher pipelines); one that keeps no
    copy is answered at once and never unanswered. The store commits at once, at an idle
    pass's end, only while an awaited one waits (``CommitWaits.delay``), and its commit
    settles every receipt that waited for it, refused if the disk refused."""
    answers: list[int] = []
    unanswered, waits = Unanswered(), CommitWaits()
    first = unanswered.receipt(lambda: answers.append(0))
    assert first.alone and not unanswered.waits(first) and unanswered.count == 0
    first = unanswered.receipt(lambda: answers.append(1))
    waits.kept(first)
    assert unanswered.waits(first) and unanswered.count == 1
    assert waits.delay(1, idle=True) == 0.0 and waits.delay(1, idle=False) == COMMIT_DELAY
    second = unanswered.receipt(lambda: answers.append(2))
    waits.kept(second)
    assert unanswered.waits(second) and unanswered.count == 2
    assert not first.alone and not second.alone
    assert waits.delay(2, idle=True) == PIPELINE_DELAY
    waits.committed("the disk is full")
    assert answers == [1, 2] and unanswered.count == 0
    assert second.refusal == commit_refused("the disk is full")
    assert unanswered.receipt(lambda: None).alone


def test_a_confirm_waits_for_every_kept_copy_and_the_store_and_says_its_refusal() -> None:
    """A publication with no copy kept is answered at once (the shell's reply); with
    copies kept — one in each link's custody, the store's — the answer goes when the last
    is held: an acknowledgement settles a link's copy (``Custody``'s ``settle``), the
    commit the store's; a store that refuses it still lets the answer go, as an error."""
    answers: list[str] = []
    now = PublishReceipt(lambda: answers.append("now"))
    assert not now.waits and answers == []
    receipt = PublishReceipt(lambda: answers.append(f"answered {receipt.refusal}"))
    links = {
        name: Custody(8, settle=lambda entries: [copy.held() for _, _, copy in entries])
        for name in ("n", "m")
    }
    off = Custody(0)  # custody off: no acknowledgement to wait for
    assert not receipt.goes(off, notification=True)
    assert not receipt.goes(links["n"], notification=False)  # not the notification itself
    for custody in links.values():
        assert receipt.goes(custody, notification=True)
        custody.sent(receipt, 1.0, kept=True)
    receipt.keep()  # the store's copy, held at its commit
    assert receipt.waits and receipt.copies == 3
    links["n"].acknowledge(1, 2.0)
    receipt.refuse("the disk is full")  # the commit failed: not kept for replay
    assert answers == [] and receipt.waits  # m's neighbour holds no copy yet
    links["m"].acknowledge(1, 3.0)
    assert answers == ["answered the disk is full"] and not receipt.waits
    links["n"].acknowledge(1, 4.0)  # an acknowledgement repeated settles nothing again
    assert answers == ["answered the disk is full"]


RECEIPT = frozenset({"PublishReceipt"})
"""The confirm's rule (``core.custody.PublishReceipt``), which the broker process kept in
``transport/links.py``: a shell that defines it keeps a copy."""


def receipt_copies(path: Path) -> list[str]:
    """In ``path``'s code: every definition (class, function or assignment) of a
    :data:`RECEIPT` name, every ``copies`` of something named ``…receipt`` (a shell
    counting a confirm's copies itself, where the receipt's ``keep`` and ``waits``
    decide), every condition weighing a receipt with a custody's ``keeps`` (whether a
    link's copy is waited for: ``PublishReceipt.goes``), and every ``x.copies -= …`` (a
    shell counting a copy as held)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        else:
            names = []
        found += [f"{path.name}:{node.lineno} def {name}" for name in names if name in RECEIPT]
        if isinstance(node, ast.Attribute) and node.attr == "copies":
            owner = node.value
            owner_name = (
                owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            )
            if owner_name.lower().endswith("receipt"):
                found.append(f"{path.name}:{node.lineno} {owner_name}.copies")
        if isinstance(node, ast.If | ast.IfExp | ast.BoolOp):
            names = {
                inner.attr if isinstance(inner, ast.Attribute) else inner.id
                for inner in ast.walk(node)
                if isinstance(inner, ast.Attribute | ast.Name)
            }
            if "keeps" in names and any(n.lower().endswith("receipt") for n in names):
                found.append(f"{path.name}:{node.lineno} receipt and keeps")
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.op, ast.Sub)
            and isinstance(node.target, ast.Attribute)
            and node.target.attr == "copies"
        ):
            found.append(f"{path.name}:{node.lineno} copies -=")
    return found


def test_the_shells_keep_no_copy_of_the_confirm_rule() -> None:
    """Neither shell defines the confirm's receipt or counts its copies itself (read
    from the AST): both keep and hold through ``core.custody.PublishReceipt``."""
    assert in_shells(receipt_copies) == []


def test_the_receipt_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "class PublishReceipt:\n"
        '    """copies of a receipt, in a docstring, are fine"""\n'
        "    def held(self):\n"
        "        self.copies -= 1\n"
        "def publish(router, n, receipt, link):\n"
        "    router.publish(n, receipt)\n"
        "    if receipt.copies == 0:\n"
        "        self.receipt.copies += 1\n"
        "    if receipt and frame[2] == KEPT and link.custody.keeps:\n"
        "        frame.append(receipt)\n"
        "    return link.copies\n"
    )
    assert sorted(receipt_copies(path)) == [
        "shell.py:1 def PublishReceipt",
        "shell.py:4 copies -=",
        "shell.py:7 receipt.copies",
        "shell.py:8 receipt.copies",
        "shell.py:9 receipt and keeps",
        "shell.py:9 receipt and keeps",
    ]


CONFIRMS = frozenset({"confirmed"})
"""Where a shell records a publisher's confirm (the simulator's stores'
``confirmed``): written only by a receipt's answer, or the shell confirms by a rule
of its own (the simulator confirmed at its store's commit, without custody)."""


def confirm_rules(path: Path) -> list[str]:
    """In ``path``'s code: every write into a :data:`CONFIRMS` record (an item set,
    deleted or augmented; an ``add``, ``update``, ``setdefault`` or ``append`` on it)
    outside the answer given to a ``PublishReceipt(...)`` in the same module (the
    function named, or the lambda, passed as its first argument)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    answers: set[str] = set()
    lambdas: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and _named(node.func) == "PublishReceipt":
            answer = node.args[0]
            if isinstance(answer, ast.Lambda):
                lambdas.add(answer)
            else:
                answers.add(_named(answer))
    found: list[str] = []

    def visit(node: ast.AST, answering: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            answering = node.name in answers
        elif isinstance(node, ast.Lambda):
            answering = node in lambdas
        written = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
            written = node.value
        elif isinstance(node, ast.AugAssign):
            written = node.target
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("add", "update", "setdefault", "append")
        ):
            written = node.func.value
        if written is not None and _named(written) in CONFIRMS and not answering:
            found.append(f"{path.name}:{node.lineno} {_named(written)} written")
        for child in ast.iter_child_nodes(node):
            visit(child, answering)

    visit(tree, False)
    return found


def _named(node: ast.AST) -> str:
    """The name an expression ends with (``a.b.c``: ``c``), or ``""``."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def test_the_shells_confirm_only_through_the_receipts_answer() -> None:
    """Neither shell records a publisher's confirm by a rule of its own (read from the
    AST): the simulator's stores confirm in the answer of the process's own
    ``PublishReceipt`` (``RetentionStores.receipt``), so custody and the store's commit
    decide when, as on the process."""
    assert in_shells(confirm_rules) == []


def test_the_confirm_check_can_fail(tmp_path: Path) -> None:
    """The simulator's store before the receipt (confirmed at its commit) is caught, and
    so are the other writes; the receipt's answer, named or a lambda, is not."""
    path = tmp_path / "stores.py"
    path.write_text(
        "class RetentionStores:\n"
        "    def keep(self, broker, notification, now):\n"
        "        key = (notification.publisher, notification.seq)\n"
        "        self.confirmed[key] = broker\n"
        "        return True\n"
        "    def confirm_all(self, keys, broker):\n"
        "        self.confirmed.update(dict.fromkeys(keys, broker))\n"
        "        confirmed.add(keys[0])\n"
        "    def receipt(self, broker, key):\n"
        "        def answered():\n"
        "            self.confirmed[key] = broker\n"
        "        other = PublishReceipt(lambda: self.confirmed.setdefault(key, broker))\n"
        "        return PublishReceipt(answered)\n"
    )
    assert confirm_rules(path) == [
        "stores.py:4 confirmed written",
        "stores.py:7 confirmed written",
        "stores.py:8 confirmed written",
    ]


def test_a_neighbour_is_silent_past_down_after_from_that_moment_on() -> None:
    """The one boundary both shells ask (``Neighbour.silent_past``, DESIGN §7: silent for
    T is down): reached at ``last_heard + down_after`` itself, not before; a timer set
    then for one last heard at its start sees it though ``(t + d) - t < d`` in floating
    point, and one heard after the silence began is not past."""
    table = Neighbours(["n"], now=0.1)
    record = table["n"]
    assert not record.silent_past(1.0999, 1.0)
    assert record.silent_past(0.1 + 1.0, 1.0) and record.silent_past(2.0, 1.0)
    began, down_after = 43.277, 0.3
    assert (began + down_after) - began < down_after  # the silence rounds below the bound
    table.heard("n", began)
    assert record.silent_past(began + down_after, down_after)
    table.heard("n", began + 0.001)  # heard since: a timer set at the silence's start
    assert not record.silent_past(began + down_after, down_after)


def test_a_neighbour_is_overdue_at_down_after_only_with_the_input_read() -> None:
    """Silent for ``down_after`` (at it exactly, as the simulator's timer sees it), up,
    and only once the broker has read what reached it: a backlog of its own is no
    neighbour's silence; whether it has is asked only when one is silent that long. A
    stall excuses."""
    table = Neighbours(["n", "m", "gone"])
    for name, heard in (("n", 1.0), ("m", 2.0), ("gone", 0.0)):
        table.built(name, 5, 0.0)
        table.heard(name, heard)
    table.silent("gone", 0.5)
    asked: list[float] = []

    def read(now: float, caught_up: bool = True) -> list[tuple[str, float]]:
        def ask() -> bool:
            asked.append(now)
            return caught_up

        return table.overdue(now, 1.0, ask)

    assert read(1.5) == [] and asked == []
    assert read(2.0) == [("n", 1.0)] and asked == [2.0]  # n silent exactly down_after
    assert read(2.5) == [("n", 1.5)] and asked == [2.0, 2.5]
    assert read(3.5, caught_up=False) == []  # its own input unread: nobody is declared
    assert read(3.5) == [("n", 2.5), ("m", 1.5)]
    table.stalled(2.0)  # this process did not run for 2 s
    assert read(3.5) == []


def test_only_a_neighbour_heard_is_declared_down_by_either_shell() -> None:
    """The one rule both shells declare a neighbour down by (``Neighbours.due_down``:
    the process's liveness tick through :meth:`Neighbours.overdue`, the simulator's
    detection timer): up, and silent ``down_after``. One never heard since the broker
    started (a restarted broker's neighbour behind a cut) is no one to lose: it is left
    to the broker's wait before serving, and an earlier simulator declared it down."""
    table = Neighbours(["heard", "never"], now=0.0)
    table.built("heard", 5, 0.0)
    assert table.due_down("heard", 1.0, 1.0) and not table.due_down("heard", 0.9, 1.0)
    assert not table.due_down("never", 5.0, 1.0) and not table.declared_down("never")
    assert table.overdue(5.0, 1.0, lambda: True) == [("heard", 5.0)]


def test_a_restarted_broker_serves_at_the_end_of_its_wait_in_floating_point_too() -> None:
    """A broker that started at ``t`` with a neighbour it never heard serves once it has
    waited ``down_after`` (:meth:`BrokerNode.serve_if_ready`), at ``t + down_after`` as
    a timer set for it sees it, though ``(t + d) - t < d`` in floating point: the
    simulator's restarted broker did not serve until an unrelated event came."""
    started, down_after = 3.453, 1.0
    assert (started + down_after) - started < down_after
    node = BrokerNode(make_broker(FIG2, "c:0", "snr", covering="off"), 100)
    node.start(started, down_after=down_after)
    assert node.serve_if_ready(started + down_after - 0.001, NoCongestion()) is None
    assert node.serve_if_ready(started + down_after, NoCongestion()) is not None


def liveness_branches(path: Path) -> list[str]:
    """Every condition in ``path`` (:func:`condition_reads`) that reads or calls
    :data:`LIVENESS_FACTS`: a shell weighing itself whether a neighbour's silence counts,
    where ``Neighbours.overdue`` does."""
    found = []
    for inner in condition_reads(path):
        name = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", "")
        if name in LIVENESS_FACTS:
            found.append(f"{path.name}:{inner.lineno} {name}")
    return found


LIVENESS_FACTS = frozenset({"caught_up", "overdue"})
"""What the broker process once branched on before declaring a neighbour down
(``if overdue and caught_up()``)."""


def test_the_shells_leave_a_neighbours_silence_to_the_node() -> None:
    """Neither shell decides itself whether a silence counts (read from the AST)."""
    assert in_shells(liveness_branches) == []


def test_the_liveness_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "shell.py"
    path.write_text(
        "def tick(table, now, caught_up):\n"
        '    """if overdue and caught_up, in a docstring, is fine"""\n'
        "    overdue = table.overdue(now, 1.0)\n"
        "    if overdue and caught_up():\n"
        "        declare(overdue)\n"
        "    for name, silent in table.overdue(now, 1.0, caught_up):\n"
        "        declare(name)\n"
    )
    assert sorted(liveness_branches(path)) == ["shell.py:4 caught_up", "shell.py:4 overdue"]


def heartbeat_calls(path: Path) -> list[str]:
    """Every call of ``heartbeat_due`` in ``path`` whose ``sending`` (its last argument)
    is a constant: a shell that passes one decides for the node whether something is
    about to leave on the link. ``file:line value``."""
    return [
        f"{path.name}:{node.lineno} {node.args[-1].value!r}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "heartbeat_due"
        and len(node.args) == 4
        and isinstance(node.args[-1], ast.Constant)
    ]


def test_both_shells_tell_the_heartbeat_rule_what_is_about_to_leave(tmp_path: Path) -> None:
    """A heartbeat is due on an idle link only when nothing is about to leave on it
    (:func:`~octopis.core.custody.heartbeat_due`): the process reads its output queue
    (not held back), the simulator its link's output queue where links measure queues.
    The simulator used to pass ``False``, beating behind a queue still draining, which
    the process does not; the checker is shown that old call."""
    assert not in_shells(heartbeat_calls)
    calls = [path for shell in SHELLS for path in (PACKAGE / shell).glob("*.py")
             if "heartbeat_due(" in path.read_text(encoding="utf-8")]  # fmt: skip
    assert {path.parent.name for path in calls} == set(SHELLS), "both shells ask the rule"
    old = "heartbeat_due(record, idle, HEARTBEAT, False)\n"
    probe = tmp_path / "custody.py"
    probe.write_text(old, encoding="utf-8")
    assert heartbeat_calls(probe) == ["custody.py:1 False"]
