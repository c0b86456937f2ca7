"""The Triton pipeline of an image model (``app.core.pipeline``): its steps' and its ensemble's
``config.pbtxt``, as Triton's own ModelConfig protobuf.

    <name>_pipeline      ensemble: image (+ detector options) -> the results
      <name>_preprocess  python backend (python, onnxruntime targets) or DALI (tensorrt target)
      <name>             the network (scripts/model_prep/triton_config.py)
      <name>_postprocess python backend, detectors only: NMS, boxes in the original pixels

Every tensor that passes from one step to the next is declared the same way on both sides; the
wiring test (tests/unit/test_pipeline_config.py) holds that for every target.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from app.core.pipeline import (
    IMAGE_SIZE,
    POSTPROCESS,
    PREPROCESS,
    SOURCE_PARAMETER,
    STEP_PARAMETER,
    ensemble_model,
    postprocess_model,
    preprocess_model,
)
from app.core.spec import ModelSpec, TensorSpec
from app.triton import IMAGE_STEPS
from clients.detection import DETECTION_TENSORS, OPTION_TENSORS  # what the router sends and reads: one definition
from clients.vision import IMAGE_TENSORS
from scripts.model_prep.triton_config import Tuning, data_type

DETECTION_FAMILY = "detection"
VERSION = "1"
STEP_FILE, DALI_FILE = "model.py", "dali.py"
# An ensemble has no model file, but Triton needs its version folder: a file in it keeps the folder
# through copies that drop empty ones (S3 holds no empty folders; aws s3 sync, many copy helpers).
ENSEMBLE_NOTE = "ENSEMBLE.txt"
STEP_SOURCE = IMAGE_STEPS

SIZE_TENSOR = TensorSpec(IMAGE_SIZE, "INT64", (2,))

# Python steps run one request at a time per instance: two instances let decoding overlap
# with the network's work (more on a machine with more cores: [instances] steps in model.toml).
DEFAULT_STEP_INSTANCES = 2


def has_postprocess(spec: ModelSpec) -> bool:
    return spec.family == DETECTION_FAMILY


def _add(fields, tensors) -> None:
    for tensor in tensors:
        fields.add(name=tensor.name, data_type=data_type(tensor.dtype), dims=tensor.dims)


def preprocess_outputs(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    return (spec.inputs[0], SIZE_TENSOR)


def postprocess_inputs(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    return (spec.outputs[0], SIZE_TENSOR, *OPTION_TENSORS)


def ensemble_inputs(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    return (*IMAGE_TENSORS, *(OPTION_TENSORS if has_postprocess(spec) else ()))


def ensemble_outputs(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    return DETECTION_TENSORS if has_postprocess(spec) else spec.outputs


def python_step_config(spec: ModelSpec, step: str, tuning: Tuning, instances: int) -> mc.ModelConfig:
    """A python-backend step (``app/triton/image_steps.py``) of the pipeline."""
    name = preprocess_model(spec.name) if step == PREPROCESS else postprocess_model(spec.name)
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=tuning.max_batch_size)
    if step == PREPROCESS:
        _add(config.input, IMAGE_TENSORS)
        _add(config.output, preprocess_outputs(spec))
    else:
        _add(config.input, postprocess_inputs(spec))
        _add(config.output, DETECTION_TENSORS)
    config.dynamic_batching.max_queue_delay_microseconds = tuning.max_queue_delay_microseconds
    config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.parameters[STEP_PARAMETER].string_value = step
    config.parameters[SOURCE_PARAMETER].string_value = spec.name
    return config


def ensemble_config(spec: ModelSpec, tuning: Tuning) -> mc.ModelConfig:
    """The ensemble: the encoded image in, the small results out."""
    config = mc.ModelConfig(name=ensemble_model(spec.name), platform="ensemble", max_batch_size=tuning.max_batch_size)
    _add(config.input, ensemble_inputs(spec))
    _add(config.output, ensemble_outputs(spec))
    network_input = spec.inputs[0].name
    pre = config.ensemble_scheduling.step.add(model_name=preprocess_model(spec.name), model_version=-1)
    for tensor in IMAGE_TENSORS:
        pre.input_map[tensor.name] = tensor.name
    pre.output_map[network_input] = "preprocessed"
    net = config.ensemble_scheduling.step.add(model_name=spec.name, model_version=-1)
    net.input_map[network_input] = "preprocessed"
    if has_postprocess(spec):
        raw = spec.outputs[0].name
        net.output_map[raw] = "network_output"
        pre.output_map[IMAGE_SIZE] = IMAGE_SIZE
        post = config.ensemble_scheduling.step.add(model_name=postprocess_model(spec.name), model_version=-1)
        post.input_map[raw] = "network_output"
        post.input_map[IMAGE_SIZE] = IMAGE_SIZE
        for tensor in OPTION_TENSORS:
            post.input_map[tensor.name] = tensor.name
        for tensor in DETECTION_TENSORS:
            post.output_map[tensor.name] = tensor.name
    else:
        for tensor in spec.outputs:
            net.output_map[tensor.name] = tensor.name
    return config


def write_pipeline(
    spec: ModelSpec, repository: Path, target: str, tuning: Tuning, instances: int = DEFAULT_STEP_INSTANCES
) -> list[str]:
    """Write the pipeline's models beside the network; returns their names.

    The preprocessing step is the python backend's (our clients' code) for the python and
    onnxruntime targets, an NVIDIA DALI pipeline for tensorrt (the NGC image's DALI backend
    serialises ``dali.py`` when it loads the model, so writing it needs no GPU)."""
    from scripts.model_prep import triton_config

    written = []
    steps = [(PREPROCESS, preprocess_model(spec.name))]
    if has_postprocess(spec):
        steps.append((POSTPROCESS, postprocess_model(spec.name)))
    for step, name in steps:
        version = repository / name / VERSION
        version.mkdir(parents=True, exist_ok=True)
        for stale in (STEP_FILE, DALI_FILE):
            (version / stale).unlink(missing_ok=True)
        if step == PREPROCESS and target == triton_config.TENSORRT:
            from scripts.model_prep import dali_pipeline

            (version / DALI_FILE).write_text(dali_pipeline.pipeline_file(spec))
            config = dali_pipeline.preprocess_config(spec, tuning.max_batch_size)
        else:
            shutil.copyfile(STEP_SOURCE, version / STEP_FILE)
            config = python_step_config(spec, step, tuning, instances)
        (repository / name / "config.pbtxt").write_text(triton_config.to_text(config))
        written.append(name)
    name = ensemble_model(spec.name)
    (repository / name / VERSION).mkdir(parents=True, exist_ok=True)
    (repository / name / VERSION / ENSEMBLE_NOTE).write_text(
        f"{name} is an ensemble (config.pbtxt): it has no model file, and Triton needs this version folder.\n"
    )
    (repository / name / "config.pbtxt").write_text(triton_config.to_text(ensemble_config(spec, tuning)))
    return [*written, name]


def remove_pipeline(spec: ModelSpec, repository: Path) -> None:
    """A model moved to the router's pipeline leaves no steps behind for Triton to load."""
    for name in (preprocess_model(spec.name), postprocess_model(spec.name), ensemble_model(spec.name)):
        if (repository / name / "config.pbtxt").is_file():
            shutil.rmtree(repository / name)
