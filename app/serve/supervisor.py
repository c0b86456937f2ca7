"""`serve`: start Triton, the router (gunicorn + Flask) and NGINX, and supervise them.

- Triton first, then the router on a unix socket, then NGINX on the public port. /ping says
  503 until Triton and every model are ready, so nothing waits here for readiness.
- If any of the three exits, the other two are stopped and `serve` exits non-zero.
- SIGTERM drains: NGINX stops accepting and finishes what is in flight (up to 25 s), then the
  router and Triton stop; exit 0 within SageMaker's 30 s.
- Each child leads its own process group and dies with `serve` (PR_SET_PDEATHSIG), so stopping
  a group takes its workers and stubs with it and nothing is left behind.
"""

from __future__ import annotations

import ctypes
import json
import logging
import logging.config
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from app.core import logs
from app.core.health import health_policy
from app.core.model_store import ModelStore
from app.core.settings import (
    MALLOC_ARENA_MAX,
    MALLOC_MMAP_THRESHOLD,
    MODEL_REPOSITORY,
    PROJECT_ROOT,
    PROMETHEUS_MULTIPROC_DIR,
    ROUTER_BIND,
    TRITON_BIND_ADDRESS,
    TRITON_GRPC_URL,
    TRITON_HTTP_URL,
    TRITON_PID,
    Settings,
    is_model_repository,
    triton_ports,
)
from app.serve import sized_repository
from app.serve.engines import check_engines
from app.serve.nginx import find_nginx, nginx_command
from app.serve.pingserver import start_ping_server
from app.serve.tritonserver import (
    AUTO_COMPLETE_OFF,
    TritonNotFound,
    find_triton,
    left_to_auto_complete,
    remove_shm_regions,
    shm_prefix,
    stock_flags,
    triton_command,
)
from clients.families import check_specs, find_specs

log = logging.getLogger("serve")

DRAIN_TIMEOUT_S = 25  # SageMaker sends SIGKILL 30 s after SIGTERM
STOP_GRACE_S = 4  # after a child died: how long the others get before SIGKILL
POLL_S = 0.1
ROUTER_START_TIMEOUT_S = 30
GUNICORN_CONF = PROJECT_ROOT / "app" / "router" / "gunicorn_conf.py"
PR_SET_PDEATHSIG = 1

_stdout_lock = threading.Lock()


def _child_setup() -> None:
    """Runs in the child before exec: its own process group, and death with its parent."""
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the supervisor's own clean-up still applies


def _relay(name: str, stream: IO[bytes]) -> None:
    """Copy a child's output to stdout; lines that are not JSON already are wrapped in JSON."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if not line.strip():
            continue
        if not line.startswith("{"):
            line = json.dumps({"level": "INFO", "logger": name, "message": line}, ensure_ascii=False)
        with _stdout_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    stream.close()


def malloc_env(env: Mapping[str, str]) -> dict[str, str]:
    """glibc settings for Triton, which copies tensors of megabytes (a yolov5 output is 8.6 MB an
    image) between gRPC, its own buffers and the python backend.

    glibc raises its mmap threshold to the size of each large block freed, up to 32 MiB, after
    which such blocks come from the heap, and the heap keeps its high-water mark: resident memory
    then follows the largest burst ever seen, not the work in flight (a soak saw Triton's private
    memory wander between 570 and 670 MiB). A fixed threshold keeps blocks over 1 MiB in their own
    mappings, given back when freed. The router does without: there the fresh mappings' page
    faults doubled a yolov5 request's CPU time.
    """
    return {MALLOC_MMAP_THRESHOLD: env.get(MALLOC_MMAP_THRESHOLD, str(1 << 20))}


class Child:
    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None):
        self.name = name
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_child_setup,  # noqa: PLW1509 - only setsid and prctl, before any thread of the child
        )
        threading.Thread(target=_relay, args=(name, self.proc.stdout), daemon=True).start()
        log.info("started %s (pid %d)", name, self.proc.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout=max(timeout, 0))
            return True
        except subprocess.TimeoutExpired:
            return False


class Supervisor:
    def __init__(self, settings: Settings, env: Mapping[str, str]):
        self.settings = settings
        self.env = dict(env)
        self.children: list[Child] = []
        self.stop_requested = threading.Event()
        self.shm_prefix: str | None = None  # the shared-memory regions of the Triton started here

    def request_stop(self, signum: int, _frame: object) -> None:
        log.info("received %s: draining", signal.Signals(signum).name)
        self.stop_requested.set()

    def start(self, runtime_dir: Path) -> None:
        settings, env = self.settings, self.env
        repository, control = settings.model_repository, []
        if settings.multi_model:
            # SageMaker loads the models through /models: Triton starts on an empty repository and
            # loads and unloads what the router links there (app.core.model_store), each load sized then.
            repository, control = (
                ModelStore(settings.multi_model_dir).create().repository,
                ["--model-control-mode=explicit"],
            )
            triton_repository, plan = repository, sized_repository.workers_plan(env)
        elif not is_model_repository(repository):
            raise FileNotFoundError(f"{repository} holds no Triton model repository: run `make models` first")
        else:
            check_specs(repository, settings)  # a model.toml mistake: one line naming the file and the key
            check_engines(repository)  # a TensorRT plan built for another GPU type: a clear refusal
            # Triton loads the models with the counts sized for this machine (app/core/sized_repository.py).
            triton_repository, plan = sized_repository.sized_repository(repository, runtime_dir, env)
            left = left_to_auto_complete(repository)
            if left:
                log.info("Triton completes the configurations of %s (they leave something out)", ", ".join(left))
            else:
                control = [AUTO_COMPLETE_OFF]
        nginx_binary = find_nginx(env)  # before anything starts: a missing NGINX fails fast
        http, grpc, metrics = triton_ports(env)
        external_triton = env.get(TRITON_GRPC_URL, "").strip()
        if external_triton:
            log.info("using the Triton at %s (%s is set): not starting one", external_triton, TRITON_GRPC_URL)
        else:
            install = find_triton(env)
            backend_dir = install.prepare(runtime_dir)
            bind_address = env.get(TRITON_BIND_ADDRESS, "").strip() or "127.0.0.1"
            self.shm_prefix = shm_prefix()
            triton_argv = triton_command(
                install,
                triton_repository,
                (http, grpc, metrics),
                bind_address,
                backend_dir,
                extra_args=[*control, *stock_flags(env)],
                shm_prefix=self.shm_prefix,
            )
            self.children.append(Child("triton", triton_argv, {**env, **install.env, **malloc_env(env)}))

        socket_path = runtime_dir / "router.sock"
        metrics_dir = runtime_dir / "metrics"
        metrics_dir.mkdir()
        router_env = {
            **env,
            ROUTER_BIND: f"unix:{socket_path}",
            TRITON_GRPC_URL: external_triton or f"127.0.0.1:{grpc}",
            TRITON_HTTP_URL: env.get(TRITON_HTTP_URL, "").strip() or f"127.0.0.1:{http}",
            # multi-model loads charge each model what Triton's processes grew by (app.core.memory, app.core.procfs)
            **({TRITON_PID: str(triton.pid)} if (triton := self._child("triton")) else {}),
            MODEL_REPOSITORY: str(repository),
            # prometheus_client's multiprocess mode: every worker writes its counters here, and
            # /metrics adds them up, whichever worker answers.
            PROMETHEUS_MULTIPROC_DIR: str(metrics_dir),
            # glibc gives every thread that allocates its own arena (up to 8 a core): with a
            # worker's threads decoding images, resident memory climbs by tens of MB for no gain.
            MALLOC_ARENA_MAX: env.get(MALLOC_ARENA_MAX, "2"),
            **sized_repository.router_env(plan),
        }
        gunicorn_argv = [sys.executable, "-m", "gunicorn", "--config", str(GUNICORN_CONF), "app.router.wsgi:app"]
        router = Child("router", gunicorn_argv, router_env, cwd=PROJECT_ROOT)
        self.children.append(router)
        self._wait_for_socket(router, socket_path)

        # The models the router serves (those with a model.toml), each with the Triton models it
        # needs (its network, and its ensemble on the Triton pipeline): what every /ping answer lists.
        health = health_policy(settings, {} if settings.multi_model else find_specs(repository))
        ping_socket = runtime_dir / "ping.sock"
        start_ping_server(
            ping_socket,
            router_env[TRITON_GRPC_URL],
            settings.triton_timeout_s,
            settings.ping_timeout_s,
            health=health,
            router_up=lambda: router.alive() and socket_path.exists(),
        )

        nginx_argv = nginx_command(
            nginx_binary,
            runtime_dir,
            port=settings.port,
            router_socket=socket_path,
            ping_socket=ping_socket,
            proxy_timeout_s=settings.server_timeout_s + 5,
            # an unload waits for the requests in flight (MODEL_SERVER_TIMEOUT), then for Triton
            load_timeout_s=settings.model_load_timeout_s + settings.server_timeout_s + 10,
            drain_timeout_s=DRAIN_TIMEOUT_S - 1,
            models=sorted(health().served),
            max_body_bytes=settings.max_body_bytes,
            workers=plan.nginx_workers,
        )
        self.children.append(Child("nginx", nginx_argv, env))
        log.info(
            "serving on port %d: models from %s, Triton at %s, %d router workers",
            settings.port,
            repository,
            router_env[TRITON_GRPC_URL],
            plan.router_workers,
        )

    def _wait_for_socket(self, router: Child, socket_path: Path) -> None:
        """NGINX starts once the router listens, so early callers see 503s, not proxy errors.
        A router that dies or hangs on its way up is left to `supervise` to notice."""
        deadline = time.monotonic() + ROUTER_START_TIMEOUT_S
        while not socket_path.exists() and router.alive() and time.monotonic() < deadline:
            if self.stop_requested.wait(POLL_S):
                return

    def supervise(self) -> int:
        while not self.stop_requested.is_set():
            for child in self.children:
                if not child.alive():
                    log.error("%s exited with status %s: stopping the stack", child.name, child.proc.returncode)
                    self.stop_now()
                    return 1
            self.stop_requested.wait(POLL_S)
        return self.drain()

    def _child(self, name: str) -> Child | None:
        return next((c for c in self.children if c.name == name), None)

    def drain(self) -> int:
        """Stop taking connections, let requests in flight finish, then stop the rest."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        nginx, router, triton = self._child("nginx"), self._child("router"), self._child("triton")
        if nginx is not None:
            nginx.signal_group(signal.SIGQUIT)  # graceful: close listeners, finish requests
            nginx.wait(deadline - time.monotonic())
        if router is not None:
            router.signal_group(signal.SIGTERM)  # graceful; nothing is in flight any more
            router.wait(min(3.0, deadline + 2 - time.monotonic()))
        if triton is not None:
            triton.signal_group(signal.SIGTERM)  # SIGTERM lets the python backend free its shm
            triton.wait(4.0)
        self._kill_leftovers()
        log.info("stopped")
        return 0

    def stop_now(self) -> None:
        """A child died: stop the others quickly (NGINX and router first, Triton last)."""
        for child in self.children:
            if child.alive():
                child.signal_group(signal.SIGQUIT if child.name == "router" else signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in self.children:
            child.wait(deadline - time.monotonic())
        self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        """SIGKILL whatever remains in the children's process groups (workers, stubs), then remove the
        shared memory that Triton's python backend did not free (a stub or Triton killed)."""
        for child in self.children:
            child.signal_group(signal.SIGKILL)
        for child in self.children:
            child.wait(2.0)
        if self.shm_prefix is not None:
            removed = remove_shm_regions(self.shm_prefix)
            if removed:
                log.info("removed %d shared-memory regions Triton's python backend left", removed)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # SageMaker runs `docker run IMAGE serve`: with `serve` as the ENTRYPOINT that is `serve serve`.
    if argv and argv[0] == "serve":
        argv = argv[1:]
    if argv and argv[0] == "plan":  # the sizing's plan, nothing started (app/serve/sizing_plan.py)
        from app.serve import sizing_plan

        return sizing_plan.main(argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv:
        print(f"serve: unexpected arguments {argv}; usage: serve [serve] | serve plan [--help]", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env()
    except ValueError as e:
        print(f"serve: {e}", file=sys.stderr)
        return 2
    logging.config.dictConfig(logs.logging_config(settings.log_level))
    supervisor = Supervisor(settings, os.environ)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    runtime_dir = Path(tempfile.mkdtemp(prefix="serve-"))
    runtime_dir.chmod(0o711)  # NGINX workers (nobody, when started as root) reach the socket
    try:
        supervisor.start(runtime_dir)
        return supervisor.supervise()
    except (TritonNotFound, FileNotFoundError, ValueError) as e:
        log.error("cannot start: %s", e)
        supervisor.stop_now()
        return 2
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)
