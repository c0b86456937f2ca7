"""The process tree and memory figures, read straight from /proc (standard library only): what the
instance has available, a process's children and descendants, and the memory a process tree takes.
Multi-model mode's memory accounting (``app.core.memory``) and the development tools' process checks
(``scripts.devtools``) walk the same tree."""

from __future__ import annotations

import contextlib
from pathlib import Path


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is no such file."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
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
