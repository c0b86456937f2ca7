"""The zero_shot_object_detection family's reference: the model and its processor as a caller runs
them, ``processor(images=image, text=[labels])`` (Grounding DINO: the labels, which it joins into one
prompt, or the prompt) -> the model -> ``post_process_grounded_object_detection(outputs, threshold,
[text_threshold,] target_sizes=[(height, width)])``, and the comparison of an answer with it (the unit
and integration tests').

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

    @property
    def grounding(self) -> bool:
        return self.model.config.model_type == "grounding-dino"

    def detect(self, image, labels, threshold: float | None = None, text_threshold: float = 0.25) -> list[dict]:
        """The answer a caller gets from transformers, best first. ``labels``: a list of labels, or
        (Grounding DINO) a prompt; ``threshold``: the processor's default unless given."""
        import torch

        text = labels if isinstance(labels, str) else [list(labels)]
        inputs = self.processor(images=image, text=text, return_tensors="pt")
        with torch.no_grad():
            outputs = self.model(**inputs)
        size = [(image.height, image.width)]
        if self.grounding:
            found = self.processor.post_process_grounded_object_detection(
                outputs,
                threshold=0.25 if threshold is None else threshold,
                text_threshold=text_threshold,
                target_sizes=size,
            )[0]
        else:
            found = self.processor.post_process_grounded_object_detection(
                outputs, threshold=0.1 if threshold is None else threshold, target_sizes=size, text_labels=text
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
