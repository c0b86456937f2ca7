"""prepare_models as a command: help without work, options, and the offline fallback to random weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.core.settings import PROJECT_ROOT
from scripts.model_prep import arguments as prepare_options
from scripts.model_prep import cli as prepare_models
from scripts.model_prep import triton_config, weights

ROOT = PROJECT_ROOT


@pytest.mark.parametrize("elsewhere", [False, True], ids=["in-the-project", "elsewhere"])
def test_help_runs_as_a_module_from_any_folder(elsewhere, tmp_path):
    """``python -m scripts.model_prep --help`` in the project, and from another folder with the
    project on the path (as installed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)} if elsewhere else None
    result = subprocess.run(
        [sys.executable, "-m", "scripts.model_prep", "--help"],
        cwd=tmp_path if elsewhere else ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "--target" in result.stdout and "--weights-file" in result.stdout


def test_per_model_values():
    assert prepare_options.per_model(["4", "resnet=16", "bert_base=2", "8"], "--max-batch-size") == {
        "*": 8,
        "resnet": 16,
        "bert_base": 2,
    }


@pytest.mark.parametrize("value", ["resnet=x", "=", "0"])
def test_bad_per_model_values_are_refused(value):
    with pytest.raises(SystemExit):
        prepare_options.per_model([value], "--max-batch-size")


def test_unknown_model_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no model.toml"):
        prepare_models.main(["--models", "nope", "--repository", str(tmp_path)])


def test_offline_pretrained_falls_back_to_random_loudly(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(weights, "probe", lambda url, timeout=weights.PROBE_TIMEOUT_S: "host unreachable (test)")

    argv = ["--models", "resnet", "--weights", "pretrained", "--repository", str(tmp_path)]
    assert prepare_models.main(argv) == 0

    stderr = capsys.readouterr().err
    assert "WARNING: [resnet] PRETRAINED WEIGHTS ARE NOT AVAILABLE: host unreachable (test)" in stderr
    assert "USING RANDOM WEIGHTS (seed 0)" in stderr
    source = json.loads((tmp_path / "resnet" / "source.json").read_text())
    assert (source["weights"], source["seed"], source["reason"]) == ("random", 0, "host unreachable (test)")
    config = triton_config.read_config(tmp_path / "resnet" / "config.pbtxt")
    assert config.parameters["weights_source"].string_value == "random"


def test_probe_gives_up_fast_on_an_unreachable_host():
    reason = weights.probe("https://unreachable.invalid/weights.pt", timeout=2)
    assert reason and "unreachable.invalid" in reason
