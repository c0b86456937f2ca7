"""Find a Triton Inference Server binary and build the command line that runs it.

Three places, in this order: ``$TRITON_SERVER_BIN``, ``tritonserver`` on ``PATH`` (the NGC image),
and the standalone server inside the ``nvidia-pytriton`` wheel (any laptop; python backend only).
The wheel's server needs a little set-up, which `prepare` does in a runtime directory.

The python backend keeps a shared-memory region per stub in ``/dev/shm`` (RAM), named with a
prefix: each Triton started here gets one of its own (``shm_prefix``), so that whoever started it
removes what it left once it has stopped (``remove_shm_regions``). A Triton or a stub killed before
it frees its regions (SIGKILL, the OOM killer, a crash) would otherwise hold that memory until the
machine restarts: tens of MiB a stub, which a test suite that kills Triton on purpose piles up.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import secrets
import shlex
import shutil
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.core.model_store import CONFIG_FILE
from app.core.settings import TRITON_SERVER_BIN

# Triton's auto-completion reads each model to fill in what its configuration leaves out; for a
# python-backend model that is a stub process started (importing its model.py: torch, for a
# text2text model) and stopped before the model's own instances start. Configurations that leave
# nothing out are loaded without it.
AUTO_COMPLETE_OFF = "--disable-auto-complete-config"


class TritonNotFound(RuntimeError):
    pass


# AWS's SageMaker Triton image's variables that become tritonserver flags here, as its `serve`
# script turns them (docs/calling.md, "For users of AWS's SageMaker Triton image", lists every variable).
STOCK_FLAGS: Mapping[str, str] = {
    "SAGEMAKER_TRITON_LOG_VERBOSE": "--log-verbose={}",
    "SAGEMAKER_TRITON_LOG_INFO": "--log-info={}",
    "SAGEMAKER_TRITON_LOG_WARNING": "--log-warning={}",
    "SAGEMAKER_TRITON_LOG_ERROR": "--log-error={}",
    "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "--backend-config=python,shm-default-byte-size={}",
    "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "--backend-config=python,shm-growth-byte-size={}",
    "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT": "--buffer-manager-thread-count={}",
}
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"  # the python backend's own, before ours is added
MODEL_LOAD_GPU_LIMIT = "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT"  # a fraction, for every GPU
ADDITIONAL_ARGS = "SAGEMAKER_TRITON_ADDITIONAL_ARGS"  # further tritonserver flags, as a shell would split them


def stock_flags(env: Mapping[str, str], gpus: int | None = None) -> list[str]:
    """The tritonserver flags the stock image's variables set in ``env`` ask for."""
    flags = [template.format(env[name].strip()) for name, template in STOCK_FLAGS.items() if env.get(name, "").strip()]
    limit = env.get(MODEL_LOAD_GPU_LIMIT, "").strip()
    if limit:
        count = len(glob.glob("/dev/nvidia[0-9]*")) if gpus is None else gpus
        flags += [f"--model-load-gpu-limit={gpu}:{limit}" for gpu in range(count)]
    return flags + shlex.split(env.get(ADDITIONAL_ARGS, ""))


def left_to_auto_complete(repository: Path) -> list[str]:
    """The models of ``repository`` whose configuration leaves something to Triton's auto-completion:
    no backend or platform, no inputs or outputs, no ``max_batch_size`` written (Triton may then pick
    one), or a python model whose model.py completes its own configuration (``auto_complete_config``)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    left = []
    for folder in sorted(p for p in Path(repository).iterdir() if (p / CONFIG_FILE).is_file()):
        text = (folder / CONFIG_FILE).read_text(errors="replace")
        try:
            config = text_format.Parse(text, mc.ModelConfig())
        except text_format.ParseError:
            left.append(folder.name)  # Triton says what is wrong with it
            continue
        own_completion = config.backend == "python" and any(
            "def auto_complete_config" in model.read_text(errors="replace") for model in folder.glob("*/model.py")
        )
        written = (config.backend or config.platform) and config.input and config.output
        if not written or "max_batch_size" not in text or own_completion:
            left.append(folder.name)
    return left


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    # Set for the wheel's server only: where its backends and python stub live.
    wheel_root: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def prepare(self, runtime_dir: Path) -> Path | None:
        """Lay out a backend directory the server can use; None when the server has its own."""
        if self.wheel_root is None:
            return None
        backends = runtime_dir / "backends"
        if not backends.exists():
            shutil.copytree(self.wheel_root / "backends", backends)
            stub = self.wheel_root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
            shutil.copy2(stub / "triton_python_backend_stub", backends / "python" / "triton_python_backend_stub")
        return backends


def _wheel_root() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    return root if (root / "bin" / "tritonserver").is_file() else None


def _wheel_env(wheel_root: Path, base: Mapping[str, str]) -> dict[str, str]:
    """The stub finds neither its libraries nor its packages without these."""
    libs = wheel_root.parent.parent / "nvidia_pytriton.libs"
    lib_path = [sysconfig.get_config_var("LIBDIR") or "", str(libs)]
    if base.get("LD_LIBRARY_PATH"):
        lib_path.append(base["LD_LIBRARY_PATH"])
    # The stub's interpreter ignores PYTHONPATH: it uses the first python3 on PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", os.defpath)])
    return {"LD_LIBRARY_PATH": os.pathsep.join(p for p in lib_path if p), "PATH": path}


def find_triton(env: Mapping[str, str] | None = None) -> TritonInstall:
    env = os.environ if env is None else env
    explicit = env.get(TRITON_SERVER_BIN, "").strip()
    if explicit:
        binary = Path(explicit)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise TritonNotFound(f"{TRITON_SERVER_BIN}={explicit} is not an executable file")
        return TritonInstall(binary=binary)
    on_path = shutil.which("tritonserver", path=env.get("PATH"))
    if on_path:
        return TritonInstall(binary=Path(on_path))
    wheel_root = _wheel_root()
    if wheel_root is not None:
        return TritonInstall(
            binary=wheel_root / "bin" / "tritonserver", wheel_root=wheel_root, env=_wheel_env(wheel_root, env)
        )
    raise TritonNotFound(
        "no Triton Inference Server found: set TRITON_SERVER_BIN, put tritonserver on PATH, "
        "or pip install nvidia-pytriton (make run does this)"
    )


def shm_prefix() -> str:
    """A prefix for the python backend's shared-memory regions of one Triton, unique on the machine
    (this process's id and a random part: Tritons of other stacks must keep theirs)."""
    return f"{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(4)}_"


def remove_shm_regions(prefix: str, shm_dir: Path = SHM_DIR) -> int:
    """Unlink the shared-memory regions named with ``prefix`` (a stopped Triton's); how many there were.
    A region still mapped by a process lives on until that process unmaps it: only its name goes."""
    regions = list(shm_dir.glob(f"{glob.escape(prefix)}*"))
    for path in regions:
        path.unlink(missing_ok=True)
    return len(regions)


def triton_command(
    install: TritonInstall,
    repository: Path,
    ports: Sequence[int],
    bind_address: str = "127.0.0.1",
    backend_dir: Path | None = None,
    exit_timeout_s: int = 3,
    extra_args: Sequence[str] = (),
    shm_prefix: str | None = None,
) -> list[str]:
    http, grpc, metrics = ports
    command = [
        str(install.binary),
        f"--model-repository={repository}",
        f"--http-address={bind_address}",
        f"--http-port={http}",
        f"--grpc-address={bind_address}",
        f"--grpc-port={grpc}",
        f"--metrics-address={bind_address}",
        f"--metrics-port={metrics}",
        # Triton's readiness is its own, not its models': /ping checks each required model itself
        # (app.core.health), so an optional model that failed to load does not make it unhealthy.
        "--strict-readiness=false",
        # A model that fails to load leaves Triton up: /ping lists that model's state and the
        # other models keep serving, instead of the whole server exiting.
        "--exit-on-error=false",
        f"--exit-timeout-secs={exit_timeout_s}",
    ]
    if install.wheel_root is not None:
        # No GPU in the wheel's world: skip GPU metrics and the pinned (CUDA host) memory pool.
        command += ["--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0"]
    if backend_dir is not None:
        command.append(f"--backend-directory={backend_dir}")
    if shm_prefix is not None:
        command.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix}")
    command += list(extra_args)
    return command
