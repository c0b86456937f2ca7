"""Where an image model's pre- and post-processing run, and the names the Triton pipeline uses.

An image model's ``model.toml`` chooses (top-level ``pipeline``):

- ``"triton"`` (the default): the router sends the encoded image unread (its header checked for
  the pixel limit) and Triton runs the whole pipeline as an ensemble: a preprocessing step
  (a python-backend model here; NVIDIA DALI on a GPU), then the network; a detector's network
  graph has its postprocessing appended (NMS, boxes in the original image's pixels:
  scripts/model_prep/detector_graph.py). Small results come back.
- ``"router"``: the router decodes, resizes and normalises, sends the network's input tensor and
  post-processes the network's output itself.

The repository for a model ``<name>`` holds the network as ``<name>``, and with the Triton pipeline
``<name>_preprocess`` and the ensemble ``<name>_pipeline``. A classifier's network keeps the tensors
model.toml describes; a detector's takes the letterbox's geometry and the request's options beside
its image and answers the detections (on the router's pipeline it is the raw network, as
model.toml describes it). ``<name>_postprocess`` (NMS in a python step) is written only by the
benchmark, which compares it with the graph.
Standard library only: the router, the clients and the model-preparation scripts all read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TRITON, ROUTER = "triton", "router"
PIPELINES = (TRITON, ROUTER)
PIPELINE_KEY = "pipeline"  # the model.toml key

# The steps' model names.
PREPROCESS_SUFFIX, POSTPROCESS_SUFFIX, ENSEMBLE_SUFFIX = "_preprocess", "_postprocess", "_pipeline"

# Tensors of the ensemble and its steps (besides the network's own, named by model.toml).
IMAGE = "image"  # UINT8 [-1]: the encoded image's bytes, zero-padded to the longest of a batch
IMAGE_LENGTH = "image_length"  # INT64 [1]: how many bytes of its ``image`` row are the image (the rest pad)
IMAGE_SIZE = "image_size"  # INT64 [2]: height, width of the image as displayed (EXIF applied)
LETTERBOX = "letterbox"  # FP32 [3]: a detector's letterbox gain and x, y padding (input pixels)
DETECTIONS = "detections"  # FP32 [-1, 6]: x1, y1, x2, y2, score, class; original pixels; best first
NUM_DETECTIONS = "num_detections"  # INT32 [1]: rows of ``detections`` that are real (the rest pad)

# The python-backend steps' config parameters: which step, and the network whose model.toml it reads.
STEP_PARAMETER, SOURCE_PARAMETER = "step", "source_model"
PREPROCESS, POSTPROCESS = "preprocess", "postprocess"

# Detector options sent as tensors of one element: name -> Triton dtype.
DETECTION_OPTIONS: Mapping[str, str] = {
    "conf_threshold": "FP32",
    "iou_threshold": "FP32",
    "max_detections": "INT32",
}


def preprocess_model(name: str) -> str:
    return name + PREPROCESS_SUFFIX


def postprocess_model(name: str) -> str:
    return name + POSTPROCESS_SUFFIX


def ensemble_model(name: str) -> str:
    return name + ENSEMBLE_SUFFIX


def pipeline_of(
    raw: Mapping[str, Any], family: str, pipelines: Sequence[str], triton: Sequence[str], where: str
) -> str:
    """The ``pipeline`` a model.toml chose, or its family's default (the first of ``pipelines``, where
    the family's pre- and post-processing may run; ``triton``: the families Triton can run them for;
    ``where`` names the file)."""
    if PIPELINE_KEY not in raw:
        return pipelines[0]
    value = str(raw[PIPELINE_KEY]).lower()
    if value not in PIPELINES:
        raise ValueError(f"{where}: {PIPELINE_KEY} must be one of {', '.join(PIPELINES)}, got {raw[PIPELINE_KEY]!r}")
    if value not in pipelines:
        raise ValueError(
            f"{where}: {PIPELINE_KEY} = {TRITON!r}: the {family} family runs its pre- and "
            f"post-processing in the router (Triton pipelines: {', '.join(triton)})"
        )
    return value


def triton_models(name: str, pipeline: str) -> tuple[str, ...]:
    """The Triton models a served model needs READY: the network, and the ensemble on its pipeline."""
    return (name, ensemble_model(name)) if pipeline == TRITON else (name,)
