"""Token classification's post-processing: Hugging Face's ``TokenClassificationPipeline`` ported to numpy
and the ``tokenizers`` library, so that the router answers, from the logits Triton returns, exactly the
entities the pipeline would (transformers 5: ``pipelines/token_classification.py``).

What it mirrors, step by step:

- ``clients.text.windows`` (the input side, with the other text input): the pipeline's
  ``preprocess``. Without ``stride`` the text is cut to the model's length (one window); with ``stride`` (``_sanitize_parameters``) the fast tokenizer returns the text as
  overlapping windows (``return_overflowing_tokens``), each with its own special tokens, that share
  ``stride`` tokens with the window before. The windows here are not padded (the pipeline pads them to
  the longest; pad tokens are special tokens, which the post-processing skips anyway).
- ``entities``: ``postprocess`` for each window (softmax in numpy, ``gather_pre_entities``, ``aggregate``
  with ``aggregate_words``/``group_entities``, the ``ignore_labels`` filter), the windows' entities joined,
  then, with several windows, ``aggregate_overlapping_entities``. Each step runs on the whole window at
  once (numpy arrays, not the pipeline's dict per token): argmaxes, sub-words, word and group boundaries
  from label arrays; the filter is applied to the groups before they are given a score and a word, so
  that only the groups an answer shows cost Python work (decoding, dicts).
- ``Vocabulary``: what those steps ask of the transformers tokenizer, read from the ``tokenizers.Tokenizer``
  of the folder's ``tokenizer.json``: ``convert_ids_to_tokens`` (the model's ``id_to_token``),
  ``convert_tokens_to_string`` (the backend decoder's ``decode``, or the tokens joined by spaces without a
  decoder), ``unk_token_id`` and the pipeline's test of a "word aware" tokenizer (its model has a non-empty
  ``continuing_subword_prefix``: WordPiece's ``##`` is; byte-level BPE, whose prefix is ``""``, and
  Unigram, which has none, are not, and fall back on the pipeline's space heuristic).

Scores come out as Python floats; every intermediate keeps the pipeline's numpy dtypes (float32) so that
means and argmaxes are the pipeline's own: the means are np.nanmean's bit for bit (``nanmeans``: numpy's
order of additions, not a cumulative sum's or np.add.reduceat's).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tokenizers

from clients.text import softmax

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
    # len() of each token, for gather_pre_entities' test of a word aware tokenizer (-1: no token of that id)
    lengths: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lengths = np.fromiter((-1 if t is None else len(t) for t in self.tokens), np.intp, len(self.tokens))
        object.__setattr__(self, "lengths", lengths)

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


def get_tag(entity_name: str) -> tuple[str, str]:
    """``get_tag``: ("B" or "I", tag); a label without a B-/I- prefix counts as a continuation of itself."""
    if entity_name.startswith("B-"):
        return "B", entity_name[2:]
    if entity_name.startswith("I-"):
        return "I", entity_name[2:]
    return "I", entity_name


class _PreEntities:
    """``gather_pre_entities``: the window's tokens that are not special tokens, in order, as arrays (the
    pipeline's one dict per token). Its "scores" and "index" are read for every token; "word", "start" and
    "end" only for the tokens an answer shows; "is_subword" only by ``aggregate_words``."""

    def __init__(self, text: str, window: Window, scores: np.ndarray, vocabulary: Vocabulary) -> None:
        self.text = text
        self.window = window
        self.vocabulary = vocabulary
        special = np.fromiter(window.special_tokens_mask, bool, len(window.special_tokens_mask))
        self.index = np.flatnonzero(~special)  # "index": the token's position in the window
        self.positions: list[int] = self.index.tolist()
        self.scores = scores[self.index]  # "scores": [tokens, labels]

    def __len__(self) -> int:
        return len(self.positions)

    def word(self, i: int) -> str | None:
        """Token i's "word": ``convert_ids_to_tokens``, or for the unknown token the text it stands for."""
        token_id = int(self.window.ids[self.positions[i]])
        if token_id == self.vocabulary.unk_id:
            start, end = self.window.offsets[self.positions[i]]
            return self.text[int(start) : int(end)]
        return self.vocabulary.token(token_id)

    def start(self, i: int) -> int:
        return int(self.window.offsets[self.positions[i]][0])

    def end(self, i: int) -> int:
        return int(self.window.offsets[self.positions[i]][1])

    def is_subword(self) -> np.ndarray:
        """The "is_subword" of every token (bool array)."""
        window, text = self.window, self.text
        offsets = np.fromiter(itertools.chain.from_iterable(window.offsets), np.int64, 2 * len(window.offsets))
        starts, ends = offsets.reshape(-1, 2)[self.index].T
        ids = np.fromiter(window.ids, np.int64, len(window.ids))[self.index]
        if self.vocabulary.word_aware:
            # len(word) != len(word_ref): "##ing" against "ing", a token longer than its text is a continuation
            size = len(text)
            subword = self.vocabulary.lengths[ids] != np.maximum(np.minimum(ends, size) - np.minimum(starts, size), 0)
        else:
            # the fallback heuristic, start > 0 and " " not in text[start - 1 : start + 1]: a continuation unless
            # the token starts the text or touches a space (only " ", on either side of its first character)
            space = np.zeros(len(text) + 1, bool)  # one past the text: a slice that ends there is shorter
            space[:-1] = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32) == ord(" ")
            subword = (starts > 0) & ~(space[starts - 1] | space[starts])
        if self.vocabulary.unk_id is not None:
            subword[ids == self.vocabulary.unk_id] = False  # the unknown token starts a word
        return subword


@dataclass(frozen=True)
class _Labels:
    """What ``group_entities`` and the ``ignore_labels`` filter read of a label, by label id."""

    names: Sequence[str]
    tags: np.ndarray  # get_tag's tag, numbered: equal tags, equal numbers
    begins: np.ndarray  # get_tag's "B"
    groups: tuple[str, ...]  # group_sub_entities' "entity_group": the label after its first "-"
    shown: np.ndarray  # the filter of a token's "entity" (the entity has no "entity_group": None)
    shown_groups: np.ndarray  # the filter of a group's "entity_group" (the group has no "entity": None)

    @classmethod
    def of(cls, labels: Sequence[str], ignore_labels: Sequence[str]) -> _Labels:
        numbers: dict[str, int] = {}
        tags = [get_tag(name) for name in labels]
        groups = tuple(name.split("-", 1)[-1] for name in labels)
        visible = None not in ignore_labels
        return cls(
            labels,
            np.array([numbers.setdefault(tag, len(numbers)) for _, tag in tags], dtype=np.intp),
            np.array([bi == "B" for bi, _ in tags], dtype=bool),
            groups,
            np.array([visible and name not in ignore_labels for name in labels], dtype=bool),
            np.array([visible and group not in ignore_labels for group in groups], dtype=bool),
        )


# numpy's sum (np.sum, so np.nanmean) adds fewer than this many numbers one after the other (its pairwise_sum)
PAIRWISE = 8


def nanmeans(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``np.nanmean(values[start:end], axis=0)`` of each segment, bit for bit (values float32: float32 means).

    np.nanmean reads NaN as 0, sums (in the values' dtype) and divides by how many are not NaN (the float32
    sum divided in float64, rounded back). numpy sums fewer than ``PAIRWISE`` numbers one after the other,
    0 + v0 + v1 + ..., and the rows of a 2-D array row by row: those segments are summed here together,
    position by position. A longer one (rare: numpy's pairwise order) is given to np.nanmean itself.
    np.add.reduceat is not the same: it starts from v0 and adds the pairwise sum of the rest."""
    means = np.empty((len(starts), *values.shape[1:]), values.dtype)
    lengths = ends - starts
    short = np.flatnonzero(lengths < PAIRWISE)
    if short.size:
        nan = np.isnan(values)
        zeroed = np.where(nan, values.dtype.type(0), values)
        first = starts[short]
        total = zeroed[first]
        count = (~nan[first]).astype(np.intp)
        for offset in range(1, int(lengths[short].max())):
            more = np.flatnonzero(lengths[short] > offset)
            rows = first[more] + offset
            total[more] += zeroed[rows]
            count[more] += ~nan[rows]
        with np.errstate(invalid="ignore"):  # all NaN: 0 / 0, NaN as np.nanmean gives (without its warning)
            means[short] = (total.astype(np.float64) / count).astype(values.dtype)
    for i in np.flatnonzero(lengths >= PAIRWISE):
        means[i] = np.nanmean(values[starts[i] : ends[i]], axis=0)
    return means


def _best(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``scores.argmax()`` and ``scores[idx]`` of each row: the label ids and their scores."""
    label_ids = scores.argmax(axis=-1)
    return label_ids, np.take_along_axis(scores, label_ids[:, None], axis=-1)[:, 0]


def _first_max(keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``max(entities, key=...)`` of each segment of ``keys`` (one segment from each start to the next): the
    position of its first highest key. As Python's max, a NaN key never wins, and a NaN first key is kept
    (nothing compares greater than it)."""
    nan = np.isnan(keys)
    filled = np.where(nan, -np.inf, keys)
    highest = np.repeat(np.maximum.reduceat(filled, starts), np.diff(starts, append=len(keys)))
    positions = np.where(filled == highest, np.arange(len(keys)), len(keys))
    return np.where(nan[starts], starts, np.minimum.reduceat(positions, starts))


@dataclass(frozen=True)
class _Items:
    """What ``group_entities`` groups: tokens (aggregation "simple") or the words ``aggregate_words`` made
    of them, each its label id, its score and its first and last token (indexes into the pre-entities)."""

    label_ids: np.ndarray
    scores: np.ndarray
    firsts: Sequence[int]
    lasts: Sequence[int]
    words: bool

    @classmethod
    def tokens(cls, pre: _PreEntities) -> _Items:
        """``aggregate`` for "none" and "simple": each token its best label."""
        return cls(*_best(pre.scores), range(len(pre)), range(len(pre)), words=False)

    def word(self, pre: _PreEntities, i: int) -> str | None:
        """Item i's "word": a token's own; a word's, its tokens decoded together (``aggregate_word``)."""
        if not self.words:
            return pre.word(i)
        return pre.vocabulary.text([pre.word(t) for t in range(self.firsts[i], self.lasts[i] + 1)])


def _aggregate_words(pre: _PreEntities, strategy: str) -> _Items:
    """``aggregate_words``: a token that is not a subword starts a word (the first token always does), and
    ``aggregate_word`` gives each word the best label of its scores: "first", its first token's; "max", those
    of its first token whose best score is the highest; "average", the mean of its tokens' (np.nanmean)."""
    is_subword = pre.is_subword()
    is_subword[0] = False
    starts = np.flatnonzero(~is_subword)
    ends = np.append(starts[1:], len(pre))
    if strategy == "first":
        scores = pre.scores[starts]
    elif strategy == "max":
        scores = pre.scores[_first_max(pre.scores.max(axis=-1), starts)]
    else:
        scores = nanmeans(pre.scores, starts, ends)
    return _Items(*_best(scores), starts.tolist(), (ends - 1).tolist(), words=True)


def group_entities(items: _Items, pre: _PreEntities, labels: _Labels) -> list[dict]:
    """``group_entities``: adjacent items of the same tag join the group before them unless they are B-; then
    ``group_sub_entities`` for each group the ``ignore_labels`` filter keeps: its label is the first one's
    after its first "-", its score the mean of the members' (np.nanmean, float32), its word the members'
    words decoded together."""
    label_ids = items.label_ids
    tags = labels.tags[label_ids]
    starts_group = np.ones(len(tags), dtype=bool)
    starts_group[1:] = (tags[1:] != tags[:-1]) | labels.begins[label_ids[1:]]
    starts = np.flatnonzero(starts_group)
    ends = np.append(starts[1:], len(tags))
    kept = labels.shown_groups[label_ids[starts]]
    starts, ends = starts[kept], ends[kept]
    scores = nanmeans(items.scores, starts, ends).tolist()
    found = []
    for start, end, label_id, score in zip(
        starts.tolist(), ends.tolist(), label_ids[starts].tolist(), scores, strict=True
    ):
        found.append(
            {
                "entity_group": labels.groups[label_id],
                "score": score,
                "word": pre.vocabulary.text([items.word(pre, i) for i in range(start, end)]),
                "start": pre.start(items.firsts[start]),
                "end": pre.end(items.lasts[end - 1]),
            }
        )
    return found


def _tokens(items: _Items, pre: _PreEntities, labels: _Labels) -> list[dict]:
    """Aggregation "none": each token the ``ignore_labels`` filter keeps, with its best label."""
    kept = np.flatnonzero(labels.shown[items.label_ids])
    return [
        {
            "entity": labels.names[label_id],
            "score": score,
            "index": pre.positions[i],
            "word": pre.word(i),
            "start": pre.start(i),
            "end": pre.end(i),
        }
        for i, label_id, score in zip(
            kept.tolist(), items.label_ids[kept].tolist(), items.scores[kept].tolist(), strict=True
        )
    ]


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
    gives them; scores as Python floats), softmax computed as the pipeline does (numpy, float32).

    ``postprocess``, each step on a whole window at once: softmax, ``gather_pre_entities``, ``aggregate``
    (the best label of each token or word), ``group_entities`` and the ``ignore_labels`` filter (only the
    groups it keeps are given a score and a word)."""
    strategy = strategy.lower()
    if strategy not in STRATEGIES:
        raise ValueError(f"aggregation strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "none" and len(windows) > 1:
        raise ValueError('several windows (stride) need an aggregation strategy other than "none"')
    table = _Labels.of(labels, ignore_labels)
    found: list[dict] = []
    for window in windows:
        pre = _PreEntities(text, window, softmax(window.logits), vocabulary)
        if not len(pre):
            continue
        if strategy in WORD_STRATEGIES:
            found.extend(group_entities(_aggregate_words(pre, strategy), pre, table))
        elif strategy == "simple":
            found.extend(group_entities(_Items.tokens(pre), pre, table))
        else:
            found.extend(_tokens(_Items.tokens(pre), pre, table))
    if len(windows) > 1:
        found = aggregate_overlapping(found)
    return found
