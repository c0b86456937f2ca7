"""Multi-model mode's memory policy: the 507s a load meets before it starts (its files, against what
is loaded and the bound), during it (a process of Triton's ended by the kernel's OOM killer) and
after it (what Triton's processes grew by, read by ``app.core.procfs``)."""

from __future__ import annotations

from app.core.errors import InsufficientMemory
from app.core.model_store import Record
from app.core.settings import MIB


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


def oom_refusal(name: str, kills_before: int | None, kills_after: int | None, said: str) -> InsufficientMemory | None:
    """The 507 for a load that failed while the kernel's OOM killer ended a process (Triton's python
    backend stub holding the model, as a rule): its files fitted, the model once in memory did not.
    None when no process was killed meanwhile (or the count cannot be read): the failure is the model's."""
    if kills_before is None or kills_after is None or kills_after <= kills_before:
        return None
    return InsufficientMemory(
        f"loading model {name!r} ran the instance out of memory: the kernel's OOM killer ended "
        f"{kills_after - kills_before} process(es) meanwhile, and Triton said: {said}"
    )
