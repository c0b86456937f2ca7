"""Fixtures shared by the integration tests (the real stack, started once per session) and by the unit
tests (moto's AWS, the small text models built once per run), and the guard that a run without integration tests starts no stack.

The guard records every argv ``subprocess.Popen`` is given during the run (and looks at the run's
processes still alive at its end); when no selected test is marked ``integration``, a program of the
stack (``serve``, ``tritonserver``, ``gunicorn``, ``nginx``) among them fails the run."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts.devtools import Stack, built_test_repository, cmdline, descendants
from scripts.model_prep.small_models import sets as small_model_sets
from scripts.model_prep.small_models.sets import Built
from tests.support import REGION

# The suite runs three processes on a machine of few cores: torch in each (the text models' builds and
# references, generate inside the test stacks' Triton) takes one thread, not one a core, whose threads
# would wait on each other spinning (a trained test model's build took minutes). Set before any test
# imports torch; the stacks the tests start inherit it. ONNX Runtime's threads are set explicitly.
os.environ.setdefault("OMP_NUM_THREADS", "1")
STACK_PROGRAMS = frozenset({"serve", "tritonserver", "gunicorn", "nginx"})
_started: list[str] = []  # every command line given to subprocess.Popen in this run
_STACK_STARTED = pytest.StashKey[list]()  # what the guard found, for the summary
_UPTIME_AT_START = pytest.StashKey[float]()  # the kernel's clock when the run began (dmesg's)
# What the kernel says of a process it ended: a test process that dies without a traceback (a
# SIGKILL) is named there, and why (the OOM killer, a segfault in a native library).
KERNEL_ENDINGS = re.compile(r"out of memory|killed process|oom-kill:|segfault|general protection|traps:", re.IGNORECASE)
_popen_init = subprocess.Popen.__init__


def _recording_init(self, args, *rest, **kwargs):
    command = args if isinstance(args, (str, bytes, os.PathLike)) else shlex.join(os.fsdecode(a) for a in args)
    _started.append(os.fsdecode(command))
    _popen_init(self, args, *rest, **kwargs)


def stack_programs(command: str) -> set[str]:
    """The programs of the stack a command line names (as its program, its script or a module)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return {Path(word).name for word in words} & STACK_PROGRAMS


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _recording_init
    config.stash[_UPTIME_AT_START] = _uptime()


def _uptime() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def kernel_endings(since: float) -> list[str]:
    """What the kernel logged since ``since`` (seconds of uptime) about processes it ended; nothing
    where its log cannot be read."""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in log.splitlines():
        stamp = re.match(r"\[\s*(\d+\.\d+)\]", line)
        if stamp and float(stamp.group(1)) >= since and KERNEL_ENDINGS.search(line):
            found.append(line)
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Whole modules in the order `make test`'s processes take them (`--dist loadfile
    --no-loadscope-reorder`): those marked ``scheduled_first`` first, then the others by their number
    of tests, most first (xdist's own order). xdist hands a process its next module while it still has
    two tests or fewer to run, so modules of one long test left for the end (the benchmarks' smoke
    runs, 20-30 s each) queue up on one process while the others have nothing left."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    first = {name for name, its in modules.items() if its[0].get_closest_marker("scheduled_first")}
    order = sorted(modules, key=lambda name: (name not in first, -len(modules[name])))
    items[:] = [item for name in order for item in modules[name]]


def pytest_unconfigure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _popen_init


def _stack_processes(session: pytest.Session) -> list[str]:
    """What a run without integration tests started of the stack (nothing when it has integration tests)."""
    if any(item.get_closest_marker("integration") for item in session.items):
        return []
    alive = [cmdline(pid) for pid in descendants(os.getpid())]
    return [command for command in [*_started, *alive] if stack_programs(command)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    found = _stack_processes(session)
    session.config.stash[_STACK_STARTED] = found
    if found and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    found = config.stash.get(_STACK_STARTED, [])
    if found:
        terminalreporter.section("a run without integration tests started the stack", sep="=", red=True)
        for command in found:
            terminalreporter.line(command)
    if exitstatus != pytest.ExitCode.OK and not hasattr(config, "workerinput"):
        # the containers' own OOM kills (tests/container) are expected; the last lines tell the rest
        ended = kernel_endings(config.stash.get(_UPTIME_AT_START, 0.0))
        if ended:
            terminalreporter.section("processes the kernel ended during the run (dmesg)", sep="=", yellow=True)
            for line in ended[-30:]:
                terminalreporter.line(line)


@pytest.fixture
def aws(monkeypatch):
    """moto in place of AWS, with test credentials (never a profile of the machine's) in REGION."""
    from moto import mock_aws

    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield


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
def small_models() -> Built:
    """The small text models' sets (scripts.model_prep.small_models: folders and prepared repositories)
    as `make test-models` built them, found by their content's key; where they are missing (a test run
    alone after a change) they are built here first, under a file lock that makes the other pytest
    processes wait for that one build. Tests read them and copy what they change or serve."""
    return small_model_sets.ensure()


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
