"""The generation benchmark end to end, as a smoke run: ``python -m scripts.bench.generation --small
--quick`` on a tiny T5 (scripts.model_prep.small_models) in a temporary folder. It prepares its repository,
starts and stops its stack, and writes a row for everything it measures, every text generating
exactly ``--max-new-tokens`` on both sides, the endpoint's answers equal to ``generate``'s. No
figure is checked: on a shared machine they only mean something side by side in one run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.core.settings import PROJECT_ROOT
from scripts.bench.generation import plan
from tests.support import ONE_INSTANCE_ARGS

pytestmark = [pytest.mark.integration, pytest.mark.scheduled_first]

MAX_NEW_TOKENS = 8


def test_a_quick_run_on_a_tiny_t5_writes_every_row(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "scripts.bench.generation", "--small", "--quick", *ONE_INSTANCE_ARGS]
        + ["--out", str(tmp_path)]
        + ["--max-new-tokens", str(MAX_NEW_TOKENS)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=180,  # about 25 s on 2 shared vCPUs
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {row["key"]: row for row in results["rows"]}
    assert set(rows) == {row.key for row in plan.plan_rows(8, 8, 4)}
    for key, row in rows.items():
        assert row["requests"] > 0 and row["errors"] == 0, (key, row["first_error"])
        assert row["tokens_per_text"] == MAX_NEW_TOKENS, key  # the router's count, or generate's
        assert row["tokens_per_s"] > 0 and (row["router_cpu_ms"] is None) == (row["side"] == plan.GENERATE)
        assert (row["texts_per_execution"] is None) == (row["side"] == plan.GENERATE)  # Triton's batch
    assert rows["generate/b8/greedy"]["texts_per_request"] == 8
    assert results["same_as_generate"] == dict.fromkeys(
        ["endpoint/c8/greedy", "endpoint/c1/greedy", "endpoint/c8/beam4"], True
    )
    assert [verdict["passed"] is None for verdict in results["verdicts"]] == [False, True, True]  # one goal
    assert "| row | texts/call |" in done.stdout and done.stdout.count("PASS ") + done.stdout.count("FAIL ") == 1
    assert done.stdout.count("info ") == 2 and "stopping the stack" in done.stdout
