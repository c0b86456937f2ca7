"""Zero-shot object detection family (OWLv2, OWL-ViT, Grounding DINO): the boxes of what a list of
labels (or a Grounding DINO prompt) names on an image, answered as the model's processor and
``post_process_grounded_object_detection`` answer.

model.toml is two lines, the rest read from a ``save_pretrained`` folder of the model and its
processor (``complete``)::

    family = "zero_shot_object_detection"
    [export]
    transformers = "hf"

Payload: the image (``img``: base64 in the JSON envelope, or a raw ``image/jpeg`` / ``image/png`` body
with the rest in the custom-attributes header), ``labels`` (a phrase or a list of phrases, at most
``MAX_LABELS``; in the header, phrases separated by semicolons: ``labels=a cat;a remote control``) or,
for Grounding DINO, ``text`` (its prompt, "a cat. a remote control."), ``threshold`` (the processor's
default: 0.1 for OWL, 0.25 for Grounding DINO) and, for Grounding DINO, ``text_threshold`` (0.25). A
list of images takes the same text on each. The answer, per image: ``[{"label", "score", "box": [x0,
y0, x1, y1]}]``, best first, the boxes in the image's pixels (as displayed; not clipped to it, as the
processor leaves them): what ``processor(images=image, text=labels)`` -> the model ->
``post_process_grounded_object_detection(outputs, threshold, [text_threshold,] target_sizes=[(height,
width)])`` gives. OWL's label is one of the labels (the box's best); Grounding DINO's is its phrase,
the prompt's tokens above ``text_threshold`` decoded (``clients.grounding``).

Where it runs: the router opens the image's header (the pixel limit, the size as displayed) and
tokenizes the text (OWL: a label a row, padded to the text encoder's 16 tokens; Grounding DINO: the
labels joined into one prompt, at most 256 tokens; longer is refused); the image's bytes and the tokens
go to one Triton model (``app/triton/zsd_model.py``), which decodes and pre-processes the image
(``clients.zsd_image``) and runs the detector's graph; the router turns its logits and boxes into the
answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from app.core import zsd_contract as contract
from app.core.access import DETECTIONS
from app.core.errors import InvalidInput
from app.core.family import Counter, Family
from app.core.spec import SpecError
from app.core.text_spec import SOURCE_KEY, TextModel, TextSpecError, model_folder
from clients import grounding, images, owl_image, prompts, zsd_image
from clients.options import Option
from clients.text import clean_up_tokenization, cleans_up_spaces, load_tokenizer, special_token
from clients.vision import EncodedImages

LABELS, TEXT, TEXT_THRESHOLD = "labels", "text", "text_threshold"
GROUNDING_THRESHOLD = 0.25  # GroundingDinoProcessor's default threshold (OWL's: 0.1)
# The detections answered, by model: a detector's, and a grounded_segmentation chain's.
DETECTIONS_COUNTER = Counter(
    DETECTIONS,
    "router_detections",
    "Detections answered (zero_shot_object_detection, grounded_segmentation), by model.",
)
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
    """A request's text and its tokens, the same for each of its images: OWL's labels (a row each,
    padded to the text length), or Grounding DINO's prompt (one row)."""

    labels: tuple[str, ...]  # OWL: a box's label is one of them; Grounding DINO: none (its phrase is read)
    input_ids: np.ndarray  # [rows, tokens] int64
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
    with np.errstate(over="ignore"):  # -inf logits (Grounding DINO's columns past the prompt): 0
        return (np.float32(1) / (np.float32(1) + np.exp(-values.astype(np.float32)))).astype(np.float32)


def best_first(logits: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The boxes a detector answers: the indices of those whose best label's probability passes
    ``threshold``, best first (a stable sort), with every box's probabilities and best score."""
    probs = sigmoid(logits)
    scores = probs.max(axis=-1)
    kept = np.flatnonzero(scores > np.float32(threshold))
    return kept[np.argsort(-scores[kept], kind="stable")], probs, scores


class ZeroShotDetectionClient(EncodedImages):
    family = "zero_shot_object_detection"
    EXTRA_FIELDS = frozenset({LABELS, TEXT})
    FIELD_SCHEMAS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        LABELS: {"type": "string", "description": "a phrase naming what to find"},
        TEXT: {"type": "string", "description": "Grounding DINO: the prompt, phrases ended by '.'"},
    }
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "array",
        "description": "zero_shot_object_detection, for one image: the boxes found, best first.",
        "items": ANSWER,
    }
    OPTIONS = (
        Option("threshold", float, 0.0, 1.0, default=0.1),
        Option(TEXT_THRESHOLD, float, 0.0, 1.0, default=0.25),
    )

    def configure(self) -> None:
        text = self.spec.text
        self.grounding = text.model_type == contract.GROUNDING_DINO
        try:
            self.processing = zsd_image.read(text.folder, text.model_type)
        except zsd_image.ProcessingError as error:
            raise SpecError(str(error)) from None
        self.tokenizer = load_tokenizer(text)
        self.clean_up = cleans_up_spaces(text, self.tokenizer)
        pad = special_token(text, "pad_token")
        self.pad_id = self.tokenizer.token_to_id(pad) if pad else 0
        if self.pad_id is None:
            raise SpecError(f"{text.folder}: pad_token {pad!r} is not in tokenizer.json")
        self.text_length = text.sequence_length

    def option_defaults(self) -> Mapping[str, Any]:
        return {"threshold": GROUNDING_THRESHOLD if self.spec.text.model_type == contract.GROUNDING_DINO else 0.1}

    def _tokens(self, texts: list[str], where: str, each: bool) -> list:
        encodings = self.tokenizer.encode_batch(texts)
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.text_length:
                raise InvalidInput(
                    f"{where}{f'[{index}]' if each else ''} is {len(encoding.ids)} tokens, over the text encoder's "
                    f"limit of {self.text_length}"
                )
        return encodings

    def queries(self, labels: tuple[str, ...], where: str) -> Queries:
        """OWL: the labels tokenized, padded to the text length; one longer than it is refused, named."""
        ids = np.full((len(labels), self.text_length), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for index, encoding in enumerate(self._tokens(list(labels), where, True)):
            ids[index, : len(encoding.ids)] = encoding.ids
            mask[index, : len(encoding.ids)] = 1
        return Queries(labels, ids, mask)

    def prompt_queries(self, text: str, where: str) -> Queries:
        """Grounding DINO: the prompt tokenized, one row; over the limit is refused, named."""
        (encoding,) = self._tokens([text], where, False)
        ids = np.array([encoding.ids], dtype=np.int64)
        return Queries((), ids, np.ones_like(ids))

    def parse_options(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        options = super().parse_options(payload)
        if not self.grounding:
            for field in (TEXT, TEXT_THRESHOLD):
                if field in payload:
                    raise InvalidInput(f"payload.{field} is Grounding DINO's; {self.name!r} takes labels")
            if payload.get(LABELS) is None:
                raise InvalidInput(f"payload.{LABELS} is required: the phrases naming what to find")
            options["queries"] = self.queries(parse_labels(payload[LABELS], f"payload.{LABELS}"), f"payload.{LABELS}")
            return options
        if (payload.get(LABELS) is None) == (payload.get(TEXT) is None):
            raise InvalidInput(
                f"payload.{LABELS} or payload.{TEXT} is required, not both: the phrases naming what to find"
            )
        if payload.get(TEXT) is not None:
            if not isinstance(payload[TEXT], str) or not payload[TEXT].strip():
                raise InvalidInput(f"payload.{TEXT} must be a non-empty string")
            options["queries"] = self.prompt_queries(payload[TEXT], f"payload.{TEXT}")
        else:
            labels = parse_labels(payload[LABELS], f"payload.{LABELS}")
            options["queries"] = self.prompt_queries(grounding.prompt(labels, f"payload.{LABELS}"), f"payload.{LABELS}")
        return options

    def options_from_attributes(self, attributes: Mapping[str, str], where: str) -> dict[str, Any]:
        found = super().options_from_attributes(attributes, where)
        if not self.grounding:
            found.pop(TEXT_THRESHOLD, None)
        if LABELS in attributes:
            found[LABELS] = prompts.split_prompts(attributes[LABELS])
        if TEXT in attributes and self.grounding:
            found[TEXT] = attributes[TEXT]
        return found

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Shown]:
        """The encoded bytes (only the header read) and the text's tokens."""
        raw, image = images.open_image(self._encoded(item, where), where, self.settings.max_image_pixels)
        queries: Queries = options["queries"]
        arrays = {
            contract.IMAGE: np.frombuffer(raw, dtype=np.uint8),
            contract.INPUT_IDS: queries.input_ids,
            contract.ATTENTION_MASK: queries.attention_mask,
        }
        return arrays, Shown(*images.displayed_size(image))

    def decode(self, ids: list[int]) -> str:
        """As the tokenizer's ``batch_decode`` (special tokens kept)."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return clean_up_tokenization(text) if self.clean_up else text

    def counted(self, result: list) -> Mapping[str, int]:
        """The detections answered for one image (router_detections)."""
        return {DETECTIONS: len(result)}

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: Shown, options: Mapping[str, Any]) -> list:
        logits, found = outputs[contract.LOGITS], outputs[contract.PRED_BOXES]
        queries: Queries = options["queries"]
        kept, probs, scores = best_first(logits, options["threshold"])
        corners = owl_image.boxes(found, context.height, context.width, self.processing.square)
        if self.grounding:
            ids = queries.input_ids[0]
            labels = [self.decode(grounding.phrase_tokens(probs[i], ids, options[TEXT_THRESHOLD])) for i in kept]
        else:
            best = logits.argmax(axis=-1)
            labels = [queries.labels[int(best[i])] for i in kept]
        return [
            {"label": label, "score": float(scores[i]), "box": [float(v) for v in corners[i]]}
            for label, i in zip(labels, kept)
        ]


def _config(hf: Path) -> dict[str, Any]:
    try:
        return json.loads((hf / "config.json").read_text(encoding="utf-8"))
    except ValueError as error:
        raise TextSpecError(f"{hf / 'config.json'}: not valid JSON: {error}") from None


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], TextModel]:
    """A zero_shot_object_detection model.toml from its folder: the detector's tensors
    (``app.core.zsd_contract``), no batching (a request is one image and its labels); the folder holds
    an OWLv2, OWL-ViT or Grounding DINO config.json, its processor's config and tokenizer.json."""
    hf = model_folder(raw, folder, where)
    config = _config(hf)
    model_type = config.get("model_type")
    if model_type not in contract.MODEL_TYPES:
        raise TextSpecError(
            f"{hf / 'config.json'}: the {ZeroShotDetectionClient.family} family serves "
            f"{', '.join(contract.MODEL_TYPES)} models; this is a {model_type or 'model'!r} model"
        )
    try:
        zsd_image.read(hf, model_type)
    except zsd_image.ProcessingError as error:
        raise TextSpecError(str(error)) from None
    if not (hf / "tokenizer.json").is_file():
        raise TextSpecError(f"{hf}: no tokenizer.json (the processor's save_pretrained writes it)")
    text_config = config.get("text_config") or {}
    positions = int(
        text_config.get("max_position_embeddings") or (512 if model_type == contract.GROUNDING_DINO else 16)
    )
    if model_type == contract.GROUNDING_DINO:  # the prompt's tokens: at most its max_text_len (256)
        positions = min(positions, int(config.get("max_text_len") or contract.MAX_TEXT_TOKENS))
    text = TextModel(
        folder=hf,
        family=str(raw.get("family", "")),
        source=str(raw["export"][SOURCE_KEY]),
        model_type=model_type,
        labels=(),
        problem_type="",
        sequence_length=positions,
        token_type_ids=False,
        pooling="",
        normalize=False,
        dimension=int(config.get("projection_dim") or config.get("d_model") or 512),
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
    small="scripts.model_prep.small_models.zsd:zero_shot_folder",
    loop=True,
    counters=(DETECTIONS_COUNTER,),
)
