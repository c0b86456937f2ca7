"""Triton python-backend model of a ``mask_generation`` model (SAM, SAM-HQ): the image decoded and
pre-processed as ``SamProcessor`` does it (``clients.sam_image``), the image encoder run once (its
outputs, whatever the graph gives: SAM-HQ's intermediate embeddings too, all fed to the decoder), then
the prompt encoder and mask decoder over every prompt of the request (``app.core.mask_contract``), or,
given the ``grid`` settings, over ``pipeline("mask-generation")``'s grid of points, a batch of
``points_per_batch`` points at a time, each batch's masks filtered as they come and the kept ones NMS'd
(``clients.sam_grid``): one call from the router, the image's embedding computed once, only the
masks answered coming back (their COCO RLE).

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
from clients import images, sam_grid, sam_image

PROVIDERS_PARAMETER = "ort_providers"
# Prompts of one mask-decoder run: its memory grows with them (ViT-B's decoder took about 28 MB a prompt:
# a chain's 685 boxes of a random-weight detector at once went past 18 GB), its time hardly shrinks.
DECODER_ROWS = 16
LABELS = (contract.BACKGROUND, contract.FOREGROUND, contract.BOX_TOP_LEFT, contract.BOX_BOTTOM_RIGHT)
NAMES = (contract.IMAGE, contract.POINTS, contract.LABELS, contract.GRID)  # the inputs


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
        self.encoded = [output.name for output in self.encoder.get_outputs()]  # all go to the decoder

    def embed(self, pixels: np.ndarray) -> tuple[dict[str, np.ndarray], tuple[int, int]]:
        """A decoded image's (HWC uint8 RGB) encoder outputs, by name (SAM's embedding; SAM-HQ's and its
        intermediate embeddings: ``contract.ENCODER_OUTPUTS``), and its resized size."""
        values, resized = sam_image.pixel_values(pixels, self.processing)
        found = self.encoder.run(self.encoded, {contract.PIXEL_VALUES: values[np.newaxis]})
        return dict(zip(self.encoded, found)), resized

    def segment(self, encoded: bytes, points: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``iou_scores [prompts, 4]`` and ``pred_masks [prompts, 4, h, w]``, each prompt as if alone; an
        image that does not decode is ``InvalidItem``."""
        embeddings, resized = self.embed(images.decode_item(encoded, self.max_pixels))
        return self.decode(embeddings, points, labels, check_prompts(points, labels, resized))

    def decode(
        self, embeddings: dict[str, np.ndarray], points: np.ndarray, labels: np.ndarray, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The mask decoder over an image's encoder outputs (``embed``), each prompt (``counts`` points)
        as if alone, at most ``DECODER_ROWS`` prompts a run."""
        scores, masks = [None] * len(points), [None] * len(points)
        for count in np.unique(counts):
            same = np.flatnonzero(counts == count)
            for start in range(0, len(same), DECODER_ROWS):
                rows = same[start : start + DECODER_ROWS]
                feed = {
                    **embeddings,
                    contract.POINTS: np.ascontiguousarray(points[rows, :count][np.newaxis], dtype=np.float32),
                    contract.LABELS: np.ascontiguousarray(labels[rows, :count][np.newaxis], dtype=np.int64),
                }
                iou, found = self.decoder.run(None, feed)
                for index, row in enumerate(rows):
                    scores[row], masks[row] = iou[0, index], found[0, index]
        return np.stack(scores).astype(np.float32), np.stack(masks).astype(np.float32)

    def generate(self, encoded: bytes, settings: sam_grid.Settings) -> dict[str, np.ndarray]:
        """Whole-image mask generation: the contract's grid outputs."""
        pixels = images.decode_item(encoded, self.max_pixels)
        embeddings, resized = self.embed(pixels)
        size = pixels.shape[:2]
        points = sam_grid.grid_points(settings.points_per_crop, size, self.processing.longest_edge)
        grid = None
        for start in range(0, len(points), settings.points_per_batch):
            batch = points[start : start + settings.points_per_batch]
            pad = np.zeros_like(batch)  # each point alone, SAM's pad point after it
            labels = np.tile(np.array([contract.FOREGROUND, contract.NOT_A_POINT], dtype=np.int64), (len(batch), 1))
            scores, masks = self.decode(embeddings, np.stack([batch, pad], axis=1), labels, np.full(len(batch), 2))
            if grid is None:  # the scaling to the image, once its low-resolution size is known
                padded = (self.processing.pad_height, self.processing.pad_width)
                grid = sam_grid.Grid(settings, *sam_image.upscaling(masks.shape[-2:], resized, size, padded))
            grid.add(scores[:, list(contract.MULTIMASK)], masks[:, list(contract.MULTIMASK)])
        return grid.best()


def no_prompts() -> dict[str, np.ndarray]:
    """The prompts' outputs of a grid request: none."""
    return {
        contract.IOU_SCORES: np.zeros((0, contract.MASK_TOKENS), dtype=np.float32),
        contract.PRED_MASKS: np.zeros((0, contract.MASK_TOKENS, 0, 0), dtype=np.float32),
    }


# What an optional input left out of a request (a KServe v2 body: prompts or a grid) is read as.
LEFT_OUT = {
    contract.POINTS: np.zeros((0, 0, 2), dtype=np.float32),
    contract.LABELS: np.zeros((0, 0), dtype=np.int64),
    contract.GRID: np.zeros(0, dtype=np.float64),
}


def run_request(segmenter: Segmenter, given: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """One request's outputs: its prompts' masks, or, given grid settings, the whole image's. An
    optional input the request left out (None) is empty; one that leaves out all three is refused."""
    if all(given[name] is None for name in LEFT_OUT):
        raise Refused("give input_points and input_labels (the prompts) or grid (the whole image's settings)")
    encoded, points, labels, grid = (LEFT_OUT[name] if given[name] is None else given[name] for name in NAMES)
    if not grid.size:
        scores, masks = segmenter.segment(encoded.tobytes(), points, labels)
        return {contract.IOU_SCORES: scores, contract.PRED_MASKS: masks, **sam_grid.outputs([], [], [])}
    if points.size or labels.size:
        raise Refused("input_points and input_labels must be empty when grid is given (the grid is the prompts)")
    try:
        settings = sam_grid.Settings.of(grid.reshape(-1))
    except ValueError as error:
        raise Refused(str(error)) from None
    return {**no_prompts(), **segmenter.generate(encoded.tobytes(), settings)}


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
        return answer_each(requests, NAMES, lambda given: run_request(self.segmenter, given), "segmentation")

    def finalize(self) -> None:
        self.segmenter = None
