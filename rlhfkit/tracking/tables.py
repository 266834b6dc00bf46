"""Completion tables as text: a rich table for the console and a markdown table for TensorBoard."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def format_cell(value: Any) -> str:
    """Text of one cell: floats with 4 significant digits, everything else as str()."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; pipes are escaped and newlines become <br> so multi-line text stays in its cell."""

    def cell(value: Any) -> str:
        return format_cell(value).replace("|", "\\|").replace("\r\n", "\n").replace("\n", "<br>")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def rich_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]):
    """A rich Table, one line between rows, like TRL's printed completion samples."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=True)
    for column in columns:
        table.add_column(str(column))
    for row in rows:
        # Text, not str: model output such as "[PAD]" must print verbatim, not be parsed as rich markup.
        table.add_row(*(Text(format_cell(v)) for v in row))
    return table
