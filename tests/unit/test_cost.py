"""scripts/sagemaker/cost.py: three single-model endpoints against one shared endpoint, every number a
parameter."""

from __future__ import annotations

import pytest

from app.core.settings import PROJECT_ROOT
from scripts.sagemaker import cost


def test_default_table(capsys):
    assert cost.main([]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].startswith("| setup |")
    assert rows[2] == "| 3 single-model endpoints (1 x ml.g4dn.xlarge each) | 3 | 3 | 2.2092 | 730 | 1,612.72 |"
    assert rows[3] == "| one shared endpoint (1 x ml.g4dn.xlarge) | 1 | 1 | 0.7364 | 730 | 537.57 |"
    assert rows[4].endswith("| 1,075.14 (67%) |")


def test_prices_and_hours_are_parameters(capsys):
    cost.main(["--hours", "100", "--single-price", "1", "--shared-price", "2", "--shared-instances", "2"])
    rows = capsys.readouterr().out.strip().splitlines()
    assert "| 300.00 |" in rows[2] and "| 400.00 |" in rows[3]
    assert rows[4].endswith("| -100.00 (-33%) |")


@pytest.mark.parametrize(
    "setup, expected", [(cost.Setup("x", 3, 2, 0.5), 3.0), (cost.Setup("y", 1, 1, 0.7364), 0.7364)]
)
def test_hourly(setup, expected):
    assert setup.hourly == pytest.approx(expected)


def test_the_deploying_page_shows_the_scripts_output(capsys):
    cost.main([])
    table = capsys.readouterr().out.strip()
    assert table in (PROJECT_ROOT / "docs" / "deploying.md").read_text()
