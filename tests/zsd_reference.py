"""The zero_shot_object_detection family's reference: the model and its processor as a caller runs
them, ``processor(images=image, text=[labels])`` -> the model -> ``post_process_grounded_object_detection(
outputs, threshold, target_sizes=[(height, width)], text_labels=[labels])``, and the comparison of an
answer with it (the unit and integration tests').

The processor answers the boxes in the model's order; the family answers them best first, so the
reference is sorted by score (a stable sort) before the comparison. Tolerances: the same boxes, in the
same order, with the same labels; scores within ``SCORE_ATOL``, each coordinate within ``BOX_ATOL`` pixels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SCORE_ATOL = 1e-4
BOX_ATOL = 0.05  # pixels


class ZsdReference:
    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        torch.set_num_threads(1)
        self.model = AutoModelForZeroShotObjectDetection.from_pretrained(str(folder)).eval()
        self.processor = AutoProcessor.from_pretrained(str(folder))

    def detect(self, image, labels: list[str], threshold: float = 0.1) -> list[dict]:
        """The answer a caller gets from transformers, best first."""
        import torch

        inputs = self.processor(images=image, text=[list(labels)], return_tensors="pt")
        with torch.no_grad():
            outputs = self.model(**inputs)
        found = self.processor.post_process_grounded_object_detection(
            outputs, threshold=threshold, target_sizes=[(image.height, image.width)], text_labels=[list(labels)]
        )[0]
        scores = found["scores"].numpy()
        order = np.argsort(-scores, kind="stable")
        return [
            {"label": found["text_labels"][i], "score": float(scores[i]), "box": found["boxes"][i].tolist()}
            for i in order
        ]


def assert_answer(answer: list, expected: list[dict]) -> dict:
    """One image's answer against its reference; returns the worst differences (for the report)."""
    assert [a["label"] for a in answer] == [e["label"] for e in expected]
    worst = {"score": 0.0, "box": 0.0, "boxes": len(answer)}
    for one, want in zip(answer, expected):
        assert set(one) == {"label", "score", "box"}
        assert abs(one["score"] - want["score"]) <= SCORE_ATOL
        assert np.abs(np.array(one["box"]) - np.array(want["box"])).max() <= BOX_ATOL
        worst["score"] = max(worst["score"], abs(one["score"] - want["score"]))
        worst["box"] = max(worst["box"], float(np.abs(np.array(one["box"]) - np.array(want["box"])).max()))
    scores = [one["score"] for one in answer]
    assert scores == sorted(scores, reverse=True)
    return worst
