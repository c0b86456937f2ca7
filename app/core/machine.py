"""What the machine serving the models has: the vCPUs this process may use, its GPUs (and whether
each has a hardware JPEG decoder) and its memory; and the same figures for SageMaker's instance
types, so that a plan can be printed for one without being on it (``app.core.sizing``).

vCPUs are the fewer of the process's CPU affinity (what ``taskset`` and a container's cpuset allow)
and its cgroups' CPU quota (``docker run --cpus``, ``app.core.cgroup``), never ``os.cpu_count()``,
which sees the host; memory is MemTotal, or the cgroups' limit where that is less.
GPUs come from NVML (the ``nvidia-ml-py`` package) where it answers, else from the driver's
``/proc/driver/nvidia/gpus``; ``CUDA_VISIBLE_DEVICES`` narrows them as it narrows Triton's.
Standard library only (NVML is imported where it is asked).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.core.cgroup import cpu_limit, memory_limit
from app.core.procfs import meminfo
from app.core.settings import SIZING_VCPUS as VCPUS_VARIABLE

GIB = 1024**3

# GPUs with nvJPEG's hardware JPEG decoder (NVIDIA's nvJPEG documentation: A100, A30, H100/H200,
# L4, L40/L40S; Blackwell has one too). The A10G (ml.g5) and the T4 (ml.g4dn) do not: there nvJPEG
# decodes on the CPU's threads and the GPU (hybrid), and DALI needs more CPU per image.
JPEG_ENGINE_GPUS = ("A100", "A30", "H100", "H200", "GH200", "L4", "L40", "B200")


def has_jpeg_engine(name: str) -> bool:
    """Whether the GPU ``name`` (NVML's, e.g. "NVIDIA H100 80GB HBM3", "NVIDIA A10G") has a JPEG engine."""
    words = name.upper().replace("-", " ").split()
    return any(word in (model, model + "S") for word in words for model in JPEG_ENGINE_GPUS)


@dataclass(frozen=True)
class Gpu:
    name: str
    jpeg_engine: bool


@dataclass(frozen=True)
class Machine:
    """What the sizing sizes for; ``source`` says where the figures came from."""

    vcpus: float
    gpus: tuple[Gpu, ...] = ()
    memory_bytes: int = 0
    source: str = ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_model(self) -> str:
        """The GPUs' model ("" without one); a machine's GPUs are of one model."""
        return self.gpus[0].name if self.gpus else ""

    @property
    def jpeg_engine(self) -> bool:
        return bool(self.gpus) and all(gpu.jpeg_engine for gpu in self.gpus)

    def describe(self) -> str:
        gpus = (
            f"{self.gpu_count} x {self.gpu_model} ({'with' if self.jpeg_engine else 'without'} a JPEG engine)"
            if self.gpus
            else "no GPU"
        )
        return f"{self.vcpus:g} vCPU{'' if self.vcpus == 1 else 's'}, {gpus}, {self.memory_bytes / GIB:.0f} GiB ({self.source})"


def _gpus(name: str, count: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(name, has_jpeg_engine(name)) for _ in range(count))


def _instance(vcpus: int, gib: int, gpus: int = 0, gpu: str = "") -> Machine:
    return Machine(float(vcpus), _gpus(gpu, gpus), gib * GIB, "SageMaker instance type")


# SageMaker's instance types (AWS's instance type pages): vCPUs, memory, GPUs.
INSTANCE_TYPES: Mapping[str, Machine] = {
    "ml.m5.large": _instance(2, 8),
    "ml.m5.xlarge": _instance(4, 16),
    "ml.c5.xlarge": _instance(4, 8),
    "ml.c5.4xlarge": _instance(16, 32),
    "ml.c5.9xlarge": _instance(36, 72),
    "ml.c6i.32xlarge": _instance(128, 256),
    "ml.g4dn.xlarge": _instance(4, 16, 1, "Tesla T4"),
    "ml.g4dn.12xlarge": _instance(48, 192, 4, "Tesla T4"),
    "ml.g5.xlarge": _instance(4, 16, 1, "NVIDIA A10G"),
    "ml.g5.2xlarge": _instance(8, 32, 1, "NVIDIA A10G"),
    "ml.g5.4xlarge": _instance(16, 64, 1, "NVIDIA A10G"),
    "ml.g5.12xlarge": _instance(48, 192, 4, "NVIDIA A10G"),
    "ml.g5.48xlarge": _instance(192, 768, 8, "NVIDIA A10G"),
    "ml.g6.xlarge": _instance(4, 16, 1, "NVIDIA L4"),
    "ml.g6.2xlarge": _instance(8, 32, 1, "NVIDIA L4"),
    "ml.g6.12xlarge": _instance(48, 192, 4, "NVIDIA L4"),
    "ml.g6e.xlarge": _instance(4, 32, 1, "NVIDIA L40S"),
    "ml.p4d.24xlarge": _instance(96, 1152, 8, "NVIDIA A100-SXM4-40GB"),
    "ml.p5.48xlarge": _instance(192, 2048, 8, "NVIDIA H100 80GB HBM3"),
}


def affinity_vcpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def memory_bytes(root: Path = Path("/")) -> int:
    """MemTotal, or the process's memory cgroup limit where that is less (0 where neither can be read)."""
    return min((f for f in (meminfo(root).get("MemTotal"), memory_limit(root)) if f is not None), default=0)


def _nvml_gpu_names() -> list[str] | None:
    """The GPUs' names from NVML; None where NVML is not there or does not answer (no driver)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml's NVMLError family: no library, no driver, no device
        return None
    try:
        names = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    except Exception:  # noqa: BLE001 - as above
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - shutting down what answered; nothing to do
            pass


def _proc_gpu_names(root: Path) -> list[str]:
    names = []
    for info in sorted((root / "proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model":
                    names.append(value.strip())
        except OSError:
            continue
    return names


def visible(names: list[str], env: Mapping[str, str]) -> list[str]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves (indices; a list of UUIDs counts as that many)."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return names
    chosen = [item.strip() for item in raw.split(",") if item.strip()]
    if chosen and all(item.isdigit() for item in chosen):
        return [names[int(item)] for item in chosen if int(item) < len(names)]
    return names[: len(chosen)] if chosen and chosen != ["-1"] else []


def detect(env: Mapping[str, str] | None = None, root: Path = Path("/")) -> Machine:
    """This machine as the process sees it; ``SIZING_VCPUS`` replaces the vCPUs it finds."""
    env = os.environ if env is None else env
    names = _nvml_gpu_names()
    names = visible(names if names is not None else _proc_gpu_names(root), env)
    gpus = tuple(Gpu(name, has_jpeg_engine(name)) for name in names)
    given = env.get(VCPUS_VARIABLE, "").strip()
    if given:
        try:
            vcpus = float(given)
        except ValueError:
            raise ValueError(f"{VCPUS_VARIABLE}={given!r} is not a number") from None
        if not math.isfinite(vcpus) or vcpus <= 0:
            raise ValueError(f"{VCPUS_VARIABLE}={given!r} must be a positive number")
        return Machine(vcpus, gpus, memory_bytes(root), f"{VCPUS_VARIABLE}={given}")
    affinity, quota = affinity_vcpus(), cpu_limit(root)
    vcpus = float(affinity) if quota is None else min(float(affinity), quota)
    source = f"CPU affinity {affinity}" + (f", cgroup quota {quota:g}" if quota is not None else "")
    return Machine(vcpus, gpus, memory_bytes(root), source)
