"""The process's own cgroups, read in one place: the folders under /sys/fs/cgroup that hold the
process (its paths from /proc/self/cgroup, cgroup v2's and each v1 controller's), and what they
limit: the CPU quota, the memory limit, the memory left under it, the OOM killer's count.

A limit set on any folder from the process's own up to the mount's top applies (a container's
cgroup nested in a pod's, a systemd service in its slice), so every limit is the smallest found
along that path. No limit (v2's ``max``, v1's -1 quota or its near-2**63 memory limit) is None.
Every reader takes ``root``: where /proc and /sys are (tests point it at a folder).
Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/")
MOUNT = "sys/fs/cgroup"
V2 = ""  # /proc/self/cgroup's controller list on cgroup v2's line ("0::/path")
# v1 writes "no memory limit" as LONG_MAX rounded down to a page, a number near 2**63.
NO_MEMORY_LIMIT = 1 << 60
# A memory cgroup's files, v2's then v1's: its limit, its use, its statistics and the key there of
# its inactive page cache (which the kernel reclaims before it kills, as MemAvailable counts it).
MEMORY_FILES = (
    ("memory.max", "memory.current", "memory.stat", "inactive_file"),
    ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_inactive_file"),
)
# Where a memory cgroup counts the processes its OOM killer ended: v2, then v1 (Linux 4.13 and later).
OOM_FILES = ("memory.events", "memory.oom_control")


def memberships(root: Path = ROOT) -> dict[str, str]:
    """/proc/self/cgroup as {controller: path below the mount}: each v1 controller's (``cpu``,
    ``memory``, ...) and v2's under ``V2``; empty where the file cannot be read."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in lines:  # hierarchy-ID:controller-list:cgroup-path
        _, _, rest = line.partition(":")
        controllers, separator, path = rest.partition(":")
        if separator:
            for controller in controllers.split(",") if controllers else [V2]:
                found[controller] = path.strip().lstrip("/")
    return found


def folders(controller: str, root: Path = ROOT) -> list[Path]:
    """The existing folders whose ``controller`` ("cpu", "memory") settings hold the process,
    innermost first: v1's ``<mount>/<controller>/<path>`` up to that mount's top, then v2's
    ``<mount>/<path>`` up to the mount. A path the mount does not show (a container without a cgroup
    namespace of its own sees its cgroup at the top) is walked up from; where /proc/self/cgroup
    cannot be read, the mounts' tops are all there is."""
    paths = memberships(root)
    trees = [(root / MOUNT, paths.get(V2, ""))]
    if controller in paths or not paths:
        trees.insert(0, (root / MOUNT / controller, paths.get(controller, "")))
    found = []
    for mount, path in trees:
        folder = mount / path
        while True:
            if folder.is_dir():
                found.append(folder)
            if folder == mount:
                break
            folder = folder.parent
    return found


def counters(path: Path) -> dict[str, int]:
    """A file of ``name value`` lines (memory.stat, memory.events, /proc/vmstat) as {name: value};
    empty where it cannot be read, lines that are not a name and a whole number left out."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[name] = int(value)
    return found


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_limit(root: Path = ROOT) -> float | None:
    """The CPU quota in CPUs (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``),
    the smallest along the process's cgroups; None without one."""
    limits = []
    for folder in folders("cpu", root):
        v2, v1 = _text(folder / "cpu.max"), _text(folder / "cpu.cfs_quota_us")
        try:
            quota, period = v2.split()[:2] if v2 is not None else (v1, _text(folder / "cpu.cfs_period_us"))
            if quota not in (None, "max") and int(quota) > 0:
                limits.append(int(quota) / int(period or ""))
        except (ValueError, ZeroDivisionError):
            continue
    return min(limits, default=None)


def _memory_limits(root: Path) -> Iterator[tuple[Path, int, tuple[str, str, str, str]]]:
    """(folder, limit, its version's MEMORY_FILES) for each of the process's memory cgroups with a limit."""
    for folder in folders("memory", root):
        for files in MEMORY_FILES:
            raw = _text(folder / files[0])
            if raw is None:
                continue
            if raw.isdigit() and int(raw) < NO_MEMORY_LIMIT:
                yield folder, int(raw), files
            break


def memory_limit(root: Path = ROOT) -> int | None:
    """The memory limit in bytes, the smallest along the process's cgroups; None without one."""
    return min((limit for _, limit, _ in _memory_limits(root)), default=None)


def memory_available(root: Path = ROOT) -> int | None:
    """The bytes the process's memory cgroups leave it: each limit less what its cgroup uses, the
    cgroup's inactive page cache counted as free; the smallest, None without a limit."""
    figures = []
    for folder, limit, (_, usage_file, stat_file, inactive_key) in _memory_limits(root):
        usage = _text(folder / usage_file)
        if usage is None or not usage.isdigit():
            continue
        inactive = counters(folder / stat_file).get(inactive_key, 0)
        figures.append(max(0, limit - int(usage) + inactive))
    return min(figures, default=None)


def oom_kills(root: Path = ROOT) -> int | None:
    """How many processes the OOM killer ended in the process's memory cgroup (v2 counts the
    cgroups below it too); None where the cgroup keeps no count."""
    for folder in folders("memory", root):
        for name in OOM_FILES:
            count = counters(folder / name).get("oom_kill")
            if count is not None:
                return count
    return None
