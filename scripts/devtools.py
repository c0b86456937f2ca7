"""Development tools the scripts and the tests share: the real stack (`serve`: Triton, gunicorn,
NGINX) started on free ports, process helpers that read /proc, and percentiles."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence

import requests

from app.core.settings import (
    BIND_TO_PORT,
    MODEL_REPOSITORY,
    PROJECT_ROOT,
    SAFE_PORT_RANGE,
    TEST_MODEL_REPOSITORY,
    TRITON_GRPC_URL,
)

ROOT = PROJECT_ROOT
DEFAULT_TEST_REPOSITORY = ROOT / "build" / "test-models"


def built_test_repository() -> Path:
    path = Path(os.environ.get(TEST_MODEL_REPOSITORY, DEFAULT_TEST_REPOSITORY))
    if not (path / "resnet" / "config.pbtxt").is_file():
        raise RuntimeError(f"{path} holds no built test models: run `make test-models` (make test does)")
    return path


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def free_ports(count: int, start: int = 20000, stop: int = 60000) -> list[int]:
    """`count` consecutive free ports (Triton's safe range needs three in a row)."""
    base = start + (os.getpid() * 7919 + int(time.time() * 1000)) % (stop - start - 100)
    for low in range(base, stop - count, count + 1):
        if all(_port_free(p) for p in range(low, low + count)):
            return list(range(low, low + count))
    raise RuntimeError("no free ports")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's
    default); NaN for no values."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0-100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def process_state(pid: int) -> str | None:
    """The state letter of a process (R, S, Z, T, ...), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2]


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == pid:
            kids.append(int(entry.name))
    return kids


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for kid in children_of(todo.pop()):
            found.append(kid)
            todo.append(kid)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


@dataclass
class Stack:
    repository: Path
    env_extra: dict = field(default_factory=dict)
    port: int = 0
    triton_ports: list[int] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    _log: IO | None = None
    started_at: float = 0.0
    start_to_ping_s: float | None = None  # set by whoever waits for /ping (the benchmark)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path) -> "Stack":
        ports = free_ports(4)  # one block: the public port and Triton's three never collide
        self.port, self.triton_ports = ports[0], ports[1:]
        env = {
            **{key: value for key, value in os.environ.items() if key != TRITON_GRPC_URL},  # its own Triton
            BIND_TO_PORT: str(self.port),
            SAFE_PORT_RANGE: f"{self.triton_ports[0]}-{self.triton_ports[2]}",
            MODEL_REPOSITORY: str(self.repository),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **self.env_extra,
        }
        self.log_path = log_dir / f"serve-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "serve")], cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        return self

    def ping(self, timeout: float = 5.0) -> requests.Response:
        return requests.get(f"{self.url}/ping", timeout=timeout)

    def wait_healthy(self, timeout: float = 180.0) -> float:
        """Seconds from start until /ping said 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                if self.ping(timeout=2).status_code == 200:
                    return time.monotonic() - self.started_at
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"/ping not 200 within {timeout} s; log:\n{self.log_tail()}")

    def pids(self) -> dict[str, list[int]]:
        """The stack's processes by role: triton (and its stubs), router (gunicorn), nginx."""
        roles: dict[str, list[int]] = {"triton": [], "router": [], "nginx": []}
        for kid in children_of(self.proc.pid):
            line = cmdline(kid)
            role = "triton" if "tritonserver" in line else "router" if "gunicorn" in line else "nginx"
            roles[role] = [kid, *descendants(kid)]
        return roles

    def log_tail(self, lines: int = 60) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        every = [self.proc.pid, *descendants(self.proc.pid)]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=35)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in every:  # never leave anything behind, even when a test failed half-way
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._log is not None:
            self._log.close()
        return self.proc.returncode
