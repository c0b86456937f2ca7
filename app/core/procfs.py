"""The process tree and memory figures, read straight from /proc (standard library only): what the
instance has available, its OOM kills, /proc/<pid>/stat, a process's children and descendants, and
the memory a process tree takes; the cgroups' limits are ``app.core.cgroup``'s to read.
Multi-model mode's memory accounting (``app.core.memory``) and the development tools' process checks
(``scripts.devtools``) walk the same tree."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from app.core import cgroup
from app.core.cgroup import ROOT, counters


def available_memory(root: Path = ROOT) -> int | None:
    """The bytes the instance has available: /proc/meminfo's MemAvailable, or less when the
    process's memory cgroups (a container started with a memory limit) leave less; None where
    neither can be read. ``root``: where /proc and /sys are (tests point it at a folder)."""
    figures = (meminfo(root).get("MemAvailable"), cgroup.memory_available(root))
    return min((figure for figure in figures if figure is not None), default=None)


def meminfo(root: Path = ROOT) -> dict[str, int]:
    """/proc/meminfo's figures in bytes ({"MemTotal": ..., "MemAvailable": ...}); empty where it
    cannot be read."""
    try:
        lines = (root / "proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        name, _, value = line.partition(":")
        number, _, unit = value.strip().partition(" ")
        if number.isdigit():
            found[name] = int(number) * (1024 if unit.strip() == "kB" else 1)
    return found


def oom_kills(root: Path = ROOT) -> int | None:
    """How many processes the kernel's OOM killer has ended in this process's memory cgroup, else
    on the machine (/proc/vmstat, Linux 4.13 and later); None where no count can be read."""
    count = cgroup.oom_kills(root)
    return count if count is not None else counters(root / "proc/vmstat").get("oom_kill")


@dataclass(frozen=True)
class ProcessStat:
    """What is read of /proc/<pid>/stat."""

    state: str  # R, S, D, Z, T, X, ...
    ppid: int
    cpu_ticks: int  # user + system time of all its threads, in clock ticks (os.sysconf("SC_CLK_TCK"))


def process_stat(pid: int, root: Path = ROOT) -> ProcessStat | None:
    """/proc/<pid>/stat, parsed; None when the process is gone. Its second field, the command's name,
    is in parentheses and may itself hold spaces and parentheses, so the fields after it are split
    after the last ")": state, ppid, ..., utime and stime (the 3rd, 4th, 14th and 15th of proc(5))."""
    try:
        text = (root / "proc" / str(pid) / "stat").read_text()
        fields = text[text.rindex(")") + 1 :].split()
        return ProcessStat(fields[0], int(fields[1]), int(fields[11]) + int(fields[12]))
    except (OSError, ValueError, IndexError):
        return None


def _children() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc."""
    found: dict[int, list[int]] = {}
    for entry in (ROOT / "proc").iterdir():
        if entry.name.isdigit() and (stat := process_stat(int(entry.name))) is not None:
            found.setdefault(stat.ppid, []).append(int(entry.name))
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
