"""The documentation: the README's tour and every example of Getting started run as
written (read from the pages, not copied here), the site builds with ``mkdocs build
--strict``, and no user-facing text names an issue."""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from octopis.cluster.launcher import find_free_base_port
from octopis.settings import every_key
from octopis.topology import PORTS_PER_BROKER

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
BIN = Path(sys.executable).parent
ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w&/])#\d+\b", re.IGNORECASE)
"""An issue named by number: "issue 18", "issues 14 and 16", "#18"."""
QUIET_MKDOCS = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
MKDOCS = "from mkdocs.__main__ import cli; cli()"
"""`mkdocs` as this interpreter runs it (a Python child process, not a server)."""


@dataclass(frozen=True)
class Block:
    """A fenced code block of a Markdown page and the ``##`` section it is in."""

    section: str
    language: str
    code: str


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    blocks: list[Block] = []
    section, fence, language, lines = "", None, "", []
    for line in path.read_text(encoding="utf-8").splitlines():
        if fence is None:
            if line.startswith("## "):
                section = line[3:].strip()
            elif line.startswith("```"):
                fence, language, lines = "```", line[3:].strip(), []
        elif line.startswith(fence):
            blocks.append(Block(section, language, "\n".join(lines) + "\n"))
            fence = None
        else:
            lines.append(line)
    assert fence is None, f"{path.name}: a fenced block is not closed"
    return blocks


def on_free_ports(script: str, base_port: int, monitor_port: int | None = None) -> str:
    """``script`` with its topology built on ``base_port`` and its monitor (if any) on
    ``monitor_port``: the one change the tests make to a page's commands."""
    lines = script.splitlines()
    builds = [i for i, line in enumerate(lines) if line.startswith("octopis-topology build ")]
    assert len(builds) == 1, "the page should build exactly one topology"
    lines[builds[0]] += f" --base-port {base_port}"
    text = "\n".join(lines) + "\n"
    if monitor_port is not None:
        assert text.count("octopis monitor") == 1 and "127.0.0.1:8700" in text
        text = text.replace("octopis monitor", f"octopis monitor --port {monitor_port}")
        text = text.replace("127.0.0.1:8700", f"127.0.0.1:{monitor_port}")
    return text


def shell(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``script`` with bash, stopping at the first failing command, with the
    environment's programs (``octopis``, ``octopis-topology``) first on the PATH."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def stop_overlay(cwd: Path) -> None:
    """``octopis down`` if a page left its overlay running (a failed step)."""
    if (cwd / ".octopis" / "cluster.json").exists():
        shell("octopis down", cwd, timeout=60)


def test_readme_is_a_short_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    first = fenced_blocks(README)[0]
    assert first.language == "bash"
    commands = first.code.splitlines()
    assert commands[0].startswith("bash .ci/setup && .venv/bin/octopis run --preset paper75 ")
    assert commands[1] == "bash .ci/setup && .venv/bin/python -m pytest"
    assert "docs/monitor.png" in text and (ROOT / "docs" / "monitor.png").is_file()


@pytest.mark.processes
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    """The tour's commands, as the README has them, in a fresh directory with the
    default run directory; only the ports are free ones."""
    tour = [b for b in fenced_blocks(README) if b.section == "A five-minute tour"]
    assert [b.language for b in tour] == ["bash"]
    for command in ("octopis up", "octopis sub", "octopis pub", "octopis status", "octopis down"):
        assert command in tour[0].code
    base = find_free_base_port(19)
    script = on_free_ports(tour[0].code, base, monitor_port=base + 18 * PORTS_PER_BROKER)
    try:
        done = shell(script, tmp_path, timeout=240)
    finally:
        stop_overlay(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "18 brokers of fig2 up" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"[a-f]:[0-2] ", line)]
    assert len(rows) == 18 and all(row[2] == "yes" for row in rows), done.stdout
    lines = [json.loads(line) for line in (tmp_path / "quotes.jsonl").read_text().splitlines()]
    assert "subscribed" in lines[0]
    assert [n["publication"]["symbol"] for n in lines[1:]] == ["AAPL"]
    snapshot = (tmp_path / "snapshot.json").read_text()
    json.loads(snapshot)
    assert all(f'"{row[0]}"' in snapshot for row in rows), snapshot
    assert "stopped 18 brokers" in done.stdout
    assert not (tmp_path / ".octopis" / "cluster.json").exists()


@pytest.mark.processes
def test_every_example_of_getting_started_runs(tmp_path: Path) -> None:
    """Each fenced block of Getting started, in order, in one fresh directory: shell
    blocks with bash, Python blocks with this interpreter. The Install section's block
    (`.ci/setup`, which CI itself runs) is the one left out."""
    blocks = fenced_blocks(GETTING_STARTED)
    install = [b for b in blocks if b.section == "Install"]
    assert len(install) == 1 and "bash .ci/setup" in install[0].code
    examples = [b for b in blocks if b.section != "Install"]
    assert {b.language for b in examples} == {"bash", "python"}
    assert sum(b.language == "python" for b in examples) >= 2
    base = find_free_base_port(18)
    try:
        for block in examples:
            if block.language == "bash":
                code = block.code
                if "octopis-topology build" in code:
                    code = on_free_ports(code, base)
                done = shell(code, tmp_path, timeout=180)
            else:
                done = run_python(block.code, tmp_path)
                assert done.stdout.strip(), f"the example printed nothing:\n{block.code}"
                pasted = run_python(block.code, tmp_path, interactive=True)
                assert "Traceback" not in pasted.stderr and "Error" not in pasted.stderr, (
                    f"pasted into the prompt:\n{block.code}\n{pasted.stderr}"
                )
                assert pasted.stdout.count("\n") == done.stdout.count("\n"), pasted.stdout
            assert done.returncode == 0, f"{block.code}\n{done.stdout}{done.stderr}"
    finally:
        stop_overlay(tmp_path)
    assert not (tmp_path / ".octopis" / "cluster.json").exists()


def run_python(code: str, cwd: Path, *, interactive: bool = False) -> subprocess.CompletedProcess:
    """``code`` run as a program (``python -c``), or pasted line by line into Python's
    interactive prompt (``python -i``: a compound statement ends at a blank line, so a
    blank line inside a function breaks it there)."""
    command = [sys.executable, "-q", "-i"] if interactive else [sys.executable, "-c", code]
    return subprocess.run(
        command,
        input=code if interactive else None,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from subcommands(child)


def program_parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from octopis.cli.broker import build_parser as broker_parser
    from octopis.cli.main import build_parser as octopis_parser
    from octopis.cli.topology import build_parser as topology_parser

    return {
        "octopis": octopis_parser,
        "octopis-topology": topology_parser,
        "octopis-broker": broker_parser,
    }


def test_no_user_facing_text_names_an_issue() -> None:
    pages = [README, ROOT / "CHANGELOG.md", ROOT / "bench" / "RESULTS.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in pages
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE.search(line)
    ]
    for build in program_parsers().values():
        for parser in subcommands(build()):
            help_text = parser.format_help()
            found += [f"{parser.prog} --help: {m.group()}" for m in ISSUE.finditer(help_text)]
    assert not found, "\n".join(found)


def test_the_issue_pattern_finds_issue_numbers() -> None:
    for text in ("see issue 18", "Issues 14 and 16", "fixed in #18", "(issue #7)"):
        assert ISSUE.search(text), text
    for text in ("c:0#<epoch>.1", "&#8212;", "docs/x.md#failures", "fig2, 18 brokers"):
        assert not ISSUE.search(text), text


def page_text(path: Path) -> str:
    """The text of a built page's article, tags dropped."""
    page = path.read_text(encoding="utf-8")
    article = page[page.index("<article") : page.index("</article>")]
    return html.unescape(re.sub(r"<[^>]+>", "", article))


PAGE_COLUMNS = 80
"""Characters of a code block's line that the page's column shows without a scrollbar:
Material's content column holds 656 px of code at 8.18 px a character at any window
width from 1,220 px up (measured in Chromium), and more below that."""
LINK = re.compile(r'(?:href|src)="([^"#?]*)[^"]*"')
OUTSIDE_PATH = re.compile(r"(?<![\w/.])\.\./[\w./-]+|/work/|/home/")
"""A path that leaves the repository (relative paths in the docs are the repository
root's) or names a machine's own directories."""
CITED = re.compile(r'<a href="([^"]*)architecture/#design-(\d+)">§(\d+)</a>')


def reads_the_site(test: Callable) -> Callable:
    """A test of the built site: marked ``site`` (the build is a process of its own, the
    quick tier's longest step, so the quick tier leaves these out) and in one xdist group,
    so that the tests share one worker and the site is built once."""
    return pytest.mark.site(pytest.mark.xdist_group("site")(test))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `mkdocs build --strict` builds it: a broken link, a missing page or a
    docstring the API reference cannot render fails the build."""
    site = tmp_path_factory.mktemp("docs") / "site"
    built = subprocess.run(
        [sys.executable, "-c", MKDOCS, "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, **QUIET_MKDOCS},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return site


def pages(site: Path) -> list[Path]:
    return sorted(site.rglob("index.html"))


@reads_the_site
def test_the_site_builds_strictly(site: Path) -> None:
    """The generated references hold every command and every setting, the sitemap lists
    every page under the site's URL, and no page of the built site names an issue."""
    for program, build in program_parsers().items():
        text = page_text(site / "reference" / "cli" / program / "index.html")
        for parser in subcommands(build()):
            assert f"usage: {parser.prog}" in text, parser.prog
    text = page_text(site / "reference" / "settings" / "index.html")
    for section, key in every_key():
        assert f"[{section}]" in text and key in text, (section, key)
    for preset in ("fig2", "paper75"):
        assert (site / "figures" / f"{preset}.svg").stat().st_size > 1000
    named = [
        f"{page.relative_to(site)}: {m.group()}"
        for page in pages(site)
        for m in ISSUE.finditer(page_text(page))
    ]
    assert not named, "\n".join(named)
    sitemap = (site / "sitemap.xml").read_text(encoding="utf-8")
    listed = re.findall(r"<loc>([^<]+)</loc>", sitemap)
    assert len(listed) == len(pages(site))
    assert all(url.startswith(("http://", "https://")) for url in listed), listed[:3]


@reads_the_site
def test_no_link_or_path_leaves_the_site(site: Path) -> None:
    """Every relative link and image of every page resolves to a file of the site, and no
    page's text names a path outside the repository (such as ``../shared/...``)."""
    checked, broken, outside = 0, [], []
    for page in pages(site):
        html_text = page.read_text(encoding="utf-8")
        for target in LINK.findall(html_text):
            if not target or re.match(r"[a-z]+:", target):  # an anchor, or another site
                continue
            checked += 1
            resolved = (page.parent / target).resolve()
            if not resolved.is_relative_to(site.resolve()):
                broken.append(f"{page.relative_to(site)}: {target} leaves the site")
            elif not (resolved.is_file() or (resolved / "index.html").is_file()):
                broken.append(f"{page.relative_to(site)}: {target} is missing")
        outside += [
            f"{page.relative_to(site)}: {m.group()}" for m in OUTSIDE_PATH.finditer(page_text(page))
        ]
    assert checked > 1000 and not broken, "\n".join(broken)
    assert not outside, "\n".join(outside)
    print(f"{checked} links of {len(pages(site))} pages checked")


@reads_the_site
def test_every_design_citation_links_to_the_architecture_page(site: Path) -> None:
    """Each "DESIGN §N" the pages show (docstrings cite the architecture page so) is a
    link to section N of the architecture page, and that section exists."""
    architecture = (site / "architecture" / "index.html").read_text(encoding="utf-8")
    sections = set(re.findall(r'id="design-(\d+)"', architecture))
    assert sections >= {str(n) for n in range(1, 13)}, sections
    linked, bare = 0, []
    for page in pages(site):
        html_text = page.read_text(encoding="utf-8")
        for prefix, target, shown in CITED.findall(html_text):
            assert target == shown and target in sections, (page, target, shown)
            assert (page.parent / prefix / "architecture" / "index.html").resolve().is_file()
            linked += 1
        article = html.unescape(re.sub(r"<[^>]+>", "", CITED.sub("", html_text)))
        bare += [
            f"{page.relative_to(site)}: {m.group()}" for m in re.finditer(r"DESIGN §\d+", article)
        ]
    assert linked >= 20 and not bare, "\n".join(bare)


@reads_the_site
def test_no_code_block_is_wider_than_the_page(site: Path) -> None:
    """No line of a code block (command help, examples, signatures, benchmark commands)
    is wider than :data:`PAGE_COLUMNS`, so none scrolls sideways."""
    blocks, wide = 0, []
    for page in pages(site):
        for block in re.findall(r"<pre[^>]*>(.*?)</pre>", page.read_text(encoding="utf-8"), re.S):
            blocks += 1
            for line in html.unescape(re.sub(r"<[^>]+>", "", block)).splitlines():
                if len(line) > PAGE_COLUMNS:
                    wide.append(f"{page.relative_to(site)} [{len(line)}]: {line}")
    assert blocks > 100 and not wide, "\n".join(wide)
