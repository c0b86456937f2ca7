"""--target tensorrt: one clear line where TensorRT or a GPU is missing; a real engine where both exist."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.core.settings import PROJECT_ROOT
from scripts.model_prep import cli as prepare_models
from scripts.model_prep.tensorrt_engine import load_engine, missing_requirements

MISSING = missing_requirements()


@pytest.mark.skipif(MISSING is None, reason="TensorRT and a GPU are present: the engine is built instead")
def test_without_tensorrt_or_gpu_it_exits_with_one_line_and_no_plan(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.model_prep",
            "--target",
            "tensorrt",
            "--weights",
            "random",
            "--models",
            "resnet",
            "--repository",
            str(tmp_path),
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines == [MISSING]
    assert lines[0].startswith("prepare_models: --target tensorrt needs ")
    assert not list(tmp_path.rglob("*.plan"))


@pytest.mark.gpu
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_engine_is_built_and_loads(tmp_path):
    argv = [
        "--target",
        "tensorrt",
        "--weights",
        "random",
        "--models",
        "resnet",
        "--max-batch-size",
        "2",
        "--repository",
        str(tmp_path),
    ]
    assert prepare_models.main(argv) == 0
    engine = load_engine(tmp_path / "resnet" / "1" / "model.plan")
    assert engine is not None
    names = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
    assert names == {"input", "scores", "classes"}  # softmax and ranking are in the graph
