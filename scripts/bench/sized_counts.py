"""The sizing at start against the counts it replaced: the image pipelines in two Tritons side by side.

``serve`` sizes the repository for the machine it runs on (``app.serve.sized_repository``): instances and
threads of every Triton model from the vCPUs and GPUs. Before it, Triton ran the counts model
preparation wrote. This section starts, on the same repository and side by side:

- ``sized``: Triton on the repository as ``serve`` sizes it for this machine (with the process's
  environment, so ``SIZING_VCPUS``, ``TRITON_INSTANCES`` and ``TRITON_THREADS`` apply);
- ``count 1``: Triton on links to the repository whose configurations have every instance count set
  to 1 and nothing else changed (threads as model preparation wrote them; 0: the backend's default).

Each loads only the benched models' Triton pipelines (the ensemble and its steps), and each image
model's pipeline gets the encoded sample as the router sends it (its ``TRITON`` route) at
``SIZING_CONCURRENCY``, the two sides interleaved round by round. Nothing assumes a CPU: on a
machine with a GPU the sized repository holds DALI steps and GPU networks, and the count-1 side keeps
their kind (a ``KIND_GPU`` group counts on each GPU).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.core.model_store import link_folder
from app.core.pipeline import TRITON, ensemble_model
from app.core.spec import ModelSpec
from scripts.bench.constants import START_TIMEOUT_S
from scripts.bench.load import GrpcCaller, Progress, bench_model
from scripts.bench.payloads import grpc_request, preprocessed_tensors
from scripts.devtools import Triton, free_ports, start_triton
from scripts.model_prep import triton_config
from scripts.terminal import text_table

SIZED_SIDE, COUNT_ONE_SIDE = "sized", "count 1"
SIDES = (SIZED_SIDE, COUNT_ONE_SIDE)
SIZING_CONCURRENCY = 8
ENSEMBLE_PLATFORM = "ensemble"


def count_one_text(text: str) -> str:
    """A config.pbtxt with every instance group's count set to 1, nothing else changed (a config
    without instance groups, an ensemble's, comes back as it was)."""
    config = triton_config.parse(text)
    if not config.instance_group:
        return text
    for group in config.instance_group:
        group.count = 1
    return triton_config.to_text(config)


def count_one_repository(repository: Path, runtime_dir: Path) -> Path:
    """``runtime_dir/repository``: links to every model folder of ``repository`` with its config at count 1."""
    from clients.sized_configs import model_folders

    target = runtime_dir / "repository"
    target.mkdir(parents=True)
    for name, folder in model_folders(repository).items():
        link_folder(target / name, folder, count_one_text)
    return target


def pipeline_members(repository: Path, model: str) -> list[str]:
    """The Triton models ``model``'s pipeline needs loaded: its ensemble, then the ensemble's steps."""
    ensemble = ensemble_model(model)
    config = triton_config.read_config(repository / ensemble / "config.pbtxt")
    steps = [step.model_name for step in config.ensemble_scheduling.step]
    return [ensemble, *dict.fromkeys(steps)]


def _threads(value: str) -> str:
    """A threads parameter as the reader should see it (0 or empty: the backend's own default;
    -1: DALI's serialised pipeline's value)."""
    value = value.strip()
    return {"": "default", "0": "default", "-1": "pipeline's"}.get(value, value)


def configuration(text: str) -> str:
    """ "instances x threads" of one config.pbtxt ("2/GPU" for a GPU group; no threads where the
    backend reads none), "-" for an ensemble."""
    from clients.sized_configs import THREAD_PARAMETERS

    config = triton_config.parse(text)
    if config.platform == ENSEMBLE_PLATFORM:
        return "-"
    groups = list(config.instance_group)
    count = sum(group.count for group in groups) if groups else 1
    gpu = any(group.kind == group.KIND_GPU for group in groups)
    instances = f"{count}/GPU" if gpu else str(count)
    key = next((k for k in THREAD_PARAMETERS.values() if k in config.parameters), None)
    return instances if key is None else f"{instances} x {_threads(config.parameters[key].string_value)}"


def configurations(repository: Path, names: Sequence[str]) -> dict[str, str]:
    """``configuration`` of each named Triton model of ``repository`` but the ensembles."""
    found = {name: configuration((repository / name / "config.pbtxt").read_text()) for name in names}
    return {name: text for name, text in found.items() if text != "-"}


def pipeline_models(specs: Mapping[str, ModelSpec]) -> list[str]:
    """The benched models that have a Triton pipeline (the image models on it)."""
    return [model for model, spec in specs.items() if spec.pipeline == TRITON]


def _start(repository: Path, models: Sequence[str], ports: Sequence[int], runtime: Path, log_path: Path) -> Triton:
    extra = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in models)]
    with log_path.open("ab") as log:
        return start_triton(repository, runtime, ports, extra, None, log)


def run_sizing(
    repository: Path,
    specs: Mapping[str, ModelSpec],
    args,
    out: Path,
    progress: Progress,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Both sides of every model with a Triton pipeline; the plan, the summaries and the configurations."""
    from app.serve.sized_repository import sized_repository
    from app.serve.sizing_plan import format_plan

    models = pipeline_models(specs)
    if not models:
        print("sizing: none of the benched models has a Triton pipeline: nothing to compare", flush=True)
        return {}
    root = out / "sizing"
    if root.exists():
        shutil.rmtree(root)
    (root / "sized").mkdir(parents=True)  # serve's runtime directory: the sized repository goes in it
    sized, plan = sized_repository(repository, root / "sized", os.environ if env is None else env)
    print(format_plan(plan, "this machine (the sized side)"), flush=True)
    repositories = {SIZED_SIDE: sized, COUNT_ONE_SIDE: count_one_repository(repository, root / "count-1")}
    members = {model: pipeline_members(repository, model) for model in models}
    loaded = [name for model in models for name in members[model]]
    print(f"sizing: starting two Tritons side by side ({', '.join(SIDES)}) on {', '.join(loaded)} ...", flush=True)
    began = time.monotonic()
    tritons: dict[str, Triton] = {}
    cells: dict = {}
    try:
        ports = free_ports(3 * len(repositories))  # one block: ports found free one after the other can overlap
        for i, (side, path) in enumerate(repositories.items()):
            log_path = root / f"triton-{side.replace(' ', '-')}.log"
            tritons[side] = _start(path, loaded, ports[3 * i : 3 * i + 3], out / "runtime", log_path)
        for triton in tritons.values():
            triton.wait_ready(START_TIMEOUT_S, loaded)
        print(f"  both ready after {time.monotonic() - began:.1f} s", flush=True)
        for model in models:
            tensors, outputs = preprocessed_tensors(specs[model], args.image, args.text, TRITON)
            request = grpc_request(ensemble_model(model), tensors, outputs)
            callers = {side: GrpcCaller(triton.grpc_url, request, args.timeout) for side, triton in tritons.items()}
            try:
                bench_model(model, callers, [SIZING_CONCURRENCY], args, cells, progress)
            finally:
                for caller in callers.values():
                    caller.close()
    finally:
        for triton in tritons.values():
            triton.stop()
    return sizing_results(cells, plan.record(), members, repositories)


def sizing_results(
    cells: Mapping[str, Mapping[str, Mapping[str, Any]]],
    plan: Mapping[str, Any],
    members: Mapping[str, Sequence[str]],
    repositories: Mapping[str, Path],
) -> dict[str, Any]:
    """The section's record: the plan, and per model each side's summary at ``SIZING_CONCURRENCY``,
    sized / count 1 throughput, and the configuration of each Triton model on each side."""
    results: dict[str, Any] = {"concurrency": SIZING_CONCURRENCY, "plan": dict(plan), "models": {}}
    for model, sides in cells.items():
        summaries = {side: sides[side][str(SIZING_CONCURRENCY)].summary() for side in SIDES if side in sides}
        sized, one = (summaries.get(side, {}).get("throughput") for side in SIDES)
        results["models"][model] = {
            **summaries,
            "ratio": sized / one if sized is not None and one else None,
            "configurations": {side: configurations(path, members[model]) for side, path in repositories.items()},
        }
    return results


def format_sizing(results: Mapping[str, Any]) -> str:
    """The section's table: per model each side's req/s and p50, their ratio, then what each side ran."""
    c = results["concurrency"]
    rows = [
        ("model", f"{SIZED_SIDE} req/s", "p50 ms", f"{COUNT_ONE_SIDE} req/s", "p50 ms", "sized / count 1", "errors")
    ]
    for model, found in results["models"].items():
        sized, one = found.get(SIZED_SIDE, {}), found.get(COUNT_ONE_SIDE, {})
        ratio = found.get("ratio")
        rows.append(
            (
                model,
                f"{sized.get('throughput', 0.0):.1f}",
                f"{sized.get('p50_ms', float('nan')):.1f}",
                f"{one.get('throughput', 0.0):.1f}",
                f"{one.get('p50_ms', float('nan')):.1f}",
                "-" if ratio is None else f"{ratio:.2f}",
                f"{sized.get('errors', 0)} / {one.get('errors', 0)}",
            )
        )
    title = (
        f"Sizing: each Triton pipeline at c={c}, the repository as serve sizes it ({SIZED_SIDE}) against every "
        f"instance count 1 with threads as model preparation wrote them ({COUNT_ONE_SIDE}), side by side"
    )
    legend = "what each side ran (instances x threads per Triton model; default: the backend's own, a thread per core):"
    lines = [title, _table(rows), "", legend]
    config_rows = [("Triton model", SIZED_SIDE, COUNT_ONE_SIDE)]
    for found in results["models"].values():
        by_side = found["configurations"]
        for name in by_side.get(SIZED_SIDE, {}):
            config_rows.append((name, by_side[SIZED_SIDE][name], by_side.get(COUNT_ONE_SIDE, {}).get(name, "?")))
    lines.append(_table(config_rows))
    for found in results["models"].values():
        for side in SIDES:
            error = found.get(side, {}).get("first_error")
            if error:
                lines.append(f"note: {side}'s first error: {error}")
    return "\n".join(lines)


def _table(rows: Sequence[Sequence[str]]) -> str:
    """A name, then figures: indented under the title."""
    return text_table(rows, right=range(1, len(rows[0])), indent="  ")


def sizing_steps(specs: Mapping[str, ModelSpec], rounds: int) -> int:
    return len(pipeline_models(specs)) * rounds * len(SIDES)
