"""clients/entities.py's aggregation rules on hand-made arrays: B-/I- grouping, other prefixes, special
tokens inside a window, the word strategies, overlapping entities of stride windows, the refusals; and
that the post-processing imports neither transformers nor torch. Against Hugging Face's pipeline on
real tokenizers: ``test_entities.py``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from clients.entities import STRATEGIES, aggregate_overlapping, entities
from clients.entity_inputs import Vocabulary, Window
from clients.text import softmax

# A vocabulary without decoder (tokens joined by spaces) and logits that pick a label.

HAND_LABELS = ("O", "B-PER", "I-PER", "PER", "B-LOC", "I-LOC")


def hand_window(text: str, spans: list[tuple[int, int]], picks: list[tuple[str, float]]) -> tuple[Window, Vocabulary]:
    """[CLS] + one token per span + [SEP]; token i's best label is picks[i][0], its logit picks[i][1] (the
    others 0; the window holds their softmax)."""
    tokens = ("[CLS]", "[SEP]", *(text[a:b] for a, b in spans))
    rows = np.zeros((len(spans) + 2, len(HAND_LABELS)), dtype=np.float32)
    for row, (label, logit) in enumerate(picks, start=1):
        rows[row, HAND_LABELS.index(label)] = logit
    window = Window(
        ids=[0, *range(2, 2 + len(spans)), 1],
        offsets=[(0, 0), *spans, (0, 0)],
        special_tokens_mask=[1, *[0] * len(spans), 1],
        scores=softmax(rows),
    )
    return window, Vocabulary(tokens, None, word_aware=False, unk_id=None)


def probability(logit: float) -> float:
    """The softmax probability of a label whose logit is ``logit`` when the others are 0."""
    return float(np.exp(logit) / (np.exp(logit) + len(HAND_LABELS) - 1))


def test_b_and_i_grouping() -> None:
    text = "Ann Lee met Bob Kim Max in Rome Paris"
    spans = [(0, 3), (4, 7), (8, 11), (12, 15), (16, 19), (20, 23), (24, 26), (27, 31), (32, 37)]
    picks = [
        ("B-PER", 2.0),  # Ann
        ("I-PER", 3.0),  # Lee: joins Ann
        ("O", 1.0),  # met: dropped
        ("B-PER", 2.0),  # Bob
        ("B-PER", 2.0),  # Kim: a second B- starts a new group
        ("PER", 4.0),  # Max: no prefix reads as I-PER and joins Kim
        ("O", 1.0),
        ("I-LOC", 2.0),  # Rome: an I- after O starts a group
        ("I-LOC", 4.0),  # Paris: joins Rome
    ]
    window, vocabulary = hand_window(text, spans, picks)
    found = entities(text, [window], HAND_LABELS, "simple", vocabulary)
    expected = [
        ("PER", "Ann Lee", 0, 7, (2.0, 3.0)),
        ("PER", "Bob", 12, 15, (2.0,)),
        ("PER", "Kim Max", 16, 23, (2.0, 4.0)),
        ("LOC", "Rome Paris", 27, 37, (2.0, 4.0)),
    ]
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found] == [x[:4] for x in expected]
    for entity, (*_, picked) in zip(found, expected, strict=True):
        assert entity["score"] == pytest.approx(np.mean([probability(x) for x in picked]), abs=1e-6)
    assert list(found[0]) == ["entity_group", "score", "word", "start", "end"]

    tokens = entities(text, [window], HAND_LABELS, "none", vocabulary)
    assert [(e["entity"], e["index"], e["word"]) for e in tokens] == [
        (label, i, text[a:b])
        for i, ((label, _), (a, b)) in enumerate(zip(picks, spans, strict=True), start=1)
        if label != "O"
    ]
    assert list(tokens[0]) == ["entity", "score", "index", "word", "start", "end"]
    kept = entities(text, [window], HAND_LABELS, "simple", vocabulary, ignore_labels=("LOC",))
    assert [e["entity_group"] for e in kept] == ["PER", "O", "PER", "PER", "O"]


def test_other_prefixes() -> None:
    # BIOES labels: a group is named after the first "-" of its first label, but only B-/I- prefixes are
    # read when joining, so E-PER (tag "E-PER") does not join the B-PER before it
    labels = ("O", "B-PER", "E-PER", "S-LOC")
    text = "Ann Lee Rome"
    tokens = ("[CLS]", "[SEP]", "Ann", "Lee", "Rome")
    rows = np.zeros((5, 4), dtype=np.float32)
    rows[1:4, [1, 2, 3]] = np.eye(3, dtype=np.float32) * 2
    window = Window([0, 2, 3, 4, 1], [(0, 0), (0, 3), (4, 7), (8, 12), (0, 0)], [1, 0, 0, 0, 1], softmax(rows))
    found = entities(text, [window], labels, "simple", Vocabulary(tokens, None, word_aware=False, unk_id=None))
    assert [(e["entity_group"], e["word"]) for e in found] == [("PER", "Ann"), ("PER", "Lee"), ("LOC", "Rome")]


def test_special_tokens_anywhere_in_the_window() -> None:
    # the mask as the encoding's list (its one run of own tokens read by the list's scans, or, with a special
    # token in between, token by token) and as an array give the same tokens, "index" their window positions
    labels = ("O", "B-PER", "I-PER")
    text = "Ann Lee Kim"
    tokens = ("[CLS]", "[SEP]", "Ann", "Lee", "Kim")
    vocabulary = Vocabulary(tokens, None, word_aware=False, unk_id=None)
    rows = np.zeros((6, 3), dtype=np.float32)
    rows[[1, 3, 4], [1, 1, 2]] = 3.0
    rows[2, 2] = 5.0  # the [SEP] in between: an I-PER if it were read as a token
    ids, offsets = [0, 2, 1, 3, 4, 1], [(0, 0), (0, 3), (0, 0), (4, 7), (8, 11), (0, 0)]
    for mask in ([1, 0, 1, 0, 0, 1], np.array([1, 0, 1, 0, 0, 1], np.uint8)):
        window = Window(ids, offsets, mask, softmax(rows))
        assert [(e["index"], e["word"]) for e in entities(text, [window], labels, "none", vocabulary)] == [
            (1, "Ann"),
            (3, "Lee"),
            (4, "Kim"),
        ]
        assert [e["word"] for e in entities(text, [window], labels, "simple", vocabulary)] == ["Ann", "Lee Kim"]
    one_run = Window([0, 2, 3, 4, 1], offsets[:2] + offsets[3:], [1, 0, 0, 0, 1], softmax(rows[[0, 1, 3, 4, 5]]))
    as_array = Window(*dataclasses.astuple(one_run)[:2], np.array([1, 0, 0, 0, 1]), one_run.scores)
    for strategy in STRATEGIES:
        found = entities(text, [one_run], labels, strategy, vocabulary)
        assert found == entities(text, [as_array], labels, strategy, vocabulary), strategy
        assert found, strategy


def test_word_strategies() -> None:
    # "Annabel" is two tokens: the second touches no space, so the fallback heuristic makes it a subword
    text = "Annabel met"
    spans = [(0, 3), (3, 7), (8, 11)]
    picks = [("B-PER", 1.0), ("B-LOC", 3.0), ("O", 1.0)]
    window, vocabulary = hand_window(text, spans, picks)
    first = entities(text, [window], HAND_LABELS, "first", vocabulary)
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in first] == [("PER", "Ann abel", 0, 7)]
    assert first[0]["score"] == pytest.approx(probability(1.0), abs=1e-6)
    highest = entities(text, [window], HAND_LABELS, "max", vocabulary)
    assert [(e["entity_group"], e["word"]) for e in highest] == [("LOC", "Ann abel")]
    assert highest[0]["score"] == pytest.approx(probability(3.0), abs=1e-6)
    average = entities(text, [window], HAND_LABELS, "average", vocabulary)
    mean = window.scores[1:3].mean(axis=0)
    assert [e["entity_group"] for e in average] == [HAND_LABELS[int(mean.argmax())].split("-")[-1]] == ["LOC"]
    assert average[0]["score"] == pytest.approx(float(mean.max()), abs=1e-6)
    simple = entities(text, [window], HAND_LABELS, "simple", vocabulary)
    assert [(e["entity_group"], e["word"]) for e in simple] == [("PER", "Ann"), ("LOC", "abel")]


def test_aggregate_overlapping() -> None:
    def entity(start: int, end: int, score: float, name: str) -> dict:
        return {"entity_group": name, "score": score, "word": name, "start": start, "end": end}

    assert aggregate_overlapping([]) == []
    longer = [entity(0, 4, 0.9, "a"), entity(2, 9, 0.1, "longer")]
    assert [e["word"] for e in aggregate_overlapping(longer)] == ["longer"]
    likelier = [entity(0, 4, 0.5, "a"), entity(1, 5, 0.6, "likelier")]
    assert [e["word"] for e in aggregate_overlapping(likelier)] == ["likelier"]
    tie = [entity(0, 4, 0.5, "first"), entity(1, 5, 0.5, "second")]
    assert [e["word"] for e in aggregate_overlapping(tie)] == ["first"]
    shorter = [entity(0, 6, 0.1, "kept"), entity(2, 4, 0.9, "inside")]
    assert [e["word"] for e in aggregate_overlapping(shorter)] == ["kept"]
    touching = [entity(5, 9, 0.5, "b"), entity(0, 5, 0.5, "a")]  # sorted by start; an end is exclusive
    assert [e["word"] for e in aggregate_overlapping(touching)] == ["a", "b"]


def test_refusals() -> None:
    text = "Ann met"
    window, vocabulary = hand_window(text, [(0, 3), (4, 7)], [("B-PER", 1.0), ("O", 1.0)])
    with pytest.raises(ValueError, match="strategy"):
        entities(text, [window], HAND_LABELS, "longest", vocabulary)
    with pytest.raises(ValueError, match="none"):
        entities(text, [window, window], HAND_LABELS, "none", vocabulary)
    assert entities(text, [window], HAND_LABELS, "SIMPLE", vocabulary) == entities(
        text, [window], HAND_LABELS, "simple", vocabulary
    )


@pytest.mark.parametrize("module", ["entities.py", "entity_inputs.py"])
def test_no_transformers_or_torch(module) -> None:
    source = (Path(__file__).parents[2] / "clients" / module).read_text()
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports
    assert not [line for line in imports if "transformers" in line or "torch" in line]
