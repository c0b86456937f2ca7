"""The prompted benchmark end to end, as a smoke run: ``python -m scripts.bench.prompted --small --quick``
on the small-model sets' tiny SAM, SAM-HQ, OWLv2 and Grounding DINO in a temporary folder. It prepares its
repository, starts and stops its stack, and writes a row for everything it measures, a verdict a goal,
the chain's line, and as many detections of the first photo as the references find. No figure is
checked: on a shared machine they only mean something side by side in one run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.core.settings import PROJECT_ROOT
from clients.families import FAMILIES
from scripts.bench.prompted import plan
from tests.support import ONE_INSTANCE_ARGS

pytestmark = [pytest.mark.integration, pytest.mark.scheduled_first]


def test_a_quick_run_on_the_tiny_models_writes_every_row(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "scripts.bench.prompted", "--small", "--quick", *ONE_INSTANCE_ARGS]
        + ["--out", str(tmp_path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=180,  # about 30 s on 2 shared vCPUs, most of it the stack's start
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    chained = plan.CHAIN_FAMILY in FAMILIES
    families = list(plan.FAMILIES) if chained else [f for f in plan.FAMILIES if f != plan.CHAIN]
    rows = {row["key"]: row for row in results["rows"]}
    assert list(rows) == [row.key for row in plan.plan_rows(families, plan.CONCURRENCY)]
    for key, row in rows.items():
        assert row["requests"] == plan.CONCURRENCY and row["errors"] == 0, (key, row["first_error"])
        assert row["images_per_s"] > 0, key
    detections = results["detections_of_the_first_photo"]  # (the endpoint's, the reference's)
    assert set(detections) == set(families) - set(plan.BOXED) and all(a == b for a, b in detections.values())
    if chained:  # its threshold lets as many detections reach SAM as the many-box row sends
        assert detections[plan.CHAIN] == [plan.MANY, plan.MANY]
    goals = len(families) + len(plan.BOXED)  # each family's speed, and 8 boxes against 1 of SAM and SAM-HQ
    assert [verdict["passed"] is None for verdict in results["verdicts"]] == [False] * goals
    assert done.stdout.count("PASS ") + done.stdout.count("FAIL ") == goals
    assert ("not in this tree" in done.stdout) != chained and "stopping the stack" in done.stdout
