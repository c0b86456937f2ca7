"""The mask_generation family's reference: ``SamModel`` + ``SamProcessor`` as a caller runs them, and
the comparison of an answer with it (the unit and integration tests').

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
