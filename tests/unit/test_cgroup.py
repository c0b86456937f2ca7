"""app.core.cgroup, the one reader of the process's cgroups, and app.core.procfs's /proc/<pid>/stat:
fake roots laid out as /proc and /sys hold them for cgroup v2, v1, a cgroup nested below the one
with the limit, and no limit at all."""

from __future__ import annotations

import os

from app.core import cgroup
from app.core.procfs import ProcessStat, available_memory, process_stat
from app.core.settings import MIB
from tests.support import lay_out

V2 = {
    "proc/self/cgroup": "0::/\n",
    "sys/fs/cgroup/cpu.max": "150000 100000\n",
    "sys/fs/cgroup/memory.max": f"{512 * MIB}\n",
    "sys/fs/cgroup/memory.current": f"{300 * MIB}\n",
    "sys/fs/cgroup/memory.stat": f"anon 1\ninactive_file {20 * MIB}\nactive_file 5\n",
    "sys/fs/cgroup/memory.events": "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n",
}
V1 = {
    "proc/self/cgroup": "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n",
    "sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us": "400000\n",
    "sys/fs/cgroup/cpu/docker/abc/cpu.cfs_period_us": "100000\n",
    "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": f"{512 * MIB}\n",
    "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": f"{300 * MIB}\n",
    "sys/fs/cgroup/memory/docker/abc/memory.stat": f"cache 1\ninactive_file 7\ntotal_inactive_file {20 * MIB}\n",
    "sys/fs/cgroup/memory/docker/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
}


def test_cgroup_v2(tmp_path):
    root = lay_out(tmp_path, V2)
    assert cgroup.folders("memory", root) == [root / "sys/fs/cgroup"]
    assert cgroup.cpu_limit(root) == 1.5
    assert cgroup.memory_limit(root) == 512 * MIB
    assert cgroup.memory_available(root) == 232 * MIB  # the limit less the use, the inactive cache free
    assert cgroup.oom_kills(root) == 2


def test_cgroup_v1(tmp_path):
    root = lay_out(tmp_path, V1)
    assert set(cgroup.memberships(root)) == {"memory", "cpu", "cpuacct", "name=systemd"}
    assert cgroup.folders("memory", root)[0] == root / "sys/fs/cgroup/memory/docker/abc"
    assert cgroup.cpu_limit(root) == 4.0
    assert cgroup.memory_limit(root) == 512 * MIB
    assert cgroup.memory_available(root) == 232 * MIB  # v1's hierarchical total_inactive_file
    assert cgroup.oom_kills(root) == 5


def test_a_container_without_a_cgroup_namespace_sees_its_cgroup_at_the_mounts_top(tmp_path):
    """/proc/self/cgroup names the host's path, which the container's mount does not show."""
    files = {name.replace("docker/abc/", ""): text for name, text in V1.items() if name.startswith("sys/")}
    root = lay_out(tmp_path, {**files, "proc/self/cgroup": V1["proc/self/cgroup"]})
    assert cgroup.cpu_limit(root) == 4.0 and cgroup.memory_limit(root) == 512 * MIB


def test_a_limit_on_a_parent_of_the_process_cgroup_applies_and_the_smallest_wins(tmp_path):
    root = lay_out(
        tmp_path,
        {
            "proc/self/cgroup": "0::/pod/container\n",
            "sys/fs/cgroup/memory.max": "max\n",  # the host's top: not the process's limit
            "sys/fs/cgroup/pod/cpu.max": "300000 100000\n",
            "sys/fs/cgroup/pod/memory.max": f"{1024 * MIB}\n",
            "sys/fs/cgroup/pod/memory.current": f"{900 * MIB}\n",
            "sys/fs/cgroup/pod/container/cpu.max": "max 100000\n",
            "sys/fs/cgroup/pod/container/memory.max": f"{512 * MIB}\n",
            "sys/fs/cgroup/pod/container/memory.current": f"{100 * MIB}\n",
            "sys/fs/cgroup/pod/container/memory.events": "oom_kill 1\n",
            "sys/fs/cgroup/pod/memory.events": "oom_kill 9\n",
        },
    )
    assert cgroup.folders("cpu", root) == [
        root / "sys/fs/cgroup/pod/container",
        root / "sys/fs/cgroup/pod",
        root / "sys/fs/cgroup",
    ]
    assert cgroup.cpu_limit(root) == 3.0  # the pod's quota; the container's own is max
    assert cgroup.memory_limit(root) == 512 * MIB  # the container's, below the pod's
    assert cgroup.memory_available(root) == 124 * MIB  # the pod's: 1024 - 900, less than 512 - 100
    assert cgroup.oom_kills(root) == 1  # the process's own cgroup, not its siblings' under the pod


def test_no_limit_is_none(tmp_path):
    v2 = lay_out(
        tmp_path / "v2",
        {
            "proc/self/cgroup": "0::/\n",
            "sys/fs/cgroup/cpu.max": "max 100000\n",
            "sys/fs/cgroup/memory.max": "max\n",
            "sys/fs/cgroup/memory.current": "1000\n",
        },
    )
    unlimited_v1 = {
        **V1,
        "sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us": "-1\n",
        "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n",
    }
    for root in (v2, lay_out(tmp_path / "v1", unlimited_v1), tmp_path / "nothing"):
        assert cgroup.cpu_limit(root) is None
        assert cgroup.memory_limit(root) is None
        assert cgroup.memory_available(root) is None
    assert cgroup.oom_kills(tmp_path / "nothing") is None


def test_what_is_available_is_the_cgroups_or_the_machines_whichever_is_less(tmp_path):
    meminfo = {"proc/meminfo": "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n"}
    assert available_memory(lay_out(tmp_path / "v2", {**V2, **meminfo})) == 232 * MIB
    assert available_memory(lay_out(tmp_path / "none", meminfo)) == 4000000 * 1024
    small = {"proc/meminfo": "MemTotal: 8000 kB\nMemAvailable: 4000 kB\n"}
    assert available_memory(lay_out(tmp_path / "small", {**V1, **small})) == 4000 * 1024


def test_proc_stat_splits_after_the_commands_last_parenthesis(tmp_path):
    """The command's name may hold spaces and parentheses of its own: "a) S (b"."""
    rest = " ".join(str(n) for n in range(5, 53))  # fields 5 on, each its number: utime 14, stime 15
    lay_out(tmp_path, {"proc/42/stat": f"42 (a) S 1 (b) R 7 {rest}\n"})
    assert process_stat(42, tmp_path) == ProcessStat("R", 7, 14 + 15)
    assert process_stat(43, tmp_path) is None
    assert process_stat(os.getpid()).ppid == os.getppid()
