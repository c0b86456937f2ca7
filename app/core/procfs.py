"""The process tree and memory figures, read straight from /proc (standard library only): what the
instance has available, a process's children and descendants, and the memory a process tree takes.
Multi-model mode's memory accounting (``app.core.memory``) and the development tools' process checks
(``scripts.devtools``) walk the same tree."""

from __future__ import annotations

import contextlib
from pathlib import Path


def available_memory(root: Path = Path("/")) -> int | None:
    """The bytes the instance has available: /proc/meminfo's MemAvailable, or less when the
    process's memory cgroup (a container started with a memory limit) leaves less; None where
    neither can be read. ``root``: where /proc and /sys are (tests point it at a folder)."""
    figures = [figure for figure in (_meminfo_available(root), _cgroup_available(root)) if figure is not None]
    return min(figures) if figures else None


def _meminfo_available(root: Path) -> int | None:
    try:
        for line in (root / "proc" / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


# Where a cgroup's limit, usage and reclaimable page cache are read: cgroup v2, then v1's memory
# controller. v1 reports "no limit" as a number near 2**63.
_CGROUP_FILES = (
    ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current", "sys/fs/cgroup/memory.stat", "inactive_file"),
    (
        "sys/fs/cgroup/memory/memory.limit_in_bytes",
        "sys/fs/cgroup/memory/memory.usage_in_bytes",
        "sys/fs/cgroup/memory/memory.stat",
        "total_inactive_file",
    ),
)
_NO_LIMIT = 1 << 60


def _cgroup_available(root: Path) -> int | None:
    """The cgroup's limit less what it uses (its inactive page cache counted as free, as
    MemAvailable counts it); None without a limit."""
    for limit_file, usage_file, stat_file, inactive_key in _CGROUP_FILES:
        try:
            raw = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if raw == "max" or not raw.isdigit() or int(raw) >= _NO_LIMIT:
            return None
        inactive = 0
        with contextlib.suppress(OSError, ValueError):
            for line in (root / stat_file).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
        return max(0, int(raw) - usage + inactive)
    return None


# Where the kernel counts the processes its OOM killer ended: the memory cgroup's events (v2, then
# v1), else the whole machine's (/proc/vmstat, Linux 4.13 and later).
_OOM_KILL_FILES = ("sys/fs/cgroup/memory.events", "sys/fs/cgroup/memory/memory.oom_control", "proc/vmstat")


def oom_kills(root: Path = Path("/")) -> int | None:
    """How many processes the kernel's OOM killer has ended in this memory cgroup (or on the
    machine); None where no count can be read. ``root``: where /proc and /sys are."""
    for name in _OOM_KILL_FILES:
        try:
            lines = (root / name).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def _children() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                found.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    return found


def children_of(pid: int) -> list[int]:
    return _children().get(pid, [])


def descendants(pid: int) -> list[int]:
    """The children of ``pid``, theirs, and so on."""
    children, found, todo = _children(), [], [pid]
    while todo:
        for kid in children.get(todo.pop(), ()):
            found.append(kid)
            todo.append(kid)
    return found


def process_tree_memory(pid: int) -> int | None:
    """The proportional set size (PSS: shared pages split between their users) of ``pid`` and all
    its descendants in bytes, from /proc; None when ``pid`` cannot be read. Triton's python-backend
    models run in stub processes of their own, so a model's memory is the tree's, not Triton's."""
    total, found = 0, False
    for current in (pid, *descendants(pid)):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    found = found or current == pid
                    break
    return total if found else None
