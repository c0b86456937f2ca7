"""The grounded_segmentation reference: the detector's (``tests/zsd_reference.py``) then SAM's
(``tests/sam_reference.py``: SAM's or SAM-HQ's) with the detector's boxes as ``input_boxes``, one after the other, as a
user would run the two. Tolerances: theirs (labels exact, scores 1e-4, boxes 0.05 pixel; masks: at
most 0.1 % of the pixels differ, each where the reference's logit is within 1e-4 of the threshold)."""

from __future__ import annotations

import io

from PIL import Image

from clients import sam_image
from tests.sam_reference import assert_answers, mask_of
from tests.zsd_reference import assert_answer


def check_against_references(
    answer: list, references: dict, detector: str, data: bytes, text, segmenter: str = "sam", **options
) -> None:
    """The answer against the detector's reference, then the segmenter's (SAM's, or SAM-HQ's: the
    reference named ``segmenter``) on the detector's boxes."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    detections = references[detector].detect(
        image, text, threshold=options.get("threshold"), text_threshold=options.get("text_threshold", 0.25)
    )
    assert detections, "a test image with no detection tests nothing"
    assert_answer([{k: one[k] for k in ("label", "score", "box")} for one in answer], detections)
    expected = references[segmenter].prompts(image, boxes=[one["box"] for one in detections])
    masks = [
        {"mask": one["mask"], "score": one["mask_score"], "box": sam_image.mask_box(mask_of(one))} for one in answer
    ]
    assert_answers(masks, expected, False, options.get("mask_threshold", 0.0))
