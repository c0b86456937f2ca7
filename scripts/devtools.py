"""Development tools the scripts and the tests share: the real stack (`serve`: Triton, gunicorn,
NGINX) or Triton alone started on free ports, the free-port search, process helpers that read /proc
(state, children, command line, memory), and the percentile every report uses (numpy's)."""

from __future__ import annotations

import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import requests

from app.core.procfs import children_of, descendants, process_stat
from app.core.settings import (
    BIND_TO_PORT,
    MODEL_REPOSITORY,
    PROJECT_ROOT,
    SAFE_PORT_RANGE,
    TEST_FULL_MODEL_REPOSITORY,
    TEST_MODEL_REPOSITORY,
    TRITON_GRPC_URL,
)
from app.serve.tritonserver import find_triton, remove_shm_regions, shm_prefix, triton_command

DEFAULT_TEST_REPOSITORY = PROJECT_ROOT / "build" / "test-models"
DEFAULT_FULL_TEST_REPOSITORY = PROJECT_ROOT / "build" / "test-models-full"


def built_test_repository(full: bool = False) -> Path:
    """The repository `make test-models` built: small networks of each family (random weights), or,
    with ``full``, the shipped architectures at full size (random weights)."""
    variable, default = (
        (TEST_FULL_MODEL_REPOSITORY, DEFAULT_FULL_TEST_REPOSITORY)
        if full
        else (TEST_MODEL_REPOSITORY, DEFAULT_TEST_REPOSITORY)
    )
    path = Path(os.environ.get(variable, default))
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


def ephemeral_low(default: int = 32768) -> int:
    """The lowest port the kernel hands out to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_ports(count: int, start: int = 20000, stop: int | None = None) -> list[int]:
    """`count` consecutive free ports (Triton's safe range needs three in a row), below the
    ephemeral range: a port found free there can be taken by any outgoing connection before the
    server that was meant to get it binds it."""
    stop = min(stop or 60000, max(ephemeral_low(), start + 1000))
    base = start + (os.getpid() * 7919 + int(time.time() * 1000)) % (stop - start - 100)
    for low in [*range(base, stop - count, count + 1), *range(start, base, count + 1)]:
        if all(_port_free(p) for p in range(low, low + count)):
            return list(range(low, low + count))
    raise RuntimeError("no free ports")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by ``numpy.percentile``'s default (linear interpolation between
    the closest ranks); NaN for no values, where numpy raises. A q outside 0-100 is a ValueError."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def process_state(pid: int) -> str | None:
    """The state letter of a process (R, S, Z, T, ...), or None when it is gone."""
    stat = process_stat(pid)
    return None if stat is None else stat.state


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def proc_status(pid: int) -> dict[str, str] | None:
    """The fields of /proc/<pid>/status ({"VmRSS": "1234 kB", ...}), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return {name: value.strip() for name, _, value in (line.partition(":") for line in text.splitlines())}


def status_kib(fields: dict[str, str], name: str) -> int:
    """A memory field of /proc/<pid>/status in KiB (0 when the kernel does not report it)."""
    return int(fields.get(name, "0 kB").split()[0])


def rss_kib(pid: int) -> int | None:
    """The resident memory of a process in KiB (VmRSS), or None when it is gone."""
    fields = proc_status(pid)
    return None if fields is None else status_kib(fields, "VmRSS")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def stop_group(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Stop a process started in its own session (``start_new_session=True``) and all its group:
    SIGCONT (it may be stopped), SIGTERM (Triton's python backend frees its shared memory then),
    SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGCONT)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_http(host: str, port: int, path: str, timeout_s: float, proc: subprocess.Popen) -> float:
    """Seconds until GET ``path`` answers 200; raises when the process exits or time runs out."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the process exited with {proc.returncode} before {path} answered 200")
        try:
            conn = http.client.HTTPConnection(host, port, timeout=2)
            conn.request("GET", path)
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return time.monotonic() - began
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{path} on port {port} did not answer 200 within {timeout_s:.0f} s")


@dataclass
class Triton:
    """tritonserver alone (no router, no NGINX), in a process group of its own."""

    proc: subprocess.Popen
    ports: tuple[int, int, int]  # HTTP, gRPC, metrics
    shm_prefix: str | None = None  # its python backend's shared-memory regions, removed once it stopped

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"

    def wait_ready(self, timeout_s: float, models: Sequence[str] = ()) -> float:
        """Seconds until the server (or each of ``models``) says ready over HTTP."""
        began = time.monotonic()
        for path in [f"/v2/models/{name}/ready" for name in models] or ["/v2/health/ready"]:
            wait_http("127.0.0.1", self.ports[0], path, timeout_s, self.proc)
        return time.monotonic() - began

    def stop(self, timeout_s: float = 30.0) -> None:
        stop_group(self.proc, timeout_s)
        if self.shm_prefix is not None:
            remove_shm_regions(self.shm_prefix)


def start_triton(
    repository: Path,
    runtime: Path,
    ports: Sequence[int] | None = None,
    extra_args: Sequence[str] = (),
    env_extra: Mapping[str, str] | None = None,
    log: IO | None = None,
) -> Triton:
    """Triton as ``serve`` would run it (``app.serve.tritonserver``), on ``ports`` (HTTP, gRPC,
    metrics; three free ones by default); its output goes to ``log``, else nowhere."""
    install = find_triton()
    http_port, grpc_port, metrics_port = ports or free_ports(3)
    prefix = shm_prefix()
    argv = triton_command(
        install,
        repository,
        (http_port, grpc_port, metrics_port),
        backend_dir=install.prepare(runtime),
        extra_args=extra_args,
        shm_prefix=prefix,
    )
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **install.env, **(env_extra or {})},
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
        start_new_session=True,
    )
    return Triton(proc, (http_port, grpc_port, metrics_port), prefix)


@dataclass
class Stack:
    """``serve`` on ``repository``: its public port and Triton's three ports in one free block.

    A variant (the image's layout) overrides ``command``; everything else is shared."""

    repository: Path
    env_extra: dict = field(default_factory=dict)
    port: int = 0
    triton_ports: list[int] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    _log: IO | None = None
    _stopping: list[int] = field(default_factory=list)  # the processes a begun stop must see gone
    started_at: float = 0.0
    start_to_ping_s: float | None = None  # set by whoever waits for /ping (the benchmark)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> tuple[list[str], Path, str]:
        """What starts ``serve``: its argv, the folder it runs in, and the name of its log."""
        return [sys.executable, str(PROJECT_ROOT / "serve")], PROJECT_ROOT, "serve"

    def start(self, log_dir: Path) -> Stack:
        ports = free_ports(4)  # one block: the public port and Triton's three never collide
        self.port, self.triton_ports = ports[0], ports[1:]
        env = {
            **{key: value for key, value in os.environ.items() if key != TRITON_GRPC_URL},  # its own Triton
            BIND_TO_PORT: str(self.port),
            SAFE_PORT_RANGE: f"{self.triton_ports[0]}-{self.triton_ports[2]}",
            MODEL_REPOSITORY: str(self.repository),
            # `serve` runs with the python and the binaries of this environment.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **self.env_extra,
        }
        argv, cwd, name = self.command()
        self.log_path = log_dir / f"{name}-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def ping(self, timeout: float = 5.0) -> requests.Response:
        return requests.get(f"{self.url}/ping", timeout=timeout)

    def wait_healthy(self, timeout: float = 180.0) -> float:
        """Seconds from start until /ping said 200, and its own Triton's HTTP port answers too: Triton
        starts its gRPC service (what /ping asks) a moment before its HTTP one, which the tests and
        KServe v2 bodies call."""
        try:
            waited = wait_http("127.0.0.1", self.port, "/ping", timeout, self.proc)
            if TRITON_GRPC_URL not in self.env_extra:
                wait_http("127.0.0.1", self.triton_ports[0], "/v2/health/live", timeout - waited, self.proc)
        except (RuntimeError, TimeoutError) as error:
            raise RuntimeError(f"serve: {error}; log:\n{self.log_tail()}") from None
        return time.monotonic() - self.started_at

    def pids(self) -> dict[str, list[int]]:
        """The stack's processes by role: triton (and its stubs), router (gunicorn), nginx."""
        roles: dict[str, list[int]] = {"triton": [], "router": [], "nginx": []}
        for kid in children_of(self.proc.pid):
            line = cmdline(kid)
            role = "triton" if "tritonserver" in line else "router" if "gunicorn" in line else "nginx"
            roles[role] = [kid, *descendants(kid)]
        return roles

    def router_workers(self) -> list[int]:
        """The gunicorn workers: the children of the router's master process."""
        return [kid for master in self.pids()["router"][:1] for kid in children_of(master)]

    def log_tail(self, lines: int = 60) -> str:
        """The log's last lines, a run of one repeated message (the router's pings while Triton loads)
        shown once with its count, so that what Triton said before it ended stays in view."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        kept: list[str] = []
        last, repeated = None, 0
        for line in self.log_path.read_text(errors="replace").splitlines():
            message = _message(line)
            if message == last:
                repeated += 1
                continue
            if repeated:
                kept.append(f"... the line above {repeated} more times")
            kept.append(line)
            last, repeated = message, 0
        if repeated:
            kept.append(f"... the line above {repeated} more times")
        return "\n".join(kept[-lines:])

    def stop(self) -> int | None:
        """SIGTERM, then wait for ``serve`` to exit; its exit status."""
        self.begin_stop()
        return self.finish_stop()

    def begin_stop(self) -> None:
        """SIGTERM to ``serve`` (Triton takes a few seconds to unload its models): ``finish_stop`` waits."""
        if self.proc is None or self._stopping:
            return
        self._stopping = [self.proc.pid, *descendants(self.proc.pid)]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def finish_stop(self) -> int | None:
        if self.proc is None:
            return None
        self.begin_stop()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=35)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self._stopping:  # never leave anything behind, even when a test failed half-way
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._log is not None:
            self._log.close()
        return self.proc.returncode


def _message(line: str) -> str:
    """A JSON log line's message (its time and process left out), else the line."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line
    return str(entry.get("message", line)) if isinstance(entry, dict) else line
