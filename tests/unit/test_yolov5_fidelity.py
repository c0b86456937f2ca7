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
import pytest
import torch
from PIL import Image

from app.core.settings import Settings
from app.core.spec import load_spec
from clients import images
from clients.detection import DetectionClient
from clients.vision import Displayed
from scripts.devtools import built_test_repository
from tests import yolov5_reference
from tests.references import OnnxTriton, real_photos
from tests.unit.test_images import planted_output

PHOTOS = real_photos()
MIN_IOU, SCORE_ATOL = 0.999, 1e-5


@pytest.fixture(scope="module")
def client() -> DetectionClient:
    repository = built_test_repository()
    return DetectionClient(load_spec(repository / "yolov5"), OnnxTriton(repository), Settings())


def pixels_of(data: bytes) -> np.ndarray:
    return np.asarray(images.decode_image(data, "img", 40_000_000), dtype=np.uint8)


def reference_detections(output: np.ndarray, image_shape: tuple[int, int], conf: float, iou: float, max_det: int):
    """YOLOv5's detect.py after the forward pass: non_max_suppression, then scale_boxes to the image."""
    found = yolov5_reference.non_max_suppression(torch.from_numpy(output.copy())[None], conf, iou, max_det=max_det)[0]
    found[:, :4] = yolov5_reference.scale_boxes((640, 640), found[:, :4], image_shape)
    return found.numpy()


def untie(output: np.ndarray) -> np.ndarray:
    """The raw output with exact score ties broken: row i's objectness times 1 + k_i * 2**-20,
    k a fixed permutation of the rows (at most +2.4%).

    With random weights, cells that see the same pixels (the grey letterbox bands, flat regions)
    give bit-identical boxes and scores (1,200 candidates of the dog photo hold 27 distinct
    scores), and greedy NMS then keeps whichever tied box its sort puts first: numpy's stable
    sort and torch's sort order ties differently, and neither is wrong. Steps of 2**-20 are 8
    float32 ulps, so every row's score becomes distinct; both sides then get the very same array.
    """
    untied = output.copy()
    steps = np.random.default_rng(0).permutation(len(untied)).astype(np.float64) * 2.0**-20
    untied[:, 4] = (untied[:, 4].astype(np.float64) * (1 + steps)).astype(np.float32)
    return untied


def canonical(rows: np.ndarray) -> np.ndarray:
    """Rows ``x1, y1, x2, y2, score, class`` best first, exact score ties in a fixed order.

    With random weights many grid cells give bit-identical scores; both sides sort by score, but
    numpy's stable sort and torch's sort order such ties differently, and the order among equal
    scores means nothing. Which boxes are kept is still compared exactly.
    """
    order = np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0], rows[:, 5], -rows[:, 4]))
    return rows[order]


def assert_same_detections(result: dict, theirs: np.ndarray, what: str) -> None:
    detections = result["detections"]
    assert len(detections) == len(theirs), what
    if not len(theirs):
        return
    ours = np.array([[*d["box"], d["score"], d["class_id"]] for d in detections], dtype=np.float32)
    scores = ours[:, 4]
    assert np.all(scores[:-1] >= scores[1:]), "best first"
    ours, theirs = canonical(ours), canonical(theirs)
    ours_boxes = torch.from_numpy(ours[:, :4])
    ious = yolov5_reference.box_iou(ours_boxes, torch.from_numpy(theirs[:, :4])).diagonal()
    # a box clipped to zero width or height has IoU 0 even with itself: those are compared exactly
    degenerate = (ours_boxes[:, 2] <= ours_boxes[:, 0]) | (ours_boxes[:, 3] <= ours_boxes[:, 1])
    np.testing.assert_allclose(ours[degenerate.numpy(), :4], theirs[degenerate.numpy(), :4], rtol=0, atol=1e-3)
    assert ours[:, 5].tolist() == theirs[:, 5].tolist(), what
    score_diff = float(np.max(np.abs(ours[:, 4] - theirs[:, 4])))
    min_iou = float(ious[~degenerate].min()) if bool((~degenerate).any()) else 1.0
    print(f"{what}: {len(theirs)} boxes of {len(set(theirs[:, 5].tolist()))} classes, "
          f"min IoU {min_iou:.7f}, max |score diff| {score_diff:.2e}")
    assert min_iou >= MIN_IOU, what
    assert score_diff <= SCORE_ATOL, what


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
def test_real_forward_pass_equals_yolov5(client, name, conf, iou, max_det):
    data = PHOTOS[name]
    pixels = pixels_of(data)
    letterboxed, _, _ = yolov5_reference.letterbox(pixels.copy(), (640, 640), color=(114, 114, 114), auto=False)
    reference_input = torch.from_numpy(np.ascontiguousarray(letterboxed.transpose(2, 0, 1))).float()[None] / 255
    (output,) = client.triton.session("yolov5").run(None, {"images": reference_input.numpy()})
    output = untie(output[0])
    theirs = reference_detections(output, pixels.shape[:2], conf, iou, max_det)
    assert len(theirs) > 0, "random weights should give low-score boxes at this threshold"
    options = {"conf_threshold": conf, "iou_threshold": iou, "max_detections": max_det}
    tensors, context = client.preprocess(base64.b64encode(data).decode(), "payload.img", options)
    assert np.array_equal(tensors["images"], reference_input.numpy()[0])
    result = client.postprocess({"output": output}, context, options)
    assert (result["width"], result["height"]) == Image.open(io.BytesIO(data)).size
    assert_same_detections(result, theirs, f"{name} conf {conf} iou {iou} max_det {max_det}")


@pytest.mark.parametrize("seed, conf, iou, max_det, shape", [
    (0, 0.25, 0.45, 300, (576, 768)), (1, 0.1, 0.45, 300, (768, 576)), (2, 0.5, 0.3, 5, (480, 640)),
    (3, 0.001, 0.6, 300, (1080, 1920)), (4, 0.25, 0.0, 300, (640, 640)), (5, 0.3, 0.45, 100, (120, 1000)),
])
def test_planted_output_equals_yolov5(client, seed, conf, iou, max_det, shape):
    output = planted_output(seed)
    theirs = reference_detections(output, shape, conf, iou, max_det)
    options = {"conf_threshold": conf, "iou_threshold": iou, "max_detections": max_det}
    result = client.postprocess({"output": output}, Displayed(width=shape[1], height=shape[0]), options)
    assert len(set(theirs[:, 5].tolist())) >= 3, "several classes"
    assert_same_detections(result, theirs, f"planted seed {seed} conf {conf} iou {iou} image {shape}")
