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
from pathlib import Path

import numpy as np
import pycocotools.mask as coco

SCORE_ATOL = 1e-4
PIXEL_FRACTION = 1e-3
LOGIT_ATOL = 1e-4


@dataclass(frozen=True)
class Expected:
    """One prompt's reference: its masks' logits in the image's pixels and their scores, best first."""

    logits: np.ndarray  # [masks, H, W]
    scores: np.ndarray  # [masks]


class SamReference:
    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import SamModel, SamProcessor

        torch.set_num_threads(1)
        self.model = SamModel.from_pretrained(str(folder)).eval()
        self.processor = SamProcessor.from_pretrained(str(folder))

    def prompt(self, image, box=None, points=None, labels=None, multimask: bool = False) -> Expected:
        import torch

        given = {}
        if box is not None:
            given["input_boxes"] = [[list(box)]]
        if points is not None:
            given["input_points"] = [[[list(p) for p in points]]]
            given["input_labels"] = [[list(labels if labels is not None else [1] * len(points))]]
        inputs = self.processor(images=image, return_tensors="pt", **given)
        with torch.no_grad():
            out = self.model(**inputs, multimask_output=multimask)
        logits = self.processor.post_process_masks(
            out.pred_masks, inputs["original_sizes"], inputs["reshaped_input_sizes"], binarize=False
        )[0][0].numpy()
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
