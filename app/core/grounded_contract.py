"""The ``grounded_segmentation`` family's contract: a detector of the ``zero_shot_object_detection``
family chained to a segmenter of the ``mask_generation`` family, each detection's box SAM's prompt
(framework-free: names and numbers only).

A chain's ``model.toml`` is three lines naming two models of the same repository::

    family = "grounded_segmentation"
    detector = "gdino"
    segmenter = "sam"

It is served as ONE Triton model of the python backend (``app/triton/grounded_model.py``) that opens
the two models' own ONNX graphs (``<repository>/<detector>/1/`` and ``<repository>/<segmenter>/1/``),
decodes the image once, runs the detector, keeps its boxes above the threshold (best first), scales
them to SAM's resized image and runs SAM's image encoder once and its mask decoder over every box. A
request is one image and its text (``max_batch_size`` 0):

- ``image`` ``UINT8 [-1]``, ``input_ids`` and ``attention_mask`` ``INT64 [rows, tokens]``: as the
  detector's own model takes them (``app.core.zsd_contract``);
- ``threshold`` ``FP32 [1]``: the detector's box threshold;
- out, for the ``detections`` kept, best first: the detector's ``logits [detections, columns]`` and
  ``pred_boxes [detections, 4]`` (its raw outputs of those boxes: the router reads their labels and
  scales their boxes as the detector's client does), SAM's ``iou_scores [detections, 1]`` and
  ``pred_masks [detections, 1, h, w]`` (the single mask, ``multimask_output=False``'s token).
"""

from __future__ import annotations

from app.core import mask_contract, zsd_contract

DETECTOR, SEGMENTER = "detector", "segmenter"  # model.toml's keys
THRESHOLD = "threshold"
IMAGE, INPUT_IDS, ATTENTION_MASK = zsd_contract.IMAGE, zsd_contract.INPUT_IDS, zsd_contract.ATTENTION_MASK
LOGITS, PRED_BOXES = zsd_contract.LOGITS, zsd_contract.PRED_BOXES
IOU_SCORES, PRED_MASKS = mask_contract.IOU_SCORES, mask_contract.PRED_MASKS
BOX_LABELS = (mask_contract.BOX_TOP_LEFT, mask_contract.BOX_BOTTOM_RIGHT)  # a box as SAM's two corners


def inputs() -> list[dict]:
    return [*zsd_contract.inputs(), {"name": THRESHOLD, "dtype": "FP32", "dims": [1]}]


def outputs() -> list[dict]:
    return [
        *zsd_contract.outputs(),
        {"name": IOU_SCORES, "dtype": "FP32", "dims": [-1, 1]},
        {"name": PRED_MASKS, "dtype": "FP32", "dims": [-1, 1, -1, -1]},
    ]
