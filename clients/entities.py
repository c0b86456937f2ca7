"""Token classification's post-processing: Hugging Face's ``TokenClassificationPipeline`` ported to numpy
and the ``tokenizers`` library, so that the router answers, from the label probabilities Triton returns
(the pipeline's softmax, run in the model's graph), exactly the entities the pipeline would
(transformers 5: ``pipelines/token_classification.py``).

What it mirrors, step by step:

- ``clients.text.windows`` (the input side, with the other text input): the pipeline's
  ``preprocess``. Without ``stride`` the text is cut to the model's length (one window); with ``stride``
  (``_sanitize_parameters``) the fast tokenizer returns the text as overlapping windows
  (``return_overflowing_tokens``), each with its own special tokens, that share ``stride`` tokens with
  the window before. The windows here are not padded (the pipeline pads them to the longest; pad
  tokens are special tokens, which the post-processing skips anyway).
- ``entities``: ``postprocess`` for each window (``gather_pre_entities``, ``aggregate``
  with ``aggregate_words``/``group_entities``, the ``ignore_labels`` filter), the windows' entities joined,
  then, with several windows, ``aggregate_overlapping_entities``. Each step runs on the whole window at
  once (numpy arrays, not the pipeline's dict per token): argmaxes, sub-words, word and group boundaries
  from label arrays; the filter is applied to the groups before they are given a score and a word, so
  that only the groups an answer shows cost Python work (decoding, dicts), and of a window's encoding
  only their tokens' offsets are read (``EncodingOffsets``; or those ``clients.plain_text.Spans``
  rebuilt). The label table (``Labels``) is built once.
- ``Vocabulary`` (``clients.entity_inputs``, with ``Window``): what those steps ask of the transformers
  tokenizer, read once from the folder's ``tokenizer.json``.

Scores come out as Python floats; every intermediate keeps the pipeline's numpy dtypes (float32) so that,
from the same probabilities, means and argmaxes are the pipeline's own, bit for bit (``clients.reductions``:
numpy's order of additions, over a whole window at once). The graph's softmax is ONNX Runtime's, within
2.4e-7 of numpy's (measured on 65,536 rows; the family's tests hold the answers within 1e-4).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from clients.entity_inputs import EncodingOffsets, Vocabulary, Window
from clients.reductions import best, first_max, nanmeans

STRATEGIES = ("none", "simple", "first", "average", "max")
WORD_STRATEGIES = frozenset({"first", "average", "max"})


def get_tag(entity_name: str) -> tuple[str, str]:
    """``get_tag``: ("B" or "I", tag); a label without a B-/I- prefix counts as a continuation of itself."""
    if entity_name.startswith("B-"):
        return "B", entity_name[2:]
    if entity_name.startswith("I-"):
        return "I", entity_name[2:]
    return "I", entity_name


def _own_run(mask: Sequence[int]) -> tuple[int, int] | None:
    """Where a window's own tokens start and stop when they are one run between its special tokens (the
    usual ``[CLS] ... [SEP]``), read from the list with the list's own scans; None otherwise."""
    if not isinstance(mask, list) or 0 not in mask:
        return None
    start, stop = mask.index(0), len(mask) - mask[::-1].index(0)
    return (start, stop) if mask.count(0) == stop - start else None


class _PreEntities:
    """``gather_pre_entities``: the window's tokens that are not special tokens, in order, as arrays (the
    pipeline's one dict per token). Its "scores" and "index" are read for every token; "word", "start" and
    "end" only for the tokens an answer shows; "is_subword" only by ``aggregate_words``."""

    def __init__(self, text: str, window: Window, scores: np.ndarray, vocabulary: Vocabulary) -> None:
        self.text = text
        self.window = window
        self.vocabulary = vocabulary
        mask = window.special_tokens_mask
        run = _own_run(mask)
        if run is not None:  # no special token in between: a view
            self.index = np.arange(*run)  # "index": the token's position in the window
            self.scores = scores[run[0] : run[1]]
        else:
            special = np.frombuffer(bytes(mask), np.uint8) if isinstance(mask, list) else np.asarray(mask)
            self.index = np.flatnonzero(special == 0)
            self.scores = scores[self.index]  # "scores": [tokens, labels]
        ids = window.ids
        self.ids = ids if isinstance(ids, np.ndarray) else np.fromiter(ids, np.int64, len(ids))  # by position

    def __len__(self) -> int:
        return len(self.index)

    def spans(self, positions: list[int]) -> list[tuple[int, int]]:
        """The offsets of the tokens at these positions in the window."""
        offsets = self.window.offsets
        if isinstance(offsets, EncodingOffsets):
            return offsets.spans(positions)
        if isinstance(offsets, np.ndarray):
            return list(map(tuple, offsets[positions].tolist()))
        return [offsets[p] for p in positions]

    def bounds(self, firsts: np.ndarray, lasts: np.ndarray, longer: list[int]) -> tuple[list[int], list[int]]:
        """Where each run of tokens from a position in ``firsts`` to the one in ``lasts`` starts and ends in
        the text: the first one's start, the last one's end (the offsets of a run's other tokens unread).
        ``longer``: the runs of more than one token (where ``firsts != lasts``)."""
        offsets = self.window.offsets
        if isinstance(offsets, np.ndarray):
            return offsets[firsts, 0].tolist(), offsets[lasts, 1].tolist()
        spans = self.spans(firsts.tolist())
        starts, ends = [start for start, _ in spans], [end for _, end in spans]
        for k, (_, end) in zip(longer, self.spans(lasts[longer].tolist()), strict=True):
            ends[k] = end
        return starts, ends

    def word(self, position: int, token_id: int) -> str | None:
        """The "word" of the token at a position: ``convert_ids_to_tokens``, or the text the unknown token
        stands for."""
        if token_id == self.vocabulary.unk_id:
            start, end = self.spans([position])[0]
            return self.text[start:end]
        return self.vocabulary.token(token_id)

    def words(self, first: int, stop: int) -> list[str | None]:
        """The "word" of tokens first..stop-1."""
        positions = self.index[first:stop]
        return list(map(self.word, positions.tolist(), self.ids[positions].tolist()))

    def is_subword(self) -> np.ndarray:
        """The "is_subword" of every token (bool array)."""
        window, text = self.window, self.text
        offsets = window.offsets
        if not isinstance(offsets, np.ndarray):
            offsets = np.fromiter(itertools.chain.from_iterable(offsets), np.int64, 2 * len(self.ids)).reshape(-1, 2)
        starts, ends = offsets[self.index].T
        ids = self.ids[self.index]
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
class Labels:
    """What ``group_entities`` and the ``ignore_labels`` filter read of a label, by label id (a model's
    labels and filter are fixed: its client builds this once)."""

    names: Sequence[str]
    tags: np.ndarray  # get_tag's tag, numbered: equal tags, equal numbers
    begins: np.ndarray  # get_tag's "B"
    groups: tuple[str, ...]  # group_sub_entities' "entity_group": the label after its first "-"
    shown: np.ndarray  # the filter of a token's "entity" (the entity has no "entity_group": None)
    shown_groups: np.ndarray  # the filter of a group's "entity_group" (the group has no "entity": None)

    @classmethod
    def of(cls, labels: Sequence[str], ignore_labels: Sequence[str] = ("O",)) -> Labels:
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


@dataclass(frozen=True)
class _Items:
    """What ``group_entities`` groups: tokens (aggregation "simple") or the words ``aggregate_words`` made
    of them, each its label id, its score and its first and last token (indexes into the pre-entities)."""

    label_ids: np.ndarray
    scores: np.ndarray
    firsts: np.ndarray
    lasts: np.ndarray
    words: bool

    @classmethod
    def tokens(cls, pre: _PreEntities) -> _Items:
        """``aggregate`` for "none" and "simple": each token its best label."""
        tokens = np.arange(len(pre))
        return cls(*best(pre.scores), tokens, tokens, words=False)

    def word(self, pre: _PreEntities, start: int, end: int) -> str:
        """The word of items start..end-1 together (``group_sub_entities``): their words decoded together, a
        token's its own, a word's its tokens' decoded together (``aggregate_word``)."""
        text = pre.vocabulary.text
        if not self.words:
            return text(pre.words(start, end))
        return text([text(pre.words(self.firsts[i], self.lasts[i] + 1)) for i in range(start, end)])


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
        scores = pre.scores[first_max(pre.scores.max(axis=-1), starts)]
    else:
        scores = nanmeans(pre.scores, starts, ends)
    return _Items(*best(scores), starts, ends - 1, words=True)


def group_entities(items: _Items, pre: _PreEntities, labels: Labels) -> list[dict]:
    """``group_entities``: adjacent items of the same tag join the group before them unless they are B-; then
    ``group_sub_entities`` for each group the ``ignore_labels`` filter keeps: its label is the first one's
    after its first "-", its score the mean of the members' (np.nanmean, float32), its word the members'
    words decoded together (a group of one token, but the unknown one: its id's ``Vocabulary.single``)."""
    label_ids = items.label_ids
    tags = labels.tags[label_ids]
    starts_group = np.empty(len(tags), dtype=bool)
    starts_group[0] = True
    starts_group[1:] = (tags[1:] != tags[:-1]) | labels.begins[label_ids[1:]]
    starts = starts_group.nonzero()[0]
    ends = np.concatenate((starts[1:], [len(tags)]))
    kept = labels.shown_groups[label_ids[starts]]
    starts, ends = starts[kept], ends[kept]
    firsts, lasts = pre.index[items.firsts[starts]], pre.index[items.lasts[ends - 1]]  # positions in the window
    several = firsts != lasts
    longer = np.flatnonzero(several).tolist()  # the groups of more than one item
    (text_starts, text_ends), first_ids = pre.bounds(firsts, lasts, longer), pre.ids[firsts].tolist()
    vocabulary, unk_id, begins, stops = pre.vocabulary, pre.vocabulary.unk_id, starts.tolist(), ends.tolist()
    words = list(map(vocabulary.singles.get, first_ids))  # None: an id not met yet, or the unknown token
    for k in longer:
        words[k] = items.word(pre, begins[k], stops[k])
    for k in [k for k, word in enumerate(words) if word is None] if None in words else ():
        token_id = first_ids[k]
        words[k] = items.word(pre, begins[k], stops[k]) if token_id == unk_id else vocabulary.single(token_id)
    if items.words:  # aggregate_word decoded a word of one token, group_sub_entities decodes it again
        for k in np.flatnonzero(~several).tolist():
            words[k] = words[k] if first_ids[k] == unk_id else vocabulary.text([words[k]])
    groups = labels.groups
    return [
        {"entity_group": groups[label_id], "score": score, "word": word, "start": start, "end": end}
        for label_id, score, word, start, end in zip(
            label_ids[starts].tolist(),
            nanmeans(items.scores, starts, ends).tolist(),
            words,
            text_starts,
            text_ends,
            strict=True,
        )
    ]


def _tokens(items: _Items, pre: _PreEntities, labels: Labels) -> list[dict]:
    """Aggregation "none": each token the ``ignore_labels`` filter keeps, with its best label."""
    kept = np.flatnonzero(labels.shown[items.label_ids])
    at = pre.index[kept].tolist()
    ids, label_ids, scores = pre.ids[at].tolist(), items.label_ids[kept].tolist(), items.scores[kept].tolist()
    each = zip(at, ids, label_ids, scores, pre.spans(at), strict=True)
    return [
        {"entity": labels.names[label], "score": score, "index": p, "word": pre.word(p, i), "start": a, "end": b}
        for p, i, label, score, (a, b) in each
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
    labels: Sequence[str] | Labels,
    strategy: str,
    vocabulary: Vocabulary,
    ignore_labels: Sequence[str] = ("O",),
) -> list[dict]:
    """Exactly the pipeline's list of entities for `text` from its windows' label probabilities (dict keys
    and their order as the pipeline gives them; scores as Python floats).
    ``labels``: the label names, or their ``Labels`` (built once; its filter is then the one it was built
    with, and ``ignore_labels`` is not read).

    ``postprocess``, each step on a whole window at once: ``gather_pre_entities``, ``aggregate``
    (the best label of each token or word), ``group_entities`` and the ``ignore_labels`` filter (only the
    groups it keeps are given a score and a word)."""
    strategy = strategy.lower()
    if strategy not in STRATEGIES:
        raise ValueError(f"aggregation strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "none" and len(windows) > 1:
        raise ValueError('several windows (stride) need an aggregation strategy other than "none"')
    table = labels if isinstance(labels, Labels) else Labels.of(labels, ignore_labels)
    found: list[dict] = []
    for window in windows:
        pre = _PreEntities(text, window, window.scores, vocabulary)
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
