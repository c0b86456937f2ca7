"""Where an image model's pre- and post-processing run, measured both ways in one run.

The benchmark's own stack serves every model as configured (image models on the Triton pipeline:
the router forwards the encoded bytes) and, beside each image model, ``<model>_router``: the same
network with ``pipeline = "router"`` (the router decodes, resizes and post-processes). Sides:

- ``P-triton``: a raw JPEG to ``<model>`` (the Triton pipeline);
- ``P-router``: the same JPEG to ``<model>_router`` (the router's pipeline); for ``bert_base``,
  whose processing always runs in the router, a one-mask text: the router's fixed cost.

For every step the CPU time of the stack's processes is read from ``/proc/<pid>/stat`` (user +
system, the process and its threads; Triton with its python-backend stubs) before and after, and
divided by the requests done: router, Triton and NGINX CPU per request. The bytes to and from
Triton per request are the sizes of the gRPC messages the router's client builds for the sample
(``ModelInferRequest``) and gets back (``ModelInferResponse``), from one call of each route.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.core.pipeline import PIPELINE_KEY, ROUTER, TRITON, ensemble_model, postprocess_model, preprocess_model
from app.core.settings import Settings
from app.core.spec import ModelSpec
from scripts.bench.constants import ROUTER_SIDE, TRITON_SIDE
from scripts.devtools import Stack
from scripts.model_prep import triton_config

ROUTER_SUFFIX = "_router"
ROLES = ("router", "triton", "nginx")
_TICKS = os.sysconf("SC_CLK_TCK")


def router_copy_name(model: str) -> str:
    return model + ROUTER_SUFFIX


def link_models(stack_repo: Path, repository: Path, models: Sequence[str]) -> None:
    """Links to each model's folders: the network and its Triton pipeline's steps."""
    for model in models:
        for name in (model, preprocess_model(model), postprocess_model(model), ensemble_model(model)):
            if (repository / name).is_dir():
                (stack_repo / name).symlink_to((repository / name).resolve(), target_is_directory=True)


def write_router_copies(stack_repo: Path, repository: Path, specs: Mapping[str, ModelSpec]) -> list[str]:
    """``<model>_router`` beside each image model on the Triton pipeline: its files linked, its
    config renamed, its model.toml choosing the router's pipeline. The names written."""
    written = []
    for model, spec in specs.items():
        if spec.pipeline != TRITON:
            continue
        name, source = router_copy_name(model), (repository / model).resolve()
        folder = stack_repo / name
        folder.mkdir(parents=True)
        for entry in source.iterdir():
            if entry.name == "config.pbtxt":
                config = triton_config.read_config(entry)
                config.name = name
                (folder / entry.name).write_text(triton_config.to_text(config))
            elif entry.name == "model.toml":
                (folder / entry.name).write_text(f'{PIPELINE_KEY} = "{ROUTER}"\n' + entry.read_text())
            else:
                (folder / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
        written.append(name)
    return written


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), 0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: fields 14 and 15 of stat


class CpuMeter:
    """CPU seconds of a stack's processes by role (``router``: the gunicorn workers)."""

    def __init__(self, stack: Stack) -> None:
        roles = stack.pids()
        self.pids = {"router": stack.router_workers(), "triton": roles["triton"], "nginx": roles["nginx"]}

    def __call__(self) -> dict[str, float]:
        return {role: sum(cpu_seconds(pid) for pid in pids) for role, pids in self.pids.items()}


def wire_bytes(spec: ModelSpec, item: Any, grpc_url: str, route: str = TRITON) -> tuple[int, int]:
    """(bytes to Triton, bytes back) of one request of ``item`` as the router's client sends it on
    ``route``: the serialised ModelInferRequest and ModelInferResponse."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from clients.registry import offline_client
    from scripts.bench.payloads import grpc_request

    client = offline_client(spec, Settings())
    chosen = client.routes[route]
    options = client.parse_options({})
    arrays, _ = chosen.prepare(item, "the sample", options)
    tensors = client._stack([arrays], chosen.inputs)
    request = grpc_request(chosen.model, tensors, [t.name for t in chosen.outputs])
    with grpc.insecure_channel(grpc_url, options=[("grpc.max_receive_message_length", -1)]) as channel:
        response: service_pb2.ModelInferResponse = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            request, timeout=60
        )
    return request.ByteSize(), response.ByteSize()


def placement_sides(specs: Mapping[str, ModelSpec]) -> dict[str, list[tuple[str, str]]]:
    """Per model: (side, the model name the request names) on the benchmark's own stack."""
    sides: dict[str, list[tuple[str, str]]] = {}
    for model, spec in specs.items():
        if spec.pipeline == TRITON:
            sides[model] = [(TRITON_SIDE, model), (ROUTER_SIDE, router_copy_name(model))]
        else:
            sides[model] = [(ROUTER_SIDE, model)]
    return sides
