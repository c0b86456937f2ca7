"""Grounded segmentation family: a zero-shot detector chained to SAM, each detection answered with
its mask, as running the two references one after the other answers it (the detector's
``post_process_grounded_object_detection`` boxes as ``SamProcessor``'s ``input_boxes``).

model.toml is three lines naming two models of the same repository (``app.core.grounded_contract``)::

    family = "grounded_segmentation"
    detector = "gdino"          # a zero_shot_object_detection model
    segmenter = "sam"           # a mask_generation model (SAM or SAM-HQ)

Payload: the detector's (``img``, ``labels`` or Grounding DINO's ``text``, ``threshold``,
``text_threshold``) and the segmenter's ``mask_threshold`` (one mask a detection: no
``multimask_output``). The answer, per image: ``[{"label", "score", "box", "mask", "mask_score"}]``,
best first: the detector's answer (``clients.zero_shot_detection``), each with the mask SAM gives its
box (``clients.mask_generation``: COCO RLE) and SAM's predicted IoU of it.

Where it runs: the router opens the image's header and tokenizes the text as the detector's client
does; one Triton model (``app/triton/grounded_model.py``) decodes the image once, runs the detector's
graph, keeps its boxes above the threshold, runs SAM's image encoder once and its mask decoder over
the boxes; the router reads the labels, scales the boxes and the masks with the two families' own
post-processing. Named models that are missing, or of other families, stop the start in one line
naming the chain's model.toml.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from app.core import grounded_contract as contract
from app.core.access import DETECTIONS, MASKS
from app.core.family import Family
from app.core.spec import SPEC_FILE, ModelSpec, read_spec
from app.core.text_spec import TextSpecError
from clients import mask_generation, sam_image, zero_shot_detection
from clients.mask_generation import ANSWER as MASK_ANSWER
from clients.mask_generation import MASKS_COUNTER, MaskGenerationClient, Segmented
from clients.vision import EncodedImages
from clients.zero_shot_detection import ANSWER as BOX_ANSWER
from clients.zero_shot_detection import (
    DETECTIONS_COUNTER,
    LABELS,
    TEXT,
    TEXT_THRESHOLD,
    Shown,
    ZeroShotDetectionClient,
)

MASK_THRESHOLD = "mask_threshold"
PARTS = {contract.DETECTOR: ZeroShotDetectionClient, contract.SEGMENTER: MaskGenerationClient}
PART_FAMILIES = {f.name: f for f in (zero_shot_detection.FAMILY, mask_generation.FAMILY)}  # the parts' specs
ANSWER = {
    "type": "object",
    "required": ["label", "score", "box", "mask", "mask_score"],
    "additionalProperties": False,
    "properties": {
        **BOX_ANSWER["properties"],
        "mask": MASK_ANSWER["properties"]["mask"],
        "mask_score": {"type": "number", "description": "SAM's predicted IoU of the mask of the box"},
    },
}


@dataclass(frozen=True)
class Found:
    """What postprocessing needs of one image: its size as displayed and as SAM resizes it."""

    shown: Shown
    segmented: Segmented


def part_folder(folder: Path, raw: Mapping[str, Any], key: str, where: str) -> Path:
    """The folder of the model that ``key`` names, beside the chain's, checked to be of the part's
    family (read raw first: a chain naming a chain is refused, not followed)."""
    name = raw.get(key)
    family = PARTS[key].family
    if not isinstance(name, str) or not name.strip() or "/" in name or name in (".", ".."):
        raise TextSpecError(f"{where}: {key} must name a {family} model of the repository, got {name!r}")
    path = folder.parent / name / SPEC_FILE
    try:
        found = tomllib.loads(path.read_text(encoding="utf-8")).get("family")
    except FileNotFoundError:
        raise TextSpecError(f"{where}: {key} = {name!r}: no model of that name beside it ({path} missing)") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise TextSpecError(f"{where}: {key} = {name!r}: {path} is not readable: {error}") from None
    if found != family:
        raise TextSpecError(f"{where}: {key} = {name!r} is a {found!r} model; the {key} must be a {family} model")
    return folder.parent / name


class GroundedSegmentationClient(EncodedImages):
    family = "grounded_segmentation"
    EXTRA_FIELDS = ZeroShotDetectionClient.EXTRA_FIELDS
    FIELD_SCHEMAS = ZeroShotDetectionClient.FIELD_SCHEMAS
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "array",
        "description": "grounded_segmentation, for one image: the detector's boxes, best first, each with its mask.",
        "items": ANSWER,
    }
    OPTIONS = (
        *ZeroShotDetectionClient.OPTIONS,
        *(o for o in MaskGenerationClient.OPTIONS if o.name == MASK_THRESHOLD),
    )

    def configure(self) -> None:
        where = f"{self.spec.folder / SPEC_FILE}"
        parts: dict[str, ModelSpec] = {
            key: read_spec(part_folder(self.spec.folder, self.spec.export, key, where), PART_FAMILIES) for key in PARTS
        }
        self.detector = ZeroShotDetectionClient(parts[contract.DETECTOR], self.triton, self.settings)
        self.segmenter = MaskGenerationClient(parts[contract.SEGMENTER], self.triton, self.settings)

    def option_defaults(self) -> Mapping[str, Any]:
        return {
            name: option.default for part in (self.detector, self.segmenter) for name, option in part.options.items()
        }

    def parse_options(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        options = super().parse_options(payload)
        text = {key: payload[key] for key in (LABELS, TEXT, TEXT_THRESHOLD) if key in payload}
        options["queries"] = self.detector.parse_options(text)["queries"]
        return options

    def options_from_attributes(self, attributes: Mapping[str, str], where: str) -> dict[str, Any]:
        return {
            **self.detector.options_from_attributes(attributes, where),
            **super().options_from_attributes(attributes, where),
        }

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Found]:
        """The detector's arrays (the encoded bytes, the text's tokens) and the threshold."""
        arrays, shown = self.detector.preprocess(item, where, options)
        arrays[contract.THRESHOLD] = np.array([options["threshold"]], dtype=np.float32)
        resized = sam_image.resized_size(shown.height, shown.width, self.segmenter.processing.longest_edge)
        return arrays, Found(shown, Segmented(shown.width, shown.height, resized))

    def counted(self, result: list) -> Mapping[str, int]:
        """The detections answered for one image, each with its mask (router_detections, router_masks)."""
        return {DETECTIONS: len(result), MASKS: len(result)}

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: Found, options: Mapping[str, Any]) -> list:
        found = self.detector.postprocess(outputs, context.shown, options)
        if len(found) != len(outputs[contract.IOU_SCORES]):
            raise RuntimeError(f"{self.name}: {len(found)} detections but {len(outputs[contract.IOU_SCORES])} masks")
        if not found:
            return []
        masks = self.segmenter.postprocess(
            outputs, context.segmented, {"multimask_output": False, MASK_THRESHOLD: options[MASK_THRESHOLD]}
        )
        return [{**box, "mask": mask["mask"], "mask_score": mask["score"]} for box, mask in zip(found, masks)]


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], None]:
    """A grounded_segmentation model.toml: its two models checked (there, of their families), the
    chain's tensors (``app.core.grounded_contract``), no batching."""
    for key in PARTS:
        part_folder(folder, raw, key, where)
    unknown = sorted(set(raw) - {"family", contract.DETECTOR, contract.SEGMENTER, "description", "required"})
    if unknown:
        raise TextSpecError(
            f"{where}: {unknown[0]!r} is not a key of a {GroundedSegmentationClient.family} model.toml "
            f"(family, {contract.DETECTOR}, {contract.SEGMENTER}, description, required)"
        )
    completed = dict(raw)
    completed["max_batch_size"] = 0
    completed["inputs"] = contract.inputs()
    completed["outputs"] = contract.outputs()
    completed["export"] = {contract.DETECTOR: raw[contract.DETECTOR], contract.SEGMENTER: raw[contract.SEGMENTER]}
    return completed, None


FAMILY = Family(
    name=GroundedSegmentationClient.family,
    client=GroundedSegmentationClient,
    complete=complete,
    export="scripts.model_prep.grounded_export:GROUNDED",
    parts=tuple(PARTS),
    counters=(DETECTIONS_COUNTER, MASKS_COUNTER),
    loop=True,
)
