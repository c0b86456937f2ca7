"""The built repositories of every target, shared by the config tests (model and pipeline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import prepare_models

TARGETS = ("python", "onnxruntime", "tensorrt")


def build_repository(repository: Path, target: str, *extra: str) -> None:
    """``prepare_models`` for a target with the small networks (their configs are the shipped models':
    same tensors); tensorrt with ``--config-only`` (no GPU)."""
    argv = ["--target", target, "--weights", "small", "--repository", str(repository), *extra]
    if target == "tensorrt":
        argv.append("--config-only")
    assert prepare_models.main(argv) == 0


@pytest.fixture(scope="session")
def repositories(tmp_path_factory) -> dict[str, Path]:
    """One repository per target, built once (ONNX exports come from the build/onnx cache)."""
    built = {}
    for target in TARGETS:
        built[target] = tmp_path_factory.mktemp(f"repository-{target}")
        build_repository(built[target], target)
    return built
