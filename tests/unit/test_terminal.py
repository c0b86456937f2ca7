"""scripts/terminal.py: the one positive-number argparse type and the one text table of the commands."""

from __future__ import annotations

import argparse
import math

import pytest

from scripts.terminal import positive, text_table


def test_positive_numbers():
    assert positive(int)("3") == 3 and positive(float)("0.5") == 0.5 and positive()("2") == 2.0
    assert positive(int, zero=True)("0") == 0
    for kind, text, message in [
        (int, "0", "0: must be above 0"),
        (float, "-1.5", "-1.5: must be above 0"),
        (float, "nan", "nan: must be above 0"),
        (int, "1.5", "'1.5': not a number"),
        (float, "lots", "'lots': not a number"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            positive(kind)(text)
    with pytest.raises(argparse.ArgumentTypeError, match="-1: must be 0 or above"):
        positive(int, zero=True)("-1")
    assert math.isinf(positive(float)("inf"))


def test_positive_as_argparse_reports_it():
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--seconds", type=positive(float))
    assert parser.parse_args(["--seconds", "2.5"]).seconds == 2.5
    with pytest.raises(argparse.ArgumentError, match="0: must be above 0"):
        parser.parse_args(["--seconds", "0"])


def test_text_table_aligns_columns_under_a_header():
    text = text_table([("model", "side", "req/s"), ("resnet", "router", "12.5"), ("bert_base", "B", "3")], right={2})
    assert text.splitlines() == [
        "model      side    req/s",
        "---------  ------  -----",
        "resnet     router   12.5",
        "bert_base  B           3",
    ]
    indented = text_table([("a", "b"), ("long cell", "")], indent="  ").splitlines()
    assert indented == ["  a          b", "  ---------  -", "  long cell"]  # no trailing spaces
