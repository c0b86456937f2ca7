"""Settings from the environment: every variable's name lives here, read once into a frozen object."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")

# Environment variable names (docs/configuration.md lists every one, docs/reference/api.md the limits).
BIND_TO_PORT = "SAGEMAKER_BIND_TO_PORT"
SAFE_PORT_RANGE = "SAGEMAKER_SAFE_PORT_RANGE"
WORKERS = "MODEL_SERVER_WORKERS"
SERVER_TIMEOUT = "MODEL_SERVER_TIMEOUT"
TRITON_TIMEOUT = "TRITON_TIMEOUT_S"
BODY_LIMIT = "MAX_BODY_BYTES"
# The stock SageMaker Triton image's: `ready` (default) or `live` (app.core.health).
PING_MODE = "SAGEMAKER_TRITON_PING_MODE"
CONCURRENT_TRANSFORMS = "MAX_CONCURRENT_TRANSFORMS"
MAX_IMAGE_PIXELS = "MAX_IMAGE_PIXELS"
LOG_LEVEL = "LOG_LEVEL"
TRITON_BIND_ADDRESS = "TRITON_BIND_ADDRESS"
# Set by `serve` for the router processes; a developer may set them to use a Triton of their own.
TRITON_GRPC_URL = "TRITON_GRPC_URL"
TRITON_HTTP_URL = "TRITON_HTTP_URL"  # KServe v2 bodies are passed to Triton's HTTP endpoint
TRITON_PID = "TRITON_PID"  # the Triton `serve` started: multi-model loads measure its memory
# The stock SageMaker Triton image's: the model a KServe v2 body goes to when the request names none.
DEFAULT_MODEL_NAME = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
MODEL_REPOSITORY = "MODEL_REPOSITORY"
# SageMaker sets it on a multi-model endpoint: models are loaded and unloaded through /models.
MULTI_MODEL = "SAGEMAKER_MULTI_MODEL"
# Multi-model mode: where loaded models are linked for Triton and recorded for the router's workers.
MULTI_MODEL_DIR = "MULTI_MODEL_DIR"
# Multi-model mode: the most bytes the loaded models may take (each charged what Triton grew by as it
# loaded, or its files where more; a load past it is a 507).
MODEL_MEMORY_LIMIT = "MODEL_MEMORY_LIMIT_BYTES"
# Multi-model mode: seconds a load (or an unload) may take; SageMaker waits up to 360 s for one.
MODEL_LOAD_TIMEOUT = "MODEL_LOAD_TIMEOUT"
ROUTER_THREADS = "MODEL_SERVER_THREADS"
# The sizing (app.core.sizing): what it sees, and counts given instead of its own. `serve` sets
# MODEL_SERVER_WORKERS and NGINX_WORKERS for the router from the plan when they are not set.
SIZING_VCPUS = "SIZING_VCPUS"  # the vCPUs the sizing sees instead of the process's affinity and quota
NGINX_WORKERS = "NGINX_WORKERS"
TRITON_INSTANCES = "TRITON_INSTANCES"  # "[NAME=]N,...": instances (copies per GPU on a GPU) of Triton models
TRITON_THREADS = "TRITON_THREADS"  # "[NAME=]N,...": ONNX Runtime intra-op threads, DALI num_threads
# Where gunicorn listens; `serve` sets a unix socket that only NGINX reaches.
ROUTER_BIND = "GUNICORN_BIND"
# Set by `serve` for the router: prometheus_client's multiprocess directory (app.router.observability).
PROMETHEUS_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
# Where `serve` finds its binaries when they are not on PATH.
NGINX_BIN = "NGINX_BIN"
TRITON_SERVER_BIN = "TRITON_SERVER_BIN"
# glibc's malloc tuning that `serve` sets for its children (app.serve.supervisor.malloc_env).
MALLOC_MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"
MALLOC_ARENA_MAX = "MALLOC_ARENA_MAX"
# Families of one's own, served beside the built-in ones: importable modules (comma-separated), each
# ending with a `FAMILY = Family(...)` (clients.families reads it once, at import, in every process).
FAMILY_MODULES = "FAMILY_MODULES"
# Set by `python -m scripts.sagemaker deploy`: the endpoint's name, on every access line (its
# per-model CloudWatch metrics take the EndpointName dimension from it).
ENDPOINT_NAME = "ENDPOINT_NAME"
# The local stack's answer to boto3's invoke_endpoint_with_response_stream (app/router/event_stream.py):
# PayloadParts of at most this many bytes (0: one a chunk). SageMaker's may end anywhere; smaller parts
# show that a caller joins them.
LOCAL_STREAM_PART_BYTES = "LOCAL_STREAM_PART_BYTES"
# Development: the repository `make test-models` built, for the tests, the soak and the benchmark.
TEST_MODEL_REPOSITORY = "TEST_MODEL_REPOSITORY"  # the test suite's repository: small networks of each family
TEST_FULL_MODEL_REPOSITORY = "TEST_FULL_MODEL_REPOSITORY"  # the same models at full size (a few tests)

MIB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 6 * MIB  # SageMaker's real-time payload limit
DEFAULT_SERVER_TIMEOUT_S = 60.0  # and its real-time deadline
DEFAULT_LOAD_TIMEOUT_S = 360.0  # how long SageMaker waits for a multi-model endpoint's load
# What SageMaker allows an asynchronous endpoint: the most either setting may be raised to.
ASYNC_MAX_BODY_BYTES = 1024 * MIB
ASYNC_MAX_TIMEOUT_S = 3600.0
# Batch Transform's bounds: MaxPayloadInMB <= 100, and MaxConcurrentTransforms * MaxPayloadInMB <= 100.
TRANSFORM_MAX_PAYLOAD_MB = 100
LOOPBACK = "127.0.0.1"
TRITON_PORTS = (8000, 8001, 8002)  # HTTP, gRPC, metrics: Triton's own, when no safe port range is set


def is_model_repository(path: Path) -> bool:
    """True when ``path`` holds at least one model folder with a config.pbtxt."""
    return path.is_dir() and any((p / "config.pbtxt").is_file() for p in path.iterdir() if p.is_dir())


def default_model_repository() -> Path:
    """``/opt/ml/model`` when SageMaker put a Triton repository there, else the image's ``models/``."""
    if is_model_repository(SAGEMAKER_MODEL_DIR):
        return SAGEMAKER_MODEL_DIR
    return PROJECT_ROOT / "models"


def triton_ports(env: Mapping[str, str]) -> tuple[int, int, int]:
    """Triton's HTTP, gRPC and metrics ports: 8000-8002, or the lowest three of the safe range."""
    spec = env.get(SAFE_PORT_RANGE, "").strip()
    if not spec:
        return TRITON_PORTS
    low, _, high = spec.partition("-")
    low_port, high_port = int(low), int(high or low)
    if high_port - low_port < 2:
        raise ValueError(f"{SAFE_PORT_RANGE}={spec!r} holds fewer than the three ports Triton needs")
    return low_port, low_port + 1, low_port + 2


READY_PING, LIVE_PING = "ready", "live"


def flag(raw: str) -> bool:
    """``true`` or ``false`` (any case), as SageMaker writes its switches."""
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"expected true or false, got {raw!r}")
    return value == "true"


def ping_mode(raw: str) -> str:
    mode = raw.strip().lower()
    if mode not in (READY_PING, LIVE_PING):
        raise ValueError(f"{PING_MODE}={raw!r}: expected {READY_PING!r} or {LIVE_PING!r}")
    return mode


def _parse(name: str, raw: str, kind: Callable[[str], Any], maximum: float | None = None) -> Any:
    """A variable's text as its field's type; a number must be positive (an integer at least 1)
    and at most ``maximum`` when the field has one."""
    if kind not in (int, float):
        try:
            return kind(raw)
        except ValueError as error:
            message = str(error)
            raise ValueError(message if message.startswith(name) else f"{name}: {message}") from None
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is int and value < 1:
        raise ValueError(f"{name}={value} is below its minimum 1")
    if not value > 0:
        raise ValueError(f"{name}={value} must be positive")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value} is above its maximum {maximum:g}")
    return value


def default_workers() -> int:
    """One router worker per core."""
    return os.cpu_count() or 1


# The fields read from the environment: each one's variable and type (numbers must be positive).
ENV_FIELDS: Mapping[str, tuple[str, Callable[[str], Any]]] = {
    "port": (BIND_TO_PORT, int),
    "workers": (WORKERS, int),
    "threads": (ROUTER_THREADS, int),
    "server_timeout_s": (SERVER_TIMEOUT, float),
    "max_body_bytes": (BODY_LIMIT, int),
    "max_concurrent_transforms": (CONCURRENT_TRANSFORMS, int),
    "triton_timeout_s": (TRITON_TIMEOUT, float),
    "max_image_pixels": (MAX_IMAGE_PIXELS, int),
    "log_level": (LOG_LEVEL, str.upper),
    "triton_grpc_url": (TRITON_GRPC_URL, str),
    "triton_http_url": (TRITON_HTTP_URL, str),
    "triton_pid": (TRITON_PID, int),
    "default_model_name": (DEFAULT_MODEL_NAME, str),
    "model_repository": (MODEL_REPOSITORY, Path),
    "router_bind": (ROUTER_BIND, str),
    "ping_mode": (PING_MODE, ping_mode),
    "multi_model": (MULTI_MODEL, flag),
    "multi_model_dir": (MULTI_MODEL_DIR, Path),
    "model_memory_limit_bytes": (MODEL_MEMORY_LIMIT, int),
    "model_load_timeout_s": (MODEL_LOAD_TIMEOUT, float),
    "endpoint_name": (ENDPOINT_NAME, str),
    "local_stream_part_bytes": (LOCAL_STREAM_PART_BYTES, int),
}

# Upper bounds of the fields that have one.
ENV_MAXIMA: Mapping[str, float] = {
    "server_timeout_s": ASYNC_MAX_TIMEOUT_S,
    "max_body_bytes": ASYNC_MAX_BODY_BYTES,
    "model_load_timeout_s": ASYNC_MAX_TIMEOUT_S,
}


@dataclass(frozen=True)
class Settings:
    """Every default is the field's own: ``from_env`` gives a field only what its variable says."""

    port: int = 8080
    workers: int = field(default_factory=default_workers)
    threads: int = 16
    server_timeout_s: float = DEFAULT_SERVER_TIMEOUT_S
    triton_timeout_s: float = 30.0
    max_image_pixels: int = 40_000_000
    log_level: str = "INFO"
    triton_grpc_url: str = f"{LOOPBACK}:{TRITON_PORTS[1]}"
    triton_http_url: str = f"{LOOPBACK}:{TRITON_PORTS[0]}"
    triton_pid: int = 0  # 0: not known (a Triton of one's own); a multi-model load then counts files only
    default_model_name: str = ""
    model_repository: Path = field(default_factory=default_model_repository)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # 0: two Batch Transform requests per router worker; while one waits on Triton, the other's
    # lines are read and prepared (each request is itself many lines, batched to Triton).
    max_concurrent_transforms: int = 0
    # /ping must answer within 2 s even when Triton hangs: each readiness call gets this deadline.
    ping_timeout_s: float = 0.5
    # A list input longer than this is refused; shorter lists are split at the model's max_batch_size.
    max_batch_items: int = 64
    router_bind: str = "unix:/tmp/router.sock"
    # Empty: the stock image's default, ``ready`` for one set of models, ``live`` in multi-model mode.
    ping_mode: str = ""
    multi_model: bool = False
    multi_model_dir: Path = Path("/tmp/multi-model")
    model_memory_limit_bytes: int = 0  # 0: only the memory the machine has available bounds a load
    model_load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    endpoint_name: str = ""  # on every access line when set
    local_stream_part_bytes: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Each field of ``ENV_FIELDS`` from its variable when that is set and not blank, else its default."""
        env = os.environ if env is None else env
        http_port, grpc_port, _ = triton_ports(env)  # a safe port range moves Triton's ports
        given: dict[str, Any] = {
            "triton_grpc_url": f"{LOOPBACK}:{grpc_port}",
            "triton_http_url": f"{LOOPBACK}:{http_port}",
        }
        for name, (variable, kind) in ENV_FIELDS.items():
            raw = env.get(variable, "").strip()
            if raw:
                given[name] = _parse(variable, raw, kind, ENV_MAXIMA.get(name))
        return cls(**given)

    @property
    def ping(self) -> str:
        """The ping mode in force: the one set, else ``live`` in multi-model mode and ``ready`` otherwise."""
        return self.ping_mode or (LIVE_PING if self.multi_model else READY_PING)

    def execution_parameters(self) -> dict[str, Any]:
        """What ``GET /execution-parameters`` answers Batch Transform: the body limit in whole MB
        (at most 100) and the concurrency, bounded so that their product stays within 100 MB."""
        payload_mb = max(1, min(TRANSFORM_MAX_PAYLOAD_MB, self.max_body_bytes // MIB))
        return {
            "MaxConcurrentTransforms": max(
                1, min(self.max_concurrent_transforms or 2 * self.workers, TRANSFORM_MAX_PAYLOAD_MB // payload_mb)
            ),
            "BatchStrategy": "MULTI_RECORD",
            "MaxPayloadInMB": payload_mb,
        }
