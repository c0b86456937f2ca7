"""The ``zero_shot_object_detection`` family's contract (OWLv2, OWL-ViT), shared by the router, model
preparation and the Triton model that runs the detector's graph (framework-free: names and numbers only).

A detector is served as ONE Triton model of the python backend (``app/triton/zsd_model.py``) over one
ONNX graph, ``detector.onnx``: ``pixel_values [1, 3, H, W]``, ``input_ids`` and ``attention_mask``
``[labels, text length]`` -> ``logits [1, boxes, labels]`` and ``pred_boxes [1, boxes, 4]`` (cx, cy, w, h
in [0, 1]). The Triton model decodes the image and pre-processes it as the model's image processor
does (``clients.owl_image``); the router tokenizes the labels (padded to the text length, as the
processor's ``padding="max_length"``) and post-processes. A request is one image and its labels
(``max_batch_size`` 0):

- ``image`` ``UINT8 [-1]``: the encoded image (JPEG or PNG);
- ``input_ids``, ``attention_mask`` ``INT64 [labels, text length]``: the labels as the processor's tokenizer gives them;
- out, ``logits`` ``FP32 [boxes, labels]`` and ``pred_boxes`` ``FP32 [boxes, 4]``.
"""

from __future__ import annotations

GRAPH_FILE = "detector.onnx"
ONNX_FILES = (GRAPH_FILE,)
PIXEL_VALUES = "pixel_values"
IMAGE, INPUT_IDS, ATTENTION_MASK = "image", "input_ids", "attention_mask"
LOGITS, PRED_BOXES = "logits", "pred_boxes"
MODEL_TYPES = ("owlv2", "owlvit")

# The documented bound of a request: labels (each one query of the text encoder).
MAX_LABELS = 64


def inputs() -> list[dict]:
    return [
        {"name": IMAGE, "dtype": "UINT8", "dims": [-1]},
        {"name": INPUT_IDS, "dtype": "INT64", "dims": [-1, -1]},
        {"name": ATTENTION_MASK, "dtype": "INT64", "dims": [-1, -1]},
    ]


def outputs() -> list[dict]:
    return [
        {"name": LOGITS, "dtype": "FP32", "dims": [-1, -1]},
        {"name": PRED_BOXES, "dtype": "FP32", "dims": [-1, 4]},
    ]
