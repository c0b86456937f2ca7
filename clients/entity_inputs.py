"""What token classification's post-processing (``clients.entities``) reads: a window of a text as the
model saw it (``Window``: its ids, character offsets, special-tokens mask and label scores; an ``Encoding``'s
offsets read through ``EncodingOffsets``) and what it asks of the tokenizer (``Vocabulary``).

``Vocabulary`` is read from the ``tokenizers.Tokenizer`` of the folder's ``tokenizer.json``, as the
pipeline asks the transformers tokenizer: ``convert_ids_to_tokens`` (the model's ``id_to_token``),
``convert_tokens_to_string`` (the backend decoder's ``decode``, or the tokens joined by spaces without a
decoder), ``unk_token_id`` and the pipeline's test of a "word aware" tokenizer (its model has a non-empty
``continuing_subword_prefix``: WordPiece's ``##`` is; byte-level BPE, whose prefix is ``""``, and Unigram,
which has none, are not, and fall back on the pipeline's space heuristic). The word of a group of one
token is remembered by id (``Vocabulary.single``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tokenizers

from clients.plain_text import id_tokens


class EncodingOffsets:
    """An Encoding's offsets, iterable (the list of them all, a tuple each), and read for the few tokens an
    answer shows alone (``spans``: ``token_to_chars``, the same pair but for a token outside the text's
    sequences, which the list gives)."""

    __slots__ = ("encoding",)

    def __init__(self, encoding: tokenizers.Encoding) -> None:
        self.encoding = encoding

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.encoding.offsets)

    def spans(self, positions: list[int]) -> list[tuple[int, int]]:
        found = list(map(self.encoding.token_to_chars, positions))
        return found if None not in found else [self.encoding.offsets[p] for p in positions]


@dataclass(frozen=True)
class Window:
    """One window of a text as the model saw it (no padding): token ids (a list, or an integer array),
    character offsets into the text ((start, end) pairs of ints, as an Encoding gives them, the Encoding's
    ``EncodingOffsets``, or an integer array [len(ids), 2]), special-tokens mask (0 or 1 each), and the
    model's label probabilities [len(ids), labels] (the pipeline's softmax of the logits)."""

    ids: Sequence[int] | np.ndarray
    offsets: Sequence[tuple[int, int]] | EncodingOffsets | np.ndarray
    special_tokens_mask: Sequence[int]
    scores: np.ndarray

    @classmethod
    def of(
        cls,
        encoding: tokenizers.Encoding,
        scores: np.ndarray,
        ids: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
    ) -> Window:
        """A window from its encoding and the scores of its tokens (padding rows, if any, cut off); ``ids``,
        where at hand, its row of the model's input_ids (cheaper than the encoding's list of them);
        ``offsets``, where the encoding's own are not the tokens' (``clients.plain_text.Spans`` rebuilt
        them), its tokens' [len(encoding), 2]."""
        n = len(encoding)
        ids = encoding.ids if ids is None else ids[:n]
        found = EncodingOffsets(encoding) if offsets is None else offsets
        return cls(ids, found, encoding.special_tokens_mask, np.asarray(scores)[:n])


@dataclass(frozen=True)
class Vocabulary:
    """What the aggregation needs of the tokenizer, read once (built per model at start, shared by
    threads, read-only but for ``singles``)."""

    tokens: tuple[str | None, ...]
    decoder: Any  # a tokenizers.decoders.Decoder, or None: tokens are then joined by spaces
    word_aware: bool
    unk_id: int | None
    # len() of each token, for gather_pre_entities' test of a word aware tokenizer (-1: no token of that id)
    lengths: np.ndarray = field(init=False, repr=False, compare=False)
    # single(id) of the ids met but the unknown token's (a dict: its reads and writes are atomic, and two
    # threads that meet an id write the same string)
    singles: dict[int, str] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        lengths = np.fromiter((-1 if t is None else len(t) for t in self.tokens), np.intp, len(self.tokens))
        object.__setattr__(self, "lengths", lengths)

    @classmethod
    def of(
        cls, tokenizer: tokenizers.Tokenizer, unk_token: str | None, tokens: tuple[str | None, ...] | None = None
    ) -> Vocabulary:
        """``unk_token``: the tokenizer's ``unk_token`` (tokenizer_config.json), or None where it has none;
        ``tokens``: its ``clients.plain_text.id_tokens`` where already read."""
        tokens = id_tokens(tokenizer) if tokens is None else tokens
        decoder = copy.deepcopy(tokenizer.decoder) if tokenizer.decoder is not None else None
        word_aware = bool(getattr(tokenizer.model, "continuing_subword_prefix", None))
        unk_id = tokenizer.token_to_id(unk_token) if unk_token is not None else None
        return cls(tokens, decoder, word_aware, unk_id)

    def token(self, token_id: int) -> str | None:
        """``convert_ids_to_tokens(token_id)``."""
        return self.tokens[token_id] if 0 <= token_id < len(self.tokens) else None

    def text(self, tokens: Sequence[str]) -> str:
        """``convert_tokens_to_string(tokens)``."""
        if self.decoder is None:
            return " ".join(tokens)
        return self.decoder.decode(list(tokens))

    def single(self, token_id: int) -> str:
        """``convert_tokens_to_string([convert_ids_to_tokens(token_id)])``, remembered in ``singles``."""
        word = self.singles.get(token_id)
        if word is None:
            word = self.text([self.token(token_id)])
            if token_id != self.unk_id:  # a group of the unknown token is worded by its text
                self.singles[token_id] = word
        return word
