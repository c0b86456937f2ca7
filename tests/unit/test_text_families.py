"""The text families against the libraries their users trust, in one process: small random-weight
models of each tokenizer kind (WordPiece with token_type_ids, byte-level BPE, Unigram), the "text"
set of scripts.model_prep.small_models (built once per run, prepared by ``python -m scripts.model_prep``),
served by their clients with ONNX Runtime standing in for Triton (the real stack:
tests/integration/test_text_models.py).

Tolerances: scores and vectors within 1e-4 of the reference (FP32, ONNX Runtime against torch);
labels, words and character offsets exactly equal."""

from __future__ import annotations

import copy
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from app.core.errors import InvalidInput
from clients.text import windows, zero_single_types
from scripts.model_prep.small_models.encoders import CORPUS
from scripts.model_prep.small_models.sets import SETS, Built
from tests.references import OnnxTriton, in_process_clients

ATOL = 1e-4
LONG_TEXT = " ".join(CORPUS * 3)  # about 200 tokens: past the small models' 64


TEST_MODELS = SETS["text"].models


@pytest.fixture(scope="module")
def built(small_models: Built) -> tuple[Path, Path]:
    return small_models.models("text"), small_models.repository("text")


@pytest.fixture(scope="module")
def triton(built) -> OnnxTriton:
    return OnnxTriton(built[1])


@pytest.fixture(scope="module")
def clients(built, triton):
    return in_process_clients(built[1], triton)


def folder(built, name: str) -> str:
    return str(built[0] / name / "hf")


def _pipeline(task: str, path: str):
    from transformers import pipeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pipeline(task, model=path)


def assert_classes(ours: list, theirs: list) -> None:
    assert [c["label"] for c in ours] == [c["label"] for c in theirs]
    np.testing.assert_allclose([c["score"] for c in ours], [c["score"] for c in theirs], rtol=0, atol=ATOL)


CLASSIFIERS = [name for name, (family, _) in TEST_MODELS.items() if family == "text_classification"]
TAGGERS = [name for name, (family, _) in TEST_MODELS.items() if family == "token_classification"]
EMBEDDERS = [name for name, (family, _) in TEST_MODELS.items() if family == "sentence_embedding"]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_text_classification_equals_the_pipeline(built, clients, name):
    client, reference = clients[name], _pipeline("text-classification", folder(built, name))
    labels = len(client.labels)
    for k in sorted({1, labels}):
        ours, _ = client.inference({"text": CORPUS, "topk": k})
        assert len(ours) == len(CORPUS)
        for text, answer in zip(CORPUS, ours):
            assert_classes(answer, reference(text, top_k=k))
    for function in ("softmax", "sigmoid", "none"):
        ours, _ = client.inference({"text": CORPUS[4], "topk": labels, "function_to_apply": function})
        assert_classes(ours, reference(CORPUS[4], top_k=labels, function_to_apply=function))


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_pair_equals_the_pipeline_with_text_pair(built, clients, name):
    client, reference = clients[name], _pipeline("text-classification", folder(built, name))
    queries, passages = CORPUS[:4], CORPUS[3::-1]  # short: a pair of the Unigram model stays within 64 tokens
    ours, _ = client.inference({"text": queries, "text_pair": passages, "topk": 1})
    for query, passage, answer in zip(queries, passages, ours):
        assert_classes(answer, reference({"text": query, "text_pair": passage}, top_k=1))
    one, _ = client.inference({"text": queries[0], "text_pair": passages[0]})
    assert one == ours[0]


def test_the_default_function_is_the_pipelines_rule(clients):
    assert clients["sentiment_bert"].options["function_to_apply"].default == "softmax"
    assert clients["reranker_xlmr"].options["function_to_apply"].default == "sigmoid"  # one label
    assert clients["tags_bert"].options["function_to_apply"].default == "sigmoid"  # multi-label
    # one sigmoid score per label, not a softmax summing to 1
    ours, _ = clients["tags_bert"].inference({"text": CORPUS[0], "topk": 3})
    assert abs(sum(c["score"] for c in ours) - 1) > 1e-3


def test_truncation_equals_the_pipelines_and_without_it_a_long_text_is_refused(built, clients):
    client, reference = clients["sentiment_bert"], _pipeline("text-classification", folder(built, "sentiment_bert"))
    with pytest.raises(InvalidInput) as refused:
        client.inference({"text": [CORPUS[0], LONG_TEXT]})
    message = refused.value.message
    assert "payload.text[1]" in message and "tokens" in message and "limit of 64" in message and "truncation" in message
    ours, _ = client.inference({"text": LONG_TEXT, "truncation": True, "topk": 2})
    assert_classes(ours, reference(LONG_TEXT, truncation=True, top_k=2))
    pair, _ = client.inference({"text": LONG_TEXT, "text_pair": CORPUS[1], "truncation": True, "topk": 2})
    assert_classes(pair, reference({"text": LONG_TEXT, "text_pair": CORPUS[1]}, truncation=True, top_k=2))


@pytest.mark.parametrize(
    ("payload", "fragments"),
    [
        ({"text": 7}, ["payload.text", "string"]),
        ({"text": ["a", None]}, ["payload.text[1]", "string"]),
        ({"text": ["a", "b"], "text_pair": ["c"]}, ["payload.text_pair", "as long as payload.text", "2"]),
        ({"text": ["a", "b"], "text_pair": "c"}, ["payload.text_pair", "list"]),
        ({"text": "a", "text_pair": 3}, ["payload.text_pair", "string"]),
        ({"text": "a", "function_to_apply": "relu"}, ["payload.function_to_apply", "'softmax'"]),
        ({"text": "a", "topk": 3}, ["payload.topk", "between 1 and 2"]),
        ({"text": "a", "truncation": "yes"}, ["payload.truncation", "true or false"]),
        ({"text": "a", "stride": 2}, ["payload.stride", "not an option"]),
    ],
)
def test_bad_classification_input_is_refused_naming_the_field(clients, payload, fragments):
    with pytest.raises(InvalidInput) as refused:
        clients["sentiment_bert"].inference(payload)
    for fragment in fragments:
        assert fragment in refused.value.message, refused.value.message


@pytest.mark.parametrize("name", EMBEDDERS)
def test_embeddings_equal_sentence_transformers(built, clients, name):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    model = SentenceTransformer(folder(built, name), device="cpu")
    # sentence-transformers cuts every text to its max_seq_length (the Unigram model's last line is past it)
    ours, _ = clients[name].inference({"text": CORPUS, "truncation": True})
    theirs = model.encode(CORPUS, batch_size=32)
    assert np.asarray(ours).shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
    # "normalize": false answers the pooled vector, also of a folder that ends with Normalize: what the
    # pipeline answers without that module (as text-embeddings-inference's normalize does); true, unit vectors
    pooled = SentenceTransformer(
        modules=[module for module in model if not isinstance(module, Normalize)],
        prompts=model.prompts,
        default_prompt_name=model.default_prompt_name,
    )
    for normalize, reference in ((True, model), (False, pooled)):
        ours, _ = clients[name].inference({"text": CORPUS[:3], "normalize": normalize})
        theirs = reference.encode(CORPUS[:3], normalize_embeddings=normalize)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
        assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5) == normalize  # the option is never ignored
    one, _ = clients[name].inference({"text": CORPUS[2]})
    assert isinstance(one, list) and isinstance(one[0], float)


def test_embeddings_with_truncation_equal_sentence_transformers_on_a_long_text(built, clients):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder(built, "embed_bert_mean"), device="cpu")
    client = clients["embed_bert_mean"]
    assert client.sequence_length == 48  # sentence-transformers' max_seq_length, not the 64 positions
    with pytest.raises(InvalidInput, match="limit of 48"):
        client.inference({"text": LONG_TEXT})
    ours, _ = client.inference({"text": LONG_TEXT, "truncation": True})
    np.testing.assert_allclose(ours, model.encode(LONG_TEXT), rtol=0, atol=ATOL)


def test_prompts_equal_sentence_transformers_and_the_folders_default_applies(built, clients):
    """A folder's prompts (config_sentence_transformers.json) as encode(prompt_name=...): the named one's
    text before each text, the folder's default_prompt_name when none is named, and "document" (a
    prompt every SentenceTransformer has, empty here) for none at all; an unknown name is a 400."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder(built, "embed_xlmr_max"), device="cpu")
    client = clients["embed_xlmr_max"]
    assert model.default_prompt_name == "query" and client.options["prompt_name"].default == "query"
    texts = CORPUS[:3]
    ours, _ = client.inference({"text": texts})
    np.testing.assert_allclose(ours, model.encode(texts), rtol=0, atol=ATOL)
    np.testing.assert_allclose(ours, model.encode(texts, prompt="query: "), rtol=0, atol=ATOL)
    for name in ("query", "passage", "document"):
        ours, _ = client.inference({"text": texts, "prompt_name": name})
        np.testing.assert_allclose(ours, model.encode(texts, prompt_name=name), rtol=0, atol=ATOL)
    bare, _ = client.inference({"text": texts, "prompt_name": "document"})
    assert np.abs(np.asarray(bare) - model.encode(texts, prompt="query: ")).max() > 10 * ATOL  # the prompt counts
    with pytest.raises(InvalidInput, match="payload.prompt_name must be one of 'query', 'document', 'passage'"):
        client.inference({"text": texts, "prompt_name": "answer"})


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"prompts": ["query: "]}, "prompts must be an object of prompt names and their texts"),
        ({"prompts": {"query": 3}}, "prompts must be an object of prompt names and their texts"),
        ({"prompts": {"passage": "passage: "}, "default_prompt_name": "answer"}, "default_prompt_name 'answer'"),
    ],
)
def test_a_folders_prompts_that_cannot_be_read_stop_naming_the_file(built, tmp_path, settings, fragment):
    from app.core.spec import SpecError
    from clients.families import load_spec

    model = tmp_path / "embed"
    shutil.copytree(built[0] / "embed_xlmr_max", model, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    (model / "hf" / "config_sentence_transformers.json").write_text(json.dumps(settings))
    with pytest.raises(SpecError, match="config_sentence_transformers.json") as raised:
        load_spec(model)
    assert fragment in str(raised.value)


def test_model_toml_may_name_another_default_prompt(built, tmp_path):
    from app.core.settings import Settings
    from app.core.spec import SpecError
    from clients.families import load_spec, offline_client

    model = tmp_path / "embed"
    shutil.copytree(built[0] / "embed_xlmr_max", model, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    toml = (model / "model.toml").read_text()
    (model / "model.toml").write_text(toml + '[postprocess]\nprompt_name = "passage"\n')
    assert offline_client(load_spec(model), Settings()).options["prompt_name"].default == "passage"
    (model / "model.toml").write_text(toml + '[postprocess]\nprompt_name = "answer"\n')
    with pytest.raises(SpecError, match=r"\[postprocess\] prompt_name must be one of 'query', 'document', 'passage'"):
        offline_client(load_spec(model), Settings())


def test_short_texts_are_padded_to_their_bucket_and_calls_fit_the_batch(clients, triton, monkeypatch):
    """Where Triton batches only requests of one length (its ONNX Runtime and TensorRT backends)."""
    client = clients["embed_bert_mean"]
    monkeypatch.setattr(client, "ragged", False)
    triton.calls.clear()
    client.inference({"text": "A man."})
    client.inference({"text": [CORPUS[0], "x " * 30]})
    client.inference({"text": [CORPUS[0]] * 40})  # more texts than max_batch_size (32): two calls
    shapes = [shape["input_ids"] for _, shape in triton.calls]
    assert shapes[0] == (1, 16)  # a few tokens: the smallest bucket, not the 48 of the limit
    assert shapes[1] == (2, 32)  # the longest text (~32 tokens) picks the bucket
    # a full batch (32 rows) pads to its longest text only (no caller could join it); the rest to a bucket
    longest = len(client.tokenizer.encode(CORPUS[0]).ids)
    assert shapes[2:] == [(32, longest), (8, 16)] and longest < 16
    assert all(shape["attention_mask"] == shape["input_ids"] for _, shape in triton.calls)


def test_on_the_python_target_requests_are_padded_to_their_own_longest_text(built, clients, triton):
    """The python target's config allows ragged batches (its model.py pads Triton's batch): a request
    is not padded to a bucket, and the answers are those of the bucket's padding."""
    from scripts.model_prep import triton_config

    client = clients["embed_bert_mean"]
    config = triton_config.read_config(built[1] / "embed_bert_mean" / "config.pbtxt")
    assert [t.allow_ragged_batch for t in config.input] == [True] * 3 and client.ragged
    lengths = [len(client.tokenizer.encode(text).ids) for text in ("A man.", CORPUS[0])]
    triton.calls.clear()
    ragged, _ = client.inference({"text": ["A man.", CORPUS[0]]})
    assert [shape["input_ids"] for _, shape in triton.calls] == [(2, max(lengths))] and max(lengths) < 16
    client.ragged = False
    try:
        bucketed, _ = client.inference({"text": ["A man.", CORPUS[0]]})
    finally:
        client.ragged = True
    assert triton.calls[-1][1]["input_ids"] == (2, 16)
    np.testing.assert_allclose(ragged, bucketed, rtol=0, atol=1e-6)


def test_inputs_follow_the_model(built, clients):
    assert [t.name for t in clients["sentiment_bert"].spec.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    for name in ("topic_roberta", "reranker_xlmr", "embed_roberta_cls"):
        assert [t.name for t in clients[name].spec.inputs] == ["input_ids", "attention_mask"]


def test_token_type_ids_are_the_tokenizers(clients):
    # one text's type ids are all 0 under BERT's template, so its row keeps the zeros it starts with;
    # a pair's, and one text's under a template that gives it another type id, are read
    from tokenizers.processors import TemplateProcessing

    client = clients["sentiment_bert"]
    tokenizer = client.tokenizer
    assert client.zero_single_types
    encodings = [
        tokenizer.encode("one text"),
        tokenizer.encode("a query", "a passage about it"),
        *windows(tokenizer, " ".join(CORPUS), 16, 4),
    ]
    assert 1 in encodings[1].type_ids
    for encoding in encodings:
        assert client.arrays([encoding])["token_type_ids"][0].tolist() == encoding.type_ids

    ones = copy.deepcopy(tokenizer)
    specials = [(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")]
    ones.post_processor = TemplateProcessing(
        single="[CLS]:1 $A:1 [SEP]:1", pair="[CLS]:1 $A:1 [SEP]:1 $B:0 [SEP]:0", special_tokens=specials
    )
    other = copy.copy(client)
    other.zero_single_types = zero_single_types(ones)
    assert not other.zero_single_types
    encoding = ones.encode("one text")
    assert set(encoding.type_ids) == {1}
    assert other.arrays([encoding])["token_type_ids"][0].tolist() == encoding.type_ids


@pytest.mark.parametrize("name", TAGGERS)
def test_entities_equal_the_pipeline(built, clients, name):
    reference = _pipeline("token-classification", folder(built, name))
    # plain texts (BERT's: offsets rebuilt by clients.plain_text.Spans), one with an added token's "[",
    # one that is not plain, one with words the small vocabulary does not hold (unknown tokens)
    texts = [CORPUS[4], CORPUS[5], "  Paris,  London and New York!  ", "[CLS] Merkel\tin Paris", CORPUS[10]]
    texts.append("Qwxz vkjq: Smith in Berlin.")
    for strategy in ("none", "simple", "first", "average", "max"):
        ours, _ = clients[name].inference({"text": texts, "aggregation_strategy": strategy})
        for text, answer in zip(texts, ours):
            theirs = reference(text, aggregation_strategy=strategy)
            assert [{k: v for k, v in e.items() if k != "score"} for e in answer] == [
                {k: v for k, v in e.items() if k != "score"} for e in theirs
            ]
            np.testing.assert_allclose([e["score"] for e in answer], [e["score"] for e in theirs], rtol=0, atol=ATOL)
    stride, _ = clients[name].inference({"text": LONG_TEXT, "aggregation_strategy": "max", "stride": 12})
    theirs = reference(LONG_TEXT, aggregation_strategy="max", stride=12)
    assert [(e["entity_group"], e["start"], e["end"]) for e in stride] == [
        (e["entity_group"], e["start"], e["end"]) for e in theirs
    ]


def test_entities_equal_the_pipeline_where_the_offsets_are_not_rebuilt(built, clients, monkeypatch):
    """A text whose rebuilt offsets fail their checks is encoded again with the tokenizer's own."""
    client = clients["ner_bert"]
    assert client.encoder.encode_spans(CORPUS[4])[1] is not None  # the text the tests above rebuild
    monkeypatch.setattr(client.encoder.plain, "spans", lambda text, ids: None)
    reference = _pipeline("token-classification", folder(built, "ner_bert"))
    for strategy in ("none", "simple"):
        answer = client.inference({"text": CORPUS[4], "aggregation_strategy": strategy})[0]
        theirs = reference(CORPUS[4], aggregation_strategy=strategy)
        assert [(e["word"], e["start"], e["end"]) for e in answer] == [
            (e["word"], e["start"], e["end"]) for e in theirs
        ]
        assert any(e["start"] > 0 for e in answer)


def test_a_long_text_without_stride_is_refused_naming_stride(clients):
    with pytest.raises(InvalidInput, match='send "stride"'):
        clients["ner_bert"].inference({"text": LONG_TEXT})
    with pytest.raises(InvalidInput, match="aggregation_strategy"):
        clients["ner_bert"].inference({"text": LONG_TEXT, "stride": 8})
