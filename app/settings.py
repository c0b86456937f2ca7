"""Settings from the environment: every variable's name lives here, read once into a frozen object."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")

# Environment variable names (CONTRACT.md lists the public ones).
BIND_TO_PORT = "SAGEMAKER_BIND_TO_PORT"
SAFE_PORT_RANGE = "SAGEMAKER_SAFE_PORT_RANGE"
WORKERS = "MODEL_SERVER_WORKERS"
SERVER_TIMEOUT = "MODEL_SERVER_TIMEOUT"
TRITON_TIMEOUT = "TRITON_TIMEOUT_S"
MAX_IMAGE_PIXELS = "MAX_IMAGE_PIXELS"
LOG_LEVEL = "LOG_LEVEL"
TRITON_BIND_ADDRESS = "TRITON_BIND_ADDRESS"
# Set by `serve` for the router processes; a developer may set them to use a Triton of their own.
TRITON_GRPC_URL = "TRITON_GRPC_URL"
MODEL_REPOSITORY = "MODEL_REPOSITORY"
ROUTER_THREADS = "MODEL_SERVER_THREADS"
# Where gunicorn listens; `serve` sets a unix socket that only NGINX reaches.
ROUTER_BIND = "GUNICORN_BIND"

MAX_BODY_BYTES = 6 * 1024 * 1024  # SageMaker's real-time payload limit


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
        return 8000, 8001, 8002
    low, _, high = spec.partition("-")
    low_port, high_port = int(low), int(high or low)
    if high_port - low_port < 2:
        raise ValueError(f"{SAFE_PORT_RANGE}={spec!r} holds fewer than the three ports Triton needs")
    return low_port, low_port + 1, low_port + 2


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} is below its minimum {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{name}={value} must be positive")
    return value


@dataclass(frozen=True)
class Settings:
    port: int = 8080
    workers: int = 2
    threads: int = 16
    server_timeout_s: float = 60.0
    triton_timeout_s: float = 30.0
    max_image_pixels: int = 40_000_000
    log_level: str = "INFO"
    triton_grpc_url: str = "127.0.0.1:8001"
    model_repository: Path = PROJECT_ROOT / "models"
    max_body_bytes: int = MAX_BODY_BYTES
    # /ping must answer within 2 s even when Triton hangs: each readiness call gets this deadline.
    ping_timeout_s: float = 0.5
    # A list input longer than this is refused; shorter lists are split at the model's max_batch_size.
    max_batch_items: int = 64
    router_bind: str = "unix:/tmp/router.sock"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        _, grpc_port, _ = triton_ports(env)
        repository = env.get(MODEL_REPOSITORY, "").strip()
        return cls(
            port=_int(env, BIND_TO_PORT, 8080),
            workers=_int(env, WORKERS, os.cpu_count() or 1),
            threads=_int(env, ROUTER_THREADS, 16),
            server_timeout_s=_float(env, SERVER_TIMEOUT, 60.0),
            triton_timeout_s=_float(env, TRITON_TIMEOUT, 30.0),
            max_image_pixels=_int(env, MAX_IMAGE_PIXELS, 40_000_000),
            log_level=env.get(LOG_LEVEL, "INFO").strip().upper() or "INFO",
            triton_grpc_url=env.get(TRITON_GRPC_URL, "").strip() or f"127.0.0.1:{grpc_port}",
            model_repository=Path(repository) if repository else default_model_repository(),
            router_bind=env.get(ROUTER_BIND, "").strip() or cls.router_bind,
        )
