"""A ``zero_shot_object_detection`` model's export: an OWLv2, OWL-ViT or Grounding DINO folder (the
model and its processor) to the detector's ONNX graph (``app.core.zsd_contract``), checked, and the
python-backend model that serves it.

``torch.onnx.export(dynamo=False, opset 17)`` of the model's forward as a caller runs it (``pixel_values``,
``input_ids``, ``attention_mask`` and, for Grounding DINO, ``pixel_mask`` and ``token_type_ids`` ->
``logits``, ``pred_boxes``). OWL: the labels' count dynamic (traced at one label, checked at one and
five). Grounding DINO: the image's height and width and the prompt's length dynamic, traced with the
patches of ``gdino_tracing`` (without them the trace is silently wrong at any other image size).

The checks, as for the other exports: ``onnx.checker``; the numpy pre-processing (``clients.zsd_image``)
against the processor's ``pixel_values`` on images of three shapes (wide, tall, large: OWLv2's blur,
Grounding DINO's other feature-map sizes); then ONNX Runtime on those pixels against the PyTorch model
as a caller runs it, ``model(**processor(images=image, text=...))`` with two texts, the max difference
printed; past the tolerance the export is refused in one line (``zsd_check``: the tolerances at real
sizes, PyTorch's own spread, Grounding DINO's near-tied proposals).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.core import zsd_contract as contract
from app.core.spec import ModelSpec
from app.triton import ZSD_MODEL
from scripts.model_prep import gdino_tracing, graph_cache, weights, zsd_check
from scripts.model_prep.onnx_export import OPSET, ExportError

CHECKED = "the processor's pixel_values equal on three image shapes, two texts"
CHECK_SIZES = ((90, 140), (150, 61), (1100, 700))  # height, width: wide, tall, larger than any input
CHECK_LABELS = ("a photo of a cat", "a remote control", "a dog", "the person", "a car")


class Detector(nn.Module):
    """The model's forward, its two outputs; Grounding DINO also takes its pixel mask and token types."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values, input_ids, attention_mask, pixel_mask=None, token_type_ids=None):
        extra = {} if pixel_mask is None else {"pixel_mask": pixel_mask, "token_type_ids": token_type_ids}
        found = self.model(pixel_values=pixel_values, input_ids=input_ids, attention_mask=attention_mask, **extra)
        return found.logits, found.pred_boxes


def grounded(spec: ModelSpec) -> bool:
    return spec.text.model_type == contract.GROUNDING_DINO


def texts(spec: ModelSpec) -> list:
    """The checks' two texts, as the processor takes them: one label and five (OWL), or the prompt
    of two labels and of five (Grounding DINO: of other lengths)."""
    if grounded(spec):
        return [". ".join(CHECK_LABELS[:2]) + ".", ". ".join(CHECK_LABELS) + "."]
    return [[list(CHECK_LABELS[:1])], [list(CHECK_LABELS)]]


def graph_inputs(spec: ModelSpec) -> tuple[str, ...]:
    names = (contract.PIXEL_VALUES, contract.INPUT_IDS, contract.ATTENTION_MASK)
    return (*names, contract.PIXEL_MASK, contract.TOKEN_TYPE_IDS) if grounded(spec) else names


def dynamic_axes(spec: ModelSpec) -> dict:
    """OWL: the labels' count; Grounding DINO: the image's height and width and the prompt's length."""
    if not grounded(spec):
        labels = {0: "labels"}
        return {contract.INPUT_IDS: labels, contract.ATTENTION_MASK: labels, contract.LOGITS: {2: "labels"}}
    tokens = {1: "tokens"}
    return {
        contract.PIXEL_VALUES: {2: "height", 3: "width"},
        contract.PIXEL_MASK: {1: "height", 2: "width"},
        contract.INPUT_IDS: tokens,
        contract.ATTENTION_MASK: tokens,
        contract.TOKEN_TYPE_IDS: tokens,
    }


def load_model(spec: ModelSpec, choice: weights.WeightsChoice) -> nn.Module:
    """The folder's detector with its own weights, or seeded random ones of its config."""
    from transformers import AutoConfig, AutoModelForZeroShotObjectDetection

    folder = str(spec.text.folder)
    try:
        if choice.source == weights.FILE:
            return AutoModelForZeroShotObjectDetection.from_pretrained(folder).eval()
        torch.manual_seed(choice.seed)
        return AutoModelForZeroShotObjectDetection.from_config(AutoConfig.from_pretrained(folder)).eval()
    except (OSError, ValueError) as error:
        raise ExportError(f"[{spec.name}] {folder}: transformers cannot load it as a detector: {error}") from None


def check_image(seed: int, height: int, width: int) -> np.ndarray:
    """A random RGB image (HWC uint8) of blocks and noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(height // 8 + 1, width // 8 + 1, 3))
    blocks = np.kron(coarse, np.ones((8, 8, 1)))[:height, :width]
    return np.clip(blocks + rng.normal(0, 12, blocks.shape), 0, 255).astype(np.uint8)


def export(spec: ModelSpec, model: nn.Module, processor, path: Path, image: np.ndarray) -> None:
    """The graph, traced on ``image`` and the first check text (Grounding DINO's patched to trace every size)."""
    given = processor(images=image, text=texts(spec)[0], return_tensors="pt")
    names = graph_inputs(spec)
    tracing = gdino_tracing.traceable() if grounded(spec) else contextlib.nullcontext()
    with tracing, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values taken as constants
        torch.onnx.export(
            Detector(model).eval(),
            tuple(given[name] for name in names),
            str(path),
            input_names=list(names),
            output_names=[contract.LOGITS, contract.PRED_BOXES],
            dynamic_axes=dynamic_axes(spec),
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def check(spec: ModelSpec, model: nn.Module, processor, path: Path, seed: int) -> tuple[dict, dict]:
    """``zsd_check.check`` on the three check images and the two texts."""
    images = [check_image(seed + index, height, width) for index, (height, width) in enumerate(CHECK_SIZES)]
    return zsd_check.check(spec, model, processor, path, images, texts(spec), graph_inputs(spec))


def ensure_export(spec: ModelSpec, choice: weights.WeightsChoice, cache: Path, reexport: bool, step) -> dict:
    """The checked graph of (model, weights) in ``cache`` and its report (from the cache when there)."""

    def load():
        from transformers import AutoProcessor

        model = load_model(spec, choice)
        try:
            return model, AutoProcessor.from_pretrained(str(spec.text.folder))
        except (OSError, ValueError) as error:
            raise ExportError(f"[{spec.name}] {spec.text.folder}: no processor there: {error}") from None

    return graph_cache.export_checked(
        spec,
        choice,
        cache,
        reexport,
        step,
        contract.ONNX_FILES,
        load,
        "the detector",
        lambda loaded, partial: export(
            spec, *loaded, partial / contract.GRAPH_FILE, check_image(choice.seed, *CHECK_SIZES[0])
        ),
        lambda loaded, partial: check(spec, *loaded, partial / contract.GRAPH_FILE, choice.seed),
    )


def write_version(version: Path, cache: Path, link, graphs: bool = True) -> None:
    """The version folder: the graph (not with ``graphs`` False: --config-only) and the python-backend
    model that serves it."""
    graph_cache.write_version(version, cache, link, graphs, contract.ONNX_FILES, ZSD_MODEL)


class ZsdExport:
    """The zero_shot_object_detection family's export (``Family.export``)."""

    CHECKED = CHECKED
    ensure_export = staticmethod(ensure_export)
    write_version = staticmethod(write_version)

    def prepare(self, spec, options, steps) -> dict:
        return steps.prepare_generation(spec, options, exporter=self)


ZSD = ZsdExport()
