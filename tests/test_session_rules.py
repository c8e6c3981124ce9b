"""Checks, read from the shells' AST as ``test_layers.py`` reads the others, that neither
shell keeps a copy of a client-session rule the node now decides (DESIGN §2, §7, §8,
§12): which of a client's subscriptions the composite host takes
(:meth:`~octopis.core.composite_hosting.HostedComposites.local_subscribe`), and when a
client is silent, its requests read and the broker's stalls excused
(:class:`~octopis.core.sessions.Liveness`); nor of the client flow's limits
(:class:`~octopis.core.client_flow.ClientFlow`) or of the wire's order of replies
(:data:`~octopis.wire.AFTER_DELIVERIES`). Each check is shown to fail on a copy of the
code it replaced."""

from __future__ import annotations

import ast
from pathlib import Path

from shell_checks import in_shells


def composite_dispatch(path: Path) -> list[str]:
    """Every ``isinstance(…, Composite)`` and every ``….composites.holds(…)`` in ``path``:
    a shell choosing between the composite host and the routing core itself."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "isinstance"
            and len(node.args) == 2
            and "Composite" in ast.unparse(node.args[1])
        ):
            found.append(f"{path.name}:{node.lineno} isinstance Composite")
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "holds"
            and "composites" in ast.unparse(func.value)
        ):
            found.append(f"{path.name}:{node.lineno} composites.holds")
    return found


def test_the_shells_leave_the_composite_dispatch_to_the_host() -> None:
    """Neither shell decides whether a subscription is the composite host's or the core's:
    both ask :meth:`HostedComposites.local_subscribe` / ``local_unsubscribe``."""
    assert in_shells(composite_dispatch) == []


def test_the_composite_dispatch_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "broker.py"
    path.write_text(
        "def subscribe(self, key, subscription):\n"
        "    '''isinstance(s, Composite) in a docstring is fine'''\n"
        "    if isinstance(subscription, Composite):\n"
        "        return self.composites.subscribe(key, subscription, 0.0)\n"
        "    if self.composites.holds(key, 's1&'):\n"
        "        return []\n"
        "    return isinstance(subscription, Subscription) and table.holds(key)\n"
    )
    assert composite_dispatch(path) == [
        "broker.py:3 isinstance Composite",
        "broker.py:5 composites.holds",
    ]


def liveness_copies(path: Path) -> list[str]:
    """Every ``….last_seen`` in ``path`` (a shell keeping, excusing or judging a client's
    silence itself), every ``CLIENT_TIMEOUT`` it reads and every timeout it divides (a
    shell reckoning when a silent client is dropped, or its tick: the simulator dropped
    one at ``cut + CLIENT_TIMEOUT``, the process ticked every ``timeout / 4``), and every
    ``stalled`` of a client liveness (a shell excusing a stall for its clients)."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = getattr(node, "attr", getattr(node, "id", None))
        client_stall = name == "stalled" and ast.unparse(node.value).endswith("liveness")
        div = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
        divided = getattr(node.left, "attr", getattr(node.left, "id", "")) if div else ""
        if name in ("last_seen", "CLIENT_TIMEOUT") or client_stall or divided.endswith("timeout"):
            found.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [f"{path.name}:{line} {text}" for line, _, text in sorted(found)]


def test_the_shells_leave_client_silence_to_the_node() -> None:
    """Neither shell keeps when its clients were last heard, reckons when one is dropped
    or its tick, excuses its own stall or judges silence itself:
    :class:`~octopis.core.sessions.Liveness` does, at the ticks it sets."""
    assert in_shells(liveness_copies) == []


def test_the_liveness_check_can_fail(tmp_path: Path) -> None:
    """The process's tick and the simulator's drop, as they were."""
    path = tmp_path / "connections.py"
    path.write_text(
        "def expire(self, now, late):\n"
        "    '''connection.last_seen, CLIENT_TIMEOUT / 4 in a docstring are fine'''\n"
        "    for connection in self.connections.values():\n"
        "        connection.last_seen += late\n"
        "    seen = {i: c.last_seen for i, c in self.connections.items()}\n"
        "    tick = self.timeout / 4\n"
        "    self.liveness.stalled(stall(now, woke, tick))\n"
        "    self.at(self.now + CLIENT_TIMEOUT, self._drop_client, subscriber, host)\n"
        "    return self.liveness.last_seen, seen, self.neighbours.stalled(late)\n"
    )
    assert liveness_copies(path) == [
        "connections.py:4 connection.last_seen",
        "connections.py:5 c.last_seen",
        "connections.py:6 self.timeout / 4",
        "connections.py:7 self.liveness.stalled",
        "connections.py:8 CLIENT_TIMEOUT",
        "connections.py:9 self.liveness.last_seen",
    ]


CLIENT_LIMITS = frozenset({"publish_window", "body_bytes", "backlog_limit"})
"""The client-side limits only :class:`~octopis.core.client_flow.ClientFlow` applies
(DESIGN §8): how many publications of a connection may await their answer, how long a
body may be, how many messages a full pipe's backlog takes."""


def client_limit_reads(path: Path) -> list[str]:
    """Every one of :data:`CLIENT_LIMITS` compared or reckoned with in ``path`` (a shell
    applying the publish window, the body limit or the backlog limit itself; naming one
    in a log message is no rule)."""
    found = {
        (node.lineno, node.col_offset, node.attr)
        for test in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(test, ast.Compare | ast.BinOp)
        for node in ast.walk(test)
        if isinstance(node, ast.Attribute) and node.attr in CLIENT_LIMITS
    }
    return [f"{path.name}:{line} {attr}" for line, _, attr in sorted(found)]


def test_the_shells_leave_the_publish_window_to_the_client_flow() -> None:
    """Neither shell compares a connection's unanswered publications with the window
    (or a body, a backlog with theirs): it asks ``ClientFlow.refuse_publication``,
    ``refuse_body``, ``backlog_takes`` and only counts what it has not answered yet."""
    assert in_shells(client_limit_reads) == []


def test_the_client_limits_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "requests.py"
    path.write_text(
        "def publish(self, connection, request):\n"
        "    '''connection.unanswered >= flow.publish_window, in a docstring'''\n"
        "    if connection.unanswered >= self.settings.publish_window:\n"
        "        raise ClientError('window')\n"
        "    log.warning('backlog_limit = %d', flow.backlog_limit)\n"
        "    return len(request.body) > limits.body_bytes\n"
    )
    assert client_limit_reads(path) == [
        "requests.py:3 publish_window",
        "requests.py:6 body_bytes",
    ]


ORDERED_REPLIES = frozenset({"unsubscribed", "bye"})
"""The reply ops :data:`~octopis.wire.AFTER_DELIVERIES` names."""


def reply_order_copies(path: Path) -> list[str]:
    """Every set, list or tuple of ``path`` that lists one of :data:`ORDERED_REPLIES`, and
    every name ``AFTER_DELIVERIES`` it assigns: a shell declaring which replies follow
    the deliveries before them (the wire's rule, :data:`octopis.wire.AFTER_DELIVERIES`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Set | ast.List | ast.Tuple) and any(
            isinstance(e, ast.Constant) and e.value in ORDERED_REPLIES for e in node.elts
        ):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [
                f"{path.name}:{node.lineno} {t.id} ="
                for t in targets
                if isinstance(t, ast.Name) and t.id == "AFTER_DELIVERIES"
            ]
    return found


def test_the_shells_take_the_reply_order_from_the_wire() -> None:
    """Which replies wait for the deliveries before them is a protocol rule the client
    relies on (it lets a connection go on them): declared once, in ``octopis.wire``."""
    assert in_shells(reply_order_copies) == []


def test_the_reply_order_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "clients.py"
    path.write_text(
        "AFTER_DELIVERIES = frozenset({'unsubscribed', 'bye'})\n"
        "'''{'bye'} in a docstring is fine'''\n"
        "notice = {'op': 'bye'}\n"
        "if reply['op'] in ('unsubscribed',):\n"
        "    pass\n"
    )
    assert reply_order_copies(path) == [
        "clients.py:1 AFTER_DELIVERIES =",
        "clients.py:1 {'unsubscribed', 'bye'}",
        "clients.py:4 ('unsubscribed',)",
    ]


REQUEST_PARSERS = frozenset({"as_filter", "parse_publication"})
"""How a request's filter or publication is read: a shell parsing one itself decides when
a malformed one is refused (``client_requests.subscribe``, ``advertise`` and
``admit_publication`` do, before anything changes)."""

DURABLE_STEPS = frozenset({"room", "attach", "ack", "unsubscribed"})
"""The durable records' single steps a client's request takes: the process checked room,
subscribed, then attached (and wrote an unacknowledged ack's refusal itself), the
simulator subscribed, then attached (room checked after the subscription was made).
Both now call ``client_requests.subscribe``, ``adopt``, ``unsubscribe`` and
``acknowledge``."""

TABLE_REQUESTS = frozenset({"subscribe", "unsubscribe"})
"""A client table's answers to a request: a shell calling one itself skips the request's
other rules (its parse, a durable record's room, attachment and end)."""

SESSION_REQUESTS = frozenset({"adopt", "advertise"})
"""``octopis.core.sessions``' rules that ``client_requests.adopt`` and ``advertise`` wrap
with the request's other rules (a durable record's room and attachment, the parse)."""

REQUEST_ERRORS = frozenset({"not_kept", "unadvertised"})
"""The error codes of the replies the node's request rules write
(``client_requests.published``, ``refusal``)."""


def request_rule_copies(path: Path) -> list[str]:
    """Every call in ``path`` of :data:`REQUEST_PARSERS`, of :data:`TABLE_REQUESTS` on a
    client table (``sessions``, ``table``), of :data:`DURABLE_STEPS` on durable records
    (an owner whose name holds ``durable``), every import of :data:`SESSION_REQUESTS`
    from ``octopis.core.sessions``, and every dict that writes an ``error`` of
    :data:`REQUEST_ERRORS`: ``file:line name``, by line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "octopis.core.sessions":
            found += [
                (node.lineno, f"import {alias.name}")
                for alias in node.names
                if alias.name in SESSION_REQUESTS
            ]
        if isinstance(node, ast.Dict):
            found += [
                (node.lineno, f"error={value.value}")
                for key, value in zip(node.keys, node.values, strict=True)
                if isinstance(key, ast.Constant)
                and key.value == "error"
                and isinstance(value, ast.Constant)
                and value.value in REQUEST_ERRORS
            ]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in REQUEST_PARSERS:
            found.append((node.lineno, name))
        if not isinstance(func, ast.Attribute):
            continue
        owner = ast.unparse(func.value)
        if name in TABLE_REQUESTS and owner.split(".")[-1] in ("sessions", "table"):
            found.append((node.lineno, f"{owner}.{name}"))
        if name in DURABLE_STEPS and "durable" in owner:
            found.append((node.lineno, f"{owner}.{name}"))
    return [f"{path.name}:{line} {what}" for line, what in sorted(found)]


def test_the_shells_leave_the_client_requests_rules_to_the_node() -> None:
    """Neither shell parses a request's filter or publication, makes a subscription past
    the request's rules, takes a durable record's steps for a request, or writes the
    errors a publication is answered with: :mod:`octopis.core.client_requests` does, for
    both."""
    assert in_shells(request_rule_copies) == []


def test_the_request_rules_check_can_fail(tmp_path: Path) -> None:
    """The process's subscribe, ack and publish answer, and the simulator's subscribers,
    as they were."""
    path = tmp_path / "requests.py"
    path.write_text(
        "def subscribe(self, key, request):\n"
        "    '''as_filter(request.filter) in a docstring is fine'''\n"
        "    subscription = as_filter(request.filter)\n"
        "    def make():\n"
        "        self.router.replaying.durables.room(request.client, request.durable, s)\n"
        "        return self.router.composites.local_subscribe(key, subscription, now)\n"
        "    sub_id, actions = self.table.subscribe(key, request.client, make)\n"
        "    sub_id, actions = self._brokers.nodes[b].sessions.subscribe(c, c, make)\n"
        "    self.durable_records[broker].attach(c.name, NAME, c.key, sub_id, (), now)\n"
        "    if not self.durable_records[host].ack(c.name, NAME, since, now, owed):\n"
        "        refused = {'op': 'error', 'message': m, 'error': 'not_kept'}\n"
        "    p = parse_publication(text) if isinstance(text, str) else text\n"
        "    return self.core.subscribe(key, subscription, now), self.rules.subscribe(t)\n"
        "from octopis.core.sessions import adopt, advertise, order_move\n"
        "actions = sessions.unsubscribe(c, c, sub_id, core.unsubscribe)\n"
        "self.table.withdraw(key, sub_id, unsubscribe)\n"
    )
    assert request_rule_copies(path) == [
        "requests.py:3 as_filter",
        "requests.py:5 self.router.replaying.durables.room",
        "requests.py:7 self.table.subscribe",
        "requests.py:8 self._brokers.nodes[b].sessions.subscribe",
        "requests.py:9 self.durable_records[broker].attach",
        "requests.py:10 self.durable_records[host].ack",
        "requests.py:11 error=not_kept",
        "requests.py:12 parse_publication",
        "requests.py:14 import adopt",
        "requests.py:14 import advertise",
        "requests.py:15 sessions.unsubscribe",
    ]
