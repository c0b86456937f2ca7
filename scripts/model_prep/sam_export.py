"""A ``mask_generation`` model's export: a ``SamModel`` + ``SamProcessor`` folder (or ``SamHQModel`` +
``SamHQProcessor``: config.json's model type picks, ``sam_graphs.KINDS``) to its two ONNX graphs
(``app.core.mask_contract``), checked, and the python-backend model that serves them.

``torch.onnx.export(dynamo=False, opset 17)`` of the two modules of ``scripts.model_prep.sam_graphs``:
``encoder.onnx`` (``pixel_values`` -> the image embedding, and SAM-HQ's intermediate embeddings) and
``decoder.onnx`` (the encoder's outputs and the prompts -> all four mask tokens' scores and masks).

The checks, as for the other exports: ``onnx.checker`` on each graph; the numpy pre-processing
(``clients.sam_image``) against the processor's ``pixel_values``; then ONNX Runtime against the
PyTorch model as a caller runs it, ``model(**processor(image, input_boxes=...))`` and with points,
single and multimask, the max difference printed; past the tolerance the export is refused in one line.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.core import mask_contract as contract
from app.core.spec import ModelSpec
from app.triton import SAM_MODEL
from clients import sam_image
from scripts.model_prep import graph_cache, weights
from scripts.model_prep.onnx_export import OPSET, ExportError
from scripts.model_prep.recipes import Tolerance
from scripts.model_prep.sam_graphs import KINDS, Kind, image_embeddings

TOLERANCE = Tolerance(atol=1e-5, rtol=1e-4)
CHECKED = "the processor's pixel_values equal, boxes and points, single and multimask"
CHECK_SIZE = (150, 200)  # the check image's height, width (not square: the padding is exercised)
CHECK_BOXES = [[10.0, 20.0, 120.0, 100.0], [60.0, 5.0, 190.0, 140.0], [0.0, 0.0, 200.0, 150.0]]
CHECK_POINTS = [[[50.0, 40.0]], [[100.0, 70.0], [20.0, 130.0]]]  # two prompts of 1 and 2 points
CHECK_LABELS = [[1], [1, 0]]


def randomise(model: nn.Module, seed: int) -> nn.Module:
    """Seeded random weights that are not degenerate: ``SamVisionConfig.initializer_range`` is 1e-10,
    so a model built from a config has a vision encoder of near-zero weights. Every parameter but the
    LayerNorms and the (tied) positional embedding is drawn again, std 0.5 / sqrt(fan-in)."""
    generator = torch.Generator().manual_seed(seed)
    norms = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("positional_embedding") or id(parameter) in norms:
                continue
            scale = 0.5 / max(1, parameter.shape[-1]) ** 0.5
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return model


def random_model(kind: Kind, config, seed: int) -> nn.Module:
    """A model of ``kind`` (``sam_graphs.KINDS``) made from ``config`` with seeded random weights, as
    every random SAM here is made (the small models, the benchmark's, ``--weights random``)."""
    torch.manual_seed(seed)
    return randomise(kind.classes()[0](config), seed).eval()


def load_model(spec: ModelSpec, choice: weights.WeightsChoice) -> nn.Module:
    """The folder's SamModel (SamHQModel) with its own weights, or seeded random ones of its config."""
    from transformers import AutoConfig

    folder, kind = str(spec.text.folder), KINDS[spec.text.model_type]
    try:
        if choice.source == weights.FILE:
            model = kind.classes()[0].from_pretrained(folder).eval()
        else:
            model = random_model(kind, AutoConfig.from_pretrained(folder), choice.seed)
    except (OSError, ValueError) as error:
        raise ExportError(f"[{spec.name}] {folder}: transformers cannot load it as a {kind.model}: {error}") from None
    if kind.intermediate and not model.config.vision_config.global_attn_indexes:
        raise ExportError(
            f"[{spec.name}] {folder}: vision_config.global_attn_indexes is empty: SAM-HQ's mask decoder reads "
            "the output of the ViT's first global-attention layer"
        )
    return model


def check_image(seed: int) -> np.ndarray:
    """A smooth random RGB image (HWC uint8): large regions, so that masks have shapes."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(CHECK_SIZE[0] // 10 + 1, CHECK_SIZE[1] // 10 + 1, 3))
    return np.kron(coarse, np.ones((10, 10, 1)))[: CHECK_SIZE[0], : CHECK_SIZE[1]].astype(np.uint8)


def _export(module: nn.Module, args: tuple, path: Path, names: tuple, axes: dict) -> None:
    module.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values taken as constants
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(names[0]),
            output_names=list(names[1]),
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    module.eval()


def box_prompts(boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(1, N, 4) scaled boxes -> points (1, N, 2, 2) float32 labelled as a box's two corners."""
    points = np.asarray(boxes, dtype=np.float32).reshape(1, -1, 2, 2)
    corners = np.array([contract.BOX_TOP_LEFT, contract.BOX_BOTTOM_RIGHT], dtype=np.int64)
    return points, np.tile(corners, (1, points.shape[1], 1))


def export(model: nn.Module, processor, folder: Path, image: np.ndarray, model_type: str) -> None:
    """The two graphs into ``folder``."""
    given = processor(images=image, input_boxes=[CHECK_BOXES[:2]], return_tensors="pt")
    encoder, decoder = KINDS[model_type].modules(model)
    encoded = contract.ENCODER_OUTPUTS[model_type]
    with torch.no_grad():
        embedded = image_embeddings(model, given["pixel_values"])
    _export(
        encoder,
        (given["pixel_values"],),
        folder / contract.ENCODER_FILE,
        ((contract.PIXEL_VALUES,), encoded),
        {name: {0: "batch"} for name in (contract.PIXEL_VALUES, *encoded)},
    )
    points, labels = box_prompts(given["input_boxes"].numpy())
    prompt_axes = {1: "prompts", 2: "points"}
    _export(
        decoder,
        (*embedded, torch.from_numpy(points), torch.from_numpy(labels)),
        folder / contract.DECODER_FILE,
        ((*encoded, contract.POINTS, contract.LABELS), (contract.IOU_SCORES, contract.PRED_MASKS)),
        {
            contract.POINTS: prompt_axes,
            contract.LABELS: prompt_axes,
            contract.IOU_SCORES: {1: "prompts"},
            contract.PRED_MASKS: {1: "prompts"},
        },
    )


def _cases(processor, image: np.ndarray) -> list[tuple[str, dict, np.ndarray, np.ndarray]]:
    """(name, the processor's inputs, the decoder's points and labels) of the checks' prompts."""
    boxes = processor(images=image, input_boxes=[CHECK_BOXES], return_tensors="pt")
    cases = [("boxes", boxes, *box_prompts(boxes["input_boxes"].numpy()))]
    for points, labels in zip(CHECK_POINTS, CHECK_LABELS):
        given = processor(images=image, input_points=[[points]], input_labels=[[labels]], return_tensors="pt")
        scaled = given["input_points"].numpy().astype(np.float32)  # SAM appends its pad point (0, 0) labelled -1
        padded = np.concatenate([scaled, np.zeros((*scaled.shape[:2], 1, 2), np.float32)], axis=2)
        marks = np.concatenate(
            [given["input_labels"].numpy(), np.full((*scaled.shape[:2], 1), contract.NOT_A_POINT)], axis=2
        )
        cases.append((f"{len(points)} point(s)", given, padded, marks.astype(np.int64)))
    return cases


def check(spec: ModelSpec, model: nn.Module, processor, folder: Path, image: np.ndarray) -> tuple[dict, dict]:
    """onnx.checker; the numpy pixel_values against the processor's; ONNX Runtime against torch."""
    import onnx
    import onnxruntime as ort

    for name in contract.ONNX_FILES:
        onnx.checker.check_model(str(folder / name))
    sessions = {
        name: ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])
        for name in contract.ONNX_FILES
    }
    diffs: dict[str, float] = {}
    limits: dict[str, float] = {}
    reference = processor(images=image, return_tensors="pt")["pixel_values"]
    ours, _ = sam_image.pixel_values(image, sam_image.Processing.read(spec.text.folder))
    graph_cache.difference(
        "pixel_values (numpy vs the processor)", reference[0].numpy(), ours, TOLERANCE, diffs, limits
    )
    encoded = contract.ENCODER_OUTPUTS[spec.text.model_type]
    found = sessions[contract.ENCODER_FILE].run(list(encoded), {contract.PIXEL_VALUES: ours[np.newaxis]})
    with torch.no_grad():
        for name, want, one in zip(encoded, image_embeddings(model, reference), found):
            graph_cache.difference(f"encoder {name}", want, one, TOLERANCE, diffs, limits)
        for name, given, points, labels in _cases(processor, image):
            iou, masks = sessions[contract.DECODER_FILE].run(
                None, {**dict(zip(encoded, found)), contract.POINTS: points, contract.LABELS: labels}
            )
            for multimask, tokens in ((False, list(contract.SINGLE)), (True, list(contract.MULTIMASK))):
                want = model(**given, multimask_output=multimask)
                kind = "multimask" if multimask else "single"
                graph_cache.difference(
                    f"decoder {name} {kind} iou_scores", want.iou_scores, iou[:, :, tokens], TOLERANCE, diffs, limits
                )
                graph_cache.difference(
                    f"decoder {name} {kind} pred_masks", want.pred_masks, masks[:, :, tokens], TOLERANCE, diffs, limits
                )
    graph_cache.refuse_beyond(spec.name, diffs, limits)
    return diffs, limits


def ensure_export(spec: ModelSpec, choice: weights.WeightsChoice, cache: Path, reexport: bool, step) -> dict:
    """The checked graphs of (model, weights) in ``cache`` and their report (from the cache when there)."""
    image = check_image(choice.seed)

    def load():
        model, kind = load_model(spec, choice), KINDS[spec.text.model_type]
        try:
            return model, kind.classes()[1].from_pretrained(str(spec.text.folder))
        except (OSError, ValueError) as error:
            raise ExportError(f"[{spec.name}] {spec.text.folder}: no {kind.processor} there: {error}") from None

    return graph_cache.export_checked(
        spec,
        choice,
        cache,
        reexport,
        step,
        contract.ONNX_FILES,
        load,
        "the image encoder and the prompt encoder + mask decoder",
        lambda loaded, partial: export(*loaded, partial, image, spec.text.model_type),
        lambda loaded, partial: check(spec, *loaded, partial, image),
    )


def write_version(version: Path, cache: Path, link, graphs: bool = True) -> None:
    """The version folder: the two graphs (not with ``graphs`` False: --config-only) and the
    python-backend model that serves them."""
    graph_cache.write_version(version, cache, link, graphs, contract.ONNX_FILES, SAM_MODEL)


class SamExport:
    """The mask_generation family's export (``Family.export``): what ``steps.prepare_generation`` calls."""

    CHECKED = CHECKED
    ensure_export = staticmethod(ensure_export)
    write_version = staticmethod(write_version)

    def prepare(self, spec, options, steps) -> dict:
        return steps.prepare_generation(spec, options, exporter=self)


SAM = SamExport()
