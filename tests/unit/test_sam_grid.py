"""Whole-image mask generation's pieces (``clients.sam_grid``) against what ``pipeline("mask-generation")``
runs: the grid of points against ``SamImageProcessor.generate_crop_boxes`` (within one float32 step:
torch's ``linspace`` rounds by the CPU's vector width), the stability score against
``_compute_stability_score``, a batch's filtering against ``post_process_masks`` + ``filter_masks``
(the same masks, scores and boxes), the NMS against ``torchvision.ops.batched_nms`` (ties, empty and
one-pixel boxes included: the same indices in the same order), and the grid's settings' bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.sam import image_processing_sam as hf_sam

from app.core import mask_contract as contract
from clients import images, rle, sam_grid, sam_image


@pytest.mark.parametrize(
    ("per_side", "size", "longest_edge"),
    [(32, (576, 768), 1024), (6, (180, 240), 256), (5, (1000, 333), 1024), (1, (37, 150), 256)],
)
def test_grid_points_equal_generate_crop_boxes(per_side, size, longest_edge):
    processor = hf_sam.SamImageProcessor()
    image = np.zeros((*size, 3), dtype=np.uint8)
    boxes, points, _, labels = processor.generate_crop_boxes(image, longest_edge, points_per_crop=per_side)
    assert boxes.tolist() == [[0, 0, size[1], size[0]]] and labels.unique().tolist() == [1]
    want = points[0, :, 0].numpy()
    found = sam_grid.grid_points(per_side, size, longest_edge)
    assert found.dtype == np.float32 and found.shape == want.shape == (per_side**2, 2)
    assert np.abs(found - want).max() <= np.spacing(np.float32(longest_edge))


def logits_of(seed: int, count: int, size: tuple[int, int]) -> np.ndarray:
    """Smooth random logits, some all below the cuts (a NaN stability score among them)."""
    rng = np.random.default_rng(seed)
    low = rng.standard_normal((count, 16, 16)).astype(np.float32)
    low[0] -= 10  # no pixel above the lower cut
    return sam_image.mask_logits(low, size, size, (80, 80)) * np.float32(2)


@pytest.mark.parametrize(("threshold", "offset"), [(0.0, 1.0), (0.25, 0.5), (-1.0, 0.1)])
def test_stability_scores_equal_the_processors(threshold, offset):
    logits = logits_of(0, 12, (50, 70))
    want = hf_sam._compute_stability_score(torch.from_numpy(logits), threshold, offset).numpy()
    found = sam_grid.stability_scores(logits, threshold, offset)
    assert found.dtype == np.float32 and np.isnan(found[0]) and np.isnan(want[0])
    np.testing.assert_array_equal(found, want)


SETTINGS = dict(contract.GRID_DEFAULTS)


@pytest.mark.parametrize(
    "changed",
    [
        {},
        {"pred_iou_thresh": 0.0, "stability_score_thresh": 0.0},
        {"pred_iou_thresh": 0.3, "mask_threshold": 0.5, "stability_score_offset": 0.25, "stability_score_thresh": 0.6},
    ],
)
def test_a_batch_is_filtered_as_filter_masks_filters_it(changed):
    settings = sam_grid.Settings(**{**SETTINGS, **changed})
    original, resized, padded = (90, 120), (48, 64), (64, 64)
    rng = np.random.default_rng(1)
    steepness = rng.uniform(10, 150, (5, 3, 1, 1))  # the steeper a mask's edges, the more stable it is
    low = (rng.standard_normal((5, 3, 16, 16)) * steepness).astype(np.float32)
    scores = rng.uniform(-0.2, 1.0, (5, 3)).astype(np.float32)
    grid = sam_grid.Grid(settings, *sam_image.upscaling((16, 16), resized, original, padded))
    grid.add(scores, low)
    processor = hf_sam.SamImageProcessor(pad_size={"height": padded[0], "width": padded[1]})
    (masks,) = processor.post_process_masks(
        [torch.from_numpy(low)], [original], [resized], binarize=False, mask_threshold=settings.mask_threshold
    )
    kept, kept_scores, boxes = processor.filter_masks(
        masks,
        torch.from_numpy(scores),
        original,
        torch.tensor([0, 0, original[1], original[0]]),
        settings.pred_iou_thresh,
        settings.stability_score_thresh,
        settings.mask_threshold,
        settings.stability_score_offset,
    )
    assert grid.scores == kept_scores.tolist() and grid.boxes == boxes.tolist()
    off = settings.pred_iou_thresh == settings.stability_score_thresh == 0.0
    assert len(grid.scores) == 15 if off else 0 < len(grid.scores) < 15  # some kept, some filtered out
    for counts, want in zip(grid.counts, kept):
        found = rle.decode({"size": list(original), "counts": counts}).astype(bool)
        differ = int((found != hf_sam._rle_to_mask(want).numpy()).sum())
        assert differ <= 1e-3 * found.size  # logits within float32 rounding of the processor's


def boxes_with_ties(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 60, (count, 2))
    sizes = rng.integers(0, 40, (count, 2))  # some empty and one-pixel-wide boxes
    boxes = np.concatenate([corners, corners + sizes], axis=1).astype(np.int64)
    boxes[5] = boxes[4]  # the same box twice
    boxes[7] = [3, 3, 3, 3]
    boxes[8] = [3, 3, 3, 3]  # two empty boxes: 0/0
    scores = rng.choice(np.linspace(0.1, 0.9, 9), count).astype(np.float32)  # many ties
    return boxes, scores


@pytest.mark.parametrize(("seed", "count", "threshold"), [(0, 40, 0.7), (1, 200, 0.5), (2, 1200, 0.7), (3, 60, 1.0)])
def test_nms_equals_torchvisions_batched_nms(seed, count, threshold):
    from torchvision.ops import batched_nms

    boxes, scores = boxes_with_ties(seed, count)
    want = batched_nms(torch.from_numpy(boxes).float(), torch.from_numpy(scores), torch.zeros(count), threshold)
    found = sam_grid.nms(boxes, scores, threshold)
    if count * 4 > 4000:  # torchvision's per-class branch sorts what it keeps again, ties in any order
        assert sorted(found.tolist()) == sorted(want.tolist())
        np.testing.assert_array_equal(scores[found], scores[want.numpy()])
    else:
        assert found.tolist() == want.tolist()


def test_greedy_nms_keeps_two_empty_boxes_as_torchvision_does():
    from torchvision.ops import nms

    boxes = np.array([[2, 2, 2, 2], [2, 2, 2, 2], [0, 0, 10, 10]], dtype=np.float32)
    want = nms(torch.from_numpy(boxes), torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist()
    assert images.greedy_nms(boxes, 0.5, 3).tolist() == want == [0, 1, 2]


def test_the_best_masks_come_back_as_the_contracts_outputs():
    settings = sam_grid.Settings(**{**SETTINGS, "crops_nms_thresh": 0.5})
    grid = sam_grid.Grid(settings, np.eye(4, dtype=np.float32), np.eye(4, dtype=np.float32))
    grid.scores, grid.boxes = [0.5, 0.9, 0.7], [[0, 0, 3, 3], [0, 0, 3, 2], [1, 1, 1, 1]]
    grid.counts = ["1", "22", "333"]
    best = grid.best()
    assert best[contract.GRID_SCORES].tolist() == pytest.approx([0.9, 0.7])
    assert best[contract.GRID_BOXES].tolist() == [[0, 0, 3, 2], [1, 1, 1, 1]]
    assert sam_grid.split_counts(best[contract.GRID_RLE], best[contract.GRID_RLE_LENGTHS]) == ["22", "333"]
    empty = sam_grid.Grid(settings, grid.rows, grid.columns).best()
    assert [v.shape for v in empty.values()] == [(0,), (0, 4), (0,), (0,)]
    assert sam_grid.split_counts(empty[contract.GRID_RLE], empty[contract.GRID_RLE_LENGTHS]) == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("points_per_crop", 0),
        ("points_per_crop", 65),
        ("points_per_crop", 2.5),
        ("points_per_batch", 257),
        ("pred_iou_thresh", 1.5),
        ("stability_score_thresh", -0.1),
        ("crops_nms_thresh", np.nan),
    ],
)
def test_settings_out_of_bounds_are_refused_naming_them(name, value):
    values = np.array([{**SETTINGS, name: value}[n] for n in contract.GRID_SETTINGS], dtype=np.float64)
    with pytest.raises(ValueError, match=f"grid {name} must be"):
        sam_grid.Settings.of(values)
    assert sam_grid.Settings.of(np.array([SETTINGS[n] for n in contract.GRID_SETTINGS], dtype=np.float64))
