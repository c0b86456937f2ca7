"""The markdown tables the benchmarks print (and their docs hold): a row's cells by column."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Column = tuple[str, Callable[[Mapping[str, Any]], str]]  # (header, the cell of a row)


def cell(value: float | None, digits: int = 1) -> str:
    """A number with thousands separators, or an em dash where the row has none."""
    return "—" if value is None else f"{value:,.{digits}f}"


def calls(row: Mapping[str, Any]) -> str:
    """The calls a row made, with its errors where there were any."""
    return f"{row['requests']}" + (f" ({row['errors']} errors)" if row["errors"] else "")


def markdown(columns: Sequence[Column], rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a markdown table, the first column left-aligned and the numbers right-aligned."""
    header = "| " + " | ".join(name for name, _ in columns) + " |"
    rule = "| --- |" + " ---: |" * (len(columns) - 1)
    return "\n".join([header, rule, *("| " + " | ".join(render(row) for _, render in columns) + " |" for row in rows)])
