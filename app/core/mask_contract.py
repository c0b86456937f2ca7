"""The ``mask_generation`` family's contract (SAM), shared by the router, model preparation and the
Triton model that runs SAM's two graphs (framework-free: names and numbers only).

A SAM model is served as ONE Triton model of the python backend (``app/triton/sam_model.py``) over two
ONNX graphs: ``encoder.onnx`` (``pixel_values`` -> ``image_embeddings``) and ``decoder.onnx`` (SAM's
prompt encoder and mask decoder: ``image_embeddings``, ``input_points``, ``input_labels`` ->
``iou_scores`` and ``pred_masks`` of all four mask tokens: token 0 is ``multimask_output=False``'s
mask, tokens 1 to 3 ``multimask_output=True``'s). The Triton model decodes the image, pre-processes it
as ``SamProcessor`` does (``clients.sam_image``), runs the encoder once and the decoder over every
prompt of the request. A request is one image and its prompts (``max_batch_size`` 0):

- ``image`` ``UINT8 [-1]``: the encoded image (JPEG or PNG);
- ``input_points`` ``FP32 [prompts, points, 2]``: each prompt's points, in the resized image's pixels
  (``SamProcessor``'s coordinates: the longest side resized to the encoder's size);
- ``input_labels`` ``INT64 [prompts, points]``: SAM's labels (``FOREGROUND``, ``BACKGROUND``, a box's
  ``BOX_TOP_LEFT`` and ``BOX_BOTTOM_RIGHT`` corners, ``NOT_A_POINT``), ``ABSENT`` after a prompt's last
  point (a prompt with fewer points than another: the rows of a request are run in groups of one
  length, since a padding token changes SAM's masks);
- out, ``iou_scores`` ``FP32 [prompts, 4]`` and ``pred_masks`` ``FP32 [prompts, 4, h, w]``: the
  low-resolution mask logits, which the router scales to the image and binarises.
"""

from __future__ import annotations

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"
ONNX_FILES = (ENCODER_FILE, DECODER_FILE)
PIXEL_VALUES, IMAGE_EMBEDDINGS = "pixel_values", "image_embeddings"
POINTS, LABELS = "input_points", "input_labels"
IOU_SCORES, PRED_MASKS = "iou_scores", "pred_masks"
IMAGE = "image"
MASK_TOKENS = 4  # token 0: the single mask; 1 to 3: the three of multimask_output
SINGLE, MULTIMASK = (0,), (1, 2, 3)

# SAM's point labels, as its prompt encoder reads them.
BACKGROUND, FOREGROUND, BOX_TOP_LEFT, BOX_BOTTOM_RIGHT = 0, 1, 2, 3
NOT_A_POINT = -1  # the pad point SAM appends to a prompt without a box
ABSENT = -100  # past a prompt's last point (not SAM's: the Triton model drops these slots)

# The documented bounds of a request.
MAX_PROMPTS = 64
MAX_POINTS = 16  # points of one prompt, its box's corners not counted


def inputs() -> list[dict]:
    return [
        {"name": IMAGE, "dtype": "UINT8", "dims": [-1]},
        {"name": POINTS, "dtype": "FP32", "dims": [-1, -1, 2]},
        {"name": LABELS, "dtype": "INT64", "dims": [-1, -1]},
    ]


def outputs() -> list[dict]:
    return [
        {"name": IOU_SCORES, "dtype": "FP32", "dims": [-1, MASK_TOKENS]},
        {"name": PRED_MASKS, "dtype": "FP32", "dims": [-1, MASK_TOKENS, -1, -1]},
    ]
