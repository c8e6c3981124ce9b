"""Rooms with one job (CONTRIBUTING, DESIGN §2): no module of ``octopis`` above
:data:`MODULE_LINES` lines, no class above :data:`CLASS_LINES`. Python is measured from
its AST; a Cython file (``.pyx``, ``.pxi``) by indentation, a class running from its
``class``/``cdef class`` line to the next line at column 0. A check of the checker shows
each measure can fail."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "octopis"
MODULE_LINES = 700
CLASS_LINES = 400

BEING_SPLIT: frozenset[str] = frozenset()
"""Modules (path under ``octopis/``) and classes (``path::Class``) over a limit today
that others are splitting; the test fails for any other, and for an entry here that is
no longer over (so the set only shrinks)."""

_CYTHON_CLASS = re.compile(r"^(?:cdef\s+)?class\s+(\w+)")


def _sources() -> list[Path]:
    return sorted(p for ext in ("py", "pyx", "pxi") for p in PACKAGE.rglob(f"*.{ext}"))


def class_sizes(path: Path) -> dict[str, int]:
    """Each top-level or nested class of ``path`` → its length in lines."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return {
            node.name: node.end_lineno - node.lineno + 1
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None
        }
    sizes: dict[str, int] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if found := _CYTHON_CLASS.match(line):
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j][:1] not in ("", " ", "#")),
                len(lines),
            )
            while lines[end - 1].strip() == "":
                end -= 1
            sizes[found.group(1)] = end - i
    return sizes


def oversized(paths: list[Path]) -> dict[str, int]:
    """Every module over :data:`MODULE_LINES` and class over :data:`CLASS_LINES` among
    ``paths``: its name (as in :data:`BEING_SPLIT`) → its lines."""
    found = {}
    for path in paths:
        name = path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else path.name
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MODULE_LINES:
            found[name] = lines
        for cls, size in class_sizes(path).items():
            if size > CLASS_LINES:
                found[f"{name}::{cls}"] = size
    return found


def test_no_module_or_class_is_too_large() -> None:
    sources = _sources()
    assert len(sources) > 50, "the checker found too few files to be looking at octopis/"
    found = oversized(sources)
    assert {k: v for k, v in found.items() if k not in BEING_SPLIT} == {}
    assert BEING_SPLIT - found.keys() == set(), "split already: take them out of BEING_SPLIT"


def test_the_size_check_can_fail(tmp_path: Path) -> None:
    body = "    x = 1\n" * CLASS_LINES
    long_py = tmp_path / "long.py"
    long_py.write_text("class Big:\n" + body + "\n\nclass Small:\n    y = 2\n")
    long_pyx = tmp_path / "long.pyx"
    long_pyx.write_text(
        "cdef class Big:\n"
        + body
        + "    # a comment\n\n"
        + "y = 2\n" * (MODULE_LINES - CLASS_LINES)
    )
    assert class_sizes(long_py) == {"Big": CLASS_LINES + 1, "Small": 2}
    assert class_sizes(long_pyx) == {"Big": CLASS_LINES + 2}
    assert oversized([long_py, long_pyx]) == {
        "long.py::Big": CLASS_LINES + 1,
        "long.pyx": MODULE_LINES + 3,
        "long.pyx::Big": CLASS_LINES + 2,
    }
