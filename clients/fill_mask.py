"""Fill-mask family: a text with one or more mask tokens in, Hugging Face's FillMaskPipeline out.

A model comes one of two ways, and ``FillMaskClient.of(spec)`` is the client class of its way:

- ``FolderFillMaskClient``: a Hugging Face masked-LM folder and the two-line model.toml of the text
  families (``[export] transformers``, ``app.core.text_spec``). Any fast tokenizer (its
  ``tokenizer.json``: WordPiece, byte-level BPE, Unigram ...) and its own mask token
  (``tokenizer_config.json``'s ``mask_token``: ``[MASK]``, ``<mask>``), through ``clients.text``:
  texts of any length up to the model's, padded per request to a length bucket; a longer text is
  a 400 naming its tokens and the limit.
- ``VocabFillMaskClient`` (``bert_base``): a WordPiece ``vocab.txt`` (``[preprocess]`` ``vocab``,
  ``lowercase``, ``sequence_length``), inputs of that fixed length (token ids, attention mask and
  optionally token type ids, INT64 or INT32 as the spec says). A text past the length is cut
  after its last ``[MASK]`` (``[SEP]`` kept); a ``[MASK]`` past it is a 400.

The model returns, at every position, the softmax probabilities of its best candidates
(``scores``, best first) and their token ids (``token_ids``); ``[postprocess]`` ``topk`` (default
5) and ``max_topk`` (the candidates the graph returns).

Results are nested as the pipeline nests them: one mask gives a list of candidates ``{"score",
"token", "token_str", "sequence"}``; several give one such list per mask, in order. As in the
pipeline, ``sequence`` is the text's tokens with the candidate in the mask's place and the padding
token left out, decoded skipping special tokens only when the text has one mask (with several, the
other masks and the ``[CLS]``/``[SEP]`` or ``<s>``/``</s>`` stay visible); ``token_str`` is the
candidate alone, special tokens kept. Decoding is the tokenizer's own decoder, then, where
transformers does it, its clean-up of spaces before punctuation (``clean_up_tokenization_spaces``
in ``tokenizer_config.json``; transformers ignores it for BPE tokenizers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from tokenizers import BertWordPieceTokenizer, Tokenizer

from app.core.errors import InvalidInput
from app.core.family import Family
from app.core.spec import ModelSpec, SpecError
from app.core.text_spec import TextModel, resolve, whole
from clients.base import ModelClient
from clients.options import Option
from clients.plain_text import Encoder
from clients.text import TextClient, clean_up_tokenization, cleans_up_spaces, special_token

MASK_TOKEN = "[MASK]"
PAD_TOKEN = "[PAD]"
SEP_TOKEN = "[SEP]"


@dataclass(frozen=True)
class Encoded:
    """One text's token ids (special tokens included, no padding) and its mask positions."""

    ids: tuple[int, ...]
    masks: tuple[int, ...]


def load_tokenizer(spec: ModelSpec) -> Tokenizer:
    relative = spec.preprocess.get("vocab")
    if not relative:
        raise SpecError(f"{spec.folder}: [preprocess] vocab is missing")
    path = spec.file(str(relative))
    if not path.is_file():
        raise SpecError(f"{path}: vocab file not found")
    lowercase = bool(spec.preprocess.get("lowercase", True))
    return Tokenizer.from_str(BertWordPieceTokenizer(str(path), lowercase=lowercase).to_str())


CANDIDATES = {  # one mask's, best first: what FillMaskPipeline answers for a text with one mask
    "type": "array",
    "items": {
        "type": "object",
        "required": ["score", "token", "token_str", "sequence"],
        "additionalProperties": False,
        "properties": {
            "score": {"type": "number"},
            "token": {"type": "integer"},
            "token_str": {"type": "string"},
            "sequence": {"type": "string"},
        },
    },
}


class FillMaskClient(ModelClient[Encoded]):
    """The family: the candidates of each mask, answered as the pipeline answers. ``of(spec)`` is the
    client class of the model's way (a Hugging Face folder, or a vocab.txt); the ways read their
    tokenizer, its mask and padding tokens and whether it cleans up spaces in ``configure``."""

    family = "fill_mask"
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "description": "fill_mask, for one text: the topk candidates of its mask, best first, or a list of "
        "such lists, one per mask in order, for a text with several (as FillMaskPipeline nests them).",
        "anyOf": [CANDIDATES, {"type": "array", "items": CANDIDATES}],
    }
    input_field = "text"
    content_types = frozenset({"text/plain"})
    OPTIONS = (Option("topk", int, 1, 1000, default=5),)  # bounded by the model's candidates (max_topk)

    tokenizer: Tokenizer
    mask_token: str
    mask_id: int
    pad_token_id: int | None  # left out of ``sequence`` as the pipeline leaves it out (None: no padding token)
    clean_up: bool = False

    @classmethod
    def of(cls, spec: ModelSpec) -> type[ModelClient]:
        """The client of the spec's way: a Hugging Face folder, or a vocab.txt."""
        return FolderFillMaskClient if spec.text is not None else VocabFillMaskClient

    def configure(self) -> None:
        super().configure()
        self.scores_name, self.token_ids_name = (t.name for t in self.spec.outputs[:2])
        self.candidates = self.spec.outputs[0].dims[-1]

    def option_limits(self) -> Mapping[str, float]:
        return {"topk": self.candidates}  # the model returns this many candidates per position

    def masks(self, ids: Sequence[int], where: str) -> tuple[int, ...]:
        """The mask tokens' positions; a text without one is refused."""
        masks = tuple(i for i, token in enumerate(ids) if token == self.mask_id)
        if not masks:
            raise InvalidInput(f"{where} has no {self.mask_token}")
        return masks

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        text = self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.clean_up else text

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: Encoded, options: Mapping[str, Any]) -> list:
        """``outputs``: ``[positions, candidates]`` scores and token ids of the text."""
        topk = options["topk"]
        scores, token_ids = outputs[self.scores_name], outputs[self.token_ids_name]
        single = len(context.masks) == 1
        rows = []
        for position in context.masks:
            row = []
            for score, token in zip(scores[position, :topk].tolist(), token_ids[position, :topk].tolist()):
                tokens = list(context.ids)
                tokens[position] = token
                tokens = [t for t in tokens if t != self.pad_token_id]
                row.append(
                    {
                        "score": score,
                        "token": token,
                        "token_str": self.decode([token], skip_special_tokens=False),
                        "sequence": self.decode(tokens, skip_special_tokens=single),
                    }
                )
            rows.append(row)
        return rows[0] if single else rows


class FolderFillMaskClient(TextClient[Encoded], FillMaskClient):
    """A Hugging Face masked-LM folder: ``clients.text``'s tokenizer, length check and length buckets."""

    LONG_TEXT_HINT = "send only the words around its mask"
    BARE = False  # every text holds the mask, an added token: the tokenizer's twin takes it

    def configure(self) -> None:
        super().configure()
        mask = special_token(self.text, "mask_token")
        mask_id = self.tokenizer.token_to_id(mask) if mask else None
        if mask is None or mask_id is None:
            named = f"names {mask!r}, which tokenizer.json does not know" if mask else "names none"
            raise SpecError(
                f"{self.text.folder}: a fill_mask model's tokenizer needs a mask token; tokenizer_config.json "
                f"mask_token {named}"
            )
        self.mask_token, self.mask_id = mask, mask_id
        self.clean_up = cleans_up_spaces(self.text, self.tokenizer)

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Encoded]:
        encoding = self.encode(self.check_text(item, where), None, where, truncation=False, hint=self.LONG_TEXT_HINT)
        ids = tuple(encoding.ids)
        return self.arrays([encoding]), Encoded(ids, self.masks(ids, where))

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: Encoded, options: Mapping[str, Any]) -> list:
        """The item's one row (``clients.text``: outputs keep a rows axis)."""
        return super().postprocess({name: array[0] for name, array in outputs.items()}, context, options)


class VocabFillMaskClient(FillMaskClient):
    """A WordPiece vocab.txt and inputs of a fixed length (``bert_base``)."""

    PREPROCESS_KEYS = frozenset({"vocab", "lowercase", "sequence_length"})

    def configure(self) -> None:
        super().configure()
        spec = self.spec
        self.tokenizer = load_tokenizer(spec)
        self.encoder = Encoder(self.tokenizer, bare=False)  # plain text through its twin (clients.plain_text)
        self.sequence_length = int(spec.preprocess.get("sequence_length", spec.inputs[0].dims[-1]))
        ids = {token: self.tokenizer.token_to_id(token) for token in (MASK_TOKEN, PAD_TOKEN, SEP_TOKEN)}
        missing = [token for token, i in ids.items() if i is None]
        if missing:
            raise SpecError(f"{spec.folder}: the vocab has no {', '.join(missing)}")
        self.mask_token, self.mask_id = MASK_TOKEN, ids[MASK_TOKEN]
        self.pad_token_id = self.pad_id = ids[PAD_TOKEN]
        self.sep_id = ids[SEP_TOKEN]
        if not 2 <= len(spec.inputs) <= 3:
            raise SpecError(
                f"{spec.folder}: the inputs must be token ids, attention mask and, optionally, "
                f"token type ids, in that order"
            )
        self.input_ids_name, self.attention_mask_name = (t.name for t in spec.inputs[:2])
        self.token_type_ids_name = spec.inputs[2].name if len(spec.inputs) == 3 else None

    def encode(self, text: Any, where: str) -> Encoded:
        """[CLS] text [SEP], cut to the sequence length only where no [MASK] is lost."""
        if not isinstance(text, str):
            raise InvalidInput(f"{where} must be a string (or a list of them)")
        ids = self.encoder.encode(text, offsets=False).ids
        masks = self.masks(ids, where)
        limit = self.sequence_length
        if len(ids) > limit:
            if masks[-1] >= limit - 1:
                raise InvalidInput(
                    f"{where} has a {MASK_TOKEN} at token {masks[-1]}, past the limit of {limit} tokens "
                    f"(the text is {len(ids)} tokens with [CLS] and [SEP]); shorten the text before it"
                )
            ids = ids[: limit - 1] + [self.sep_id]
        return Encoded(tuple(ids), masks)

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


DEFAULT_CANDIDATES = 50  # the candidates per position when [postprocess] max_topk names none


def candidates(config: Mapping[str, Any], postprocess: Mapping[str, Any], where: str) -> int:
    """The candidates per position the graph returns (``[postprocess] max_topk``), at most the vocabulary."""
    vocabulary = config.get("vocab_size")
    vocabulary = vocabulary if isinstance(vocabulary, int) and vocabulary > 0 else None
    given = postprocess.get("max_topk")
    if given is None:
        return min(DEFAULT_CANDIDATES, vocabulary or DEFAULT_CANDIDATES)
    return whole(given, f"{where}: [postprocess] max_topk", 1, vocabulary, "the vocabulary's {} tokens")


def _outputs(text: TextModel, config: Mapping[str, Any], raw: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """The best ``K`` candidates of every position, softmax and top-k inside the graph: ``scores`` and
    ``token_ids [batch, tokens, K]`` instead of the logits of the whole vocabulary (megabytes a text)."""
    k = candidates(config, raw.get("postprocess", {}), where)
    return [
        {"name": "scores", "dtype": "FP32", "dims": [-1, k]},
        {"name": "token_ids", "dtype": "INT64", "dims": [-1, k]},
    ]


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], TextModel]:
    """A masked-LM folder's model.toml: its tokenizer's inputs and the candidates of every position."""
    return resolve(raw, folder, where, outputs=_outputs)


FAMILY = Family(
    name=FillMaskClient.family,
    client=FillMaskClient,
    complete=complete,
    export="scripts.model_prep.transformers_export:MASKED_TOPK",
    small="scripts.model_prep.small_models.encoders:fill_mask_folder",
)
