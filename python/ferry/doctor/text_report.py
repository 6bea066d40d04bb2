"""The doctor's report as plain text: the sections of report.py, drawn as they are.

Section titles start a line; block headings are indented two spaces and their rows
four, as aligned 'label  value' lines (long values wrap under the value column,
items follow as '- item' lines). A finding starts a line with '[severity] id:
title' (scripts grep for it), then its evidence and its fix. Detail blocks are
left out (the JSON has them).
"""

from __future__ import annotations

import textwrap

from . import report as model_report
from .model import Block, FindingBlock, Row, Section, Table

LINE_WIDTH = 120  # long values wrap under their column
LABEL_WIDTH = (20, 36)  # the label column: at least, at most


def format_report(report: dict) -> str:
    """The whole text report of a doctor report dict."""
    return render(model_report.sections(report))


def render(sections: list[Section]) -> str:
    out: list[str] = []
    for section in sections:
        out.append(section.title)
        if section.intro:
            out += _wrap(section.intro, "  ")
        for block in section.blocks:
            if isinstance(block, FindingBlock):
                out += _finding(block)
            elif not block.detail:
                out += _block(block)
        out.append("")
    return "\n".join(out)


def _wrap(value: str, indent: str, rest: str | None = None) -> list[str]:
    return textwrap.wrap(value, width=LINE_WIDTH, initial_indent=indent,
                         subsequent_indent=indent + "  " if rest is None else rest,
                         break_long_words=False, break_on_hyphens=False) or [indent.rstrip()]


def _finding(f: FindingBlock) -> list[str]:
    lines = ["", *_wrap(f"[{f.severity}] {f.id}: {f.title}", "")]
    for item in f.evidence:
        lines += _wrap(f"- {item}", "    ")
    if f.fix:
        lines += _wrap(f"fix: {f.fix}", "    ")
    return lines


def _block(block: Block) -> list[str]:
    lines, indent = [], "  "
    if block.heading:
        lines.append("  " + block.heading)
        indent = "    "
    if block.text:
        lines += _wrap(block.text, indent)
    if block.rows:
        lines += _rows(block.rows, indent)
    if block.table is not None:
        lines += _table(block.table, indent)
    return lines


def _rows(rows: tuple[Row, ...], indent: str) -> list[str]:
    width = min(max(LABEL_WIDTH[0], *(len(r.label) + 2 for r in rows)), LABEL_WIDTH[1])
    lines = []
    for r in rows:
        prefix = indent + (r.label.ljust(width) if len(r.label) + 2 <= width else r.label + "  ")
        value_column = " " * (len(indent) + width)
        lines += _wrap(r.value, prefix, value_column) if r.value else [prefix.rstrip()]
        for item in r.items:
            lines += _wrap(f"- {item}", value_column, value_column + "  ")
    return lines


def _table(table: Table, indent: str) -> list[str]:
    widths = [max(len(c), *(len(row[i]) for row in table.rows)) if table.rows else len(c)
              for i, c in enumerate(table.columns)]

    def line(cells) -> str:  # figures right-aligned, the first column (what) left-aligned
        return indent + "  ".join(c.rjust(w) if table.numeric and i else c.ljust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(table.columns), *(line(row) for row in table.rows)]
