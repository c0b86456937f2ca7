"""Token classification's post-processing: Hugging Face's ``TokenClassificationPipeline`` ported to numpy
and the ``tokenizers`` library, so that the router answers, from the logits Triton returns, exactly the
entities the pipeline would (transformers 5: ``pipelines/token_classification.py``).

What it mirrors, step by step:

- ``windows``: the pipeline's ``preprocess``. Without ``stride`` the text is cut to the model's length
  (one window); with ``stride`` (``_sanitize_parameters``) the fast tokenizer returns the text as
  overlapping windows (``return_overflowing_tokens``), each with its own special tokens, that share
  ``stride`` tokens with the window before. The windows here are not padded (the pipeline pads them to
  the longest; pad tokens are special tokens, which the post-processing skips anyway).
- ``entities``: ``postprocess`` for each window (softmax in numpy, ``gather_pre_entities``, ``aggregate``
  with ``aggregate_words``/``group_entities``, the ``ignore_labels`` filter), the windows' entities joined,
  then, with several windows, ``aggregate_overlapping_entities``.
- ``Vocabulary``: what those steps ask of the transformers tokenizer, read from the ``tokenizers.Tokenizer``
  of the folder's ``tokenizer.json``: ``convert_ids_to_tokens`` (the model's ``id_to_token``),
  ``convert_tokens_to_string`` (the backend decoder's ``decode``, or the tokens joined by spaces without a
  decoder), ``unk_token_id`` and the pipeline's test of a "word aware" tokenizer (its model has a non-empty
  ``continuing_subword_prefix``: WordPiece's ``##`` is; byte-level BPE, whose prefix is ``""``, and
  Unigram, which has none, are not, and fall back on the pipeline's space heuristic).

Scores come out as Python floats; every intermediate keeps the pipeline's numpy dtypes (float32) so that
means and argmaxes are the pipeline's own.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tokenizers

STRATEGIES = ("none", "simple", "first", "average", "max")
WORD_STRATEGIES = frozenset({"first", "average", "max"})


@dataclass(frozen=True)
class Window:
    """One window of a text as the model saw it (no padding): token ids, character offsets into the
    text, special-tokens mask, and the model's logits [len(ids), labels] (float32)."""

    ids: Sequence[int]
    offsets: Sequence[tuple[int, int]]
    special_tokens_mask: Sequence[int]
    logits: np.ndarray

    @classmethod
    def of(cls, encoding: tokenizers.Encoding, logits: np.ndarray) -> Window:
        """A window from its encoding and the logits of its tokens (padding rows, if any, cut off)."""
        n = len(encoding.ids)
        return cls(encoding.ids, encoding.offsets, encoding.special_tokens_mask, np.asarray(logits)[:n])


@dataclass(frozen=True)
class Vocabulary:
    """What the aggregation needs of the tokenizer, read once (built per model at start, shared by
    threads, read-only)."""

    tokens: tuple[str | None, ...]
    decoder: Any  # a tokenizers.decoders.Decoder, or None: tokens are then joined by spaces
    word_aware: bool
    unk_id: int | None

    @classmethod
    def of(cls, tokenizer: tokenizers.Tokenizer, unk_token: str | None) -> Vocabulary:
        """``unk_token``: the tokenizer's ``unk_token`` (tokenizer_config.json), or None where it has none."""
        size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        tokens = tuple(tokenizer.id_to_token(i) for i in range(size))
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


def raw_copy(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
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
    tokenizer: tokenizers.Tokenizer,
    text: str,
    max_length: int,
    stride: int | None,
    raw: tokenizers.Tokenizer | None = None,
) -> list[tokenizers.Encoding]:
    """The overlapping windows the pipeline makes with stride (tokenizer(..., truncation=True,
    max_length=..., return_overflowing_tokens=True, stride=stride)), first window first; with ``stride``
    None, the one window the pipeline makes without stride (the text cut to ``max_length`` tokens).

    The shared tokenizer is not changed: the text is encoded by ``raw``, its ``raw_copy`` (made here
    when not given),
    then cut as the Rust tokenizer's truncation cuts (``max_length`` less the special tokens, each
    overflowing piece starting ``stride`` tokens before the end of the one before), then given its
    special tokens by the tokenizer's own post-processor, which does the same to each overflowing piece.
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


def softmax(logits: np.ndarray) -> np.ndarray:
    """The pipeline's softmax over labels (in the logits' dtype; half precision is read as float32)."""
    logits = np.asarray(logits)
    if logits.dtype == np.float16:
        logits = logits.astype(np.float32)
    maxes = np.max(logits, axis=-1, keepdims=True)
    shifted_exp = np.exp(logits - maxes)
    return shifted_exp / shifted_exp.sum(axis=-1, keepdims=True)


def _pre_entities(text: str, window: Window, scores: np.ndarray, vocabulary: Vocabulary) -> list[dict]:
    """``gather_pre_entities``: one entry per token that is not a special token."""
    pre_entities = []
    for idx, token_scores in enumerate(scores):
        if window.special_tokens_mask[idx]:
            continue
        token_id = int(window.ids[idx])
        word = vocabulary.token(token_id)
        start, end = (int(x) for x in window.offsets[idx])
        word_ref = text[start:end]
        if vocabulary.word_aware:
            # "##ing" against "ing": a token longer than its text is a continuation
            is_subword = len(word) != len(word_ref)
        else:
            # the fallback heuristic: a continuation unless the token starts the text or touches a space
            # (only " ", not other whitespace, and on either side of its first character)
            is_subword = start > 0 and " " not in text[start - 1 : start + 1]
        if token_id == vocabulary.unk_id:
            word = word_ref
            is_subword = False
        pre_entities.append(
            {"word": word, "scores": token_scores, "start": start, "end": end, "index": idx, "is_subword": is_subword}
        )
    return pre_entities


def _aggregate_word(entities: list[dict], strategy: str, labels: Sequence[str], vocabulary: Vocabulary) -> dict:
    """``aggregate_word``: one word's tokens as one entity."""
    word = vocabulary.text([entity["word"] for entity in entities])
    if strategy == "first":
        scores = entities[0]["scores"]
    elif strategy == "max":
        # the first token whose best score is the highest (max keeps the first of equals)
        scores = max(entities, key=lambda entity: entity["scores"].max())["scores"]
    else:
        scores = np.nanmean(np.stack([entity["scores"] for entity in entities]), axis=0)
    idx = scores.argmax()
    return {
        "entity": labels[idx],
        "score": scores[idx],
        "word": word,
        "start": entities[0]["start"],
        "end": entities[-1]["end"],
    }


def _aggregate_words(entities: list[dict], strategy: str, labels: Sequence[str], vocabulary: Vocabulary) -> list[dict]:
    """``aggregate_words``: a token that is not a subword starts a word (the first token always does)."""
    words: list[dict] = []
    group: list[dict] = []
    for entity in entities:
        if group and not entity["is_subword"]:
            words.append(_aggregate_word(group, strategy, labels, vocabulary))
            group = []
        group.append(entity)
    if group:
        words.append(_aggregate_word(group, strategy, labels, vocabulary))
    return words


def get_tag(entity_name: str) -> tuple[str, str]:
    """``get_tag``: ("B" or "I", tag); a label without a B-/I- prefix counts as a continuation of itself."""
    if entity_name.startswith("B-"):
        return "B", entity_name[2:]
    if entity_name.startswith("I-"):
        return "I", entity_name[2:]
    return "I", entity_name


def _group_sub_entities(entities: list[dict], vocabulary: Vocabulary) -> dict:
    """``group_sub_entities``: the group's label is the first one's after its first "-" (any prefix, not only
    B-/I-), its score the mean of the members' (float32), its word their words decoded together."""
    scores = np.nanmean([entity["score"] for entity in entities])
    return {
        "entity_group": entities[0]["entity"].split("-", 1)[-1],
        "score": np.mean(scores),
        "word": vocabulary.text([entity["word"] for entity in entities]),
        "start": entities[0]["start"],
        "end": entities[-1]["end"],
    }


def group_entities(entities: list[dict], vocabulary: Vocabulary) -> list[dict]:
    """``group_entities``: adjacent entities of the same tag join the group before them unless they are B-."""
    groups: list[dict] = []
    members: list[dict] = []
    for entity in entities:
        if members:
            bi, tag = get_tag(entity["entity"])
            _, last_tag = get_tag(members[-1]["entity"])
            if tag != last_tag or bi == "B":
                groups.append(_group_sub_entities(members, vocabulary))
                members = []
        members.append(entity)
    if members:
        groups.append(_group_sub_entities(members, vocabulary))
    return groups


def aggregate_overlapping(entities: list[dict]) -> list[dict]:
    """``aggregate_overlapping_entities``: sorted by start (stably), an entity that starts inside the one
    kept before it replaces that one if it is longer, or as long with a higher score; else it is dropped."""
    if not entities:
        return entities
    entities = sorted(entities, key=lambda x: x["start"])
    aggregated = []
    previous = entities[0]
    for entity in entities:
        if previous["start"] <= entity["start"] < previous["end"]:
            length = entity["end"] - entity["start"]
            previous_length = previous["end"] - previous["start"]
            if length > previous_length or length == previous_length and entity["score"] > previous["score"]:
                previous = entity
        else:
            aggregated.append(previous)
            previous = entity
    aggregated.append(previous)
    return aggregated


def entities(
    text: str,
    windows: Sequence[Window],
    labels: Sequence[str],
    strategy: str,
    vocabulary: Vocabulary,
    ignore_labels: Sequence[str] = ("O",),
) -> list[dict]:
    """Exactly the pipeline's list of entities for `text` (dict keys and their order as the pipeline
    gives them; scores as Python floats), softmax computed as the pipeline does (numpy, float32)."""
    strategy = strategy.lower()
    if strategy not in STRATEGIES:
        raise ValueError(f"aggregation strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "none" and len(windows) > 1:
        raise ValueError('several windows (stride) need an aggregation strategy other than "none"')
    found: list[dict] = []
    for window in windows:
        pre_entities = _pre_entities(text, window, softmax(window.logits), vocabulary)
        if strategy in WORD_STRATEGIES:
            tokens = _aggregate_words(pre_entities, strategy, labels, vocabulary)
        else:
            tokens = []
            for pre in pre_entities:
                idx = pre["scores"].argmax()
                tokens.append(
                    {
                        "entity": labels[idx],
                        "score": pre["scores"][idx],
                        "index": pre["index"],
                        "word": pre["word"],
                        "start": pre["start"],
                        "end": pre["end"],
                    }
                )
        grouped = tokens if strategy == "none" else group_entities(tokens, vocabulary)
        found.extend(
            entity
            for entity in grouped
            if entity.get("entity") not in ignore_labels and entity.get("entity_group") not in ignore_labels
        )
    if len(windows) > 1:
        found = aggregate_overlapping(found)
    for entity in found:
        entity["score"] = float(entity["score"])
    return found
