"""What the shell-rule checks share (tests/test_shell_rules*.py, test_link_rules.py,
test_session_rules.py): the shells' packages, a check run over every module of them, and
the string constants of a module that hold given words, and the attributes a statement
assigns on anything but ``self``."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from test_layers import PACKAGE

SHELLS = ("transport", "sim")


def in_shells(check: Callable[[Path], list[str]]) -> list[str]:
    """What ``check`` finds in every module of the shells."""
    return [
        hit
        for shell in SHELLS
        for path in sorted((PACKAGE / shell).glob("*.py"))
        for hit in check(path)
    ]


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
