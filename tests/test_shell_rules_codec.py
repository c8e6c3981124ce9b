"""The shells keep no copy of the peer codec or of which frames are stale (issue 55, DESIGN
§2): they decode and encode peer bodies through ``octopis.core.codec`` only and let the
node say which bodies it takes; read from the AST, with a check of the checker that shows
it failing."""

from __future__ import annotations

import ast
from pathlib import Path

from shell_checks import in_shells

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
    assert in_shells(codec_copies) == []


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
