"""Token classification family (NER and other taggers), answered as Hugging Face's
``TokenClassificationPipeline`` answers.

Payload: ``{"text": str | [str], "aggregation_strategy": "none" | "simple" | "first" | "average" |
"max", "stride": n}``; one text answers its list of entities (``entity`` or ``entity_group``,
``score``, ``word``, ``start``, ``end``, and ``index`` for "none"), a list a list of them. The
network returns every token's label probabilities (the pipeline's softmax, in the graph); the rest of
the pipeline's post-processing (its sub-word rules, word reconstruction, grouping) runs here
(``clients.entities``). With ``stride``, a text longer than the sequence length is cut into windows
overlapping by ``stride`` tokens, each a row of the batch, and their entities merged as the pipeline
merges them; without it, such a text is refused. ``model.toml`` may set the default strategy
(``[postprocess] aggregation_strategy``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from app.core.errors import InvalidInput
from app.core.family import Family
from app.core.text_spec import TextModel, resolve
from clients.entities import STRATEGIES, Labels, entities
from clients.entity_inputs import Vocabulary, Window
from clients.options import Option
from clients.text import TextClient, raw_copy, special_token, windows

NONE = "none"


@dataclass(frozen=True)
class Tagged:
    """What postprocess needs of one text: the text, the encodings of its windows (one without stride),
    their input_ids (a row each, as preprocess made them) and, where the encoder rebuilt them, the one
    window's [tokens, 2] character offsets (the encoding's own are then (0, 0))."""

    text: str
    encodings: Sequence[Encoding]
    ids: np.ndarray
    offsets: np.ndarray | None = None


class TokenClassificationClient(TextClient[Tagged]):
    family = "token_classification"
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "array",
        "description": "token_classification, for one text: its entities (TokenClassificationPipeline); entity "
        "and index with aggregation_strategy none, entity_group otherwise; start and end are character offsets.",
        "items": {
            "type": "object",
            "required": ["score", "word", "start", "end"],
            "properties": {
                "entity": {"type": "string"},
                "entity_group": {"type": "string"},
                "score": {"type": "number"},
                "index": {"type": "integer"},
                "word": {"type": "string"},
                "start": {"type": "integer"},
                "end": {"type": "integer"},
            },
        },
    }
    SPANS = True  # an entity's "start" and "end"
    OPTIONS = (
        Option("aggregation_strategy", str, default=NONE, choices=STRATEGIES),
        Option("stride", int, 0, 100_000),
    )

    def configure(self) -> None:
        super().configure()
        self.labels = self.text.labels
        self.label_table = Labels.of(self.labels)  # the labels as clients.entities reads them, "O" ignored
        self.scores_name = self.spec.outputs[0].name
        self.vocabulary = Vocabulary.of(self.tokenizer, special_token(self.text, "unk_token"), self.encoder.id_tokens)

    @functools.cached_property
    def raw_tokenizer(self) -> Tokenizer:
        """The windows' encoder (``clients.text.windows``), built on the first text sent with a stride (a
        tokenizer of a 30k vocabulary holds 6 MiB)."""
        return raw_copy(self.tokenizer)

    def option_limits(self) -> Mapping[str, float]:
        # a window keeps at least one token of its own besides the overlap and the special tokens
        return {"stride": self.sequence_length - self.tokenizer.num_special_tokens_to_add(False) - 1}

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Tagged]:
        text = self.check_text(item, where)
        stride = options["stride"]
        if stride is None:
            encoding, taken = self.encoder.encode_spans(text)
            arrays = self.arrays([self.checked(encoding, where, 'send "stride": n')])
            offsets = None if taken is None else self.encoder.spans(taken, arrays["input_ids"][0])
            if taken is not None and offsets is None:  # a text Spans cannot read after all: the tokenizer's own
                encoding = self.encoder.encode(text)
            return arrays, Tagged(text, [encoding], arrays["input_ids"], offsets)
        if options["aggregation_strategy"] == NONE:
            raise InvalidInput(
                'payload.stride needs an aggregation_strategy other than "none" (the windows\' entities '
                "are merged by word)"
            )
        try:
            encodings = windows(self.tokenizer, text, self.sequence_length, stride, self.raw_tokenizer)
        except ValueError as error:  # a stride the windows cannot take (options bound it first)
            raise InvalidInput(f"payload.stride {stride}: {error}") from None
        arrays = self.arrays(encodings)
        return arrays, Tagged(text, encodings, arrays["input_ids"])

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: Tagged, options: Mapping[str, Any]) -> list:
        scores = outputs[self.scores_name].astype(np.float32, copy=False)
        found = [
            Window.of(encoding, scores[row], context.ids[row], context.offsets)
            for row, encoding in enumerate(context.encodings)
        ]
        return entities(context.text, found, self.label_table, options["aggregation_strategy"], self.vocabulary)


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], TextModel]:
    """A token classifier's model.toml from its folder: its labels (id2label) and each token's label
    probabilities, the pipeline's softmax inside the graph: ``scores [batch, tokens, labels]``."""
    return resolve(
        raw,
        folder,
        where,
        labels=True,
        outputs=lambda text, *_: [{"name": "scores", "dtype": "FP32", "dims": [-1, len(text.labels)]}],
    )


FAMILY = Family(
    name=TokenClassificationClient.family,
    client=TokenClassificationClient,
    complete=complete,
    export="scripts.model_prep.transformers_export:TOKEN_PROBABILITIES",
    small="scripts.model_prep.small_models.encoders:token_classification_folder",
)
