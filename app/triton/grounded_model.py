"""Triton python-backend model of a ``grounded_segmentation`` chain: a zero-shot detector, then SAM over
its boxes (``app.core.grounded_contract``).

Copied as ``<chain>/1/model.py`` by model preparation. It holds ONNX Runtime sessions of the two
models' own graphs, opened where their model preparation wrote them (``<repository>/<detector>/1/``,
``<repository>/<segmenter>/1/``), through the two families' own Triton classes (``Detector``,
``Segmenter``). A request: the image decoded once (numpy), the detector's pre-processing and graph,
its boxes above the threshold kept best first (``clients.zero_shot_detection.best_first``) and scaled
to the image's pixels as its client scales them (``clients.owl_image.boxes``), then to SAM's resized
image (``clients.sam_image.scale_points``) as two corners each, SAM's pre-processing of the same
decoded pixels, its image encoder run once and its mask decoder over every box (each as if alone).

The boxes are not checked against the image (a detector's box may reach past it, and SAM's processor
takes it as it is); the tokens are checked as the detector's own model checks them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.core import grounded_contract as contract
from app.core.settings import Settings
from app.triton.responses import Refused, answer_each
from app.triton.sam_model import Segmenter
from app.triton.zsd_model import Detector
from clients import images, owl_image, sam_image
from clients.zero_shot_detection import best_first

PROVIDERS_PARAMETER = "ort_providers"
VERSION = "1"  # where model preparation writes the parts' graphs


class Chain:
    """The detector and the segmenter, built once per instance."""

    def __init__(self, detector: Detector, segmenter: Segmenter, max_pixels: int) -> None:
        self.detector = detector
        self.segmenter = segmenter
        self.max_pixels = max_pixels

    def run(
        self, encoded: bytes, input_ids: np.ndarray, attention_mask: np.ndarray, threshold: float
    ) -> dict[str, np.ndarray]:
        """The contract's outputs for one image; an image that does not decode is ``InvalidItem``."""
        if not 0.0 <= threshold <= 1.0:
            raise Refused(f"threshold must be between 0 and 1, got {threshold}")
        pixels = images.decode_item(encoded, self.max_pixels)  # once, for both models
        logits, boxes = self.detector.detect_pixels(pixels, input_ids, attention_mask)
        kept, _, _ = best_first(logits, threshold)
        outputs = {contract.LOGITS: logits[kept], contract.PRED_BOXES: boxes[kept]}
        if not kept.size:
            outputs[contract.IOU_SCORES] = np.zeros((0, 1), dtype=np.float32)
            outputs[contract.PRED_MASKS] = np.zeros((0, 1, 0, 0), dtype=np.float32)
            return outputs
        height, width = pixels.shape[:2]
        corners = owl_image.boxes(boxes[kept], height, width, self.detector.processing.square)
        embeddings, resized = self.segmenter.embed(pixels)
        points = sam_image.scale_points(corners.reshape(-1, 2, 2), (height, width), resized).astype(np.float32)
        labels = np.tile(np.array(contract.BOX_LABELS, dtype=np.int64), (len(kept), 1))
        scores, masks = self.segmenter.decode(embeddings, points, labels, np.full(len(kept), 2))
        outputs[contract.IOU_SCORES], outputs[contract.PRED_MASKS] = scores[:, :1], masks[:, :1]
        return outputs


def open_chain(repository: Path, config: dict, max_pixels: int) -> Chain:
    """The chain of ``<repository>/model.toml``, its parts' graphs opened where they were prepared."""
    from app.triton.onnx_model import intra_op_threads
    from clients.families import load_spec

    spec = load_spec(repository)
    providers = config.get("parameters", {}).get(PROVIDERS_PARAMETER, {}).get("string_value", "")
    usable = [p for p in providers.split(",") if p]
    threads = intra_op_threads(config)
    folders = {key: repository.parent / spec.export[key] for key in (contract.DETECTOR, contract.SEGMENTER)}
    detector = load_spec(folders[contract.DETECTOR])
    segmenter = load_spec(folders[contract.SEGMENTER])
    return Chain(
        Detector(detector.text, folders[contract.DETECTOR] / VERSION, threads, usable, max_pixels),
        Segmenter(segmenter.text.folder, folders[contract.SEGMENTER] / VERSION, threads, usable, max_pixels),
        max_pixels,
    )


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from app.triton.onnx_model import volunteer_for_the_oom_killer

        volunteer_for_the_oom_killer()
        self.chain = open_chain(
            Path(args["model_repository"]), json.loads(args["model_config"]), Settings.from_env().max_image_pixels
        )

    def execute(self, requests: list) -> list:
        def run(given):
            return self.chain.run(
                given[contract.IMAGE].tobytes(),
                given[contract.INPUT_IDS],
                given[contract.ATTENTION_MASK],
                float(given[contract.THRESHOLD].reshape(-1)[0]),
            )

        names = (contract.IMAGE, contract.INPUT_IDS, contract.ATTENTION_MASK, contract.THRESHOLD)
        return answer_each(requests, names, run, "grounded segmentation")

    def finalize(self) -> None:
        self.chain = None
