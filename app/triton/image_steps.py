"""Triton python-backend steps of an image model's pipeline (``app.core.pipeline``).

Copied as ``<name>_preprocess/1/model.py`` by model preparation
(scripts/model_prep/pipeline_config.py); the config's ``step`` parameter says which,
``source_model`` names the network whose ``model.toml`` (in the repository beside this model)
describes the processing. The steps run the router's own family client (``clients``), so the
image is processed by one implementation wherever it runs:

- preprocess: encoded image bytes (UINT8, zero-padded; the length of each row's image beside
  them) -> the network's input tensor and the image's displayed size (a detector's letterbox
  gain and padding too, which its graph's box scaling takes); an image that does not decode
  answers an ``InvalidItem`` error naming its row, which the router reports as a 400 naming the
  caller's item.
- postprocess (detectors, only in the benchmark's comparison: served detectors run NMS in their
  graph): the network's raw output, the displayed size and the request's options -> YOLOv5's NMS
  and ``scale_boxes``, padded to the longest of the batch, with the count of each.

Each request of a dynamically batched ``execute()`` is answered on its own, as Triton expects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from app.core.errors import InvalidInput, InvalidItem
from app.core.pipeline import (
    DETECTION_OPTIONS,
    DETECTIONS,
    IMAGE,
    IMAGE_LENGTH,
    IMAGE_SIZE,
    LETTERBOX,
    NUM_DETECTIONS,
    POSTPROCESS,
    PREPROCESS,
    SOURCE_PARAMETER,
    STEP_PARAMETER,
)
from app.core.settings import Settings
from clients.detection import DetectionClient, detect, geometry
from clients.families import load_spec, offline_client

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # outside Triton (unit tests call the functions below)
    pb_utils = None


def load_client(network_folder: Path):
    """The router's client of the network's family, built from its model.toml."""
    spec = load_spec(network_folder)
    return offline_client(spec, Settings.from_env())


def preprocess_batch(client, encoded: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """[B, L] encoded images, [B, 1] their lengths -> the network's [B, ...] input tensor, the [B, 2]
    displayed height, width (``IMAGE_SIZE``) and for a detector its [B, 3] letterbox gain and padding
    (``LETTERBOX``).

    Raises ``InvalidItem`` for the first row that does not decode."""
    tensor = client.spec.inputs[0]
    inputs, sizes = [], []
    for row, (data, length) in enumerate(zip(encoded, lengths.reshape(-1))):
        try:
            if not 0 < length <= len(data):
                raise InvalidInput(
                    f"{InvalidItem.WHERE}: {IMAGE_LENGTH} {int(length)} is not within its {len(data)} bytes"
                )
            arrays, displayed = client.preprocess(data[:length].tobytes(), InvalidItem.WHERE, {})
        except InvalidInput as error:
            raise InvalidItem(row, error.message) from None
        inputs.append(arrays[tensor.name].astype(tensor.numpy_dtype, copy=False))
        sizes.append((displayed.height, displayed.width))
    result = {tensor.name: np.stack(inputs), IMAGE_SIZE: np.asarray(sizes, dtype=np.int64)}
    if isinstance(client, DetectionClient):
        result[LETTERBOX] = np.stack([geometry(client.size, size)[LETTERBOX] for size in sizes])
    return result


def postprocess_batch(
    client, output: np.ndarray, sizes: np.ndarray, options: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """A detector's [B, N, 5 + classes] output -> ([B, K, 6] detections zero-padded, [B, 1] counts)."""
    found = []
    for row in range(len(output)):
        chosen = {name: options[name].reshape(len(output), -1)[row, 0] for name in DETECTION_OPTIONS}
        found.append(detect(output[row], client.size, (int(sizes[row][0]), int(sizes[row][1])), chosen))
    longest = max(len(rows) for rows in found)
    detections = np.zeros((len(found), longest, 6), dtype=np.float32)
    for row, rows in enumerate(found):
        detections[row, : len(rows)] = rows
    return detections, np.asarray([[len(rows)] for rows in found], dtype=np.int32)


def _parameter(config: Mapping, name: str) -> str:
    return config.get("parameters", {}).get(name, {}).get("string_value", "")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.step = _parameter(config, STEP_PARAMETER)
        if self.step not in (PREPROCESS, POSTPROCESS):
            raise ValueError(f"parameter {STEP_PARAMETER!r} must be {PREPROCESS} or {POSTPROCESS}, got {self.step!r}")
        source = _parameter(config, SOURCE_PARAMETER)
        self.client = load_client(Path(args["model_repository"]).parent / source)
        self.network_output = self.client.spec.outputs[0].name

    def _input(self, request, name: str) -> np.ndarray:
        return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

    def _answer(self, request) -> Sequence:
        if self.step == PREPROCESS:
            arrays = preprocess_batch(self.client, self._input(request, IMAGE), self._input(request, IMAGE_LENGTH))
            return [pb_utils.Tensor(name, array) for name, array in arrays.items()]
        options = {name: self._input(request, name) for name in DETECTION_OPTIONS}
        detections, counts = postprocess_batch(
            self.client, self._input(request, self.network_output), self._input(request, IMAGE_SIZE), options
        )
        return [pb_utils.Tensor(DETECTIONS, detections), pb_utils.Tensor(NUM_DETECTIONS, counts)]

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._answer(request)))
            except InvalidItem as error:  # the caller's image: Triton answers it 400
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            InvalidItem.encode(error.index, error.message), pb_utils.TritonError.INVALID_ARG
                        )
                    )
                )
            except Exception as error:  # noqa: BLE001 - one failed request answers an error; the step lives on
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"{self.step} failed: {error.__class__.__name__}: {error}")
                    )
                )
        return responses
