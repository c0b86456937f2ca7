"""`serve`'s sizing at start: the plan for this machine and the repository (``app.core.sizing``),
one log record saying what was chosen and why, and the repository Triton loads: a folder in the
runtime directory holding, for every model, links to its files and its configuration with the
plan's counts (the repository itself is never written: ``/opt/ml/model`` is mounted read-only).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from app.core import machine as machines
from app.core.model_store import link_folder
from app.core.settings import NGINX_WORKERS, WORKERS
from app.core.sizing import CPU_NETWORK, DALI, GPU_NETWORK, PYTHON_STEP, Part, Plan
from clients import sized_configs

log = logging.getLogger("serve.sizing")


def workers_plan(env: Mapping[str, str]) -> Plan:
    """A multi-model endpoint starts with no model loaded: its router and NGINX are sized as for one
    image model on the Triton pipeline (on a GPU: its network and DALI; else its network and python
    step), and each load shares what is left with the models loaded (``clients.multimodel``)."""
    machine = machines.detect(env)
    gpu = bool(machine.gpu_count)
    stand_in = [
        Part("network", "model", GPU_NETWORK if gpu else CPU_NETWORK),
        Part("preprocess", "model", DALI if gpu else PYTHON_STEP),
    ]
    plan = replace(sized_configs.plan_models(machine, stand_in, env), parts=(), notes=())
    log_plan(plan)
    return plan


def sized_repository(repository: Path, runtime_dir: Path, env: Mapping[str, str]) -> tuple[Path, Plan]:
    """The repository Triton is to load, sized for this machine, and the plan."""
    machine = machines.detect(env)
    plan, configs = sized_configs.plan_repository(repository, machine, env)
    sized = {part.triton_name: part for part in plan.parts}
    target = runtime_dir / "repository"
    target.mkdir()
    for name, folder in sized_configs.model_folders(repository).items():
        found = configs.get(name)
        if found is not None and name in sized:
            text = sized_configs.sized_text(found.config, sized[name])
            link_folder(target / name, folder, lambda _, text=text: text)
        else:
            link_folder(target / name, folder, str)
    log_plan(plan)
    return target, plan


def log_plan(plan: Plan) -> None:
    """The one record of what was chosen and why."""
    counts = ", ".join(
        f"{part.triton_name} {part.count}{' per GPU' if part.on_gpu else ''}"
        + (f" x {part.threads} threads" if part.threads else "")
        for part in plan.parts
    )
    log.info(
        "sized for %s: %s, %s, %s; %d CPU threads on a budget of %d%s",
        plan.machine.describe(),
        plural(plan.router_workers, "router worker"),
        plural(plan.nginx_workers, "NGINX worker"),
        counts or "no model to size",
        plan.cpu_threads,
        plan.budget,
        f" ({'; '.join(plan.notes)})" if plan.notes else "",
        extra={"fields": {"sizing": plan.record()}},
    )


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def router_env(plan: Plan) -> dict[str, str]:
    """The router's and NGINX's worker counts, for the router's environment (its multi-model loads
    plan with them)."""
    return {WORKERS: str(plan.router_workers), NGINX_WORKERS: str(plan.nginx_workers)}
