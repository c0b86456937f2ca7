"""What the commands share at the terminal: the argparse type of a positive number, and the text
table their results print as (the benchmark's, the GPU check's, the preprocessing comparison's)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

Number = TypeVar("Number", int, float)


def positive(kind: Callable[[str], Number] = float, *, zero: bool = False) -> Callable[[str], Number]:
    """An argparse type: a number of ``kind`` (int, float) above 0, or from 0 up with ``zero``; NaN is
    refused. The error names the text: "'x': not a number", "0: must be above 0"."""

    def parse(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
        if not (value >= 0 if zero else value > 0):
            raise argparse.ArgumentTypeError(f"{text}: must be {'0 or above' if zero else 'above 0'}")
        return value

    parse.__name__ = f"{'non-negative' if zero else 'positive'} {getattr(kind, '__name__', 'number')}"
    return parse


def text_table(rows: Sequence[Sequence[str]], right: Collection[int] = (), indent: str = "") -> str:
    """``rows`` as columns two spaces apart, the first row the header with a line of dashes under it;
    the columns whose index is in ``right`` (the numbers) aligned right, the others left; no
    trailing spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width) for i, (cell, width) in enumerate(zip(row, widths))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join((indent + line).rstrip() for line in lines)
