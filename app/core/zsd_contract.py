"""The ``zero_shot_object_detection`` family's contract (OWLv2, OWL-ViT, Grounding DINO), shared by the
router, model preparation and the Triton model that runs the detector's graph (framework-free: names
and numbers only).

A detector is served as ONE Triton model of the python backend (``app/triton/zsd_model.py``) over one
ONNX graph, ``detector.onnx``, the model's forward as a caller runs it:

- OWLv2, OWL-ViT: ``pixel_values [1, 3, H, W]``, ``input_ids`` and ``attention_mask`` ``[labels, 16]``
  (a query a label) -> ``logits [1, boxes, labels]`` and ``pred_boxes [1, boxes, 4]``;
- Grounding DINO: ``pixel_values [1, 3, H, W]`` (any size), ``pixel_mask [1, H, W]``, ``input_ids``,
  ``attention_mask`` and ``token_type_ids`` ``[1, tokens]`` (one prompt, "a cat. a remote control.") ->
  ``logits [1, queries, 256]`` (a column a token) and ``pred_boxes [1, queries, 4]``.

``pred_boxes`` are (cx, cy, w, h) in [0, 1]. The Triton model decodes the image and pre-processes it as
the model's image processor does (``clients.zsd_image``); the router tokenizes the labels and
post-processes. A request is one image and its text (``max_batch_size`` 0):

- ``image`` ``UINT8 [-1]``: the encoded image (JPEG or PNG);
- ``input_ids``, ``attention_mask`` ``INT64 [rows, tokens]``: the text as the processor's tokenizer gives it;
- out, ``logits`` ``FP32 [boxes, columns]`` and ``pred_boxes`` ``FP32 [boxes, 4]``.
"""

from __future__ import annotations

GRAPH_FILE = "detector.onnx"
ONNX_FILES = (GRAPH_FILE,)
PIXEL_VALUES = "pixel_values"
IMAGE, INPUT_IDS, ATTENTION_MASK = "image", "input_ids", "attention_mask"
PIXEL_MASK, TOKEN_TYPE_IDS = "pixel_mask", "token_type_ids"  # Grounding DINO's graph only
LOGITS, PRED_BOXES = "logits", "pred_boxes"
OWLV2, OWLVIT, GROUNDING_DINO = "owlv2", "owlvit", "grounding-dino"
MODEL_TYPES = (OWLV2, OWLVIT, GROUNDING_DINO)

# The documented bounds of a request: labels (OWL: each one query of the text encoder; Grounding
# DINO: joined into one prompt), and Grounding DINO's prompt in tokens (its max_text_len).
MAX_LABELS = 64
MAX_TEXT_TOKENS = 256


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
