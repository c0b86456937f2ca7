"""The ``mask_generation`` family's contract (SAM, SAM-HQ), shared by the router, model preparation and
the Triton model that runs the model's two graphs (framework-free: names and numbers only).

A SAM model is served as ONE Triton model of the python backend (``app/triton/sam_model.py``) over two
ONNX graphs: ``encoder.onnx`` (``pixel_values`` -> ``ENCODER_OUTPUTS``) and ``decoder.onnx`` (the
prompt encoder and mask decoder: the encoder's outputs, ``input_points``, ``input_labels`` ->
``iou_scores`` and ``pred_masks`` of all four mask tokens: token 0 is ``multimask_output=False``'s
mask, tokens 1 to 3 ``multimask_output=True``'s). By model type (``MODEL_TYPES``, config.json's):

- SAM (``sam``): the encoder gives ``image_embeddings``;
- SAM-HQ (``sam_hq``): the encoder gives ``image_embeddings`` and ``intermediate_embeddings`` (the
  output of its ViT's first global-attention layer, ``[1, h, w, vit_dim]``), which the HQ mask decoder
  fuses with them; each token's mask is SAM's plus the HQ token's, and tokens 1 to 3 come sorted by
  score, best first (``SamHQMaskDecoder`` with ``hq_token_only`` false).

The Triton model decodes the image, pre-processes it as ``SamProcessor`` does (``clients.sam_image``),
runs the encoder once and the decoder over every prompt of the request (each run fed all the encoder
gave), or over a grid of points (whole-image mask generation, ``clients.sam_grid``). A request is one
image and its prompts or grid (``max_batch_size`` 0); ``input_points``, ``input_labels`` and ``grid``
are optional in its config (``clients.mask_generation``'s ``optional_inputs``): a KServe v2 body
leaves out those it does not use, read as empty (the router always sends all four):

- ``image`` ``UINT8 [-1]``: the encoded image (JPEG or PNG);
- ``input_points`` ``FP32 [prompts, points, 2]``: each prompt's points, in the resized image's pixels
  (``SamProcessor``'s coordinates: the longest side resized to the encoder's size);
- ``input_labels`` ``INT64 [prompts, points]``: SAM's labels (``FOREGROUND``, ``BACKGROUND``, a box's
  ``BOX_TOP_LEFT`` and ``BOX_BOTTOM_RIGHT`` corners, ``NOT_A_POINT``), ``ABSENT`` after a prompt's last
  point (a prompt with fewer points than another: the rows of a request are run in groups of one
  length, since a padding token changes SAM's masks);
- ``grid`` ``FP64 [settings]``: empty, the prompts are run; else the whole image is segmented
  (``pipeline("mask-generation")``'s grid of points; ``input_points`` and ``input_labels`` then empty,
  ``[0, 0, 2]`` and ``[0, 0]``), with the values of ``GRID_SETTINGS`` in their order;
- out, ``iou_scores`` ``FP32 [prompts, 4]`` and ``pred_masks`` ``FP32 [prompts, 4, h, w]``: the
  low-resolution mask logits, which the router scales to the image and binarises (none for a grid);
- out, for a grid, its masks kept best first: ``grid_scores`` ``FP32 [masks]`` (SAM's predicted IoU),
  ``grid_boxes`` ``INT64 [masks, 4]`` (each mask's tight box in the image's pixels), ``grid_rle``
  ``UINT8 [bytes]`` (their COCO RLE counts, ``clients.rle``, one after the other) and
  ``grid_rle_lengths`` ``INT64 [masks]`` (each one's length in it); none for prompts.
"""

from __future__ import annotations

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"
ONNX_FILES = (ENCODER_FILE, DECODER_FILE)
PIXEL_VALUES, IMAGE_EMBEDDINGS = "pixel_values", "image_embeddings"
INTERMEDIATE_EMBEDDINGS = "intermediate_embeddings"  # SAM-HQ's early ViT features
SAM, SAM_HQ = "sam", "sam_hq"
MODEL_TYPES = (SAM, SAM_HQ)  # config.json's model_type of the models served
ENCODER_OUTPUTS = {SAM: (IMAGE_EMBEDDINGS,), SAM_HQ: (IMAGE_EMBEDDINGS, INTERMEDIATE_EMBEDDINGS)}
POINTS, LABELS = "input_points", "input_labels"
IOU_SCORES, PRED_MASKS = "iou_scores", "pred_masks"
IMAGE = "image"
GRID = "grid"
GRID_SCORES, GRID_BOXES, GRID_RLE, GRID_RLE_LENGTHS = "grid_scores", "grid_boxes", "grid_rle", "grid_rle_lengths"
MASK_TOKENS = 4  # token 0: the single mask; 1 to 3: the three of multimask_output
SINGLE, MULTIMASK = (0,), (1, 2, 3)

# SAM's point labels, as its prompt encoder reads them.
BACKGROUND, FOREGROUND, BOX_TOP_LEFT, BOX_BOTTOM_RIGHT = 0, 1, 2, 3
NOT_A_POINT = -1  # the pad point SAM appends to a prompt without a box
ABSENT = -100  # past a prompt's last point (not SAM's: the Triton model drops these slots)

# The documented bounds of a request.
MAX_PROMPTS = 64
MAX_POINTS = 16  # points of one prompt, its box's corners not counted

# Whole-image mask generation: pipeline("mask-generation")'s settings, in the grid input's order, with
# its defaults and the served bounds (points_per_crop: the grid's points a side, at most 3 masks a point).
GRID_SETTINGS = (
    "points_per_crop",
    "points_per_batch",
    "pred_iou_thresh",
    "stability_score_thresh",
    "mask_threshold",
    "stability_score_offset",
    "crops_nms_thresh",
)
GRID_DEFAULTS = {
    "points_per_crop": 32,
    "points_per_batch": 64,
    "pred_iou_thresh": 0.88,
    "stability_score_thresh": 0.95,
    "mask_threshold": 0.0,
    "stability_score_offset": 1.0,
    "crops_nms_thresh": 0.7,
}
GRID_BOUNDS = {
    "points_per_crop": (1, 64),
    "points_per_batch": (1, 256),
    "pred_iou_thresh": (0.0, 1.0),
    "stability_score_thresh": (0.0, 1.0),
    "mask_threshold": (-1000.0, 1000.0),
    "stability_score_offset": (0.0, 1000.0),
    "crops_nms_thresh": (0.0, 1.0),
}
MAX_GRID_MASKS = 3 * GRID_BOUNDS["points_per_crop"][1] ** 2  # SAM's three masks a point of the largest grid


def inputs() -> list[dict]:
    return [
        {"name": IMAGE, "dtype": "UINT8", "dims": [-1]},
        {"name": POINTS, "dtype": "FP32", "dims": [-1, -1, 2]},
        {"name": LABELS, "dtype": "INT64", "dims": [-1, -1]},
        {"name": GRID, "dtype": "FP64", "dims": [-1]},
    ]


def outputs() -> list[dict]:
    return [
        {"name": IOU_SCORES, "dtype": "FP32", "dims": [-1, MASK_TOKENS]},
        {"name": PRED_MASKS, "dtype": "FP32", "dims": [-1, MASK_TOKENS, -1, -1]},
        {"name": GRID_SCORES, "dtype": "FP32", "dims": [-1]},
        {"name": GRID_BOXES, "dtype": "INT64", "dims": [-1, 4]},
        {"name": GRID_RLE, "dtype": "UINT8", "dims": [-1]},
        {"name": GRID_RLE_LENGTHS, "dtype": "INT64", "dims": [-1]},
    ]
