"""The mask_generation family's reference: ``SamModel`` + ``SamProcessor`` as a caller runs them, and
the comparison of an answer with it (the unit and integration tests').

Whole-image mask generation's reference is ``pipeline("mask-generation", model=<folder>)`` with the
same options (``whole_image``), its masks matched one to one (``assert_whole_image``).

Each prompt is run alone (``SamProcessor`` cannot pad prompts of different point counts within one
image, and a padding token changes SAM's masks), its masks ``post_process_masks(...)`` kept as logits
so that a pixel that differs can be told to sit at the threshold. Tolerances: scores within
``SCORE_ATOL``; a mask's pixels that differ from the reference's binarised mask at most
``PIXEL_FRACTION`` of the mask, each where the reference's logit is within ``LOGIT_ATOL`` of the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pycocotools.mask as coco

from scripts.bench.prompted import references

SCORE_ATOL = 1e-4
PIXEL_FRACTION = 1e-3
LOGIT_ATOL = 1e-4


@dataclass(frozen=True)
class Expected:
    """One prompt's reference: its masks' logits in the image's pixels and their scores, best first."""

    logits: np.ndarray  # [masks, H, W]
    scores: np.ndarray  # [masks]


class SamReference(references.SamReference):
    """The shared reference (``scripts.bench.prompted.references``), each prompt run alone."""

    def __init__(self, folder) -> None:
        super().__init__(folder)
        self.folder, self.generator = folder, None

    def prompt(self, image, box=None, points=None, labels=None, multimask: bool = False) -> Expected:
        given = {}
        if box is not None:
            given["input_boxes"] = [[list(box)]]
        if points is not None:
            given["input_points"] = [[[list(p) for p in points]]]
            given["input_labels"] = [[list(labels if labels is not None else [1] * len(points))]]
        masks, out = self.run(image, multimask, binarize=False, **given)
        logits = masks[0].numpy()
        scores = out.iou_scores[0, 0].numpy()
        order = np.argsort(-scores, kind="stable")
        return Expected(logits[order], scores[order])

    def whole_image(self, image, **options) -> dict:
        """``pipeline("mask-generation", model=<folder>)(image, **options)``: its masks and scores."""
        from transformers import pipeline

        if self.generator is None:
            self.generator = pipeline("mask-generation", model=str(self.folder))
        return self.generator(image, **options)

    def prompts(self, image, boxes=None, points=None, labels=None, multimask: bool = False) -> list[Expected]:
        count = len(boxes) if boxes is not None else len(points)
        return [
            self.prompt(
                image,
                None if boxes is None else boxes[i],
                None if points is None else points[i],
                None if labels is None else labels[i],
                multimask,
            )
            for i in range(count)
        ]


def mask_of(answer: dict) -> np.ndarray:
    """An answer's mask, decoded by pycocotools as a caller decodes it."""
    return coco.decode({"size": answer["mask"]["size"], "counts": answer["mask"]["counts"].encode()}).astype(bool)


def differing(answer: dict, logits: np.ndarray, threshold: float) -> tuple[int, float]:
    """How many pixels differ from the reference's mask, and the largest |logit - threshold| among them."""
    diff = mask_of(answer) != (logits > threshold)
    return int(diff.sum()), float(np.abs(logits[diff] - threshold).max()) if diff.any() else 0.0


def assert_answers(answers: list, expected: list[Expected], multimask: bool, threshold: float = 0.0) -> dict:
    """The answer of each prompt against its reference; returns the worst figures (for the report)."""
    assert len(answers) == len(expected)
    worst = {"score": 0.0, "fraction": 0.0, "logit": 0.0}
    for answer, want in zip(answers, expected):
        found = answer if multimask else [answer]
        assert len(found) == len(want.scores) == (3 if multimask else 1)
        for one, logits, score in zip(found, want.logits, want.scores):
            assert set(one) == {"mask", "score", "box"}
            assert one["mask"]["size"] == list(logits.shape)
            assert abs(one["score"] - float(score)) <= SCORE_ATOL
            count, at = differing(one, logits, threshold)
            assert count <= PIXEL_FRACTION * logits.size and at <= LOGIT_ATOL, (count, at)
            mask = mask_of(one)
            ys, xs = np.nonzero(mask)
            assert one["box"] == ([int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())] if xs.size else [0] * 4)
            worst = {
                "score": max(worst["score"], abs(one["score"] - float(score))),
                "fraction": max(worst["fraction"], count / logits.size),
                "logit": max(worst["logit"], at),
            }
        scores = [one["score"] for one in found]
        assert scores == sorted(scores, reverse=True)
    return worst


def assert_whole_image(answers: list, expected: dict, at_least: int) -> dict:
    """A whole image's answers against the pipeline's masks and scores: as many, at least ``at_least``
    (so that nothing passes for want of masks), best first, each matched to one of the pipeline's
    (score within ``SCORE_ATOL``, at most ``PIXEL_FRACTION`` of its pixels differing), its box its
    mask's; returns the worst figures (for the report)."""
    masks = [mask.numpy().astype(bool) for mask in expected["masks"]]
    scores = [float(score) for score in expected["scores"]]
    assert len(answers) == len(masks) >= at_least, (len(answers), len(masks))
    assert [one["score"] for one in answers] == sorted((one["score"] for one in answers), reverse=True)
    unmatched = set(range(len(masks)))
    worst = {"score": 0.0, "fraction": 0.0}
    for one in answers:
        assert set(one) == {"mask", "score", "box"}
        found = mask_of(one)
        ys, xs = np.nonzero(found)
        assert one["box"] == ([int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())] if xs.size else [0] * 4)
        assert one["mask"]["size"] == list(masks[0].shape)
        fits = {i: (abs(one["score"] - scores[i]), int((found != masks[i]).sum()) / found.size) for i in unmatched}
        close = {i: fit for i, fit in fits.items() if fit[0] <= SCORE_ATOL and fit[1] <= PIXEL_FRACTION}
        assert close, f"no mask of the pipeline's matches the answer of score {one['score']} (left: {fits})"
        index, (score, fraction) = min(close.items(), key=lambda item: (item[1][1], item[1][0]))
        unmatched.remove(index)
        worst = {"score": max(worst["score"], score), "fraction": max(worst["fraction"], fraction)}
    return worst
