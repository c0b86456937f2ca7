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
def full_repository() -> Path:
    """The same models at full size (ResNet50, YOLOv5s, BERT base; random weights): for the few tests
    that need a network's real size (its memory, a worker kept busy)."""
    return built_test_repository(full=True)


def detector_only(repository: Path, target: Path) -> Path:
    """A repository of the detector alone (with its Triton pipeline's steps)."""
    for folder in repository.glob("yolov5*"):
        shutil.copytree(folder, target / folder.name)
    return target


@pytest.fixture(scope="session")
def small_repository(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model only: for tests that start and stop whole stacks, so each start is quick."""
    return detector_only(repository, tmp_path_factory.mktemp("small-repository"))


@pytest.fixture(scope="session")
def full_detector_repository(full_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The full-size detector alone: requests that keep a worker busy for seconds."""
    return detector_only(full_repository, tmp_path_factory.mktemp("full-detector-repository"))


@pytest.fixture(scope="session")
def stopping():
    """Stacks a test is done with: told to stop (SIGTERM) and left to unload in the background while
    the next tests run (Triton takes seconds to unload its models); every one is waited for at the end."""
    stacks: list[Stack] = []
    yield stacks
    for s in stacks:
        s.begin_stop()
    for s in stacks:
        s.finish_stop()


@pytest.fixture(scope="session")
def stack(repository: Path, tmp_path_factory: pytest.TempPathFactory, stopping: list[Stack]):
    """The whole stack on the three models, shared by the tests that only send requests."""
    started = Stack(repository).start(tmp_path_factory.mktemp("stack-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


@pytest.fixture
def new_stack(tmp_path: Path, stopping: list[Stack]):
    """Start stacks of one's own (for tests that kill or stop them); each is stopped afterwards."""

    def start(repo: Path, **env: str) -> Stack:
        s = Stack(repo, env_extra=env).start(tmp_path)
        stopping.append(s)
        return s

    made_before = len(stopping)
    yield start
    for s in stopping[made_before:]:
        s.begin_stop()
