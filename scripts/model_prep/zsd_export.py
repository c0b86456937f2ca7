"""A ``zero_shot_object_detection`` model's export: an OWLv2 or OWL-ViT folder (the model and its
processor) to the detector's ONNX graph (``app.core.zsd_contract``), checked, and the python-backend
model that serves it.

``torch.onnx.export(dynamo=False, opset 17)`` of the model's forward as a caller runs it
(``pixel_values``, ``input_ids``, ``attention_mask`` -> ``logits``, ``pred_boxes``), the labels' count
dynamic: traced at two labels, it answers any count (checked at one and five).

The checks, as for the other exports: ``onnx.checker``; the numpy pre-processing (``clients.owl_image``)
against the processor's ``pixel_values`` on images of three shapes (wide, tall, larger than the input:
OWLv2's blur); then ONNX Runtime on those pixels against the PyTorch model as a caller runs it,
``model(**processor(images=image, text=labels))``, the max difference printed; past the tolerance the
export is refused in one line.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.core import zsd_contract as contract
from app.core.spec import ModelSpec
from app.triton import ZSD_MODEL
from clients import owl_image
from scripts.model_prep import graph_cache, weights
from scripts.model_prep.onnx_export import OPSET, ExportError
from scripts.model_prep.recipes import Tolerance

TOLERANCE = Tolerance(atol=1e-5, rtol=1e-4)
CHECKED = "the processor's pixel_values equal on three image shapes, 1 and 5 labels"
CHECK_SIZES = ((90, 140), (150, 61), (1100, 700))  # height, width: wide, tall, larger than any input
CHECK_LABELS = ("a photo of a cat", "a remote control", "a dog", "the person", "a car")


class Detector(nn.Module):
    """The model's forward, its two outputs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values, input_ids, attention_mask):
        found = self.model(pixel_values=pixel_values, input_ids=input_ids, attention_mask=attention_mask)
        return found.logits, found.pred_boxes


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


def export(model: nn.Module, processor, path: Path, image: np.ndarray) -> None:
    given = processor(images=image, text=[list(CHECK_LABELS[:2])], return_tensors="pt")
    names = (contract.PIXEL_VALUES, contract.INPUT_IDS, contract.ATTENTION_MASK)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values taken as constants
        torch.onnx.export(
            Detector(model).eval(),
            tuple(given[name] for name in names),
            str(path),
            input_names=list(names),
            output_names=[contract.LOGITS, contract.PRED_BOXES],
            dynamic_axes={
                contract.INPUT_IDS: {0: "labels"},
                contract.ATTENTION_MASK: {0: "labels"},
                contract.LOGITS: {2: "labels"},
            },
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def check(spec: ModelSpec, model: nn.Module, processor, path: Path, seed: int) -> tuple[dict, dict]:
    """onnx.checker; the numpy pixel_values against the processor's; ONNX Runtime against torch."""
    import onnx
    import onnxruntime as ort

    onnx.checker.check_model(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    processing = owl_image.Processing.read(spec.text.folder, spec.text.model_type)
    diffs: dict[str, float] = {}
    limits: dict[str, float] = {}
    for index, (height, width) in enumerate(CHECK_SIZES):
        image = check_image(seed + index, height, width)
        ours = owl_image.pixel_values(image, processing)
        for count in (1, 5):
            given = processor(images=image, text=[list(CHECK_LABELS[:count])], return_tensors="pt")
            if count == 1:
                graph_cache.difference(
                    "pixel_values (numpy vs processor)",
                    given["pixel_values"][0].numpy(),
                    ours,
                    TOLERANCE,
                    diffs,
                    limits,
                )
            feed = {
                contract.PIXEL_VALUES: ours[np.newaxis],
                contract.INPUT_IDS: given[contract.INPUT_IDS].numpy().astype(np.int64),
                contract.ATTENTION_MASK: given[contract.ATTENTION_MASK].numpy().astype(np.int64),
            }
            logits, boxes = session.run([contract.LOGITS, contract.PRED_BOXES], feed)
            with torch.no_grad():
                want = model(**given)
            graph_cache.difference(contract.LOGITS, want.logits, logits, TOLERANCE, diffs, limits)
            graph_cache.difference(contract.PRED_BOXES, want.pred_boxes, boxes, TOLERANCE, diffs, limits)
    graph_cache.refuse_beyond(spec.name, diffs, limits)
    return diffs, limits


def ensure_export(spec: ModelSpec, choice: weights.WeightsChoice, cache: Path, reexport: bool, step) -> dict:
    """The checked graph of (model, weights) in ``cache`` and its report (from the cache when there)."""
    from transformers import AutoProcessor

    hit = None if reexport else graph_cache.cached(cache, contract.ONNX_FILES)
    if hit:
        print(f"[{spec.name}] ONNX export ({choice.describe()}) from the cache: {cache}", flush=True)
        return hit
    with step(spec.name, f"loading the model ({choice.describe()})"):
        model = load_model(spec, choice)
        try:
            processor = AutoProcessor.from_pretrained(str(spec.text.folder))
        except (OSError, ValueError) as error:
            raise ExportError(f"[{spec.name}] {spec.text.folder}: no processor there: {error}") from None
    partial = cache / "partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with step(spec.name, "exporting the detector to ONNX"):
        export(model, processor, partial / contract.GRAPH_FILE, check_image(choice.seed, *CHECK_SIZES[0]))
    with step(spec.name, "checking the export (onnx.checker, pixel_values, ONNX Runtime vs torch)"):
        diffs, limits = check(spec, model, processor, partial / contract.GRAPH_FILE, choice.seed)
    return graph_cache.keep(partial, cache, contract.ONNX_FILES, diffs, limits)


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
