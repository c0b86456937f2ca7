"""What the sizing sees of a machine (app/core/machine.py): the vCPUs from the CPU affinity and the
cgroups' quota (read by app.core.cgroup, tests/unit/test_cgroup.py), never the host's count; the
memory; the GPUs and their JPEG engines; SIZING_VCPUS in place of what it finds. The files are laid
out under a folder as /proc and /sys would hold them."""

from __future__ import annotations

import os

import pytest

from app.core import machine
from app.core.sizing import budget_of
from tests.support import lay_out


def test_half_a_cpu_of_quota_is_no_whole_cpu_to_hand_out():
    assert budget_of(machine.Machine(1.5)) == 1  # whole CPUs to hand out: rounded down


def test_the_memory_is_the_cgroups_limit_where_that_is_less(tmp_path):
    """The limit of the process's own cgroup, not the mount's top (app.core.cgroup walks the path)."""
    root = lay_out(
        tmp_path,
        {
            "proc/meminfo": "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n",
            "proc/self/cgroup": "0::/pod/container\n",
            "sys/fs/cgroup/memory.max": "max\n",
            "sys/fs/cgroup/pod/container/memory.max": f"{2 * machine.GIB}\n",
        },
    )
    assert machine.memory_bytes(root) == 2 * machine.GIB
    assert machine.detect({}, root).memory_bytes == 2 * machine.GIB
    (root / "sys/fs/cgroup/pod/container/memory.max").write_text("max\n")
    assert machine.memory_bytes(root) == 8000000 * 1024
    assert machine.memory_bytes(tmp_path / "nothing") == 0


def test_the_quota_wins_over_a_larger_affinity_and_the_host_count_is_not_used(tmp_path):
    root = lay_out(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "50000 100000\n"})
    found = machine.detect({}, root)
    assert found.vcpus == 0.5 and "cgroup quota 0.5" in found.source
    assert machine.detect({}, tmp_path / "nothing").vcpus == len(os.sched_getaffinity(0))


def test_sizing_vcpus_replaces_what_is_found(tmp_path):
    assert machine.detect({"SIZING_VCPUS": "16"}, tmp_path).vcpus == 16.0
    for bad in ("sixteen", "0", "-2", "nan"):
        with pytest.raises(ValueError, match="SIZING_VCPUS"):
            machine.detect({"SIZING_VCPUS": bad}, tmp_path)


def test_gpus_from_the_driver_and_their_jpeg_engines(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "_nvml_gpu_names", lambda: None)  # no NVML: the driver's files
    root = lay_out(
        tmp_path,
        {
            "proc/driver/nvidia/gpus/0000:00:1e.0/information": "Model: \t\t NVIDIA A10G\nIRQ: 40\n",
            "proc/driver/nvidia/gpus/0000:00:1f.0/information": "Model: \t\t NVIDIA A10G\nIRQ: 41\n",
        },
    )
    found = machine.detect({}, root)
    assert (found.gpu_count, found.gpu_model, found.jpeg_engine) == (2, "NVIDIA A10G", False)
    assert machine.detect({"CUDA_VISIBLE_DEVICES": "1"}, root).gpu_count == 1
    assert machine.detect({"CUDA_VISIBLE_DEVICES": ""}, root).gpu_count == 0


@pytest.mark.parametrize(
    ("name", "engine"),
    [
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H200", True),
        ("NVIDIA A100-SXM4-40GB", True),
        ("NVIDIA A30", True),
        ("NVIDIA L4", True),
        ("NVIDIA L40S", True),
        ("NVIDIA A10G", False),
        ("Tesla T4", False),
        ("NVIDIA A10", False),
    ],
)
def test_which_gpus_have_a_jpeg_engine(name, engine):
    assert machine.has_jpeg_engine(name) is engine
