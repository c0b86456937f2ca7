"""app.core.procfs.available_memory: what a multi-model load is checked against (507 beyond it)."""

from __future__ import annotations

from pathlib import Path

from app.core.procfs import available_memory
from app.core.settings import MIB


def _machine(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in {"proc/meminfo": "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_available_memory_is_the_machines_without_a_cgroup_limit(tmp_path: Path):
    assert available_memory(_machine(tmp_path, {})) == 4000000 * 1024
    unlimited = {"sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "1000\n"}
    assert available_memory(_machine(tmp_path, unlimited)) == 4000000 * 1024


def test_a_containers_memory_limit_bounds_what_is_available(tmp_path: Path):
    """A container started with --memory: its cgroup's limit less what it uses, its inactive page
    cache counted as free (cgroup v1 as podman and docker set it up on v1 hosts, and v2)."""
    v1 = {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": str(512 * MIB),
        "sys/fs/cgroup/memory/memory.usage_in_bytes": str(300 * MIB),
        "sys/fs/cgroup/memory/memory.stat": f"cache 1\ntotal_inactive_file {20 * MIB}\n",
    }
    assert available_memory(_machine(tmp_path / "v1", v1)) == 232 * MIB
    v2 = {
        "sys/fs/cgroup/memory.max": str(512 * MIB),
        "sys/fs/cgroup/memory.current": str(600 * MIB),
        "sys/fs/cgroup/memory.stat": "inactive_file 0\n",
    }
    assert available_memory(_machine(tmp_path / "v2", v2)) == 0
    no_limit_v1 = {**v1, "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"}
    assert available_memory(_machine(tmp_path / "v1-unlimited", no_limit_v1)) == 4000000 * 1024
