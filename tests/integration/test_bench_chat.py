"""The chat benchmark end to end, as a smoke run: ``python -m scripts.bench.chat --small --quick`` on a
tiny Llama (scripts.model_prep.small_models) in a temporary folder. It prepares its repository, starts
and stops its stack, and writes a row for everything it measures, every call generating exactly the
tokens it asked for, the streamed rows timed, the endpoint's tokens equal to ``generate``'s. No
figure is checked: on a shared machine they only mean something side by side in one run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.core.settings import PROJECT_ROOT
from scripts.bench.chat import plan
from tests.support import ONE_INSTANCE_ARGS

pytestmark = [pytest.mark.integration, pytest.mark.scheduled_first]

MAX_NEW_TOKENS, SHORT_NEW_TOKENS = 16, 4


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_a_quick_run_on_a_tiny_llama_writes_every_row(tmp_path, engine):
    done = subprocess.run(
        [sys.executable, "-m", "scripts.bench.chat", "--small", "--quick", *ONE_INSTANCE_ARGS]
        + ["--out", str(tmp_path), "--engine", engine]
        + ["--max-new-tokens", str(MAX_NEW_TOKENS), "--short-new-tokens", str(SHORT_NEW_TOKENS)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=180,  # 30 to 40 s on 2 shared vCPUs, most of it the stack's start
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {row["key"]: row for row in results["rows"]}
    assert set(rows) == {row.key for row in plan.plan_rows(8, engine)}
    assert any(row["side"] == plan.GENAI for row in rows.values()) == (engine == "openvino")
    for key, row in rows.items():
        assert row["requests"] > 0 and row["errors"] == 0, (key, row["first_error"])
        asked = SHORT_NEW_TOKENS if row["side"] in plan.PROBES else MAX_NEW_TOKENS
        at_once = row["concurrency"] if row["side"] == plan.GENAI else 1  # GenAI's calls: several prompts
        if row["side"] in (plan.CONSTRAINED, plan.TOOLS):  # the schema (the call) done, the model ends
            assert 0 < row["tokens_per_call"] <= asked, key
        else:
            assert row["tokens_per_call"] == asked * at_once, key  # random weights end no generation early
        streamed = row["side"] not in (*plan.LOCAL, *plan.WHOLE)
        assert (row["ttft_p50_ms"] is not None) == streamed and (row["itl_p99_ms"] is not None) == streamed, key
    assert results["settings"]["long_new"] == plan.LONG_NEW  # the small model's 1,024 positions hold them
    checks = results["checks"]
    assert checks["same_as_generate"] and checks["stream_tokens_same_as_generate"]
    assert checks["tokens_of_the_first_answer"] == [MAX_NEW_TOKENS] * 3
    infos = 3 if engine == "openvino" else 1  # and the endpoint against GenAI in this process, c=1 and c=8
    goals = 2 if engine == "openvino" else 4  # and, on the onnxruntime engine, a JSON Schema's and a tool's
    assert [verdict["passed"] is None for verdict in results["verdicts"]] == [False] * goals + [True] * infos
    assert "| row | tokens/s |" in done.stdout and done.stdout.count("PASS ") + done.stdout.count("FAIL ") == goals
    assert done.stdout.count("info ") == 1 + infos and "stopping the stack" in done.stdout
