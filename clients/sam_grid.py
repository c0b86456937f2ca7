"""Whole-image mask generation, ``pipeline("mask-generation")``'s steps after SAM's network, as pure
numpy functions (the Triton model ``app/triton/sam_model.py`` runs them beside its ONNX Runtime sessions).

The pipeline, with its one crop (``crops_n_layers`` 0: the whole image):

- ``grid_points``: ``SamImageProcessor.generate_crop_boxes``' points: a grid of ``points_per_crop`` a
  side (``_build_point_grid``) over the image, in the resized image's pixels. Each point is a prompt
  of its own (SAM's pad point after it); the image's embedding is computed once.
- ``Grid.add``, for each batch of ``points_per_batch`` points: the three masks of each point
  (``multimask_output``, as the pipeline runs the model) scaled to the image (``post_process_masks``,
  ``clients.sam_image``), then ``filter_masks``: predicted IoU over ``pred_iou_thresh``, stability
  score (``stability_scores``) over ``stability_score_thresh``, each filter off at 0; the masks kept
  binarised at ``mask_threshold``, their tight boxes and COCO RLE. (``filter_masks``' test of a box
  near a crop's edge never holds for the one crop that is the image.)
- ``Grid.best``: ``post_process_for_mask_generation``: NMS over the boxes of every batch's masks at
  ``crops_nms_thresh`` (``nms``: torchvision's ``batched_nms`` of one class), best score first.

The answer is bounded by the grid: at most three masks a point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from app.core import mask_contract as contract
from clients import images, rle, sam_image

CHUNK = 16  # masks scaled to the image at once: 16 x H x W float32 at a time


def grid_points(per_side: int, size: tuple[int, int], longest_edge: int) -> np.ndarray:
    """[per_side**2, 2] float32 x, y: the grid (row by row) over an image of ``size`` (height, width),
    in the resized image's pixels. torch's ``linspace`` rounds by the CPU's vector width; this is the
    exact grid rounded once to float32 (within one float32 step of it)."""
    offset = 1 / (2 * per_side)
    side = np.linspace(offset, 1 - offset, per_side).astype(np.float32)
    points = np.stack([np.tile(side[None, :], (per_side, 1)), np.tile(side[:, None], (1, per_side))], axis=-1)
    height, width = size
    points = points.reshape(-1, 2) * np.array([width, height], dtype=np.float32)
    resized = sam_image.resized_size(height, width, longest_edge)
    scale = np.array([resized[1] / width, resized[0] / height], dtype=np.float32)
    return (points * scale).astype(np.float32)


def stability_scores(logits: np.ndarray, threshold: float, offset: float) -> np.ndarray:
    """[masks] float32: the pixels above ``threshold + offset`` over those above ``threshold - offset``
    (``_compute_stability_score``; NaN for a mask with none above the lower cut)."""
    flat = logits.reshape(len(logits), -1)
    inner = (flat > np.float32(threshold + offset)).sum(axis=1).astype(np.float32)
    outer = (flat > np.float32(threshold - offset)).sum(axis=1).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return inner / outer


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices kept, best score first: ``torchvision.ops.batched_nms`` of one class on float32 boxes."""
    order = np.argsort(-scores, kind="stable")
    keep = images.greedy_nms(boxes[order].astype(np.float32), iou_threshold, len(order))
    return order[keep]


@dataclass(frozen=True)
class Settings:
    """The grid's settings (``app.core.mask_contract.GRID_SETTINGS``)."""

    points_per_crop: int
    points_per_batch: int
    pred_iou_thresh: float
    stability_score_thresh: float
    mask_threshold: float
    stability_score_offset: float
    crops_nms_thresh: float

    @classmethod
    def of(cls, values: np.ndarray) -> Settings:
        """From the contract's grid input; a value out of bounds is a ValueError naming it."""
        if len(values) != len(contract.GRID_SETTINGS):
            raise ValueError(f"grid must hold {len(contract.GRID_SETTINGS)} values {contract.GRID_SETTINGS}")
        given = {}
        for name, value in zip(contract.GRID_SETTINGS, values.astype(np.float64).tolist()):
            low, high = contract.GRID_BOUNDS[name]
            whole = isinstance(low, int)
            if not (low <= value <= high) or (whole and not value.is_integer()):
                raise ValueError(
                    f"grid {name} must be {'an integer ' if whole else ''}from {low} to {high}, got {value}"
                )
            given[name] = int(value) if whole else value
        return cls(**given)


@dataclass
class Grid:
    """The masks kept so far of one image (``size``: height, width), batch after batch."""

    settings: Settings
    rows: np.ndarray  # sam_image.upscaling's two matrices: low resolution -> the image's pixels
    columns: np.ndarray
    scores: list[float] = field(default_factory=list)
    boxes: list[list[int]] = field(default_factory=list)
    counts: list[str] = field(default_factory=list)

    def add(self, iou_scores: np.ndarray, low_res: np.ndarray) -> None:
        """A batch's ``iou_scores [points, 3]`` and ``pred_masks [points, 3, h, w]``: its masks that
        pass the filters kept (point by point, each point's three in order)."""
        settings = self.settings
        scores = iou_scores.reshape(-1).astype(np.float32)
        masks = low_res.reshape(-1, *low_res.shape[-2:]).astype(np.float32)
        candidates = np.arange(len(scores))
        if settings.pred_iou_thresh > 0.0:
            candidates = candidates[scores > np.float32(settings.pred_iou_thresh)]
        for start in range(0, len(candidates), CHUNK):
            chosen = candidates[start : start + CHUNK]
            logits = self.rows @ masks[chosen] @ self.columns
            if settings.stability_score_thresh > 0.0:
                stable = stability_scores(logits, settings.mask_threshold, settings.stability_score_offset)
                passed = stable > np.float32(settings.stability_score_thresh)
                chosen, logits = chosen[passed], logits[passed]
            for index, mask in zip(chosen, logits > np.float32(settings.mask_threshold)):
                self.scores.append(float(scores[index]))
                self.boxes.append(sam_image.mask_box(mask))
                self.counts.append(rle.counts_to_string(rle.run_lengths(mask)))

    def best(self) -> dict[str, np.ndarray]:
        """The masks NMS keeps, best first, as the contract's grid outputs."""
        scores = np.asarray(self.scores, dtype=np.float32)
        boxes = np.asarray(self.boxes, dtype=np.int64).reshape(-1, 4)
        keep = nms(boxes, scores, self.settings.crops_nms_thresh)
        return outputs(scores[keep], boxes[keep], [self.counts[i] for i in keep])


def outputs(scores: np.ndarray, boxes: np.ndarray, counts: list[str]) -> dict[str, np.ndarray]:
    """Masks' scores, boxes and RLE counts as the contract's grid outputs (none: a prompts request's)."""
    encoded = [text.encode("ascii") for text in counts]
    return {
        contract.GRID_SCORES: np.asarray(scores, dtype=np.float32).reshape(-1),
        contract.GRID_BOXES: np.asarray(boxes, dtype=np.int64).reshape(-1, 4),
        contract.GRID_RLE: np.frombuffer(b"".join(encoded), dtype=np.uint8),
        contract.GRID_RLE_LENGTHS: np.array([len(text) for text in encoded], dtype=np.int64),
    }


def split_counts(data: np.ndarray, lengths: np.ndarray) -> list[str]:
    """The grid outputs' RLE counts, one string a mask (``Grid.best``'s inverse)."""
    text = np.asarray(data, dtype=np.uint8).tobytes().decode("ascii")
    ends = np.cumsum(lengths).tolist()
    return [text[start:end] for start, end in zip([0, *ends[:-1]], ends)]
