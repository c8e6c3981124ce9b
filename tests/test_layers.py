"""The import rule of DESIGN §2: every layer imports only the layers below it.

Each module of ``octopis`` is read as source (AST, every ``import`` anywhere in the file,
function-local ones included) and its imports are checked against :data:`ALLOWED`; a
second check imports the SDK, the core and the simulator in fresh interpreters and looks
at what they pulled in. A check of the checker shows it fails on a forbidden import.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "octopis"

BASE = {"octopis.filters", "octopis._match", "octopis.matching"}
POLICY = {"octopis.defaults", "octopis.client_policy"}
"""Defaults read by several layers, and the client policy the SDK, the durable records
(and the STOMP gateway's durable subscriptions) and the simulator's clients share
(DESIGN §2)."""
ALLOWED: dict[str, set[str]] = {
    "octopis": set(),
    "octopis.filters": set(),
    "octopis.filters.language": {"octopis.filters.limits"},
    "octopis.filters.composite": {"octopis.filters.language"},
    "octopis.filters.covering": {"octopis.filters.language"},
    "octopis.wire": set(),
    "octopis.defaults": set(),
    "octopis.client_policy": {"octopis.defaults"},
    "octopis.topology_factors": set(),
    "octopis.topology": {"octopis.topology_factors"},
    "octopis.topology_change": {"octopis.topology"},
    "octopis.failure_schedule": set(),
    "octopis.keys": set(),
    "octopis.overlay": {"octopis.topology", "octopis.keys"},
    "octopis.logs": set(),
    "octopis._match": {"octopis.filters.language"},
    "octopis.matching": BASE,
    "octopis.quotes": BASE,
    "octopis.shapes": BASE,
    "octopis.accounting": BASE,
    "octopis.workload": {*BASE, "octopis.quotes", "octopis.topology", "octopis.workload"},
    "octopis.core": {*BASE, *POLICY, "octopis.core", "octopis.wire"},
    "octopis.settings": {*BASE, *POLICY, "octopis.core"},
    "octopis.sim": {
        *BASE,
        *POLICY,
        "octopis.core",
        "octopis.sim",
        "octopis.accounting",
        "octopis.topology",
        "octopis.workload",
        "octopis.failure_schedule",
        "octopis.balance",
        "octopis.topology_change",
        "octopis.wire",
    },
    "octopis.nemesis": {
        *BASE,
        *POLICY,
        "octopis.core",
        "octopis.sim",
        "octopis.nemesis",
        "octopis.failure_schedule",
        "octopis.topology",
    },
    "octopis.transport": {
        *BASE,
        *POLICY,
        "octopis.core",
        "octopis.transport",
        "octopis.settings",
        "octopis.topology",
        "octopis.topology_change",
        "octopis.wire",
        "octopis.keys",
        "octopis.logs",
    },
    "octopis.gateway": {
        *BASE,
        *POLICY,
        "octopis.gateway",
        "octopis.core",
        "octopis.transport",
        "octopis.settings",
        "octopis.topology",
        "octopis.wire",
        "octopis.keys",
        "octopis.logs",
    },
    "octopis.client": {
        *POLICY,
        "octopis.client",
        "octopis.filters",
        "octopis.wire",
        "octopis.keys",
        "octopis.logs",
        "octopis.overlay",
    },
    "octopis.cluster": {
        *BASE,
        *POLICY,
        "octopis.cluster",
        "octopis.client",
        "octopis.accounting",
        "octopis.topology",
        "octopis.workload",
        "octopis.settings",
        "octopis.wire",
        "octopis.failure_schedule",
        "octopis.keys",
        "octopis.overlay",
        "octopis.balance",
        "octopis.topology_change",
    },
    "octopis.monitor": {"octopis.topology"},
    "octopis.balance": {"octopis.balance", "octopis.topology"},
    "octopis.cli": {"octopis"},
}
"""Module (or package) → the ``octopis`` modules it may import (prefixes). A module that
no entry names more closely than ``octopis`` may import nothing of the package: a new
module has to be placed in a layer here. The core reads the wire's declarations (a peer
frame is one of its events, :mod:`octopis.core.codec`); the wire imports nothing."""

FORBIDDEN_OUTSIDE: dict[str, set[str]] = {
    "octopis.core": {"zmq", "aiozmq", "asyncio", "networkx", "pyarrow", "matplotlib", "time"},
    "octopis.sim": {"zmq", "aiozmq", "asyncio", "pyarrow", "matplotlib"},
    "octopis.nemesis": {"zmq", "aiozmq", "asyncio", "pyarrow", "matplotlib"},
    "octopis.client": {"networkx", "pyarrow", "matplotlib", "aiozmq"},
    "octopis.wire": {"zmq", "networkx", "pyarrow", "matplotlib"},
    "octopis.filters": {"zmq", "networkx", "pyarrow", "matplotlib"},
}
"""Third-party (or clock) modules a layer must not import: the core is sans-IO and reads
no clock, the simulator has no sockets and no parquet, the SDK no broker internals."""


def _rule(module: str, table: dict[str, set[str]]) -> set[str]:
    best = max((p for p in table if module == p or module.startswith(p + ".")), key=len)
    return table[best]


CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import|c?import\s+([\w.]+))", re.M)


def _imports(path: Path, module: str) -> list[str]:
    """Every module ``path`` imports, absolute names (relative imports resolved); a Cython
    file is read line by line, as Python's parser does not take it."""
    if path.suffix == ".pyx":
        return [a or b for a, b in CYTHON_IMPORT.findall(path.read_text(encoding="utf-8"))]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join([*parent, base]) if base else ".".join(parent)
            found.append(base)
    return found


def violations(path: Path, module: str) -> list[str]:
    """The imports of ``module`` (at ``path``) that break the layering rule."""
    allowed = _rule(module, ALLOWED)
    forbidden = next(
        (v for p, v in FORBIDDEN_OUTSIDE.items() if module == p or module.startswith(p + ".")),
        set(),
    )
    own = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    bad = []
    for name in _imports(path, module):
        if name.startswith("octopis"):
            if name == own or any(name == a or name.startswith(a + ".") for a in allowed):
                continue
            bad.append(f"{module} imports {name}")
        elif name.split(".")[0] in forbidden:
            bad.append(f"{module} imports {name}")
    return bad


def _modules() -> list[tuple[Path, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((path, ".".join(parts)))
    pyx = PACKAGE / "_match.pyx"
    out.append((pyx, "octopis._match"))
    return out


def test_every_module_imports_only_downward() -> None:
    modules = _modules()
    assert len(modules) > 30, "the checker found too few modules to be looking at octopis/"
    problems = [v for path, module in modules for v in violations(path, module)]
    assert problems == []


def import_edges(modules: list[tuple[Path, str]]) -> dict[str, set[str]]:
    """Module → the modules of ``modules`` it imports (every ``import``, those under
    ``TYPE_CHECKING`` and in functions included; ``from pkg import mod`` names ``mod``).
    A package's ``__init__`` is its face, not a room of its own: importing a name from it
    is no edge, so the graph is the one ``farm-studio look`` draws."""
    packages = {m for path, m in modules if path.name == "__init__.py"}
    rooms = {m for path, m in modules if path.suffix == ".py"} - packages
    edges: dict[str, set[str]] = {}
    for path, module in modules:
        if module not in rooms:
            continue
        found = edges.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names} & rooms
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = module.split(".")[: -node.level]
                    base = ".".join([*parent, base]) if base else ".".join(parent)
                found |= ({base} | {f"{base}.{a.name}" for a in node.names}) & rooms
        found.discard(module)
    return edges


def import_circles(modules: list[tuple[Path, str]]) -> list[list[str]]:
    """The import circles among ``modules``: each a sorted list of the modules whose
    imports lead back to one another (strongly connected, more than one module)."""
    graph = nx.DiGraph(import_edges(modules))
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_no_module_imports_itself_in_a_circle() -> None:
    """DESIGN §2: the layers are a stack, and inside a layer the modules are one too; a
    type named only for checking counts, as it ties the two rooms just the same."""
    assert import_circles(_modules()) == []


def test_the_circle_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg.a import A\n")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\nA = 1\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    )
    (tmp_path / "pkg" / "c.py").write_text("from pkg import A\n")
    modules = [
        (tmp_path / "pkg" / "__init__.py", "pkg"),
        *((tmp_path / "pkg" / f"{m}.py", f"pkg.{m}") for m in "abc"),
    ]
    assert import_circles(modules) == [["pkg.a", "pkg.b"]]


@pytest.mark.parametrize(
    ("module", "source", "problem"),
    [
        ("octopis.core.clustered", "from octopis.topology import Scot\n", "octopis.topology"),
        ("octopis.core.table", "import zmq\n", "zmq"),
        ("octopis.core.lst", "def f():\n    import time\n", "time"),
        ("octopis.client", "from octopis.transport.frames import KIND\n", "transport"),
        ("octopis.sim.engine", "import pyarrow.parquet as pq\n", "pyarrow"),
        ("octopis.transport.peers", "from octopis.cluster import launcher\n", "cluster"),
        ("octopis.core.bid", "from ..sim import engine\n", "octopis.sim"),
        ("octopis.filters.limits", "from .language import FilterError\n", "language"),
        ("octopis.filters.covering", "from octopis.filters.composite import Var\n", "composite"),
    ],
)
def test_the_checker_catches_a_forbidden_import(
    tmp_path: Path, module: str, source: str, problem: str
) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    found = violations(path, module)
    assert len(found) == 1 and problem in found[0]


HEAVY = ("networkx", "pyarrow", "matplotlib", "octopis._match", "zmq", "octopis.topology")


def _loaded(module: str) -> set[str]:
    code = (
        f"import json, sys; import {module}; "
        f"print(json.dumps(sorted({{m for m in sys.modules if m.split('.')[0] in "
        f"('networkx', 'pyarrow', 'matplotlib', 'zmq')}} | "
        f"({{'octopis._match'}} & set(sys.modules)) | "
        f"({{'octopis.topology'}} & set(sys.modules)))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return {m.split(".")[0] if not m.startswith("octopis") else m for m in json.loads(out.stdout)}


@pytest.mark.parametrize(
    ("module", "must_not_load"),
    [
        ("octopis.client", {"networkx", "pyarrow", "matplotlib", "octopis._match"}),
        ("octopis.wire", {"networkx", "pyarrow", "matplotlib", "octopis._match", "zmq"}),
        ("octopis.core", {"networkx", "pyarrow", "matplotlib", "zmq", "octopis.topology"}),
        ("octopis.sim", {"pyarrow", "matplotlib", "zmq"}),
        # A broker process reads its topology file without a graph library (its start).
        ("octopis.cli.broker", {"networkx", "pyarrow", "matplotlib"}),
        ("octopis.transport.serving", {"networkx", "pyarrow", "matplotlib"}),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(module: str, must_not_load: set[str]) -> None:
    assert _loaded(module) & must_not_load == set()


def test_the_runtime_check_sees_what_a_module_loads() -> None:
    assert {"networkx", "octopis.topology"} <= _loaded("octopis.cli.topology")
