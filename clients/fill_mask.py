"""Fill-mask family (``bert_base``): WordPiece tokenisation in, Hugging Face's FillMaskPipeline out.

Spec ``[preprocess]``: ``vocab`` (the tokenizer's WordPiece file), ``lowercase``, ``sequence_length``;
the inputs are token ids, attention mask and optionally token type ids (their dtype, INT64 or
INT32, is the spec's). ``[postprocess]``: ``topk``
(default), ``max_topk``. The model returns, at every position, the softmax probabilities of its
best candidates (``scores``, best first) and their token ids (``token_ids``).

Results are nested as the pipeline nests them: one ``[MASK]`` gives a list of candidates
``{"score", "token", "token_str", "sequence"}``; several give one such list per mask, in order.
As in the pipeline, ``sequence`` skips special tokens only when the text has one mask (with
several, the other ``[MASK]`` tokens and ``[CLS]``/``[SEP]`` stay visible).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import BertWordPieceTokenizer

from app.core.errors import InvalidInput
from app.core.spec import ModelSpec, SpecError
from clients.base import ModelClient, Option

MASK_TOKEN = "[MASK]"
PAD_TOKEN = "[PAD]"
SEP_TOKEN = "[SEP]"


@dataclass(frozen=True)
class Encoded:
    """One text's token ids (with [CLS] and [SEP], no padding) and its mask positions."""

    ids: tuple[int, ...]
    masks: tuple[int, ...]


def load_tokenizer(spec: ModelSpec) -> BertWordPieceTokenizer:
    relative = spec.preprocess.get("vocab")
    if not relative:
        raise SpecError(f"{spec.folder}: [preprocess] vocab is missing")
    path = spec.file(str(relative))
    if not path.is_file():
        raise SpecError(f"{path}: vocab file not found")
    return BertWordPieceTokenizer(str(path), lowercase=bool(spec.preprocess.get("lowercase", True)))


class FillMaskClient(ModelClient[Encoded]):
    family = "fill_mask"
    input_field = "text"
    content_types = frozenset({"text/plain"})
    OPTIONS = (Option("topk", int, 1, 50, default=5),)
    PREPROCESS_KEYS = frozenset({"vocab", "lowercase", "sequence_length"})

    def configure(self) -> None:
        super().configure()
        spec = self.spec
        self.tokenizer = load_tokenizer(spec)
        self.sequence_length = int(spec.preprocess.get("sequence_length", spec.inputs[0].dims[-1]))
        ids = {token: self.tokenizer.token_to_id(token) for token in (MASK_TOKEN, PAD_TOKEN, SEP_TOKEN)}
        missing = [token for token, i in ids.items() if i is None]
        if missing:
            raise SpecError(f"{spec.folder}: the vocab has no {', '.join(missing)}")
        self.mask_id, self.pad_id, self.sep_id = ids[MASK_TOKEN], ids[PAD_TOKEN], ids[SEP_TOKEN]
        if not 2 <= len(spec.inputs) <= 3:
            raise SpecError(
                f"{spec.folder}: the inputs must be token ids, attention mask and, optionally, "
                f"token type ids, in that order"
            )
        self.input_ids_name, self.attention_mask_name = (t.name for t in spec.inputs[:2])
        self.token_type_ids_name = spec.inputs[2].name if len(spec.inputs) == 3 else None
        self.scores_name, self.token_ids_name = (t.name for t in spec.outputs[:2])
        self.candidates = spec.outputs[0].dims[-1]

    def option_limits(self) -> Mapping[str, float]:
        return {"topk": self.candidates}  # the model returns this many candidates per position

    def encode(self, text: Any, where: str) -> Encoded:
        """[CLS] text [SEP], cut to the sequence length only where no [MASK] is lost."""
        if not isinstance(text, str):
            raise InvalidInput(f"{where} must be a string (or a list of them)")
        ids = self.tokenizer.encode(text).ids
        masks = [i for i, token in enumerate(ids) if token == self.mask_id]
        if not masks:
            raise InvalidInput(f"{where} has no {MASK_TOKEN}")
        limit = self.sequence_length
        if len(ids) > limit:
            if masks[-1] >= limit - 1:
                raise InvalidInput(
                    f"{where} has a {MASK_TOKEN} at token {masks[-1]}, past the limit of {limit} tokens "
                    f"(the text is {len(ids)} tokens with [CLS] and [SEP]); shorten the text before it"
                )
            ids = ids[: limit - 1] + [self.sep_id]
        return Encoded(tuple(ids), tuple(masks))

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Encoded]:
        encoded = self.encode(item, where)
        input_ids = np.full(self.sequence_length, self.pad_id, dtype=np.int64)
        input_ids[: len(encoded.ids)] = encoded.ids
        attention_mask = np.zeros(self.sequence_length, dtype=np.int64)
        attention_mask[: len(encoded.ids)] = 1
        arrays = {self.input_ids_name: input_ids, self.attention_mask_name: attention_mask}
        if self.token_type_ids_name:  # one segment: all zeros
            arrays[self.token_type_ids_name] = np.zeros(self.sequence_length, dtype=np.int64)
        return arrays, encoded

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: Encoded, options: Mapping[str, Any]) -> list:
        topk = options["topk"]
        scores, token_ids = outputs[self.scores_name], outputs[self.token_ids_name]
        single = len(context.masks) == 1
        rows = []
        for position in context.masks:
            row = []
            for score, token in zip(scores[position, :topk].tolist(), token_ids[position, :topk].tolist()):
                tokens = list(context.ids)
                tokens[position] = token
                tokens = [t for t in tokens if t != self.pad_id]
                row.append(
                    {
                        "score": score,
                        "token": token,
                        "token_str": self.tokenizer.decode([token], skip_special_tokens=False),
                        "sequence": self.tokenizer.decode(tokens, skip_special_tokens=single),
                    }
                )
            rows.append(row)
        return rows[0] if single else rows
