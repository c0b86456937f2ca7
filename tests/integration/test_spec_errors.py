"""A model.toml mistake is one line naming the file and the key (and what is expected), and a non-zero
exit, never a traceback: from model preparation (`make models`) and from `serve`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.settings import PROJECT_ROOT
from scripts.devtools import free_ports

pytestmark = pytest.mark.integration  # serve is started (and refuses to start)

BERT = (PROJECT_ROOT / "models" / "bert_base" / "model.toml").read_text()
MISTAKES = {
    "no family": ("max_batch_size = 4\n", ["model.toml", "missing 'family'"]),
    "no dtype": (
        'family = "fill_mask"\nmax_batch_size = 4\n[[inputs]]\nname = "ids"\ndims = [8]\n',
        ["model.toml", "inputs[0]", "'dtype'"],
    ),
    "unknown family": (
        BERT.replace('family = "fill_mask"', 'family = "speech"'),
        ["model.toml", "'speech'", "fill_mask"],
    ),
    "bad instances": (BERT.replace('count = "auto"', "count = 0"), ["[instances]", "count = 0", "whole number"]),
    "text folder missing": (
        'family = "text_classification"\n[export]\ntransformers = "./nowhere/"\n',
        ["transformers", "nowhere"],
    ),
}


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def prepare_models(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scripts.model_prep", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("mistake", MISTAKES)
def test_model_preparation_names_the_file_and_the_key(tmp_path: Path, mistake: str):
    text, fragments = MISTAKES[mistake]
    (tmp_path / "models" / "broken").mkdir(parents=True)
    (tmp_path / "models" / "broken" / "model.toml").write_text(text)
    done = prepare_models("--source", str(tmp_path / "models"))
    assert done.returncode != 0
    line = one_line(done.stderr)
    for fragment in fragments:
        assert fragment in line, line


def test_a_mistake_in_the_last_model_is_said_before_the_first_is_prepared(tmp_path: Path):
    """Every model.toml is read before any model is prepared: the sound model first in the run is
    not exported (nor its weights looked for) before the mistake after it stops the run."""
    models, repository = tmp_path / "models", tmp_path / "repository"
    shutil.copytree(PROJECT_ROOT / "models" / "resnet", models / "a_sound", ignore=shutil.ignore_patterns("[0-9]*"))
    (models / "z_broken").mkdir()
    (models / "z_broken" / "model.toml").write_text(MISTAKES["no family"][0])
    done = prepare_models("--source", str(models), "--repository", str(repository))
    assert done.returncode != 0
    line = one_line(done.stderr)
    assert "z_broken" in line and "missing 'family'" in line, line
    assert "a_sound" not in done.stdout and not (repository / "a_sound").exists(), done.stdout


def test_serve_names_the_file_and_the_key(repository: Path, tmp_path: Path):
    """A prepared repository whose model.toml gives an option of the wrong type: serve stops before
    it starts anything, with one log line naming the file, the key and what it must be."""
    served = tmp_path / "repository"
    shutil.copytree(repository / "bert_base", served / "bert_base")
    spec = served / "bert_base" / "model.toml"
    spec.write_text(re.sub(r"^topk = 5$", 'topk = "five"', spec.read_text(), flags=re.MULTILINE))
    port, low = free_ports(2)
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/bin",
        "MODEL_REPOSITORY": str(served),
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "SAGEMAKER_SAFE_PORT_RANGE": f"{low}-{low + 2}",
    }
    done = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "serve")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    errors = [line for line in (done.stdout + done.stderr).splitlines() if '"ERROR"' in line]
    assert len(errors) == 1 and "Traceback" not in done.stdout + done.stderr, errors
    assert f"{spec}: [postprocess] topk must be an integer" in errors[0]
