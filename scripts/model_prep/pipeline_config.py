"""The Triton pipeline of an image model (``app.core.pipeline``): its steps' and its ensemble's
``config.pbtxt``, as Triton's own ModelConfig protobuf.

    <name>_pipeline      ensemble: image (+ detector options) -> the results
      <name>_preprocess  python backend (python, onnxruntime targets) or DALI (tensorrt target)
      <name>             the network (scripts/model_prep/triton_config.py); a detector's graph has
                         its NMS and box scaling appended (scripts/model_prep/detector_graph.py) and
                         takes the letterbox's geometry and the options beside the image

The benchmark alone asks for the former layout of a detector (``python_step``): the raw network,
then ``<name>_postprocess``, a python-backend step running YOLOv5's NMS in numpy, to compare the two.
Every tensor that passes from one step to the next is declared the same way on both sides; the
wiring test (tests/unit/test_pipeline_config.py) holds that for every target.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from app.core.pipeline import (
    POSTPROCESS,
    PREPROCESS,
    SOURCE_PARAMETER,
    STEP_PARAMETER,
    ensemble_model,
    postprocess_model,
    preprocess_model,
)
from app.core.sizing import SIZING_PARAMETER, auto_marker
from app.core.spec import ModelSpec, TensorSpec
from app.triton import IMAGE_STEPS
from clients.detection import (  # what the router sends and reads: one definition
    DETECTION_TENSORS,
    GEOMETRY_TENSORS,
    OPTION_TENSORS,
)
from clients.families import family_of
from clients.vision import IMAGE_TENSORS
from scripts.model_prep.triton_config import Tuning, data_type

VERSION = "1"
STEP_FILE, DALI_FILE = "model.py", "dali.py"
# An ensemble has no model file, but Triton needs its version folder: a file in it keeps the folder
# through copies that drop empty ones (S3 holds no empty folders; aws s3 sync, many copy helpers).
ENSEMBLE_NOTE = "ENSEMBLE.txt"
STEP_SOURCE = IMAGE_STEPS

SIZE_TENSOR = GEOMETRY_TENSORS[0]

# Python steps run one request at a time per instance: two let decoding overlap with the network's
# work where nothing sizes them; serve sizes them for the machine ([instances] preprocess = "auto").
DEFAULT_STEP_INSTANCES = 2


def has_postprocess(spec: ModelSpec) -> bool:
    """Whether the family's post-processing joins its graph, fed the letterbox's geometry (a detector)."""
    return family_of(spec).graph_postprocess


def _add(fields, tensors) -> None:
    for tensor in tensors:
        fields.add(name=tensor.name, data_type=data_type(tensor.dtype), dims=tensor.dims)


def preprocess_outputs(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    """The network's image tensor and the image's displayed size; a detector's letterbox geometry too."""
    return (spec.inputs[0], *(GEOMETRY_TENSORS if has_postprocess(spec) else (SIZE_TENSOR,)))


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
    config.parameters[SIZING_PARAMETER].string_value = auto_marker(spec.preprocess_instances, None)
    return config


def dali_step_config(spec: ModelSpec, tuning: Tuning) -> mc.ModelConfig:
    """The DALI step (``scripts/model_prep/dali_pipeline.py``) with the network it serves and its
    sizing: copies on each GPU and num_threads, "auto" unless model.toml gives them."""
    from scripts.model_prep import dali_pipeline

    config = dali_pipeline.preprocess_config(spec, tuning.max_batch_size)
    del config.instance_group[:]
    config.instance_group.add(count=spec.preprocess_instances or 1, kind=mc.ModelInstanceGroup.KIND_GPU)
    if spec.preprocess_threads:
        config.parameters["num_threads"].string_value = str(spec.preprocess_threads)
    config.parameters[SOURCE_PARAMETER].string_value = spec.name
    config.parameters[SIZING_PARAMETER].string_value = auto_marker(spec.preprocess_instances, spec.preprocess_threads)
    return config


def ensemble_config(spec: ModelSpec, tuning: Tuning, python_step: bool = False) -> mc.ModelConfig:
    """The ensemble: the encoded image in, the small results out (``python_step``: a detector's raw
    network and the python postprocessing step, for the benchmark's comparison)."""
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
    if not has_postprocess(spec):
        for tensor in spec.outputs:
            net.output_map[tensor.name] = tensor.name
        return config
    # the python step computes the letterbox's geometry from the size itself
    geometry = (SIZE_TENSOR,) if python_step else GEOMETRY_TENSORS
    for tensor in geometry:
        pre.output_map[tensor.name] = tensor.name
    last = net
    if python_step:
        raw = spec.outputs[0].name
        net.output_map[raw] = "network_output"
        last = config.ensemble_scheduling.step.add(model_name=postprocess_model(spec.name), model_version=-1)
        last.input_map[raw] = "network_output"
    for tensor in (*geometry, *OPTION_TENSORS):
        last.input_map[tensor.name] = tensor.name
    for tensor in DETECTION_TENSORS:
        last.output_map[tensor.name] = tensor.name
    return config


def write_pipeline(
    spec: ModelSpec,
    repository: Path,
    target: str,
    tuning: Tuning,
    instances: int = DEFAULT_STEP_INSTANCES,
    python_step: bool = False,
) -> list[str]:
    """Write the pipeline's models beside the network; returns their names.

    The preprocessing step is the python backend's (our clients' code) for the python and
    onnxruntime targets, an NVIDIA DALI pipeline for tensorrt (the NGC image's DALI backend
    serialises ``dali.py`` when it loads the model, so writing it needs no GPU). ``python_step``:
    a detector's ``<name>_postprocess`` python step after its raw network (the benchmark's)."""
    from scripts.model_prep import triton_config

    written = []
    steps = [(PREPROCESS, preprocess_model(spec.name))]
    if python_step and has_postprocess(spec):
        steps.append((POSTPROCESS, postprocess_model(spec.name)))
    else:
        remove_steps(repository, [postprocess_model(spec.name)])
    for step, name in steps:
        version = repository / name / VERSION
        version.mkdir(parents=True, exist_ok=True)
        for stale in (STEP_FILE, DALI_FILE):
            (version / stale).unlink(missing_ok=True)
        if step == PREPROCESS and target == triton_config.TENSORRT:
            from scripts.model_prep import dali_pipeline

            (version / DALI_FILE).write_text(dali_pipeline.pipeline_file(spec))
            config = dali_step_config(spec, tuning)
        else:
            shutil.copyfile(STEP_SOURCE, version / STEP_FILE)
            config = python_step_config(spec, step, tuning, spec.preprocess_instances or instances)
        (repository / name / "config.pbtxt").write_text(triton_config.to_text(config))
        written.append(name)
    name = ensemble_model(spec.name)
    (repository / name / VERSION).mkdir(parents=True, exist_ok=True)
    (repository / name / VERSION / ENSEMBLE_NOTE).write_text(
        f"{name} is an ensemble (config.pbtxt): it has no model file, and Triton needs this version folder.\n"
    )
    (repository / name / "config.pbtxt").write_text(triton_config.to_text(ensemble_config(spec, tuning, python_step)))
    return [*written, name]


def remove_steps(repository: Path, names: list[str]) -> None:
    for name in names:
        if (repository / name / "config.pbtxt").is_file():
            shutil.rmtree(repository / name)


def remove_pipeline(spec: ModelSpec, repository: Path) -> None:
    """A model moved to the router's pipeline leaves no steps behind for Triton to load."""
    remove_steps(repository, [preprocess_model(spec.name), postprocess_model(spec.name), ensemble_model(spec.name)])
