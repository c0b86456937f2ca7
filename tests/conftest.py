"""Fixtures shared by the integration tests: the real stack, started once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scripts.devtools import Stack, built_test_repository


@pytest.fixture(scope="session")
def repository() -> Path:
    """The models `make test-models` built (python target, seeded random weights)."""
    return built_test_repository()


@pytest.fixture(scope="session")
def small_repository(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model only (with its Triton pipeline's steps): for tests that start and stop whole
    stacks, so each start is quick."""
    target = tmp_path_factory.mktemp("small-repository")
    for folder in repository.glob("yolov5*"):
        shutil.copytree(folder, target / folder.name)
    return target


@pytest.fixture(scope="session")
def stack(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    """The whole stack on the three models, shared by the tests that only send requests."""
    started = Stack(repository).start(tmp_path_factory.mktemp("stack-logs"))
    try:
        started.wait_healthy()
        yield started
    finally:
        started.stop()


@pytest.fixture
def new_stack(tmp_path: Path):
    """Start stacks of one's own (for tests that kill or stop them); all are stopped afterwards."""
    made: list[Stack] = []

    def start(repo: Path, **env: str) -> Stack:
        s = Stack(repo, env_extra=env).start(tmp_path)
        made.append(s)
        return s

    yield start
    for s in made:
        s.stop()
