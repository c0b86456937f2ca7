"""Triton python-backend model of a ``mask_generation`` model (SAM): the image decoded and
pre-processed as ``SamProcessor`` does it (``clients.sam_image``), the image encoder run once, then
the prompt encoder and mask decoder over every prompt of the request (``app.core.mask_contract``).

Copied as ``<model>/1/model.py`` by model preparation; the model's ``model.toml`` (beside this version
folder) names its Hugging Face folder, whose processor config sets the pre-processing.

A request is one image and its prompts. SAM's masks change when a prompt gains a padding token, so
the prompts are run in groups of one length (the slots past a prompt's last point are ``ABSENT``):
each prompt's answer is the one it gets alone. The values are checked here too (the router checks
first; a KServe v2 body reaches here unchanged); an image that does not decode, or values out of
bounds, are answered an error that the router reports as a 400.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.core import mask_contract as contract
from app.core.settings import Settings
from app.triton.responses import Refused, answer_each
from clients import images, sam_image

PROVIDERS_PARAMETER = "ort_providers"
LABELS = (contract.BACKGROUND, contract.FOREGROUND, contract.BOX_TOP_LEFT, contract.BOX_BOTTOM_RIGHT)


def check_prompts(points: np.ndarray, labels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Each prompt's count of points (its slots before the first ``ABSENT``), the values checked:
    shapes, labels, coordinates within the resized image (``size``: height, width)."""
    if points.ndim != 3 or points.shape[2] != 2 or labels.shape != points.shape[:2] or not len(points):
        raise Refused(
            f"input_points {list(points.shape)} and input_labels {list(labels.shape)} must be "
            "[prompts, points, 2] and [prompts, points], at least one prompt"
        )
    if len(points) > contract.MAX_PROMPTS or points.shape[1] > contract.MAX_POINTS + 2:
        raise Refused(f"at most {contract.MAX_PROMPTS} prompts of {contract.MAX_POINTS} points and a box")
    present = labels != contract.ABSENT
    counts = present.sum(axis=1)
    if (counts == 0).any() or not (present == (np.arange(labels.shape[1]) < counts[:, None])).all():
        raise Refused("each prompt's points come first, ABSENT after them, and a prompt has at least one")
    if not np.isin(labels[present], (*LABELS, contract.NOT_A_POINT)).all():
        raise Refused(f"input_labels must be SAM's labels {(*LABELS, contract.NOT_A_POINT)} or {contract.ABSENT}")
    inside = points[present]
    if (
        not np.isfinite(inside).all()
        or (inside < 0).any()
        or (inside[:, 0] > size[1]).any()
        or (inside[:, 1] > size[0]).any()
    ):
        raise Refused(f"input_points must lie within the resized image, {size[1]}x{size[0]}")
    return counts


class Segmenter:
    """The two sessions and the processor's settings; built once per instance."""

    def __init__(self, folder: Path, onnx_folder: Path, threads: int, providers: list[str], max_pixels: int) -> None:
        import onnxruntime as ort

        self.processing = sam_image.Processing.read(folder)
        self.max_pixels = max_pixels
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        usable = [p for p in providers if p in ort.get_available_providers()] or ["CPUExecutionProvider"]
        self.encoder, self.decoder = (
            ort.InferenceSession(str(onnx_folder / name), options, providers=usable) for name in contract.ONNX_FILES
        )

    def embed(self, pixels: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
        """A decoded image's (HWC uint8 RGB) embedding and its resized size."""
        values, resized = sam_image.pixel_values(pixels, self.processing)
        (embeddings,) = self.encoder.run(None, {contract.PIXEL_VALUES: values[np.newaxis]})
        return embeddings, resized

    def segment(self, encoded: bytes, points: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``iou_scores [prompts, 4]`` and ``pred_masks [prompts, 4, h, w]``, each prompt as if alone; an
        image that does not decode is ``InvalidItem``."""
        embeddings, resized = self.embed(images.decode_item(encoded, self.max_pixels))
        return self.decode(embeddings, points, labels, check_prompts(points, labels, resized))

    def decode(
        self, embeddings: np.ndarray, points: np.ndarray, labels: np.ndarray, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The mask decoder over an image's embedding, each prompt (``counts`` points) as if alone."""
        scores, masks = [None] * len(points), [None] * len(points)
        for count in np.unique(counts):
            rows = np.flatnonzero(counts == count)
            feed = {
                contract.IMAGE_EMBEDDINGS: embeddings,
                contract.POINTS: np.ascontiguousarray(points[rows, :count][np.newaxis], dtype=np.float32),
                contract.LABELS: np.ascontiguousarray(labels[rows, :count][np.newaxis], dtype=np.int64),
            }
            iou, found = self.decoder.run(None, feed)
            for index, row in enumerate(rows):
                scores[row], masks[row] = iou[0, index], found[0, index]
        return np.stack(scores).astype(np.float32), np.stack(masks).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from app.triton.onnx_model import intra_op_threads, volunteer_for_the_oom_killer
        from clients.families import load_spec

        volunteer_for_the_oom_killer()
        config = json.loads(args["model_config"])
        spec = load_spec(Path(args["model_repository"]))
        providers = config.get("parameters", {}).get(PROVIDERS_PARAMETER, {}).get("string_value", "")
        self.segmenter = Segmenter(
            spec.text.folder,
            Path(args["model_repository"]) / args["model_version"],
            intra_op_threads(config),
            [p for p in providers.split(",") if p],
            Settings.from_env().max_image_pixels,
        )

    def execute(self, requests: list) -> list:
        def run(given):
            scores, masks = self.segmenter.segment(
                given[contract.IMAGE].tobytes(), given[contract.POINTS], given[contract.LABELS]
            )
            return {contract.IOU_SCORES: scores, contract.PRED_MASKS: masks}

        return answer_each(requests, (contract.IMAGE, contract.POINTS, contract.LABELS), run, "segmentation")

    def finalize(self) -> None:
        self.segmenter = None
