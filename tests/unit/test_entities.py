"""clients/entities.py against Hugging Face's TokenClassificationPipeline: tiny random-weight models with a
WordPiece (bert), byte-level BPE (roberta) and Unigram (xlm-roberta) tokenizer (the "entities" set of
scripts.model_prep.small_models, built once per run), every aggregation strategy,
with and without stride; ``windows()`` against the fast tokenizer's own windows. The aggregation rules on
hand-made arrays: ``test_entity_rules.py``."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import tokenizers

from clients.entities import STRATEGIES, entities
from clients.entity_inputs import Vocabulary, Window
from clients.reductions import PAIRWISE, nanmeans
from clients.text import softmax, windows
from scripts.model_prep.small_models.encoders import CORPUS, KINDS, MAX_POSITIONS, NER_LABELS
from scripts.model_prep.small_models.sets import Built

SCORE_TOLERANCE = 1e-5  # our logits come from unpadded windows, the pipeline's from padded ones
EDGE_TEXTS = [
    "Prices: 5€ or ¥7 in 漢字 land, said Zoë.",  # characters the tiny vocabularies lack: unknown tokens
    "   John lives in Berlin.   ",
    "John   Smith    works  for   Acme.",
    "Wait!!! What?!... (really) -- yes;; ok...",
    "Café déjà vu 🙂🙂 naïve façade — São Paulo, Ünïcödé!",
    "Hugging\tFace\nBerlin lives,no-spaces:here",
    "",
    " ",
]
TEXTS = [*CORPUS, *EDGE_TEXTS]
LONG_TEXTS = [" ".join(CORPUS * 2), " ".join(reversed(CORPUS[4:])) * 3]
STRIDES = (8, 20)
WORD_AWARE = {"bert": True, "roberta": False, "xlm-roberta": False}  # WordPiece has a "##" prefix


@dataclass
class Setup:
    kind: str
    hf_tokenizer: object
    tokenizer: tokenizers.Tokenizer
    vocabulary: Vocabulary
    model: object
    pipeline: object
    labels: list[str]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models: torch's threads only contend for the machine's few cores (restored afterwards)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=KINDS)
def setup(request, small_models: Built) -> Setup:
    """One kind's folder: the tokenizer as the router loads it, the torch model, the pipeline."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    kind = request.param
    folder = small_models.models("entities") / f"ner_{kind}" / "hf"
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    unk_token = json.loads((folder / "tokenizer_config.json").read_text()).get("unk_token")
    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    return Setup(
        kind,
        AutoTokenizer.from_pretrained(folder),
        tokenizer,
        Vocabulary.of(tokenizer, unk_token),
        model,
        pipeline("token-classification", model=str(folder)),
        labels,
    )


def logits(model, encoding: tokenizers.Encoding) -> np.ndarray:
    import torch

    inputs = {
        "input_ids": torch.tensor([encoding.ids]),
        "attention_mask": torch.tensor([encoding.attention_mask]),
        "token_type_ids": torch.tensor([encoding.type_ids]),
    }
    with torch.no_grad():
        return model(**inputs).logits[0].numpy()


def ours(setup: Setup, text: str, strategy: str, stride: int | None = None) -> list[dict]:
    """The entities from each window's label probabilities: the pipeline's softmax of the logits, as the
    model's graph returns them."""
    found = [
        Window.of(encoding, softmax(logits(setup.model, encoding)))
        for encoding in windows(setup.tokenizer, text, MAX_POSITIONS, stride)
    ]
    return entities(text, found, setup.labels, strategy, setup.vocabulary)


def assert_same(found: list[dict], expected: list[dict], where: str) -> None:
    assert len(found) == len(expected), f"{where}: {found} != {expected}"
    for mine, theirs in zip(found, expected, strict=True):
        assert list(mine) == list(theirs), where
        assert type(mine["score"]) is float, where
        for key in theirs:
            if key == "score":
                assert abs(mine[key] - float(theirs[key])) <= SCORE_TOLERANCE, f"{where}: {mine} != {theirs}"
            else:
                assert mine[key] == theirs[key], f"{where}: {mine} != {theirs}"


@pytest.mark.filterwarnings("ignore:Tokenizer does not support real words")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_entities_are_the_pipelines(setup: Setup, strategy: str) -> None:
    seen = 0
    for text in [*TEXTS, *LONG_TEXTS]:  # the long ones are cut to the model's length, as the pipeline cuts them
        expected = setup.pipeline(text, aggregation_strategy=strategy)
        assert_same(ours(setup, text, strategy), expected, f"{setup.kind} {strategy} {text!r}")
        seen += len(expected)
    assert seen > 0  # the comparison saw entities


@pytest.mark.filterwarnings("ignore:Tokenizer does not support real words")
@pytest.mark.parametrize("stride", STRIDES)
@pytest.mark.parametrize("strategy", ["simple", "first", "average", "max"])
def test_stride_entities_are_the_pipelines(setup: Setup, strategy: str, stride: int) -> None:
    for text in LONG_TEXTS:
        assert len(setup.tokenizer.encode(text).ids) >= 150
        expected = setup.pipeline(text, aggregation_strategy=strategy, stride=stride)
        assert_same(ours(setup, text, strategy, stride), expected, f"{setup.kind} {strategy} {stride} {text!r}")
        assert expected


# Any logits, the pipeline's own postprocess on them (no model run): long windows, many groups, none, groups and
# words longer than numpy's pairwise threshold, NaN rows; scores bit for bit.
RUN_ON = "".join(CORPUS[9].split())  # no spaces: one word of many subwords
LOGIT_TEXTS = [" ".join([*CORPUS * 4, RUN_ON, *EDGE_TEXTS[:2]]), CORPUS[4], EDGE_TEXTS[0], ""]


def random_logits(rows: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """[rows, labels] float32: "entities", about 1 token in 5 an entity; "all O"; "many groups", any label;
    "runs", runs of 1 to 40 tokens of one I- label, a B- now and then; "nan", entities with NaN and inf rows."""
    logits = rng.normal(size=(rows, len(NER_LABELS))).astype(np.float32)
    if kind in ("entities", "nan"):
        logits[:, 0] += 2.25
    elif kind == "all O":
        logits[:, 0] += 50
    elif kind == "runs":
        at = 0
        while at < rows:
            length = int(rng.integers(1, 41))
            logits[at : at + length, rng.choice([2, 4, 6])] += 6
            logits[at, rng.choice([1, 3, 5])] += 12 * (rng.random() < 0.3)
            at += length
    if kind == "nan":
        logits[rng.random(rows) < 0.1] = np.nan
        logits[rng.random(rows) < 0.05, 1] = np.inf
        logits[rng.random(rows) < 0.05, 2] = -np.inf
    return logits


def pipelines_postprocess(
    setup: Setup, text: str, found: list[Window], drawn: list[np.ndarray], strategy: str
) -> list[dict]:
    import torch
    from transformers.pipelines.token_classification import AggregationStrategy

    outputs = [
        {
            "logits": torch.from_numpy(window_logits)[None],
            "sentence": text,
            "input_ids": torch.tensor([list(window.ids)]),
            "offset_mapping": torch.tensor([list(window.offsets)]),
            "special_tokens_mask": torch.tensor([list(window.special_tokens_mask)]),
        }
        for window, window_logits in zip(found, drawn, strict=True)
    ]
    return setup.pipeline.postprocess(outputs, aggregation_strategy=AggregationStrategy(strategy))


def assert_exact(found: list[dict], expected: list[dict], where: str) -> None:
    """assert_same with the scores bit for bit (NaN as NaN)."""
    assert [list(e) for e in found] == [list(e) for e in expected], where
    for mine, theirs in zip(found, expected, strict=True):
        assert type(mine["score"]) is float, where
        score = float(theirs["score"])
        assert mine["score"] == score or np.isnan(mine["score"]) and np.isnan(score), f"{where}: {mine} != {theirs}"
        assert {**mine, "score": 0} == {**theirs, "score": 0}, f"{where}: {mine} != {theirs}"


@pytest.mark.filterwarnings("ignore:Tokenizer does not support real words")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN and inf logits: numpy's own warnings
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_any_logits_are_the_pipelines(setup: Setup, strategy: str) -> None:
    rng = np.random.default_rng(7)
    assert len(setup.tokenizer.encode(LOGIT_TEXTS[0]).ids) > 500
    seen = long = 0
    for text in LOGIT_TEXTS:
        for stride in [None] if strategy == "none" else [None, 20]:
            length = 1024 if stride is None else MAX_POSITIONS
            for kind in ("entities", "all O", "many groups", "runs", "nan"):
                encodings = windows(setup.tokenizer, text, length, stride)
                drawn = [random_logits(len(encoding.ids), kind, rng) for encoding in encodings]
                found = [Window.of(encoding, softmax(x)) for encoding, x in zip(encodings, drawn, strict=True)]
                expected = pipelines_postprocess(setup, text, found, drawn, strategy)
                where = f"{setup.kind} {strategy} {stride} {kind} {text[:20]!r}"
                assert_exact(entities(text, found, setup.labels, strategy, setup.vocabulary), expected, where)
                seen += len(expected)
                long += sum(e["end"] - e["start"] > 40 for e in expected)
    assert seen > 1000
    assert long > 0 or strategy == "none"  # groups (and words) longer than numpy's pairwise threshold were met


def test_nanmeans_are_numpys() -> None:
    rng = np.random.default_rng(5)
    for shape in [(700,), (700, 9)]:
        values = rng.random(shape).astype(np.float32) ** 3
        values[rng.random(700) < 0.1] = np.nan
        values[100:105] = np.nan  # all NaN: NaN, np.nanmean's mean of no number (without its warning)
        lengths = rng.choice([1, 2, 3, PAIRWISE - 1, PAIRWISE, PAIRWISE + 1, 20, 130, 200], size=300)
        bounds = np.cumsum([0, *lengths])
        bounds = bounds[bounds <= 700]
        starts, ends = bounds[:-1], bounds[1:]
        starts, ends = np.append(starts, 100), np.append(ends, 105)
        found = nanmeans(values, starts, ends)
        with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
            expected = np.stack([np.nanmean(values[a:b], axis=0) for a, b in zip(starts, ends, strict=True)])
        assert found.dtype == expected.dtype == np.float32
        assert np.array_equal(found, expected, equal_nan=True)
        assert np.isnan(found[-1]).all()
    # group_sub_entities' mean: np.nanmean of a list of float32 scores
    scores = rng.random(12).astype(np.float32)
    pipeline_means = [np.nanmean([np.float32(x) for x in scores[a:b]]) for a, b in [(0, 3), (3, 5), (5, 12)]]
    assert nanmeans(scores, np.array([0, 3, 5]), np.array([3, 5, 12])).tolist() == pipeline_means


@pytest.mark.parametrize("stride", [None, 0, *STRIDES])
def test_windows_are_the_fast_tokenizers(setup: Setup, stride: int | None) -> None:
    before = setup.tokenizer.to_str()
    for text in [*TEXTS, *LONG_TEXTS]:
        options = {} if stride is None else {"return_overflowing_tokens": True, "stride": stride}
        expected = setup.hf_tokenizer(
            [text],
            truncation=True,
            max_length=MAX_POSITIONS,
            return_special_tokens_mask=True,
            return_offsets_mapping=True,
            **options,
        )
        found = windows(setup.tokenizer, text, MAX_POSITIONS, stride)
        where = f"{setup.kind} {stride} {text!r}"
        assert [e.ids for e in found] == expected["input_ids"], where
        assert [e.offsets for e in found] == [[tuple(o) for o in w] for w in expected["offset_mapping"]], where
        assert [e.special_tokens_mask for e in found] == expected["special_tokens_mask"], where
        assert [e.attention_mask for e in found] == expected["attention_mask"], where
    assert setup.tokenizer.to_str() == before  # the shared tokenizer is untouched
    assert setup.tokenizer.truncation is None and setup.tokenizer.padding is None


def test_windows_refuse_a_stride_without_room(setup: Setup) -> None:
    with pytest.raises(ValueError, match="stride"):
        windows(setup.tokenizer, LONG_TEXTS[0], MAX_POSITIONS, MAX_POSITIONS - 2)
    with pytest.raises(BaseException, match="stride"):  # the fast tokenizer panics (pyo3's PanicException)
        setup.hf_tokenizer(
            LONG_TEXTS[0], truncation=True, max_length=MAX_POSITIONS, return_overflowing_tokens=True, stride=62
        )


def test_vocabulary_is_the_tokenizers(setup: Setup) -> None:
    hf = setup.hf_tokenizer
    vocabulary = setup.vocabulary
    assert vocabulary.word_aware is WORD_AWARE[setup.kind]
    assert vocabulary.word_aware == bool(getattr(hf._tokenizer.model, "continuing_subword_prefix", None))
    assert hf.unk_token_id is not None
    assert vocabulary.unk_id == hf.unk_token_id
    assert len(vocabulary.tokens) == len(hf)
    assert [vocabulary.token(i) for i in range(len(hf))] == hf.convert_ids_to_tokens(list(range(len(hf))))
    for text in TEXTS:
        tokens = hf.convert_ids_to_tokens(hf(text, add_special_tokens=False)["input_ids"])
        assert vocabulary.text(tokens) == hf.convert_tokens_to_string(tokens)
        words = [vocabulary.text(tokens[:2]), vocabulary.text(tokens[2:])]  # group_sub_entities decodes words too
        assert vocabulary.text(words) == hf.convert_tokens_to_string(words)
