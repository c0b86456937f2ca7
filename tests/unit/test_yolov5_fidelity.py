"""Issue check 2: the detection client against the YOLOv5 reference (yolov5 7.0.14's ``letterbox``,
``non_max_suppression`` and ``scale_boxes``, tests/yolov5_reference.py) on real photos:

- letterbox equal to ultralytics' (``auto=False``, colour 114) pixel for pixel, and the model input
  equal to ultralytics' ``float() / 255``;
- on the same raw output (a real forward pass of the built YOLOv5s ONNX, random weights, and a
  synthetic output with planted overlapping boxes of several classes), NMS plus box scaling give
  the same boxes (IoU >= 0.999), classes and scores (1e-5).
"""

from __future__ import annotations

import base64
import io

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from app.core.settings import Settings
from clients import images
from clients.detection import DetectionClient
from clients.families import load_spec
from clients.vision import Displayed
from scripts.devtools import built_test_repository
from scripts.model_prep import detector_graph
from tests import yolov5_reference
from tests.detections import assert_same_detections, planted_output, reference_detections, untie
from tests.references import OnnxTriton, real_photos

PHOTOS = real_photos()


@pytest.fixture(scope="module")
def client() -> DetectionClient:
    repository = built_test_repository()
    return DetectionClient(load_spec(repository / "yolov5"), OnnxTriton(repository), Settings())


@pytest.fixture(scope="module")
def raw_network(tmp_path_factory):
    """The built network without the postprocessing its graph has on the Triton pipeline: the raw
    output the router's pipeline post-processes (``client.postprocess``)."""
    repository = built_test_repository()
    path = tmp_path_factory.mktemp("raw") / "model.onnx"
    detector_graph.raw_network(repository / "yolov5" / "1" / "model.onnx", load_spec(repository / "yolov5"), path)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def pixels_of(data: bytes) -> np.ndarray:
    return np.asarray(images.decode_image(data, "img", 40_000_000), dtype=np.uint8)


@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_letterbox_and_input_equal_ultralytics(client, name):
    pixels = pixels_of(PHOTOS[name])
    ours, ratio, pad = images.letterbox(pixels, 640, (114, 114, 114))
    theirs, (r, _), their_pad = yolov5_reference.letterbox(pixels.copy(), (640, 640), color=(114, 114, 114), auto=False)
    assert ours.shape == theirs.shape == (640, 640, 3)
    assert np.array_equal(ours, theirs) and (ratio, pad) == (r, their_pad)
    tensor, context = client.preprocess(PHOTOS[name], "img", {})
    reference_input = torch.from_numpy(np.ascontiguousarray(theirs.transpose(2, 0, 1))).float() / 255
    assert np.array_equal(tensor["images"], reference_input.numpy())
    assert (context.width, context.height) == (pixels.shape[1], pixels.shape[0])


@pytest.mark.parametrize("name", ["dog.jpg", "horses.jpg", "person.jpg", "kite.jpg", "astronaut.png", "chelsea.png"])
# random weights: objectness about 1e-3 (YOLOv5's prior bias), class scores about 0.01-0.1
@pytest.mark.parametrize("conf, iou, max_det", [(1e-4, 0.45, 300), (5e-5, 0.6, 50)])
def test_real_forward_pass_equals_yolov5(client, raw_network, name, conf, iou, max_det):
    data = PHOTOS[name]
    pixels = pixels_of(data)
    letterboxed, _, _ = yolov5_reference.letterbox(pixels.copy(), (640, 640), color=(114, 114, 114), auto=False)
    reference_input = torch.from_numpy(np.ascontiguousarray(letterboxed.transpose(2, 0, 1))).float()[None] / 255
    (output,) = raw_network.run(None, {"images": reference_input.numpy()})
    output = untie(output[0])
    theirs = reference_detections(output, pixels.shape[:2], conf, iou, max_det)
    assert len(theirs) > 0, "random weights should give low-score boxes at this threshold"
    options = {"conf_threshold": conf, "iou_threshold": iou, "max_detections": max_det}
    tensors, context = client.preprocess(base64.b64encode(data).decode(), "payload.img", options)
    assert np.array_equal(tensors["images"], reference_input.numpy()[0])
    result = client.postprocess({"output": output}, context, options)
    assert (result["width"], result["height"]) == Image.open(io.BytesIO(data)).size
    assert_same_detections(result, theirs, f"{name} conf {conf} iou {iou} max_det {max_det}")


@pytest.mark.parametrize(
    "seed, conf, iou, max_det, shape",
    [
        (0, 0.25, 0.45, 300, (576, 768)),
        (1, 0.1, 0.45, 300, (768, 576)),
        (2, 0.5, 0.3, 5, (480, 640)),
        (3, 0.001, 0.6, 300, (1080, 1920)),
        (4, 0.25, 0.0, 300, (640, 640)),
        (5, 0.3, 0.45, 100, (120, 1000)),
    ],
)
def test_planted_output_equals_yolov5(client, seed, conf, iou, max_det, shape):
    output = planted_output(seed)
    theirs = reference_detections(output, shape, conf, iou, max_det)
    options = {"conf_threshold": conf, "iou_threshold": iou, "max_detections": max_det}
    result = client.postprocess({"output": output}, Displayed(width=shape[1], height=shape[0]), options)
    assert len(set(theirs[:, 5].tolist())) >= 3, "several classes"
    assert_same_detections(result, theirs, f"planted seed {seed} conf {conf} iou {iou} image {shape}")
