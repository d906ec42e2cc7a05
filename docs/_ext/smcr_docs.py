"""Sphinx directives for the tables smcr's code defines once, so the documentation cannot
drift from it:

``smcr-variables``
    Every ``SMCR_*`` variable of :data:`smcr.settings.VARIABLES` (``:group:`` picks one
    group): name, what it allows, what unset means, what it does.
``smcr-exit-status``
    :data:`smcr.cli.EXIT_STATUS`.
``smcr-commands``
    Each sub-command's usage and options, as ``smcr COMMAND -h`` prints them.
"""

from __future__ import annotations

import argparse
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from smcr import settings
from smcr.cli import EXIT_STATUS, build_parser


def _inline(text: str) -> list[nodes.Node]:
    """Text with ``literal`` parts, as docstrings write them."""
    parts = " ".join(text.split()).split("``")
    return [nodes.literal(part, part) if i % 2 else nodes.Text(part)
            for i, part in enumerate(parts) if part]  # fmt: skip


def _table(head: list[str], rows: list[list[str]], widths: list[int]) -> nodes.table:
    """A table of docutils nodes (built here: the pages are Markdown, not reST)."""
    group = nodes.tgroup(cols=len(head))
    group += [nodes.colspec(colwidth=w) for w in widths]

    def row(cells: list[str]) -> nodes.row:
        out = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", *_inline(cell))
            out += entry
        return out

    thead = nodes.thead()
    thead += row(head)
    tbody = nodes.tbody()
    tbody += [row(r) for r in rows]
    group += [thead, tbody]
    table = nodes.table()
    table += group
    return table


class _Table(SphinxDirective):
    """A directive whose body is a table made from code."""

    def table(self) -> nodes.table:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        return [self.table()]


class Variables(_Table):
    option_spec = {"group": directives.unchanged}  # noqa: RUF012 - docutils' interface

    def table(self) -> nodes.table:
        group = self.options.get("group")
        rows = [[f"``{v.name}``", v.allowed, v.default, v.meaning]
                for v in settings.VARIABLES if group in (None, v.group)]
        return _table(["Variable", "Allowed", "Unset", "What it does"], rows, [18, 20, 14, 48])


class ExitStatus(_Table):
    def table(self) -> nodes.table:
        rows = [[f"``{code}``", text] for code, text in EXIT_STATUS.items()]
        return _table(["Status", "Meaning"], rows, [10, 90])


class Commands(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        parser = build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps: dict[str, Any] = {a.dest: a.help for a in sub._choices_actions}
        out: list[nodes.Node] = []
        for name, command in sub.choices.items():
            command.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=88)
            out.append(nodes.rubric("", f"smcr {name}"))
            out.append(nodes.paragraph("", "", *_inline(helps.get(name) or "")))
            text = command.format_help()
            out.append(nodes.literal_block(text, text))
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("smcr-variables", Variables)
    app.add_directive("smcr-exit-status", ExitStatus)
    app.add_directive("smcr-commands", Commands)
    return {"parallel_read_safe": True, "version": "1"}
