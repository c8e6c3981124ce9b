"""The client policy's rules that the SDK and the simulator's subscribers both drive
(DESIGN §2: "the sans-IO client policy (fail-over order, replay start, last-seen record,
seam) used by the SDK and the simulator alike"), and the check, read from their AST as
``test_layers.py`` reads the shells, that neither puts one together again from its
parts. The rules themselves are tested in ``test_client_policy.py``."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from types import SimpleNamespace

from test_layers import PACKAGE

from octopis.client import Subscriber
from octopis.client_policy import RecentDeliveries
from octopis.filters.language import parse_subscription
from octopis.wire.client import ReplayRequest

CLIENTS = ("client", "sim", "gateway")
"""The drivers of the client policy (DESIGN §2): the SDK, the simulator and the STOMP
gateway's durable subscriptions (which make the SDK's durable requests)."""

CLIENT_RULE_PARTS = frozenset(
    {
        "claim_gap",
        "resume_from",
        "replay_after",
        "owed_after_failover",
        "ReplayGaps",
        "still_silent",
        "awaiting_late",
        "LATE_KEPT",
        "LATE_WAITING",
    }
)
"""Parts of client rules the SDK, the simulator and the STOMP gateway each once put
together: a durable claim's answer (its gap, the copy to resume from, where the record
then owes from; now ``DurableProgress.claim_answered``), a fail-over's replay and the
start its durables' records owe from (``SubscriberReplays.failed_over``), and a replay's
late answers (its silent brokers, what was delivered since; ``LateAnswers``)."""


def client_rule_copies(path: Path) -> list[str]:
    """Every name of :data:`CLIENT_RULE_PARTS` in ``path``'s code, and every class
    ``Seam`` of no base (the client policy's ``Seam`` is the one seam): ``file:line
    name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if name in CLIENT_RULE_PARTS:
            found.append(f"{path.name}:{node.lineno} {name}")
        if isinstance(node, ast.alias) and node.name in CLIENT_RULE_PARTS:
            found.append(f"{path.name}:{node.lineno} import {node.name}")
        if isinstance(node, ast.ClassDef) and node.name == "Seam" and not node.bases:
            found.append(f"{path.name}:{node.lineno} class Seam")
    return found


def test_the_sdk_the_simulator_and_the_gateway_keep_no_copy_of_the_client_policy() -> None:
    """client/, sim/ and gateway/ drive the client policy's claim answer, fail-over
    replay, seam and late answers, and put none of them together from its parts (read
    from the AST)."""
    assert [
        hit
        for driver in CLIENTS
        for path in sorted((PACKAGE / driver).glob("*.py"))
        for hit in client_rule_copies(path)
    ] == []


def test_the_client_policy_copies_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "client.py"
    path.write_text(
        "from octopis.client_policy import claim_gap, Seam as PolicySeam\n"
        "@dataclass\n"
        "class Seam:\n"
        "    req_id: str\n"
        "class Held(PolicySeam):\n"
        "    pass\n"
        "why = policy.claim_gap(found, silent)\n"
        "after = replay_after(first, silent)\n"
        "self.awaiting_late.append(record)\n"
    )
    assert sorted(client_rule_copies(path)) == [
        "client.py:1 import claim_gap",
        "client.py:3 class Seam",
        "client.py:7 claim_gap",
        "client.py:8 replay_after",
        "client.py:9 awaiting_late",
    ]


def test_the_copies_check_fails_on_a_gateway_that_resumes_a_claim_itself(tmp_path: Path) -> None:
    """The STOMP gateway's durable subscription as it was: it resumed from the claimed
    copies itself instead of asking ``DurableProgress.claim_answered``."""
    path = tmp_path / "durable.py"
    path.write_text(
        "from octopis.client_policy import LastSeen, resume_from\n"
        "def claim_done(self, notice, req):\n"
        "    _, since, self.after = resume_from(self.found)\n"
        "    self.taken.saw_all(since)\n"
    )
    assert client_rule_copies(path) == [
        "durable.py:1 import resume_from",
        "durable.py:3 resume_from",
    ]


def test_the_sdk_asks_its_failovers_replay_from_the_policy_once() -> None:
    """At a fail-over the SDK's subscriber takes its replay's ``since`` and start from
    ``SubscriberReplays.failed_over`` (the start its durables' records owe from) and
    asks exactly that: the from-points are read once, not again for the request."""
    connection = SimpleNamespace(
        group=RecentDeliveries(),
        silent_since=100.0,
        register=lambda *a: None,
        on_notice=lambda *a: None,
        on_failover=lambda *a: None,
        on_dropped=lambda *a: None,
    )
    sub = Subscriber("s", connection)  # type: ignore[arg-type]
    sub._subscriptions["s#1"] = parse_subscription("[x,<,3]")
    sub.replaying.subscribed(10.0)
    for seq, at in ((1, 50.0), (2, 99.0)):
        sub.replaying.delivered("P", 0, seq, at)
    read: list[float] = []
    since = sub.replaying.last_seen.since
    sub.replaying.last_seen.since = lambda silent: read.append(silent) or since(silent)  # type: ignore[method-assign]
    asked: list[ReplayRequest] = []

    async def resubscribe() -> None:
        pass

    async def replayed(seam: object, message: ReplayRequest, timeout: float) -> tuple:
        asked.append(message)
        return None, None

    sub.resubscribe = resubscribe  # type: ignore[method-assign]
    sub.past.replayed = replayed  # type: ignore[method-assign]
    asyncio.run(sub._resume_after_failover(connection))  # type: ignore[arg-type]
    assert read == [100.0]
    assert [(m.since, m.after) for m in asked] == [([("P", 0, 1)], 70.0)]
