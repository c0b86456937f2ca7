"""YOLOv5 detections for the fidelity tests: a planted raw output, YOLOv5's own post-processing on it
(``tests.yolov5_reference``), and the comparison of an answer's detections with it, at ``MIN_IOU`` and
``SCORE_ATOL``. torch and the reference are imported where used: they are slow to load."""

from __future__ import annotations

import numpy as np

MIN_IOU, SCORE_ATOL = 0.999, 1e-5


def planted_output(seed: int, classes: int = 80, rows: int = 25200) -> np.ndarray:
    """Raw YOLO output: low-score background plus clusters of overlapping boxes of several classes."""
    rng = np.random.default_rng(seed)
    out = np.zeros((rows, 5 + classes), dtype=np.float32)
    out[:, :2] = rng.uniform(0, 640, (rows, 2))
    out[:, 2:4] = rng.uniform(4, 200, (rows, 2))
    out[:, 4] = rng.uniform(0, 0.3, rows)
    out[:, 5:] = rng.uniform(0, 0.3, (rows, classes))
    row = 0
    for cluster in range(30):
        cx, cy, w, h = rng.uniform(50, 590), rng.uniform(50, 590), rng.uniform(20, 200), rng.uniform(20, 200)
        cls = int(rng.integers(0, classes))
        for _ in range(int(rng.integers(2, 12))):
            out[row, :4] = (
                cx + rng.normal(0, w / 8),
                cy + rng.normal(0, h / 8),
                w * rng.uniform(0.8, 1.2),
                h * rng.uniform(0.8, 1.2),
            )
            out[row, 4] = rng.uniform(0.5, 1.0)
            out[row, 5:] = rng.uniform(0, 0.1, classes)
            # the same place under another class too: class-aware NMS keeps both
            out[row, 5 + (cls if cluster % 3 else (cls + row) % classes)] = rng.uniform(0.4, 1.0)
            row += 1
    return out


def reference_detections(
    output: np.ndarray, image_shape: tuple[int, int], conf: float, iou: float, max_det: int, size: int = 640
):
    """YOLOv5's detect.py after the forward pass: non_max_suppression, then scale_boxes from the
    ``size`` square input to the image."""
    import torch

    from tests import yolov5_reference

    found = yolov5_reference.non_max_suppression(torch.from_numpy(output.copy())[None], conf, iou, max_det=max_det)[0]
    found[:, :4] = yolov5_reference.scale_boxes((size, size), found[:, :4], image_shape)
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
    import torch

    from tests import yolov5_reference

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
    print(
        f"{what}: {len(theirs)} boxes of {len(set(theirs[:, 5].tolist()))} classes, "
        f"min IoU {min_iou:.7f}, max |score diff| {score_diff:.2e}"
    )
    assert min_iou >= MIN_IOU, what
    assert score_diff <= SCORE_ATOL, what
