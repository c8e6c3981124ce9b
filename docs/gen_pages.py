"""Pages of the documentation made at build time (mkdocs-gen-files), each from its one
source of truth:

- ``reference/cli/<program>.md``: the ``--help`` of every command and subcommand, from
  the argparse parsers the programs themselves use;
- ``reference/settings.md``: every broker setting with its default and meaning, from the
  settings types of ``octopis.settings`` (one per section) and their fields' docstrings;
- ``figures/<preset>.svg``: the shipped topologies drawn by ``octopis-topology draw``;
- ``benchmarks.md`` and ``changelog.md``: ``bench/RESULTS.md`` (with the plots it shows)
  and ``CHANGELOG.md``.

Run by ``mkdocs build``; nothing here is written into the repository.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import os
import re
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import mkdocs_gen_files
import msgspec

ROOT = Path(__file__).resolve().parent.parent
HELP_COLUMNS = "82"
"""argparse wraps help to the terminal's width: a fixed one keeps the pages stable."""


def subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand under it, depth first, in the order registered."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from subcommands(child)


def cli_page(program: str, build: Callable[[], argparse.ArgumentParser], summary: str) -> str:
    """A page with the help of ``program`` and of each of its subcommands."""
    lines = [
        f"# {program}",
        "",
        summary,
        "",
        "Each section is the command's own `--help`, as the installed program prints it.",
        "",
    ]
    for parser in subcommands(build()):
        lines += [f"## `{parser.prog}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def write_cli_pages() -> None:
    from octopis.cli.broker import build_parser as broker_parser
    from octopis.cli.main import build_parser as octopis_parser
    from octopis.cli.topology import build_parser as topology_parser

    programs = {
        "octopis": (
            octopis_parser,
            "Runs overlays and workloads: the simulator, broker processes, the shell clients, "
            "the balancer and the monitor.",
        ),
        "octopis-topology": (
            topology_parser,
            "Builds, shows, draws and changes topology files, and makes a deployment's keys "
            "and systemd units.",
        ),
        "octopis-broker": (
            broker_parser,
            "Runs one broker process; `octopis up` and the systemd units start brokers with it.",
        ),
    }
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        for program, (build, summary) in programs.items():
            with mkdocs_gen_files.open(f"reference/cli/{program}.md", "w") as page:
                page.write(cli_page(program, build, summary))
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def attribute_docstrings(cls: type) -> dict[str, str]:
    """The docstring written under each annotated attribute of ``cls``'s body and of its
    bases' (a field a class declares again takes its own)."""
    docs: dict[str, str] = {}
    for owner in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(owner)))
        except (OSError, TypeError):  # a base without source of its own (msgspec.Struct)
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def markdown_of_docstring(text: str) -> str:
    """A field docstring as one Markdown table cell (reST literals and roles as code)."""
    text = re.sub(r":(?:class|attr|data|func|mod|meth):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`").replace("\n", " ").replace("|", "\\|")


def value_kind(kind: msgspec.inspect.Type) -> str:
    """What a key of msgspec type ``kind`` takes, as the settings page says it."""
    if isinstance(kind, msgspec.inspect.LiteralType):
        return "one of " + ", ".join(f'`"{word}"`' for word in kind.values)
    name = "integer" if isinstance(kind, msgspec.inspect.IntType) else "number"
    return f"{name} ≥ {kind.ge:g}"  # type: ignore[attr-defined]


def settings_page() -> str:
    """Every ``[section] key`` a settings file may hold, with its default and meaning: the
    fields of the section's settings type, their defaults, annotations and docstrings."""
    from octopis import settings

    sections = msgspec.inspect.type_info(settings.BrokerSettings).fields  # type: ignore[attr-defined]
    defaults = settings.BrokerSettings()
    example = defaults.lst
    lines = [
        "# Broker settings",
        "",
        "A broker reads its settings from a TOML file: `octopis up --config FILE`, "
        "`octopis run --config FILE` or `octopis-broker --config FILE`. Every key may be "
        "left out; a key or table the broker does not know, or a value out of range, is "
        "refused with its name. This page is generated from the settings types "
        "themselves (`octopis.settings`): one per section, whose fields are its keys.",
        "",
        "```toml",
        "[lst]",
        f"window = {example.window!r}",
        f"queue_threshold = {example.queue_threshold!r}",
        "",
        "[links.capacities]   # messages/s on single directed links",
        '"b:2>b:0" = 200',
        "```",
        "",
    ]
    for section in sections:
        owner = section.type.cls
        meanings = attribute_docstrings(owner)
        rows, tables = [], []
        for key in section.type.fields:
            if key.name not in meanings:
                raise ValueError(
                    f"settings key {section.name}.{key.name} has no meaning: write a "
                    f"docstring under its field in {owner.__name__}"
                )
            meaning = markdown_of_docstring(meanings[key.name])
            if isinstance(key.type, msgspec.inspect.DictType):
                tables += [f"### `[{section.name}.{key.name}]`", "", meaning, ""]
                continue
            default = getattr(getattr(defaults, section.name), key.name)
            shown = f'`"{default}"`' if isinstance(default, str) else f"`{default!r}`"
            kind = value_kind(settings.key_type(section.name, key.name))
            rows.append(f"| `{key.name}` | {shown} | {kind} | {meaning} |")
        lines += [
            f"## `[{section.name}]`",
            "",
            "| key | default | value | meaning |",
            "|---|---|---|---|",
            *rows,
            "",
            *tables,
        ]
    return "\n".join(lines)


def write_settings_page() -> None:
    with mkdocs_gen_files.open("reference/settings.md", "w") as page:
        page.write(settings_page())


def write_figures() -> None:
    """The shipped topologies as `octopis-topology draw` draws them."""
    from octopis.cli.topology import draw_topology
    from octopis.topology import build_preset, preset_names

    with tempfile.TemporaryDirectory() as tmp:
        for preset in preset_names():
            picture = Path(tmp) / f"{preset}.svg"
            draw_topology(build_preset(preset), picture)
            with mkdocs_gen_files.open(f"figures/{preset}.svg", "wb") as out:
                out.write(picture.read_bytes())


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def write_copied_pages() -> None:
    """``bench/RESULTS.md`` (and each plot it shows) and ``CHANGELOG.md`` as pages."""
    results = ROOT / "bench" / "RESULTS.md"
    text = results.read_text(encoding="utf-8")
    with mkdocs_gen_files.open("benchmarks.md", "w") as page:
        page.write(text)
    for target in IMAGE.findall(text):
        with mkdocs_gen_files.open(target, "wb") as out:
            out.write((results.parent / target).read_bytes())
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    with mkdocs_gen_files.open("changelog.md", "w") as page:
        page.write(changelog.replace("](bench/RESULTS.md)", "](benchmarks.md)"))


write_cli_pages()
write_settings_page()
write_figures()
write_copied_pages()
