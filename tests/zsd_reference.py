"""The zero_shot_object_detection family's reference: the model and its processor as a caller runs
them, ``processor(images=image, text=[labels])`` (Grounding DINO: the labels, which it joins into one
prompt, or the prompt) -> the model -> ``post_process_grounded_object_detection(outputs, threshold,
[text_threshold,] target_sizes=[(height, width)])``, and the comparison of an answer with it (the unit
and integration tests').

The processor answers the boxes in the model's order; the family answers them best first, so the
reference is sorted by score (a stable sort) before the comparison. Tolerances: the same boxes, in the
same order, with the same labels; scores within ``SCORE_ATOL``, each coordinate within ``BOX_ATOL`` pixels.

The reference itself is ``scripts.bench.prompted.references.ZsdReference`` (the benchmark times it).
"""

from __future__ import annotations

import numpy as np

from scripts.bench.prompted.references import ZsdReference  # noqa: F401 - the tests import it from here

SCORE_ATOL = 1e-4
BOX_ATOL = 0.05  # pixels


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
