"""app.core.procfs.available_memory: what a multi-model load is checked against (507 beyond it);
oom_kills: how a load that ran the instance out of memory is told from one the model failed."""

from __future__ import annotations

from pathlib import Path

from app.core.procfs import available_memory, oom_kills
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


def test_oom_kills_are_the_cgroups_then_the_machines(tmp_path: Path):
    v2 = tmp_path / "v2" / "sys" / "fs" / "cgroup"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    assert oom_kills(tmp_path / "v2") == 2
    v1 = tmp_path / "v1" / "sys" / "fs" / "cgroup" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert oom_kills(tmp_path / "v1") == 5
    machine = tmp_path / "machine" / "proc"
    machine.mkdir(parents=True)
    (machine / "vmstat").write_text("nr_free_pages 100\noom_kill 7\n")
    assert oom_kills(tmp_path / "machine") == 7
    assert oom_kills(tmp_path / "nothing") is None
