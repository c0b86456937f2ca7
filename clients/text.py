"""What the text families share: a Hugging Face fast tokenizer (its ``tokenizer.json``, through the
``tokenizers`` library), the length check against the model's sequence length, and padding per
request (to its longest text, or to a few length buckets where Triton batches one length only).

A text is encoded with the tokenizer's own special tokens and no truncation or padding; a text
longer than the sequence length is a 400 naming its token count and the limit, unless the request
asks for ``"truncation": true`` (then it is cut as Hugging Face's tokenizer cuts it, longest first
for a pair). A request's texts are padded together to the longest, so a ten-token text does not
cost what a 512-token one does. Where the model's ``config.pbtxt`` allows ragged batches (the
``python`` target, whose model.py pads the batch Triton forms to its longest), that is all: Triton's
dynamic batcher joins requests of any length. Elsewhere (Triton's ONNX Runtime and TensorRT backends
take one dense tensor) a request is padded to the shortest bucket (16, 32, 64, 128, 256, ... up to
the sequence length) that holds its longest text, so that requests of many callers in the same bucket
have the same shape, which is what the batcher needs to run them together; texts that fill a batch
(``max_batch_size`` rows) on their own are padded only to their longest: no other request could join
them.

An item's arrays carry a leading rows axis (one row per text, several for a long text cut into
windows); a chunk's rows go to Triton in calls of at most ``max_batch_size`` rows.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from google.protobuf import text_format
from tokenizers import Encoding, Tokenizer
from tritonclient.grpc import model_config_pb2

from app.core.errors import InvalidInput
from app.core.spec import SpecError
from app.core.text_spec import TextModel
from clients.base import ModelClient
from clients.options import Option
from clients.plain_text import Encoder

Context = TypeVar("Context")
SMALLEST_BUCKET = 16
CONFIG_FILE = "config.pbtxt"
TRUNCATION = Option("truncation", bool, default=False)


def length_buckets(sequence_length: int) -> tuple[int, ...]:
    """16, 32, 64, ... below the sequence length, then the sequence length itself."""
    buckets, size = [], SMALLEST_BUCKET
    while size < sequence_length:
        buckets.append(size)
        size *= 2
    return (*buckets, sequence_length)


def ragged_batches(folder: Path) -> bool:
    """Whether Triton batches the model's requests of different lengths together: its ``config.pbtxt``
    (beside its model.toml) allows ragged batches on every input whose length varies."""
    try:
        config = text_format.Parse((folder / CONFIG_FILE).read_text(), model_config_pb2.ModelConfig())
    except (OSError, text_format.ParseError):
        return False
    varying = [tensor for tensor in config.input if -1 in tensor.dims]
    return bool(varying) and all(tensor.allow_ragged_batch for tensor in varying)


def bucket(length: int, buckets: Sequence[int]) -> int:
    return next((size for size in buckets if size >= length), buckets[-1])


def tokenizer_setting(text: TextModel, name: str) -> Any:
    """A setting of the folder's tokenizer (``mask_token``, ``clean_up_tokenization_spaces``, ...) from
    tokenizer_config.json, where transformers reads it, else special_tokens_map.json; None where neither names it."""
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        path = text.folder / file
        if path.is_file():
            value = json.loads(path.read_text(encoding="utf-8")).get(name)
            if value is not None:
                return value
    return None


def special_token(text: TextModel, name: str) -> str | None:
    """A special token's text (``pad_token``, ``unk_token``, ``mask_token``, ...)."""
    value = tokenizer_setting(text, name)
    if isinstance(value, dict):  # an AddedToken's fields
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_tokenizer(text: TextModel) -> Tokenizer:
    """The folder's fast tokenizer, with any truncation or padding its file carries turned off."""
    path = text.folder / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
        raise SpecError(f"{path}: not a tokenizer the tokenizers library loads: {error}") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


CLEAN_UP = "clean_up_tokenization_spaces"
# transformers' flag that cleans up a BPE tokenizer's text anyway (its name says what it does to it).
CLEAN_UP_BPE = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
# transformers' PreTrainedTokenizerBase.clean_up_tokenization: (written, replaced by), in its order.
SPACES_BEFORE = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def clean_up_tokenization(text: str) -> str:
    for written, replaced in SPACES_BEFORE:
        text = text.replace(written, replaced)
    return text


def cleans_up_spaces(text: TextModel, tokenizer: Tokenizer) -> bool:
    """Whether transformers' ``decode`` cleans up the decoder's text: as the folder's
    ``clean_up_tokenization_spaces`` says (default no), never for a BPE model unless it insists."""
    if not tokenizer_setting(text, CLEAN_UP):
        return False
    return type(tokenizer.model).__name__ != "BPE" or bool(tokenizer_setting(text, CLEAN_UP_BPE))


class TextClient(ModelClient[Context]):
    """A text family's tokenizer, limits and padding; the families add their options and their ends."""

    input_field = "text"
    content_types = frozenset({"text/plain"})
    PREPROCESS_KEYS = frozenset({"sequence_length"})
    SETTING_INPUTS: frozenset[str] = frozenset()  # a family's inputs besides the text's (text2text's settings)
    # Whether the family reads the tokens' character offsets (token classification's entities): its
    # encoder then rebuilds them where it can (clients.plain_text.Spans); the others' texts are encoded
    # without them (a 496-token text 0.47 ms, not 0.63)
    SPANS = False
    # Whether the family's texts may go through a bare twin (clients.plain_text): not where every text
    # holds an added token (the fill-mask's mask)
    BARE = True

    def configure(self) -> None:
        super().configure()
        spec = self.spec
        if spec.text is None:
            raise SpecError(
                f"{spec.folder}/model.toml: the {self.family} family needs [export] transformers = "
                '"<a save_pretrained folder of the model\'s, or a hub id>"'
            )
        self.text = spec.text
        self.sequence_length = spec.text.sequence_length
        self.tokenizer = load_tokenizer(spec.text)
        self.encoder = Encoder(self.tokenizer, spans=self.SPANS, bare=self.BARE)  # plain text through twins
        pad = special_token(spec.text, "pad_token")
        self.pad_token_id = self.tokenizer.token_to_id(pad) if pad else None  # None: the tokenizer has none
        self.pad_id = self.pad_token_id if self.pad_token_id is not None else 0  # what pads a request's rows
        self.buckets = length_buckets(self.sequence_length)
        self.ragged = ragged_batches(spec.folder)
        names = [t.name for t in spec.inputs if t.name not in self.SETTING_INPUTS]
        if names[:2] != ["input_ids", "attention_mask"] or names[2:] not in ([], ["token_type_ids"]):
            raise SpecError(
                f"{spec.folder}/model.toml: a text model's inputs are input_ids, attention_mask and, where the "
                f"model takes them, token_type_ids; these are {', '.join(names)}"
            )
        self.token_type_ids = len(names) == 3
        self.zero_single_types = self.token_type_ids and zero_single_types(self.tokenizer)

    def check_text(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise InvalidInput(f"{where} must be a string (or a list of them), not {type(value).__name__}")
        return value

    def encode(
        self, text: str, pair: str | None, where: str, truncation: bool, hint: str = 'send "truncation": true to cut it'
    ) -> Encoding:
        """The text (and its pair) as the model reads it, offsets (0, 0); too long a 400 (``hint``: what else
        the caller can do) unless ``truncation``."""
        encoding = self.encoder.encode(text, pair, offsets=False)
        if truncation and len(encoding) > self.sequence_length:
            return self.truncating.encode(text, pair, offsets=False)
        return self.checked(encoding, where, hint)

    def checked(self, encoding: Encoding, where: str, hint: str) -> Encoding:
        """The encoding, or a 400 where it is longer than the sequence length."""
        if len(encoding) <= self.sequence_length:
            return encoding
        raise InvalidInput(
            f"{where} is {len(encoding)} tokens (special tokens included), over the model's limit of "
            f"{self.sequence_length}; shorten it, or {hint}"
        )

    @functools.cached_property
    def truncating(self) -> Encoder:
        """A second tokenizer that cuts to the sequence length: a tokenizer's settings are shared by the
        threads that use it, so truncation is a tokenizer of its own, not a setting changed per request.
        Built on the first text that asks to be cut (a tokenizer of a 30k vocabulary holds 6 MiB, and
        most models never cut one), without a plain-text twin."""
        tokenizer = copy.deepcopy(self.tokenizer)
        tokenizer.enable_truncation(self.sequence_length)
        return Encoder(tokenizer, twin=False)

    def arrays(self, encodings: Sequence[Encoding]) -> dict[str, np.ndarray]:
        """An item's input arrays, one row per encoding, each as long as the longest (no batch padding yet).
        The tokenizer pads nothing (``load_tokenizer``): its attention mask is every token's 1."""
        rows = [encoding.ids for encoding in encodings]
        lengths = [len(row) for row in rows]
        longest = max(lengths)
        ids = np.full((len(encodings), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), longest), dtype=np.int64)
        arrays = {"input_ids": ids, "attention_mask": mask}
        if self.token_type_ids:
            arrays["token_type_ids"] = np.zeros((len(encodings), longest), dtype=np.int64)
        for row, (encoding, token_ids, n) in enumerate(zip(encodings, rows, lengths, strict=True)):
            ids[row, :n] = token_ids
            mask[row, :n] = 1
            if self.token_type_ids and not (self.zero_single_types and encoding.n_sequences == 1):
                arrays["token_type_ids"][row, :n] = encoding.type_ids
        return arrays

    def _stack(self, arrays: Sequence[Mapping[str, np.ndarray]], tensors=None) -> dict[str, np.ndarray]:
        """A chunk's rows, padded to its longest text; to the bucket of that where Triton batches only
        requests of one length, unless the chunk fills a batch on its own (no other caller's request
        could join it in Triton)."""
        rows = sum(len(a["input_ids"]) for a in arrays)
        longest = max(a["input_ids"].shape[1] for a in arrays)
        alone = self.ragged or rows >= self.spec.max_batch_size
        length = longest if alone else bucket(longest, self.buckets)
        stacked = {}
        for name in arrays[0]:
            batch = np.full((rows, length), self.pad_id if name == "input_ids" else 0, dtype=np.int64)
            row = 0
            for a in arrays:
                n, width = a[name].shape
                batch[row : row + n, :width] = a[name]
                row += n
            stacked[name] = batch
        return stacked

    def _unstack(
        self, outputs: Mapping[str, np.ndarray], items: Sequence[Mapping[str, np.ndarray]]
    ) -> list[dict[str, np.ndarray]]:
        """Each item's outputs with its rows axis (one row a text, or a text's windows)."""
        found, row = [], 0
        for arrays in items:
            n = len(arrays["input_ids"])
            found.append({k: v[row : row + n] for k, v in outputs.items()})
            row += n
        return found

    def _infer(self, model, inputs, output_names, version):
        """Rows past ``max_batch_size`` go in further calls; their outputs are joined in order."""
        rows, batch = len(inputs["input_ids"]), max(1, self.spec.max_batch_size)
        if rows <= batch:
            return self.triton.infer(model, inputs, output_names, version)
        parts, answered = [], ""
        for start in range(0, rows, batch):
            outputs, answered = self.triton.infer(
                model, {k: v[start : start + batch] for k, v in inputs.items()}, output_names, version
            )
            parts.append(outputs)
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}, answered


def zero_single_types(tokenizer: Tokenizer) -> bool:
    """Whether every one-text encoding's token type ids are 0 (BERT's are): the post-processor gives them by
    its template for one sequence (one type id for each special token, one for the text's tokens), whatever
    the text, so a text with tokens of its own tells; a one-text row then keeps the zeros it starts with
    instead of reading them (a 496-token text's list, 10 us)."""
    encoding = tokenizer.encode_batch_fast(["a b c"])[0]
    return len(encoding) > tokenizer.num_special_tokens_to_add(False) and not any(encoding.type_ids)


def softmax(logits: np.ndarray) -> np.ndarray:
    """The pipeline's softmax over labels (in the logits' dtype; half precision is read as float32)."""
    logits = np.asarray(logits)
    if logits.dtype == np.float16:
        logits = logits.astype(np.float32)
    maxes = np.max(logits, axis=-1, keepdims=True)
    shifted_exp = np.exp(logits - maxes)
    return shifted_exp / shifted_exp.sum(axis=-1, keepdims=True)


def raw_copy(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of the tokenizer without post-processor, truncation or padding (a client makes it once):
    its ``encode`` gives the encoding the Rust tokenizer has before its post-processing step. (Encoding
    with the tokenizer itself and special tokens off is not that: RoBERTa's post-processor trims the
    offsets even then, and would trim them a second time.)"""
    raw = copy.deepcopy(tokenizer)
    raw.no_truncation()
    raw.no_padding()
    raw.post_processor = None
    return raw


def windows(
    tokenizer: Tokenizer,
    text: str,
    max_length: int,
    stride: int | None,
    raw: Tokenizer | None = None,
) -> list[Encoding]:
    """The overlapping windows the pipeline makes with stride (tokenizer(..., truncation=True,
    max_length=..., return_overflowing_tokens=True, stride=stride)), first window first; with ``stride``
    None, the one window the pipeline makes without stride (the text cut to ``max_length`` tokens).

    The shared tokenizer is not changed: the text is encoded by ``raw``, its ``raw_copy`` (made here
    when not given), then cut as the Rust tokenizer's truncation cuts (``max_length`` less the special
    tokens, each overflowing piece starting ``stride`` tokens before the end of the one before), then
    given its special tokens by the tokenizer's own post-processor, which does the same to each
    overflowing piece.
    """
    budget = max_length - tokenizer.num_special_tokens_to_add(False)
    # a stride that leaves a window no new token makes the Rust truncation panic: refuse it as an error
    if (stride or 0) >= budget:
        raise ValueError(
            f"stride {stride or 0} must be less than max_length {max_length} less the "
            f"{max_length - budget} special tokens"
        )
    encoding = (raw or raw_copy(tokenizer)).encode(text, add_special_tokens=False)
    if len(encoding.ids) > budget:
        encoding.truncate(budget, stride=stride or 0, direction="right")
    processor = tokenizer.post_processor
    processed = processor.process(encoding, None, True) if processor is not None else encoding
    if stride is None:
        return [processed]
    return [processed, *processed.overflowing]
