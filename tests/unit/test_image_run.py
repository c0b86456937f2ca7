"""``python -m scripts.image run`` stopped by a signal, with a fake engine and a fake ``run`` client:
which commands the stop sends, in which order, the exit status, the handlers put back, and what a
second signal, an ignored one and a client that outlives its container do. The real container,
stopped by real signals sent to the script's own process, is
tests/container/test_image.py::test_image_run_stops_and_removes_its_container_on_a_signal.

The signals here are handed to the handlers the script installs (``deliver``), not sent to the test's
own process: a real SIGTERM that finds its default disposition ends the pytest-xdist worker and every
test it was to run (in one whole run, the worker running this module's first test ended there without
a traceback, and xdist's scheduler then waited forever for it)."""

from __future__ import annotations

import argparse
import signal
import subprocess
from pathlib import Path

import pytest

from scripts.image import cli, engine
from scripts.image.engine import Engine

NAME = "multi-model-8123"


def deliver(signum: int) -> None:
    """``signum`` handed to this process's handler for it, as Python runs a handler when the signal
    arrives: an ignored one does nothing; one at its default fails the test, naming it."""
    handler = signal.getsignal(signum)
    if handler is signal.SIG_IGN:
        return
    if not callable(handler):
        pytest.fail(f"{signal.Signals(signum).name} has no handler (it is {handler!r}): it would end the process")
    handler(signum, None)


class FakeEngine(Engine):
    """Records every command instead of running it; ``during_stop`` runs while ``stop`` would wait."""

    def __init__(self, during_stop=lambda: None) -> None:
        super().__init__("/usr/bin/podman")
        self.commands: list[tuple[tuple[str, ...], bool]] = []
        self.during_stop = during_stop

    def run(self, *args: str, new_session: bool = False, **_: object) -> subprocess.CompletedProcess:
        self.commands.append((args, new_session))
        if args[0] == "stop":
            self.during_stop()
        return subprocess.CompletedProcess(args, 0, "", "")


class FakeClient:
    """The attached ``run`` client: its first wait is interrupted by ``signum`` (sent to this very
    process), later ones return at once, or time out when ``outlives`` (until it is killed)."""

    def __init__(self, signum: int | None, code: int = 0, outlives: bool = False) -> None:
        self.signum, self.code, self.outlives = signum, code, outlives
        self.waits: list[float | None] = []
        self.killed = False

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if len(self.waits) == 1 and self.signum is not None:
            deliver(self.signum)
        if self.outlives and not self.killed and timeout is not None:
            raise subprocess.TimeoutExpired("podman run", timeout)
        return self.code

    def kill(self) -> None:
        self.killed = True


@pytest.fixture(autouse=True)
def interruptible():
    """SIGINT handled as in a terminal, also where the run inherited it ignored (a shell's background
    job): what the script does with a signal that stays ignored is a test of its own."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def terminal_signals():
    """The stop signals at their defaults, as in a terminal, also where this run inherited one ignored
    (``nohup``): ``cli.run`` rightly leaves an ignored signal ignored. Put back afterwards."""
    ignored = [number for number in cli.STOP_SIGNALS if signal.getsignal(number) is signal.SIG_IGN]
    for number in ignored:
        signal.signal(number, signal.SIG_DFL)
    yield
    for number in ignored:
        signal.signal(number, signal.SIG_IGN)


@pytest.fixture
def start(monkeypatch: pytest.MonkeyPatch, terminal_signals):
    """``cli.run`` with the fakes; returns the engine, the client, the Popen keywords and the status."""

    def run(fake_engine: FakeEngine, client: FakeClient):
        popen_kwargs: dict = {}

        def popen(argv, **kwargs):
            popen_kwargs.update(kwargs)
            return client

        monkeypatch.setattr(cli, "find_engine", lambda: fake_engine)
        monkeypatch.setattr(cli, "settle_podman", lambda *_: None)
        monkeypatch.setattr(cli, "can_publish", lambda *_: True)
        monkeypatch.setattr(cli.subprocess, "Popen", popen)
        args = argparse.Namespace(tag="multi-model:cpu", repository=Path("models"), port=8123)
        return cli.run(args), popen_kwargs

    return run


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_stops_with_30_s_then_removes(start, capsys, signum: signal.Signals):
    before = {number: signal.getsignal(number) for number in cli.STOP_SIGNALS}
    fake, client = FakeEngine(), FakeClient(signum)
    status, popen_kwargs = start(fake, client)

    assert fake.commands == [(("stop", "-t", "30", NAME), True), (("rm", "-f", NAME), True)]
    assert status == 128 + signum
    assert f"stopping container {NAME} ({signum.name}), up to 30 s" in capsys.readouterr().err
    assert popen_kwargs["start_new_session"] is True  # the client never sees the terminal's signals
    assert not client.killed and client.waits == [None, engine.CLIENT_EXIT_S, engine.CLIENT_EXIT_S]
    assert {number: signal.getsignal(number) for number in cli.STOP_SIGNALS} == before


def test_without_a_signal_the_containers_status_is_the_scripts(start):
    fake = FakeEngine()
    assert start(fake, FakeClient(None, code=3))[0] == 3
    assert fake.commands == []


def test_a_second_signal_during_the_stop_is_swallowed(start):
    fake = FakeEngine(during_stop=lambda: deliver(signal.SIGINT))
    status, _ = start(fake, FakeClient(signal.SIGTERM))
    assert status == 128 + signal.SIGTERM
    assert [args[0] for args, _ in fake.commands] == ["stop", "rm"]


def test_an_ignored_signal_stays_ignored(start):
    """``nohup``: a closed terminal's SIGHUP leaves the container running, as the user asked."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        fake = FakeEngine()
        assert start(fake, FakeClient(signal.SIGHUP, code=0))[0] == 0
        assert fake.commands == []
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_client_that_outlives_its_container_is_killed():
    """A stop that came before the container existed: ``rm -f`` removes the container started since,
    and a client still attached after that is killed rather than waited for forever."""
    fake, client = FakeEngine(), FakeClient(None, outlives=True)
    engine.stop_container(fake, NAME, client, grace_s=30)
    assert [args for args, _ in fake.commands] == [("stop", "-t", "30", NAME), ("rm", "-f", NAME)]
    assert client.killed and client.waits[-1] is None
