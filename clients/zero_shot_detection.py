"""Zero-shot object detection family (OWLv2, OWL-ViT): the boxes of what a list of labels names on
an image, answered as the model's processor and ``post_process_grounded_object_detection`` answer.

model.toml is two lines, the rest read from a ``save_pretrained`` folder of the model and its
processor (``complete``)::

    family = "zero_shot_object_detection"
    [export]
    transformers = "hf"

Payload: the image (``img``: base64 in the JSON envelope, or a raw ``image/jpeg`` / ``image/png`` body
with the rest in the custom-attributes header), ``labels`` (a phrase or a list of phrases, at most
``MAX_LABELS``; in the header, phrases separated by semicolons: ``labels=a cat;a remote control``) and
``threshold`` (the processor's default, 0.1). A list of images takes the same labels on each. The
answer, per image: ``[{"label", "score", "box": [x0, y0, x1, y1]}]``, best first, the boxes in the
image's pixels (as displayed; not clipped to it, as the processor leaves them): what
``processor(images=image, text=labels)`` -> the model -> ``post_process_grounded_object_detection(
outputs, threshold, target_sizes=[(height, width)], text_labels=[labels])`` gives.

Where it runs: the router opens the image's header (the pixel limit, the size as displayed) and
tokenizes the labels (a label longer than the text encoder's length is refused: the processor would
fail on it); the image's bytes and the tokens go to one Triton model (``app/triton/zsd_model.py``),
which decodes and pre-processes the image (``clients.owl_image``) and runs the detector's graph; the
router turns its logits and boxes into the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from app.core import zsd_contract as contract
from app.core.errors import InvalidInput
from app.core.family import Family
from app.core.spec import SpecError
from app.core.text_spec import SOURCE_KEY, TextModel, TextSpecError, model_folder
from clients import images, owl_image, prompts
from clients.options import Option
from clients.text import load_tokenizer, special_token
from clients.vision import EncodedImages

LABELS = "labels"
ANSWER = {
    "type": "object",
    "required": ["label", "score", "box"],
    "additionalProperties": False,
    "properties": {
        "label": {"type": "string", "description": "the label (one of the request's) the box was found for"},
        "score": {"type": "number", "description": "the sigmoid of the box's best label logit"},
        "box": {
            "type": "array",
            "items": {"type": "number"},
            "minItems": 4,
            "maxItems": 4,
            "description": "[xmin, ymin, xmax, ymax] in the image's pixels (as displayed), not clipped to it",
        },
    },
}


@dataclass(frozen=True)
class Queries:
    """A request's labels and their tokens, the same for each of its images."""

    labels: tuple[str, ...]
    input_ids: np.ndarray  # [labels, text length] int64
    attention_mask: np.ndarray


@dataclass(frozen=True)
class Shown:
    """What postprocessing needs of one image: its size as displayed."""

    width: int
    height: int


def parse_labels(value: Any, where: str) -> tuple[str, ...]:
    """One phrase or a list of them, each non-empty, at most ``MAX_LABELS``."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise InvalidInput(f"{where} must be a phrase or a non-empty list of phrases")
    if len(items) > contract.MAX_LABELS:
        raise InvalidInput(f"{where}: {len(items)} labels, over the limit of {contract.MAX_LABELS}")
    for index, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise InvalidInput(f"{where}[{index}] must be a non-empty string, got {item!r}")
    return tuple(items)


def sigmoid(values: np.ndarray) -> np.ndarray:
    return (np.float32(1) / (np.float32(1) + np.exp(-values.astype(np.float32)))).astype(np.float32)


class ZeroShotDetectionClient(EncodedImages):
    family = "zero_shot_object_detection"
    EXTRA_FIELDS = frozenset({LABELS})
    FIELD_SCHEMAS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        LABELS: {"type": "string", "description": "a phrase naming what to find"}
    }
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "array",
        "description": "zero_shot_object_detection, for one image: the boxes found, best first.",
        "items": ANSWER,
    }
    OPTIONS = (Option("threshold", float, 0.0, 1.0, default=0.1),)

    def configure(self) -> None:
        text = self.spec.text
        try:
            self.processing = owl_image.Processing.read(text.folder, text.model_type)
        except owl_image.ProcessingError as error:
            raise SpecError(str(error)) from None
        self.tokenizer = load_tokenizer(text)
        pad = special_token(text, "pad_token")
        self.pad_id = self.tokenizer.token_to_id(pad) if pad else 0
        if self.pad_id is None:
            raise SpecError(f"{text.folder}: pad_token {pad!r} is not in tokenizer.json")
        self.text_length = text.sequence_length

    def queries(self, labels: tuple[str, ...], where: str) -> Queries:
        """The labels tokenized, padded to the text length; one longer than it is refused, named."""
        ids = np.full((len(labels), self.text_length), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for index, encoding in enumerate(self.tokenizer.encode_batch(list(labels))):
            if len(encoding.ids) > self.text_length:
                raise InvalidInput(
                    f"{where}[{index}] is {len(encoding.ids)} tokens, over the text encoder's limit of "
                    f"{self.text_length}"
                )
            ids[index, : len(encoding.ids)] = encoding.ids
            mask[index, : len(encoding.ids)] = 1
        return Queries(labels, ids, mask)

    def parse_options(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        options = super().parse_options(payload)
        where = f"payload.{LABELS}"
        if payload.get(LABELS) is None:
            raise InvalidInput(f"{where} is required: the phrases naming what to find")
        options["queries"] = self.queries(parse_labels(payload[LABELS], where), where)
        return options

    def options_from_attributes(self, attributes: Mapping[str, str], where: str) -> dict[str, Any]:
        found = super().options_from_attributes(attributes, where)
        if LABELS in attributes:
            found[LABELS] = prompts.split_prompts(attributes[LABELS])
        return found

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Shown]:
        """The encoded bytes (only the header read) and the labels' tokens."""
        raw, image = images.open_image(self._encoded(item, where), where, self.settings.max_image_pixels)
        queries: Queries = options["queries"]
        arrays = {
            contract.IMAGE: np.frombuffer(raw, dtype=np.uint8),
            contract.INPUT_IDS: queries.input_ids,
            contract.ATTENTION_MASK: queries.attention_mask,
        }
        return arrays, Shown(*images.displayed_size(image))

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: Shown, options: Mapping[str, Any]) -> list:
        logits, found = outputs[contract.LOGITS], outputs[contract.PRED_BOXES]
        labels = options["queries"].labels
        scores = sigmoid(logits.max(axis=-1))
        best = logits.argmax(axis=-1)
        corners = owl_image.boxes(found, self.processing.kind, context.height, context.width)
        kept = np.flatnonzero(scores > np.float32(options["threshold"]))
        kept = kept[np.argsort(-scores[kept], kind="stable")]
        return [
            {"label": labels[int(best[i])], "score": float(scores[i]), "box": [float(v) for v in corners[i]]}
            for i in kept
        ]


def _config(hf: Path) -> dict[str, Any]:
    try:
        return json.loads((hf / "config.json").read_text(encoding="utf-8"))
    except ValueError as error:
        raise TextSpecError(f"{hf / 'config.json'}: not valid JSON: {error}") from None


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], TextModel]:
    """A zero_shot_object_detection model.toml from its folder: the detector's tensors
    (``app.core.zsd_contract``), no batching (a request is one image and its labels); the folder holds
    an OWLv2 or OWL-ViT config.json, its processor's config and tokenizer.json."""
    hf = model_folder(raw, folder, where)
    config = _config(hf)
    model_type = config.get("model_type")
    if model_type not in contract.MODEL_TYPES:
        raise TextSpecError(
            f"{hf / 'config.json'}: the {ZeroShotDetectionClient.family} family serves "
            f"{' and '.join(contract.MODEL_TYPES)} models; this is a {model_type or 'model'!r} model"
        )
    try:
        owl_image.Processing.read(hf, model_type)
    except owl_image.ProcessingError as error:
        raise TextSpecError(str(error)) from None
    if not (hf / "tokenizer.json").is_file():
        raise TextSpecError(f"{hf}: no tokenizer.json (the processor's save_pretrained writes it)")
    text_config = config.get("text_config") or {}
    text = TextModel(
        folder=hf,
        family=str(raw.get("family", "")),
        source=str(raw["export"][SOURCE_KEY]),
        model_type=model_type,
        labels=(),
        problem_type="",
        sequence_length=int(text_config.get("max_position_embeddings") or 16),
        token_type_ids=False,
        pooling="",
        normalize=False,
        dimension=int(config.get("projection_dim") or 512),
    )
    completed = dict(raw)
    completed.setdefault("max_batch_size", 0)
    completed.setdefault("inputs", contract.inputs())
    completed.setdefault("outputs", contract.outputs())
    return completed, text


FAMILY = Family(
    name=ZeroShotDetectionClient.family,
    client=ZeroShotDetectionClient,
    complete=complete,
    export="scripts.model_prep.zsd_export:ZSD",
    loop=True,
)
