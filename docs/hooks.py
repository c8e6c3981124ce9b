"""MkDocs hooks of the site: every "DESIGN §N" a page shows (the docstrings of the SDK,
API and settings references cite the architecture page that way) becomes a link to
section N of the architecture page.

Only text outside tags and outside links is touched, so a citation already written as a
link, or inside an attribute, is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

from mkdocs.utils import get_relative_url

ARCHITECTURE = "architecture.md"
"""The page the citations point to; its sections carry the anchors ``design-N``."""
CITATION = re.compile(r"DESIGN (§\d+(?:[–-]\d+)?(?:, §\d+(?:[–-]\d+)?)*)")
""""DESIGN §7", "DESIGN §2–3", "DESIGN §7, §11"."""
SECTION = re.compile(r"§(\d+)((?:[–-]\d+)?)")
PIECES = re.compile(r"(<[^>]*>)")


def link_citations(html: str, architecture_url: str) -> str:
    """``html`` with each "DESIGN §N" in its text linked to ``architecture_url#design-N``
    (each section of a list, "§2–3" to its first)."""

    def section(match: re.Match[str]) -> str:
        return f'<a href="{architecture_url}#design-{match.group(1)}">{match.group(0)}</a>'

    def citation(match: re.Match[str]) -> str:
        return "DESIGN " + SECTION.sub(section, match.group(1))

    out, depth = [], 0
    for piece in PIECES.split(html):
        if piece.startswith("<"):
            if re.match(r"<a[\s>]", piece):
                depth += 1
            elif piece.startswith("</a"):
                depth = max(0, depth - 1)
            out.append(piece)
        else:
            out.append(piece if depth else CITATION.sub(citation, piece))
    return "".join(out)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Link the page's citations of the architecture page (an MkDocs event)."""
    target = files.get_file_from_path(ARCHITECTURE)
    if target is None:
        raise ValueError(f"the site has no {ARCHITECTURE} for DESIGN §N citations to link to")
    return link_citations(html, get_relative_url(target.url, page.url))
