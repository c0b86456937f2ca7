"""The text benchmark end to end, as a smoke run: ``python -m scripts.bench.text --small --quick`` on
tiny models (scripts.model_prep.small_models, and build/test-models' small bert_base) in a temporary
folder. It prepares its repository, starts and stops its stack, and writes a row for everything it
measures. No figure is checked: on a shared machine they only mean something side by side in one run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.core.settings import PROJECT_ROOT
from scripts.bench.text import plan
from scripts.devtools import built_test_repository
from tests.support import ONE_INSTANCE_ARGS

pytestmark = [pytest.mark.integration, pytest.mark.scheduled_first]


def test_a_quick_run_on_tiny_models_writes_every_row(tmp_path):
    built_test_repository()  # the small bert_base: `make test-models`
    done = subprocess.run(
        [sys.executable, "-m", "scripts.bench.text", "--small", "--quick", *ONE_INSTANCE_ARGS]
        + ["--out", str(tmp_path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {row["key"]: row for row in results["rows"]}
    assert set(rows) == {row.key for row in plan.plan_rows(plan.LENGTHS, 8, 16)}
    for key, row in rows.items():
        assert row["requests"] > 0 and row["errors"] == 0, (key, row["first_error"])
        assert row["texts_per_s"] > 0 and (row["router_cpu_ms"] is None) == (row["side"] == plan.ENCODE_SIDE)
    assert rows["sentence_embedding/short/batch"]["texts_per_request"] == 32
    assert len(results["verdicts"]) == 3 * 2 + 2 * 2
    assert all(verdict["passed"] is not None for verdict in results["verdicts"])
    assert "| row | model |" in done.stdout and done.stdout.count("PASS ") + done.stdout.count("FAIL ") == 10
    assert "stopping the stack" in done.stdout
