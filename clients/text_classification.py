"""Text classification family: sentiment and intent classifiers, NLI and cross-encoder rerankers
(a pair of texts, one label), answered as Hugging Face's ``TextClassificationPipeline`` answers.

Payload: ``{"text": str | [str], "text_pair": str | [str] (as many), "topk": k, "function_to_apply":
"softmax" | "sigmoid" | "none", "truncation": bool}``. One text answers the ``k`` best
``{"label", "score"}``, best first, equal to ``pipeline(text, top_k=k)`` (a pair: to
``pipeline({"text": a, "text_pair": b}, top_k=k)``); a list answers a list. The network returns the
logits (one number per label); the function runs here, as the pipeline runs it (numpy, float32),
and its default is the pipeline's rule from ``config.json``: none for regression, sigmoid for one
label or ``multi_label_classification``, softmax otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from app.core.errors import InvalidInput
from app.core.family import Family
from app.core.text_spec import TextModel, resolve
from clients.options import Option
from clients.text import TRUNCATION, TextClient, softmax

SOFTMAX, SIGMOID, NONE = "softmax", "sigmoid", "none"
FUNCTIONS = (SOFTMAX, SIGMOID, NONE)
PAIR_FIELD = "text_pair"


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits))


def default_function(problem_type: str, labels: int) -> str:
    """The pipeline's choice when the request names no function."""
    if problem_type == "regression":
        return NONE
    if problem_type == "multi_label_classification" or labels == 1:
        return SIGMOID
    return SOFTMAX


@dataclass(frozen=True)
class Pair:
    """One item: a text and, for a pair, its second text."""

    text: str
    pair: str | None


class TextClassificationClient(TextClient[None]):
    family = "text_classification"
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "array",
        "description": "text_classification, for one text: the topk labels, best first "
        "(TextClassificationPipeline(text, top_k=k)).",
        "items": {
            "type": "object",
            "required": ["label", "score"],
            "properties": {"label": {"type": "string"}, "score": {"type": "number"}},
        },
    }
    EXTRA_FIELDS = frozenset({PAIR_FIELD})
    OPTIONS = (
        Option("topk", int, 1, 1000, default=1),
        Option("function_to_apply", str, choices=FUNCTIONS),
        TRUNCATION,
    )

    def configure(self) -> None:
        super().configure()
        self.labels = self.text.labels
        self.logits_name = self.spec.outputs[0].name

    def option_limits(self) -> Mapping[str, float]:
        return {"topk": len(self.labels)}

    def option_defaults(self) -> Mapping[str, Any]:
        return {"function_to_apply": default_function(self.text.problem_type, len(self.labels))}

    def _items(self, payload: Mapping[str, Any], label: str) -> tuple[list[tuple[Any, str]], bool]:
        """Each text with its pair (``text_pair``: a string for a string, a list as long for a list)."""
        items, single = super()._items(payload, label)
        if PAIR_FIELD not in payload:
            return [(Pair(self.check_text(text, where), None), where) for text, where in items], single
        pairs = payload[PAIR_FIELD]
        pair_label = label.replace(self.input_field, PAIR_FIELD) if label.startswith("payload.") else PAIR_FIELD
        if single:
            return [(Pair(self.check_text(items[0][0], label), self.check_text(pairs, pair_label)), label)], True
        if not isinstance(pairs, list) or len(pairs) != len(items):
            given = f"a list of {len(pairs)}" if isinstance(pairs, list) else type(pairs).__name__
            raise InvalidInput(f"{pair_label} must be a list as long as {label} ({len(items)} texts), got {given}")
        return [
            (Pair(self.check_text(text, where), self.check_text(pair, f"{pair_label}[{i}]")), where)
            for i, ((text, where), pair) in enumerate(zip(items, pairs))
        ], False

    def preprocess(self, item: Pair, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], None]:
        return self.arrays([self.encode(item.text, item.pair, where, options["truncation"])]), None

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: None, options: Mapping[str, Any]) -> list:
        logits = outputs[self.logits_name][0].astype(np.float32, copy=False)
        function = options["function_to_apply"]
        scores = softmax(logits) if function == SOFTMAX else sigmoid(logits) if function == SIGMOID else logits
        ranked = sorted(
            ({"label": label, "score": score} for label, score in zip(self.labels, scores.tolist())),
            key=lambda entry: entry["score"],
            reverse=True,
        )
        return ranked[: options["topk"]]


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], TextModel]:
    """A text classifier's model.toml from its folder: its labels (id2label), ``logits [batch, labels]``."""
    return resolve(
        raw,
        folder,
        where,
        labels=True,
        outputs=lambda text, *_: [{"name": "logits", "dtype": "FP32", "dims": [len(text.labels)]}],
    )


FAMILY = Family(
    name=TextClassificationClient.family,
    client=TextClassificationClient,
    complete=complete,
    export="scripts.model_prep.transformers_export:SEQUENCE_LOGITS",
    small="scripts.model_prep.small_models.encoders:text_classification_folder",
)
