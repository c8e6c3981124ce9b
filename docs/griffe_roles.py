"""A Griffe extension for the API reference: the docstrings' reST roles
(``:class:`Subscriber```, ``:attr:`~x.gaps```) become Markdown code spans, so they read
as names rather than as role markup, and a paragraph ending in reST's ``::`` before a
literal block ends in ``:`` (the indented block is a code block in Markdown too)."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|attr|data|func|meth|mod|exc|obj):`~?([^`]+)`")
LITERAL = re.compile(r"(?<=\S)::\n\n")


class ReSTRoles(griffe.Extension):
    """Rewrite the roles of every docstring of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._rewrite(pkg, set())

    def _rewrite(self, obj: Any, seen: set[int]) -> None:
        if id(obj) in seen or obj.is_alias:
            return
        seen.add(id(obj))
        if obj.docstring is not None:
            text = ROLE.sub(r"`\1`", obj.docstring.value)
            obj.docstring.value = LITERAL.sub(":\n\n", text)
        for member in obj.members.values():
            self._rewrite(member, seen)
