"""config.pbtxt for each target, built as Triton's own ModelConfig protobuf from a model's spec."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from app.core.sizing import SIZING_PARAMETER, auto_marker
from app.core.spec import ModelSpec
from clients.families import family_of
from clients.sized_configs import config_text

PYTHON, ONNXRUNTIME, TENSORRT = "python", "onnxruntime", "tensorrt"
TARGETS = (PYTHON, ONNXRUNTIME, TENSORRT)

# The file each target's backend loads from the version folder.
ARTIFACT = {PYTHON: "model.onnx", ONNXRUNTIME: "model.onnx", TENSORRT: "model.plan"}

# Where instances run. python: ONNX Runtime on the CPU provider inside the python backend.
# onnxruntime: KIND_AUTO, so the same repository loads on a GPU instance (GPU) and on a CPU-only
# one (CPU); KIND_GPU would fail to load without a GPU. tensorrt: engines only run on a GPU.
INSTANCE_KIND = {
    PYTHON: mc.ModelInstanceGroup.KIND_CPU,
    ONNXRUNTIME: mc.ModelInstanceGroup.KIND_AUTO,
    TENSORRT: mc.ModelInstanceGroup.KIND_GPU,
}

WEIGHTS_SOURCE_PARAMETER = "weights_source"
ORT_THREADS_PARAMETER = "ort_intra_op_threads"  # app/triton/onnx_model.py reads it
ORT_BACKEND_THREADS_PARAMETER = "intra_op_thread_count"  # Triton's onnxruntime backend reads it
# A generation model (text2text, text_generation) runs in the python backend for every target
# (app/triton/text2text_model.py, causal_lm_model.py); the target picks ONNX Runtime's providers, by preference.
ORT_PROVIDERS_PARAMETER = "ort_providers"
GENERATION_PROVIDERS = {
    PYTHON: "CPUExecutionProvider",
    ONNXRUNTIME: "CUDAExecutionProvider,CPUExecutionProvider",
    TENSORRT: "TensorrtExecutionProvider,CUDAExecutionProvider,CPUExecutionProvider",
}


@dataclass(frozen=True)
class Tuning:
    """The settings a user tunes per model, already resolved against the spec's defaults."""

    max_batch_size: int
    max_queue_delay_microseconds: int
    instance_count: int  # 0: auto (sized by serve for the machine)
    ort_threads: int = 0  # 0: auto (sized by serve; ONNX Runtime's default where nothing sizes it)


def model_config(spec: ModelSpec, target: str, tuning: Tuning, weights_source: str) -> mc.ModelConfig:
    if family_of(spec).loop:
        return generation_config(spec, target, tuning, weights_source)
    config = mc.ModelConfig(name=spec.name, max_batch_size=tuning.max_batch_size)
    if target == PYTHON:
        config.backend = "python"
    else:
        config.platform = "onnxruntime_onnx" if target == ONNXRUNTIME else "tensorrt_plan"
    from scripts.model_prep.detector_graph import served_tensors

    inputs, outputs = served_tensors(spec)  # a detector's graph on the Triton pipeline post-processes
    # The python target's model.py pads the requests of a batch to the longest (app/triton/onnx_model.py):
    # Triton may batch a text model's requests of different lengths, and the router pads none to a bucket.
    ragged = target == PYTHON and spec.text is not None
    for tensor in inputs:
        config.input.add(
            name=tensor.name,
            data_type=data_type(tensor.dtype),
            dims=tensor.dims,
            allow_ragged_batch=ragged and -1 in tensor.dims,
        )
    for tensor in outputs:
        config.output.add(name=tensor.name, data_type=data_type(tensor.dtype), dims=tensor.dims)
    config.dynamic_batching.max_queue_delay_microseconds = tuning.max_queue_delay_microseconds
    # One request of the largest batch, of zeros, before the model says READY: the first caller
    # does not pay for ONNX Runtime's (or TensorRT's) first run, and the runtime's memory arena
    # takes its working size at load time instead of growing under traffic.
    warmup = config.model_warmup.add(name=f"batch_{tuning.max_batch_size}", batch_size=tuning.max_batch_size, count=1)
    longest = spec.text.sequence_length if spec.text else 1  # a text model warms up at its longest texts
    for tensor in inputs:
        warmup.inputs[tensor.name].data_type = data_type(tensor.dtype)
        warmup.inputs[tensor.name].dims.extend(longest if d < 0 else d for d in tensor.dims)
        warmup.inputs[tensor.name].zero_data = True
    # instance count 0 is "auto": 1 here (what a Triton that does not size runs), sized by serve
    config.instance_group.add(count=tuning.instance_count or 1, kind=INSTANCE_KIND[target])
    if target != PYTHON:
        config.default_model_filename = ARTIFACT[target]
    config.parameters[WEIGHTS_SOURCE_PARAMETER].string_value = weights_source
    if target == PYTHON:
        config.parameters[ORT_THREADS_PARAMETER].string_value = str(tuning.ort_threads)
    elif target == ONNXRUNTIME and tuning.ort_threads:
        config.parameters[ORT_BACKEND_THREADS_PARAMETER].string_value = str(tuning.ort_threads)
    threads = None if target == TENSORRT else tuning.ort_threads
    config.parameters[SIZING_PARAMETER].string_value = auto_marker(tuning.instance_count, threads)
    return config


def generation_config(spec: ModelSpec, target: str, tuning: Tuning, weights_source: str) -> mc.ModelConfig:
    """A generation model (a family's ``loop``): the python backend on every target, its tensors from
    the spec (those of its ``optional_inputs`` marked optional), no warm-up request (its model.py warms
    up with a short generation of its own). A family that ``streams`` gets a decoupled model (a
    response per token) that batches the requests itself: ``max_batch_size`` 0 and no dynamic
    batching, and one instance unless model.toml asks for more: its requests join one running batch,
    where two instances would each step half of them (the sizing then gives that instance the threads
    two would have had); the others, Triton's dynamic batching."""
    family = family_of(spec)
    streams = family.streams
    instances = tuning.instance_count or (1 if streams else 0)
    batch = 0 if streams else tuning.max_batch_size
    config = mc.ModelConfig(name=spec.name, max_batch_size=batch, backend="python")
    for tensor in spec.inputs:
        optional = tensor.name in family.optional_inputs
        config.input.add(name=tensor.name, data_type=data_type(tensor.dtype), dims=tensor.dims, optional=optional)
    for tensor in spec.outputs:
        config.output.add(name=tensor.name, data_type=data_type(tensor.dtype), dims=tensor.dims)
    if streams:
        config.model_transaction_policy.decoupled = True
    elif batch:  # a model that takes one request at a time (mask_generation: an image) has none
        config.dynamic_batching.max_queue_delay_microseconds = tuning.max_queue_delay_microseconds
    config.instance_group.add(count=instances or 1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.parameters[WEIGHTS_SOURCE_PARAMETER].string_value = weights_source
    config.parameters[ORT_THREADS_PARAMETER].string_value = str(tuning.ort_threads)
    config.parameters[ORT_PROVIDERS_PARAMETER].string_value = GENERATION_PROVIDERS[target]
    config.parameters[SIZING_PARAMETER].string_value = auto_marker(instances, tuning.ort_threads)
    return config


def data_type(dtype: str) -> int:
    return mc.DataType.Value(f"TYPE_{dtype}")


def to_text(config: mc.ModelConfig) -> str:
    return config_text(config)


ParseError = text_format.ParseError


def parse(text: str) -> mc.ModelConfig:
    """A config.pbtxt's text as Triton's ModelConfig; ParseError when it is not one."""
    return text_format.Parse(text, mc.ModelConfig())


def read_config(path: Path) -> mc.ModelConfig:
    """A config.pbtxt file as Triton's ModelConfig: the one reader of the scripts and the tests."""
    return parse(Path(path).read_text())
