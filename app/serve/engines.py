"""TensorRT plans run only on the GPU type they were built for: check that before Triton starts.

A plan (``model.plan``) is compiled for one GPU architecture: an engine built on a g4dn (T4,
compute capability 7.5) does not run on a g5 (A10G, 8.6), and Triton's own error says little.
``python -m scripts.model_prep --target tensorrt`` therefore writes which GPU it built on into a
record beside the plan (``model.plan.gpu.json``), and ``serve`` compares that record with the
GPUs it finds, refusing to start with a message that says what to rebuild where.

No plan, or no GPU visible: nothing to check. A plan without a record (built by other tools) is
started with a warning.
"""

from __future__ import annotations

import ctypes
import json
import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("serve.engines")

RECORD_SUFFIX = ".gpu.json"
PLAN_GLOB = "*/[0-9]*/*.plan"
# cuDeviceGetAttribute's CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
_CC_MAJOR, _CC_MINOR = 75, 76


class EngineMismatch(ValueError):
    """A plan in the repository was built for another GPU type than the one here."""


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str  # "7.5"


def record_path(plan: Path) -> Path:
    return plan.with_name(plan.name + RECORD_SUFFIX)


def write_record(plan: Path, gpu: GpuInfo, tensorrt_version: str | None = None) -> Path:
    """Write which GPU ``plan`` was built on beside it; returns the record's path."""
    path = record_path(plan)
    path.write_text(json.dumps({**asdict(gpu), "tensorrt_version": tensorrt_version}, indent=2) + "\n")
    return path


def read_record(plan: Path) -> GpuInfo | None:
    path = record_path(plan)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return GpuInfo(name=str(data["name"]), compute_capability=str(data["compute_capability"]))


def _gpus_from_cuda() -> list[GpuInfo] | None:
    """The GPUs the CUDA driver shows this process (honours CUDA_VISIBLE_DEVICES); None without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cuda.cuInit(0) != 0:
        return None
    count = ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    gpus = []
    for ordinal in range(count.value):
        device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        if (
            cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0
            or cuda.cuDeviceGetName(name, len(name), device) != 0
            or cuda.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, device) != 0
            or cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, device) != 0
        ):
            return None
        gpus.append(GpuInfo(name.value.decode(errors="replace"), f"{major.value}.{minor.value}"))
    return gpus


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """``nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader`` lines -> GpuInfo."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, capability = line.rpartition(",")
        gpus.append(GpuInfo(name.strip(), capability.strip()))
    return gpus


def _gpus_from_nvidia_smi() -> list[GpuInfo] | None:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        result = subprocess.run(
            [binary, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi(result.stdout) if result.returncode == 0 else None


def detect_gpus() -> list[GpuInfo]:
    """The GPUs visible here: the CUDA driver first, nvidia-smi else; [] when there is none."""
    for probe in (_gpus_from_cuda, _gpus_from_nvidia_smi):
        found = probe()
        if found is not None:
            return found
    return []


def find_plans(repository: Path) -> list[Path]:
    return sorted(repository.glob(PLAN_GLOB))


def check_engines(repository: Path, detect: Callable[[], Sequence[GpuInfo]] | None = None) -> None:
    """Raise EngineMismatch when a plan in ``repository`` was built for another GPU type than one here."""
    plans = find_plans(repository)
    if not plans:
        return
    gpus = list((detect or detect_gpus)())
    if not gpus:
        log.warning(
            "%d TensorRT plan(s) in %s but no GPU visible: Triton will fail to load them", len(plans), repository
        )
        return
    problems = []
    for plan in plans:
        built = read_record(plan)
        where = plan.relative_to(repository)
        if built is None:
            log.warning("%s has no %s record: cannot check which GPU it was built for", where, RECORD_SUFFIX)
            continue
        for gpu in gpus:
            if gpu.compute_capability != built.compute_capability:
                problems.append(
                    f"{where} was built on {built.name} (compute capability "
                    f"{built.compute_capability}); this GPU is {gpu.name} ({gpu.compute_capability})"
                )
            elif gpu.name != built.name:
                log.warning(
                    "%s was built on %s, runs on %s (same compute capability %s)",
                    where,
                    built.name,
                    gpu.name,
                    gpu.compute_capability,
                )
    if problems:
        unique = list(dict.fromkeys(problems))
        raise EngineMismatch(
            "TensorRT engines built for another GPU type: "
            + "; ".join(unique)
            + ". Rebuild them on this instance type (python -m scripts.model_prep --target tensorrt, "
            "see docs/deploying.md, 'TensorRT engines and the GPU type') and deploy the new repository."
        )
