"""Triton's auto-completion is skipped (`--disable-auto-complete-config`: no stub started and stopped
per python model before its instances start) only for repositories whose configurations leave
nothing for it to fill in."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.serve.tritonserver import left_to_auto_complete

ONNX_WITHOUT_TENSORS = 'name: "user_onnx"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
PYTHON_WRITTEN = """name: "user_python"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""
OWN_COMPLETION = """class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        return config
"""


def model(root: Path, name: str, config: str, model_py: str | None = None) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    if model_py is not None:
        (folder / "1" / "model.py").write_text(model_py)
    return folder


def test_what_model_preparation_writes_leaves_nothing(repository: Path):
    assert left_to_auto_complete(repository) == []


def test_a_users_complete_python_model_leaves_nothing(tmp_path: Path):
    model(tmp_path, "user_python", PYTHON_WRITTEN, "class TritonPythonModel:\n    pass\n")
    assert left_to_auto_complete(tmp_path) == []


@pytest.mark.parametrize(
    "config, model_py",
    [
        (ONNX_WITHOUT_TENSORS, None),  # Triton reads the inputs and outputs from the ONNX file
        (PYTHON_WRITTEN.replace("max_batch_size: 4\n", ""), "class TritonPythonModel:\n    pass\n"),
        (PYTHON_WRITTEN.replace('backend: "python"\n', ""), None),
        (PYTHON_WRITTEN, OWN_COMPLETION),  # its model.py completes its configuration
        ("name: 'broken' input [", None),
    ],
    ids=["no tensors", "no max_batch_size", "no backend", "auto_complete_config", "unreadable"],
)
def test_a_config_that_leaves_something_out_keeps_auto_completion(tmp_path: Path, repository: Path, config, model_py):
    shutil.copytree(repository, tmp_path / "repository", symlinks=True)
    model(tmp_path / "repository", "zz_user", config, model_py)
    assert left_to_auto_complete(tmp_path / "repository") == ["zz_user"]
