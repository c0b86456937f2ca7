"""Where an image model's pre- and post-processing run, measured both ways in one run.

The benchmark's own stack serves every model as configured (image models on the Triton pipeline:
the router forwards the encoded bytes) and, beside each image model, ``<model>_router``: the same
network with ``pipeline = "router"`` (the router decodes, resizes and post-processes). Sides:

- ``P-triton``: a raw JPEG to ``<model>`` (the Triton pipeline);
- ``P-router``: the same JPEG to ``<model>_router`` (the router's pipeline); for ``bert_base``,
  whose processing always runs in the router, a one-mask text: the router's fixed cost;
- ``P-pystep`` (detectors): the same JPEG to ``<model>_pystep``, the Triton pipeline with the raw
  network and NMS in a python step after it (the layout before NMS joined the graph), to compare
  Triton's CPU per request with the graph's.

For every step the CPU time of the stack's processes is read from each process's CPU-time clock
(``cpu_seconds``: user + system, the process and its threads; Triton with its python-backend stubs)
before and after, and divided by the requests done: router, Triton and NGINX CPU per request. The
bytes to and from Triton per request are the sizes of the gRPC messages the router's client builds
for the sample (``ModelInferRequest``) and gets back (``ModelInferResponse``), from one call of each
route.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.core.pipeline import PIPELINE_KEY, ROUTER, TRITON, ensemble_model, postprocess_model, preprocess_model
from app.core.procfs import process_stat
from app.core.settings import Settings
from app.core.spec import ModelSpec
from clients.families import load_spec
from scripts.bench.constants import PYSTEP_SIDE, ROUTER_SIDE, TRITON_SIDE
from scripts.devtools import Stack
from scripts.model_prep import detector_graph, pipeline_config, triton_config

ROUTER_SUFFIX, PYSTEP_SUFFIX = "_router", "_pystep"
VERSION = "1"
ROLES = ("router", "triton", "nginx")
_TICKS = os.sysconf("SC_CLK_TCK")
# Linux's clock id for the CPU time of a whole process, as glibc's and musl's clock_getcpuclockid()
# build it: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), that is (~pid << 3) | 2.
_CPUCLOCK_SCHED = 2


def router_copy_name(model: str) -> str:
    return model + ROUTER_SUFFIX


def python_step_copy_name(model: str) -> str:
    return model + PYSTEP_SUFFIX


def link_models(stack_repo: Path, repository: Path, models: Sequence[str]) -> None:
    """Links to each model's folders: the network and its Triton pipeline's steps."""
    for model in models:
        for name in (model, preprocess_model(model), postprocess_model(model), ensemble_model(model)):
            if (repository / name).is_dir():
                (stack_repo / name).symlink_to((repository / name).resolve(), target_is_directory=True)


def write_router_copies(stack_repo: Path, repository: Path, specs: Mapping[str, ModelSpec]) -> list[str]:
    """``<model>_router`` beside each image model on the Triton pipeline: its files linked, its
    config renamed, its model.toml choosing the router's pipeline. A detector's served graph has
    its postprocessing appended: its copy is the raw network (extracted from that graph), and a
    second copy, ``<model>_pystep``, serves the raw network on the Triton pipeline with NMS in a
    python step after it (``P-pystep``), to compare with the graph. The names written."""
    written = []
    for model, spec in specs.items():
        if spec.pipeline != TRITON:
            continue
        name, source = router_copy_name(model), (repository / model).resolve()
        _copy(source, stack_repo / name, f'{PIPELINE_KEY} = "{ROUTER}"\n')
        written.append(name)
        if detector_graph.appends(spec):
            raw = stack_repo / name / VERSION / "model.onnx"
            (stack_repo / name / VERSION).unlink()  # the link to the served graph's folder
            detector_graph.raw_network(source / VERSION / "model.onnx", spec, raw)
            if (source / VERSION / "model.py").is_file():  # the python target's runner
                (stack_repo / name / VERSION / "model.py").symlink_to(source / VERSION / "model.py")
            _raw_config(stack_repo / name, load_spec(stack_repo / name))
            pystep = python_step_copy_name(model)
            _copy(stack_repo / name, stack_repo / pystep, "")
            pystep_spec = load_spec(stack_repo / pystep)
            config = _raw_config(stack_repo / pystep, pystep_spec)
            pipeline_config.write_pipeline(pystep_spec, stack_repo, _target(config), _tuning(config), python_step=True)
            written.append(pystep)
    return written


def _copy(source: Path, folder: Path, toml_prefix: str) -> None:
    """A model folder under another name: files linked, config renamed, model.toml prefixed."""
    folder.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name == "config.pbtxt":
            config = triton_config.read_config(entry)
            config.name = folder.name
            (folder / entry.name).write_text(triton_config.to_text(config))
        elif entry.name == "model.toml":
            text = entry.read_text()
            (folder / entry.name).write_text(toml_prefix + text.replace(f'{PIPELINE_KEY} = "{ROUTER}"\n', ""))
        else:
            (folder / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())


def _target(config) -> str:
    return triton_config.PYTHON if config.backend == "python" else triton_config.ONNXRUNTIME


def _tuning(config) -> triton_config.Tuning:
    threads = config.parameters[triton_config.ORT_THREADS_PARAMETER].string_value
    return triton_config.Tuning(
        max_batch_size=config.max_batch_size,
        max_queue_delay_microseconds=config.dynamic_batching.max_queue_delay_microseconds,
        instance_count=config.instance_group[0].count,
        ort_threads=int(threads or 0),
    )


def _raw_config(folder: Path, spec: ModelSpec):
    """The raw network's config.pbtxt (the spec's own tensors), with the served one's tuning."""
    served = triton_config.read_config(folder / "config.pbtxt")
    router_spec = replace(spec, pipeline=ROUTER)  # the raw network's tensors, whatever the copy's pipeline
    weights = served.parameters[triton_config.WEIGHTS_SOURCE_PARAMETER].string_value
    config = triton_config.model_config(router_spec, _target(served), _tuning(served), weights)
    config.name = folder.name
    (folder / "config.pbtxt").write_text(triton_config.to_text(config))
    return config


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads, ended ones too), 0 when it is gone.

    Read from the process's CPU-time clock: the scheduler's own count, in nanoseconds.
    ``/proc/<pid>/stat`` counts in clock ticks (10 ms): a step's figure was off by up to 10 ms a
    process, up to 0.18 ms a request on the text benchmark's fill-mask row (two router workers, about
    110 requests a 12 s step). Where the clock cannot be read (not Linux), the ticks."""
    try:
        return time.clock_gettime_ns((~pid << 3) | _CPUCLOCK_SCHED) / 1e9
    except (OSError, OverflowError):
        stat = process_stat(pid)
        return 0.0 if stat is None else stat.cpu_ticks / _TICKS


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

    from clients.families import offline_client
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
            if detector_graph.appends(spec):
                sides[model].append((PYSTEP_SIDE, python_step_copy_name(model)))
        else:
            sides[model] = [(ROUTER_SIDE, model)]
    return sides
