"""Multi-model mode's memory accounting: what the instance has available, what Triton's processes
take, and the 507s a load meets before it starts (its files) and after it (what Triton took); and
the process tree those figures (and the development tools' process checks) walk. Standard library
only: /proc is read directly."""

from __future__ import annotations

import contextlib
from pathlib import Path

from app.core.errors import InsufficientMemory
from app.core.multimodel import Record
from app.core.settings import MIB


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


def memory_refusal(name: str, need: int, loaded: int, limit: int, available: int | None) -> InsufficientMemory | None:
    """The 507 for loading ``need`` bytes next to ``loaded`` ones, or None when it fits both the
    configured limit (0: none) and the memory the machine has available."""
    if limit and loaded + need > limit:
        return InsufficientMemory(
            f"model {name!r} needs about {need / MIB:.1f} MiB (its files); the models loaded take "
            f"{loaded / MIB:.1f} MiB (what Triton grew by as each loaded) of the {limit / MIB:.1f} MiB "
            "MODEL_MEMORY_LIMIT_BYTES allows"
        )
    if available is not None and need > available:
        return InsufficientMemory(
            f"model {name!r} needs about {need / MIB:.1f} MiB (its files); the instance has "
            f"{available / MIB:.1f} MiB available"
        )
    return None


def memory_overrun(record: Record, others: int, limit: int) -> InsufficientMemory | None:
    """The 507 for a model that, once loaded, takes more than the limit (0: none) leaves beside
    the ``others``: its files fitted, what Triton took for it does not."""
    if not limit or others + record.charged <= limit:
        return None
    return InsufficientMemory(
        f"model {record.model_name!r} took {record.charged / MIB:.1f} MiB once loaded (its files: "
        f"{record.size_bytes / MIB:.1f} MiB); beside the {others / MIB:.1f} MiB the models loaded take, that "
        f"passes the {limit / MIB:.1f} MiB MODEL_MEMORY_LIMIT_BYTES allows"
    )
