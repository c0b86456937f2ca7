"""Mask generation family (SAM, SAM-HQ): the masks of the objects that boxes and points show on an
image, answered as ``SamModel`` + ``SamProcessor`` (``SamHQModel`` + ``SamHQProcessor``) answer them.

model.toml is two lines, the rest read from a ``save_pretrained`` folder of ``SamModel`` and
``SamProcessor``, or of ``SamHQModel`` and ``SamHQProcessor`` (``complete``: config.json's
``model_type``, ``sam`` or ``sam_hq``, tells them apart; the spec's ``model_type`` says which)::

    family = "mask_generation"
    [export]
    transformers = "hf"

SAM-HQ takes the same prompts, options and answers; its model differs inside the graphs only (its
image encoder also gives the intermediate embeddings its HQ mask decoder reads:
``app.core.mask_contract``), and its masks are its model's with ``hq_token_only`` false, the default.

Payload: the image (``img``: base64 in the JSON envelope, or a raw ``image/jpeg`` / ``image/png`` body
with the rest in the custom-attributes header), its prompts (``clients.prompts``: ``boxes``, ``points``,
``point_labels``), ``multimask_output`` (default false) and ``mask_threshold`` (default 0.0). A list of
images takes the same prompts on each. The answer, per image: a list with one entry per prompt, in
the prompts' order: ``{"mask": <COCO RLE>, "score": <predicted IoU>, "box": [xmin, ymin, xmax, ymax]}``
(with ``multimask_output``, a list of three, best score first). The mask is
``SamProcessor.post_process_masks(outputs.pred_masks, original_sizes, reshaped_input_sizes)``
binarised at ``mask_threshold``, as ``pycocotools.mask.encode`` writes it (``clients.rle``).

Without prompts the whole image is segmented as ``pipeline("mask-generation")`` segments it
(``clients.sam_grid``), with its options (``GRID_OPTIONS``: ``points_per_crop``, ``points_per_batch``,
``pred_iou_thresh``, ``stability_score_thresh``, ``stability_score_offset``, ``crops_nms_thresh``, and
``mask_threshold``) and their defaults: the answer is its masks, best score first, each as above (at
most three a point of the grid). A grid option given with prompts, or ``multimask_output`` without,
is refused naming it.

Where it runs: the router opens the image's header (the pixel limit, the size as displayed), checks
the prompts against the image and scales their coordinates to the resized image; the image's bytes
and the prompts go to one Triton model (``app/triton/sam_model.py``), which decodes and
pre-processes the image (as the image families' Triton pipeline does) and runs the image encoder
once and the mask decoder over the prompts; the router scales the low-resolution logits to the
image (``clients.sam_image``), binarises and encodes them. Without prompts the grid's settings go
instead, and the Triton model runs the whole pipeline (the grid, the decoder batch by batch, the
filters, the NMS): the masks answered come back, as their RLE.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from app.core import mask_contract as contract
from app.core.access import MASKS
from app.core.errors import InvalidInput
from app.core.family import Counter, Family
from app.core.spec import SpecError
from app.core.text_spec import SOURCE_KEY, TextModel, TextSpecError, model_folder
from clients import images, prompts, rle, sam_grid, sam_image
from clients.options import Option
from clients.vision import EncodedImages

# The masks answered, by model: SAM's, and a grounded_segmentation chain's (one a detection).
MASKS_COUNTER = Counter(MASKS, "router_masks", "Masks answered (mask_generation, grounded_segmentation), by model.")
ANSWER = {
    "type": "object",
    "required": ["mask", "score", "box"],
    "additionalProperties": False,
    "properties": {
        "mask": {
            "type": "object",
            "description": "COCO run-length encoding, as pycocotools.mask.encode writes it (decode with "
            "pycocotools.mask.decode)",
            "required": ["size", "counts"],
            "properties": {
                "size": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                "counts": {"type": "string"},
            },
        },
        "score": {"type": "number", "description": "SAM's predicted IoU of the mask"},
        "box": {
            "type": "array",
            "items": {"type": "integer"},
            "minItems": 4,
            "maxItems": 4,
            "description": "the mask's tight box [xmin, ymin, xmax, ymax], its last pixels included",
        },
    },
}


MULTIMASK_OUTPUT, MASK_THRESHOLD = "multimask_output", "mask_threshold"
GRID_OPTIONS = tuple(  # pipeline("mask-generation")'s, bounded and defaulted by the contract
    Option(name, type(contract.GRID_DEFAULTS[name]), *contract.GRID_BOUNDS[name], default=contract.GRID_DEFAULTS[name])
    for name in contract.GRID_SETTINGS
    if name != MASK_THRESHOLD
)


@dataclass(frozen=True)
class Segmented:
    """What postprocessing needs of one image: its size as displayed and as resized (height, width),
    and whether it is segmented whole (no prompts)."""

    width: int
    height: int
    resized: tuple[int, int]
    whole: bool = False


class MaskGenerationClient(EncodedImages):
    family = "mask_generation"
    EXTRA_FIELDS = prompts.FIELDS
    FIELD_SCHEMAS = prompts.SCHEMAS
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "array",
        "description": "mask_generation, for one image: one answer per prompt, in the prompts' order (with "
        "multimask_output, a list of three per prompt, best score first); without prompts, the whole image's "
        "masks, best score first (pipeline('mask-generation')).",
        "items": {"oneOf": [ANSWER, {"type": "array", "minItems": 3, "maxItems": 3, "items": ANSWER}]},
    }
    OPTIONS = (
        Option(MULTIMASK_OUTPUT, bool, default=False),
        Option(MASK_THRESHOLD, float, *contract.GRID_BOUNDS[MASK_THRESHOLD], default=0.0),
        *GRID_OPTIONS,
    )

    def configure(self) -> None:
        try:
            self.processing = sam_image.Processing.read(self.spec.text.folder)
        except sam_image.ProcessingError as error:
            raise SpecError(str(error)) from None

    def parse_options(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        options = super().parse_options(payload)
        options["prompts"] = prompts.parse(payload)
        if options["prompts"]:
            for option in GRID_OPTIONS:
                if option.name in payload:
                    raise InvalidInput(
                        f"payload.{option.name} applies to the whole image, segmented without boxes or points"
                    )
        elif MULTIMASK_OUTPUT in payload:
            raise InvalidInput(
                f"payload.{MULTIMASK_OUTPUT} applies to boxes and points: without them the whole image is "
                "segmented, each point of its grid giving SAM's three masks"
            )
        return options

    def options_from_attributes(self, attributes: Mapping[str, str], where: str) -> dict[str, Any]:
        return {**super().options_from_attributes(attributes, where), **prompts.from_header(attributes, where)}

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Segmented]:
        """The encoded bytes (only the header read) and the prompts as SAM's tokens, in the resized image."""
        raw, image = images.open_image(self._encoded(item, where), where, self.settings.max_image_pixels)
        width, height = images.displayed_size(image)
        resized = sam_image.resized_size(height, width, self.processing.longest_edge)
        encoded = np.frombuffer(raw, dtype=np.uint8)
        if not options["prompts"]:  # the whole image: the grid's settings, no prompt
            return {
                contract.IMAGE: encoded,
                contract.POINTS: np.zeros((0, 0, 2), dtype=np.float32),
                contract.LABELS: np.zeros((0, 0), dtype=np.int64),
                contract.GRID: np.array([options[name] for name in contract.GRID_SETTINGS], dtype=np.float64),
            }, Segmented(width, height, resized, whole=True)
        prompts.check_within(options["prompts"], width, height, "payload")
        points, labels = prompts.tokens(options["prompts"])
        arrays = {
            contract.IMAGE: encoded,
            contract.POINTS: sam_image.scale_points(points, (height, width), resized).astype(np.float32),
            contract.LABELS: labels,
            contract.GRID: np.zeros(0, dtype=np.float64),
        }
        return arrays, Segmented(width, height, resized)

    def postprocess(
        self, outputs: Mapping[str, np.ndarray], context: Segmented, options: Mapping[str, Any]
    ) -> list[Any]:
        if context.whole:
            return whole_image_answers(outputs, context)
        scores, masks = outputs[contract.IOU_SCORES], outputs[contract.PRED_MASKS]
        tokens = contract.MULTIMASK if options["multimask_output"] else contract.SINGLE
        rows, columns = sam_image.upscaling(
            masks.shape[-2:],
            context.resized,
            (context.height, context.width),
            (self.processing.pad_height, self.processing.pad_width),
        )
        answers: list[Any] = []
        for prompt_scores, prompt_masks in zip(scores, masks):
            found = []
            for token in sorted(tokens, key=lambda t: -float(prompt_scores[t])):  # best first (a stable sort)
                mask = (rows @ prompt_masks[token].astype(np.float32) @ columns) > options["mask_threshold"]
                found.append(
                    {"mask": rle.encode(mask), "score": float(prompt_scores[token]), "box": sam_image.mask_box(mask)}
                )
            answers.append(found if options["multimask_output"] else found[0])
        return answers

    def counted(self, result: list[Any]) -> Mapping[str, int]:
        """The masks answered for one image (router_masks): one a prompt, or each of its multimask list."""
        return {MASKS: sum(len(answer) if isinstance(answer, list) else 1 for answer in result)}


def whole_image_answers(outputs: Mapping[str, np.ndarray], context: Segmented) -> list[dict[str, Any]]:
    """The grid's masks (the Triton model's outputs: kept, best first, their RLE made) as answers."""
    counts = sam_grid.split_counts(outputs[contract.GRID_RLE], outputs[contract.GRID_RLE_LENGTHS])
    scores, boxes = outputs[contract.GRID_SCORES], outputs[contract.GRID_BOXES]
    if not len(counts) == len(scores) == len(boxes):
        raise RuntimeError(f"{len(counts)} masks, {len(scores)} scores and {len(boxes)} boxes from one grid")
    size = [context.height, context.width]
    return [
        {"mask": {"size": size, "counts": text}, "score": float(score), "box": [int(v) for v in box]}
        for text, score, box in zip(counts, scores, boxes)
    ]


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], TextModel]:
    """A mask_generation model.toml from its folder: SAM's tensors (``app.core.mask_contract``), no
    batching (a request is one image and its prompts); the folder holds a SamModel's (or a
    SamHQModel's) config.json and its processor's config; the model type is the spec's."""
    hf = model_folder(raw, folder, where)
    source = raw["export"][SOURCE_KEY]
    try:
        config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    except ValueError as error:
        raise TextSpecError(f"{hf / 'config.json'}: not valid JSON: {error}") from None
    model_type = config.get("model_type")
    if model_type not in contract.MODEL_TYPES:
        raise TextSpecError(
            f"{hf / 'config.json'}: the {MaskGenerationClient.family} family serves SAM and SAM-HQ (SamModel, "
            f"SamHQModel: model_type 'sam' or 'sam_hq'); this is a {config.get('model_type', 'model')!r} model"
        )
    try:
        sam_image.Processing.read(hf)
    except sam_image.ProcessingError as error:
        raise TextSpecError(str(error)) from None
    text = TextModel(
        folder=hf,
        family=str(raw.get("family", "")),
        source=source,
        model_type=model_type,
        labels=(),
        problem_type="",
        sequence_length=0,
        token_type_ids=False,
        pooling="",
        normalize=False,
        dimension=int(config.get("vision_config", {}).get("output_channels") or 256),
    )
    completed = dict(raw)
    completed.setdefault("max_batch_size", 0)
    completed.setdefault("inputs", contract.inputs())
    completed.setdefault("outputs", contract.outputs())
    return completed, text


FAMILY = Family(
    name=MaskGenerationClient.family,
    client=MaskGenerationClient,
    complete=complete,
    export="scripts.model_prep.sam_export:SAM",
    small="scripts.model_prep.small_models.sam:sam_model_folder",
    loop=True,
    counters=(MASKS_COUNTER,),
    optional_inputs=(contract.POINTS, contract.LABELS, contract.GRID),  # a v2 body sends prompts or a grid
)
