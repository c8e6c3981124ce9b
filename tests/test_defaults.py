"""Every default once (issue 55, "Settings and defaults once"; DESIGN §2): the defaults
several layers read are defined in ``octopis/defaults.py`` and nowhere else, as NATS
declares its own once (``server/const.go``). Read from the AST: a module that assigns,
at its top level, a name ``defaults.py`` defines restates a default."""

from __future__ import annotations

import ast
from pathlib import Path

from test_layers import PACKAGE

DEFAULTS = PACKAGE / "defaults.py"
CLIENT_DEFAULTS = ("BUFFER", "LATE_KEPT", "LATE_WAITING", "LOOKBACK", "PUBLISHERS_KNOWN")
"""The client policy's defaults the SDK and the simulator's subscribers both read."""


def defined(path: Path) -> dict[str, int]:
    """The names ``path`` assigns at its top level, with their lines."""
    names = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names.update({t.id: node.lineno for t in targets if isinstance(t, ast.Name)})
    return names


def restated(root: Path, defaults: set[str]) -> list[str]:
    """Each top-level assignment under ``root`` (``defaults.py`` aside) of a name of
    ``defaults``: ``file:line name``."""
    return [
        f"{path.relative_to(root)}:{line} {name}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "defaults.py"
        for name, line in defined(path).items()
        if name in defaults
    ]


def test_every_default_is_defined_once_in_defaults() -> None:
    names = set(defined(DEFAULTS))
    assert set(CLIENT_DEFAULTS) <= names
    assert restated(PACKAGE, names) == []


def test_the_defaults_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "defaults.py").write_text("BUFFER = 1\n", encoding="utf-8")
    (tmp_path / "policy.py").write_text("X = 2\nBUFFER: int = 3\n", encoding="utf-8")
    assert restated(tmp_path, set(defined(tmp_path / "defaults.py"))) == ["policy.py:2 BUFFER"]
