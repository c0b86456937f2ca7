"""``serve plan`` (or ``python -m app.serve.sizing_plan``): the sizing's plan without starting anything, for
this machine or for a SageMaker instance type (``--instance-type ml.g5.xlarge``; ``--all`` for every
one the project knows, ``--markdown`` as the documentation's table).

The models are the repository's (``--repository``; ``/opt/ml/model`` or ``models/`` by default): its
configurations where it has them, else its ``model.toml`` files prepared for ``--target`` (by default
tensorrt on an instance type with GPUs, python without). The environment's counts (MODEL_SERVER_WORKERS,
NGINX_WORKERS, TRITON_INSTANCES, TRITON_THREADS) apply as they would at start.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from app.core import machine as machines
from app.core.settings import default_model_repository, is_model_repository
from app.core.sizing import GPU_NETWORK, Plan
from app.core.spec import SpecError, find_specs
from clients import sized_configs

TARGETS = ("python", "onnxruntime", "tensorrt")


def plan_for(machine: machines.Machine, repository: Path, target: str | None) -> Plan:
    """The plan for ``machine``: the repository's configs (no ``target``), else its specs for ``target``."""
    if target is None and is_model_repository(repository):
        return sized_configs.plan_repository(repository, machine)[0]
    chosen = target or ("tensorrt" if machine.gpu_count else "python")
    return sized_configs.plan_models(
        machine, sized_configs.parts_from_specs(find_specs(repository), chosen, machine), os.environ
    )


def _count(part) -> str:
    return f"{part.count}/GPU" if part.on_gpu else str(part.count)


def format_plan(plan: Plan, title: str = "this machine") -> str:
    """The plan as the lines ``serve plan`` prints."""
    lines = [
        f"Plan for {title}: {plan.machine.describe()}",
        f"  CPU budget {plan.budget}; handed out {plan.cpu_threads} CPU threads"
        + (f" ({'; '.join(plan.notes)})" if plan.notes else ""),
        f"  router (gunicorn)  {plan.router_workers} workers",
        f"  NGINX              {plan.nginx_workers} workers",
        f"  {'Triton model':<22} {'kind':<12} {'instances':>9} {'threads':>7} {'CPU':>4}  why",
    ]
    for part in plan.parts:
        threads = str(part.threads) if part.threads else "-"
        lines.append(
            f"  {part.triton_name:<22} {part.kind:<12} {_count(part):>9} {threads:>7} {part.cpu:>4}  {part.why}"
        )
    return "\n".join(lines)


def markdown_table(rows: Sequence[tuple[str, Plan]]) -> str:
    """One row per instance type: the machine and the counts (the documentation's table)."""
    names = sorted({part.triton_name for _, plan in rows for part in plan.parts})
    head = ["instance type", "vCPUs", "GPUs", "JPEG engine", "router workers", "NGINX", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for title, plan in rows:
        machine = plan.machine
        gpus = f"{machine.gpu_count} x {machine.gpu_model.removeprefix('NVIDIA ')}" if machine.gpus else "-"
        cells = []
        for name in names:
            part = next((p for p in plan.parts if p.triton_name == name), None)
            if part is None:
                cells.append("")
            elif part.kind == GPU_NETWORK:
                cells.append(_count(part))
            else:
                cells.append(f"{_count(part)} x {part.threads}" if part.threads else _count(part))
        engine = ("yes" if machine.jpeg_engine else "no") if machine.gpus else "-"
        row = [f"`{title}`", f"{machine.vcpus:g}", gpus, engine, str(plan.router_workers), str(plan.nginx_workers)]
        lines.append("| " + " | ".join(row + cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="serve plan", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--instance-type", choices=sorted(machines.INSTANCE_TYPES), metavar="TYPE", help="e.g. ml.g5.xlarge"
    )
    which.add_argument("--all", action="store_true", help="every instance type the project knows")
    parser.add_argument("--repository", type=Path, default=None, help="the model repository (default: as serve)")
    parser.add_argument("--target", choices=TARGETS, help="plan the model.toml files prepared for this target")
    parser.add_argument("--markdown", action="store_true", help="with --all: one Markdown table")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    repository = args.repository or Path(os.environ.get("MODEL_REPOSITORY", "") or default_model_repository())
    if args.all:
        chosen = list(machines.INSTANCE_TYPES.items())
    elif args.instance_type:
        chosen = [(args.instance_type, machines.INSTANCE_TYPES[args.instance_type])]
    else:
        chosen = [("this machine", machines.detect())]
    try:
        rows = [(title, plan_for(machine, repository, args.target)) for title, machine in chosen]
    except (ValueError, SpecError, OSError) as error:
        print(f"serve plan: {error}", file=sys.stderr)
        return 2
    text = markdown_table(rows) if args.markdown else "\n\n".join(format_plan(plan, title) for title, plan in rows)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `serve plan --all | head`: the reader has what it wanted
        sys.stdout = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
