"""The text families through the whole stack (NGINX, gunicorn, the router, a real Triton) against
Hugging Face's pipelines and sentence-transformers: small random-weight models of the three
tokenizer kinds (six of the "text" set of scripts.model_prep.small_models, built once per run and
prepared by ``python -m scripts.model_prep``), served from a copy of their own.
Both request forms (the JSON envelope, a raw ``text/plain`` body with the options in the custom
attributes), JSON Lines, callers at once (Triton's dynamic batcher), and bad input (400s naming the
field; the endpoint keeps serving). Tolerances as in tests/unit/test_text_families.py: 1e-4 on
scores and vectors, labels, words and offsets exact."""

from __future__ import annotations

import json
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from scripts.devtools import Stack
from scripts.model_prep.small_models.encoders import CORPUS
from scripts.model_prep.small_models.sets import Built
from scripts.sagemaker.model_archives import multi_model_archive
from tests.references import served_copy
from tests.support import ONE_INSTANCE, assert_conforms, assert_error, post

pytestmark = pytest.mark.integration

ATOL = 1e-4
MODELS = ("sentiment_bert", "reranker_xlmr", "ner_roberta", "ner_bert", "embed_bert_mean", "fill_roberta")
LONG_TEXT = " ".join(CORPUS * 3)


@pytest.fixture(scope="module")
def models(small_models: Built) -> Path:
    return small_models.models("text")


@pytest.fixture(scope="module")
def text_stack(small_models: Built, tmp_path_factory, stopping: list[Stack]):
    repository = served_copy(small_models.repository("text"), MODELS, tmp_path_factory.mktemp("text-repository"))
    started = Stack(repository, env_extra=ONE_INSTANCE).start(tmp_path_factory.mktemp("text-stack-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


def reference(task: str, models: Path, name: str):
    from transformers import pipeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pipeline(task, model=str(models / name / "hf"))


def invoke(stack: Stack, model: str, payload: dict) -> requests.Response:
    r = post(stack, {"modelname": model, "payload": payload})
    assert_conforms(r, "/invocations", "POST")
    return r


def result(stack: Stack, model: str, payload: dict):
    r = invoke(stack, model, payload)
    assert r.status_code == 200, r.text[:500]
    return r.json()["result"]


def assert_classes(ours: list, theirs: list) -> None:
    assert [c["label"] for c in ours] == [c["label"] for c in theirs]
    np.testing.assert_allclose([c["score"] for c in ours], [c["score"] for c in theirs], rtol=0, atol=ATOL)


def assert_entities(ours: list, theirs: list) -> None:
    exact = [{k: v for k, v in e.items() if k != "score"} for e in theirs]
    assert [{k: v for k, v in e.items() if k != "score"} for e in ours] == exact
    np.testing.assert_allclose([e["score"] for e in ours], [float(e["score"]) for e in theirs], rtol=0, atol=ATOL)


def test_classification_and_pairs_equal_the_pipeline(text_stack, models):
    pipe = reference("text-classification", models, "sentiment_bert")
    answers = result(text_stack, "sentiment_bert", {"text": CORPUS, "topk": 2})
    assert len(answers) == len(CORPUS)
    for text, answer in zip(CORPUS, answers):
        assert_classes(answer, pipe(text, top_k=2))
    rerank = reference("text-classification", models, "reranker_xlmr")
    query, passages = CORPUS[0], [CORPUS[1], CORPUS[2], CORPUS[3]]
    scores = result(text_stack, "reranker_xlmr", {"text": [query] * 3, "text_pair": passages})
    for passage, answer in zip(passages, scores):
        assert_classes(answer, rerank({"text": query, "text_pair": passage}, top_k=1))


def test_a_raw_text_body_takes_its_options_from_the_custom_attributes(text_stack, models):
    pipe = reference("text-classification", models, "sentiment_bert")
    attributes = "modelname=sentiment_bert,topk=2,function_to_apply=sigmoid"
    r = post(text_stack, CORPUS[4].encode(), "text/plain", attributes)
    assert r.status_code == 200, r.text
    assert_classes(r.json()["result"], pipe(CORPUS[4], top_k=2, function_to_apply="sigmoid"))
    r = post(text_stack, LONG_TEXT.encode(), "text/plain", "modelname=embed_bert_mean,truncation=true,normalize=false")
    assert r.status_code == 200, r.text
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(models / "embed_bert_mean" / "hf"), device="cpu")
    # normalize=false on a folder that ends with Normalize: the pooled vector, as the pipeline without it
    pooled = SentenceTransformer(modules=[model[0], model[1]], device="cpu")
    np.testing.assert_allclose(r.json()["result"], pooled.encode(LONG_TEXT), rtol=0, atol=ATOL)
    r = post(text_stack, CORPUS[5].encode(), "text/plain", "modelname=ner_roberta,aggregation_strategy=first")
    assert r.status_code == 200, r.text
    assert_entities(
        r.json()["result"],
        reference("token-classification", models, "ner_roberta")(CORPUS[5], aggregation_strategy="first"),
    )


def test_embeddings_equal_sentence_transformers(text_stack, models):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(models / "embed_bert_mean" / "hf"), device="cpu")
    texts = CORPUS[:8]
    vectors = result(text_stack, "embed_bert_mean", {"text": texts})
    np.testing.assert_allclose(vectors, model.encode(texts), rtol=0, atol=ATOL)
    one = result(text_stack, "embed_bert_mean", {"text": texts[0]})
    np.testing.assert_allclose(one, vectors[0], rtol=0, atol=1e-6)
    # a prompt every SentenceTransformer has, empty in a folder that names none
    named = result(text_stack, "embed_bert_mean", {"text": texts, "prompt_name": "document"})
    np.testing.assert_allclose(named, model.encode(texts, prompt_name="document"), rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", ["ner_roberta", "ner_bert"])
def test_entities_equal_the_pipeline(text_stack, models, name):
    pipe = reference("token-classification", models, name)
    for strategy in ("none", "simple", "first", "average", "max"):
        answers = result(text_stack, name, {"text": CORPUS[4:8], "aggregation_strategy": strategy})
        for text, answer in zip(CORPUS[4:8], answers):
            assert_entities(answer, pipe(text, aggregation_strategy=strategy))
    ours = result(text_stack, name, {"text": LONG_TEXT, "aggregation_strategy": "simple", "stride": 16})
    assert_entities(ours, pipe(LONG_TEXT, aggregation_strategy="simple", stride=16))


def test_a_fill_mask_folder_equals_the_pipeline(text_stack, models):
    """fill_mask on the text families' path: RoBERTa's byte-level BPE and its <mask>, one and two masks."""
    pipe = reference("fill-mask", models, "fill_roberta")
    texts = ["A man is eating <mask>.", "<mask> Smith lives in <mask>."]
    answers = result(text_stack, "fill_roberta", {"text": texts, "topk": 3})
    for text, answer in zip(texts, answers):
        theirs = pipe(text, top_k=3)
        masks = [answer] if isinstance(answer[0], dict) else answer
        expected = [theirs] if isinstance(theirs[0], dict) else theirs
        for ours, reference_row in zip(masks, expected, strict=True):
            assert [(c["token"], c["token_str"], c["sequence"]) for c in ours] == [
                (c["token"], c["token_str"], c["sequence"]) for c in reference_row
            ]
            np.testing.assert_allclose([c["score"] for c in ours], [c["score"] for c in reference_row], atol=ATOL)


def test_callers_at_once_each_get_their_own_answer(text_stack, models):
    """Eight callers at once, with texts of different lengths (the python target's config allows
    ragged batches, so Triton's dynamic batcher may run them together): each answer is the
    reference's for its own texts."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(models / "embed_bert_mean" / "hf"), device="cpu")
    texts = [" ".join([CORPUS[i % 4]] * (1 + i % 3)) for i in range(8)]  # 7 to 30 tokens
    assert len({len(model.tokenizer(text)["input_ids"]) for text in texts}) >= 5
    stats = f"http://127.0.0.1:{text_stack.triton_ports[0]}/v2/models/embed_bert_mean/stats"

    def counts() -> tuple[int, int]:
        entry = requests.get(stats, timeout=10).json()["model_stats"][0]
        return entry["inference_count"], entry["execution_count"]

    before = counts()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda t: result(text_stack, "embed_bert_mean", {"text": t}), texts * 3))
    np.testing.assert_allclose(answers, np.concatenate([model.encode(texts)] * 3), rtol=0, atol=ATOL)
    # the answers may come a moment before Triton has counted the last inference
    after, settled = counts(), time.monotonic() + 10
    while after[0] - before[0] < 24 and time.monotonic() < settled:
        time.sleep(0.05)
        after = counts()
    inferences, executions = after[0] - before[0], after[1] - before[1]
    print(f"24 texts from 8 callers: {inferences} inferences in {executions} executions")
    assert inferences == 24 and executions < inferences  # Triton's dynamic batcher ran some together


def test_json_lines_answer_each_line_in_order(text_stack):
    lines = [
        {"modelname": "sentiment_bert", "payload": {"text": CORPUS[0]}},
        {"modelname": "embed_bert_mean", "payload": {"text": CORPUS[1]}},
        {"modelname": "ner_bert", "payload": {"text": CORPUS[4], "aggregation_strategy": "simple"}},
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines)
    r = post(text_stack, body.encode(), "application/jsonlines")
    assert r.status_code == 200, r.text
    answers = [json.loads(line) for line in r.text.splitlines()]
    assert [a["modelname"] for a in answers] == [line["modelname"] for line in lines]
    for answer, line in zip(answers, lines):
        alone = result(text_stack, line["modelname"], line["payload"])
        assert json.dumps(answer["result"]) == json.dumps(alone)


@pytest.mark.parametrize(
    ("model", "payload", "fragments"),
    [
        ("sentiment_bert", {"text": LONG_TEXT}, ["payload.text", "tokens", "limit of 64", "truncation"]),
        ("ner_bert", {"text": LONG_TEXT}, ["payload.text", "limit of 64", "stride"]),
        ("sentiment_bert", {"text": ["a", 5]}, ["payload.text[1]", "string"]),
        ("sentiment_bert", {"text": ["a", "b"], "text_pair": ["c"]}, ["payload.text_pair", "as long as"]),
        ("sentiment_bert", {"text": "a", "function_to_apply": "tanh"}, ["payload.function_to_apply"]),
        ("ner_bert", {"text": "a", "aggregation_strategy": "longest"}, ["payload.aggregation_strategy"]),
        ("ner_bert", {"text": "a", "stride": 8}, ["payload.stride", "aggregation_strategy"]),
        ("ner_bert", {"text": "a", "stride": 500, "aggregation_strategy": "first"}, ["payload.stride", "between"]),
        ("embed_bert_mean", {"text": "a", "normalize": 1}, ["payload.normalize", "true or false"]),
        ("embed_bert_mean", {"text": "a", "prompt_name": "answer"}, ["payload.prompt_name", "'query', 'document'"]),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_the_endpoint_keeps_serving(text_stack, model, payload, fragments):
    assert_error(invoke(text_stack, model, payload), 400, "invalid_input", *fragments)
    assert text_stack.ping().status_code == 200
    assert len(result(text_stack, model, {"text": CORPUS[0]})) > 0


def test_invoke_prints_each_familys_answer(text_stack, tmp_path):
    """python -m scripts.caller invoke with MODEL=FILE pairs: a raw text body for each text family."""
    import subprocess
    import sys

    from app.core.settings import PROJECT_ROOT

    text = tmp_path / "text.txt"
    text.write_text(CORPUS[4])
    pairs = [f"{model}={text}" for model in ("sentiment_bert", "ner_bert", "embed_bert_mean")]
    done = subprocess.run(
        [sys.executable, "-m", "scripts.caller", "invoke", "--endpoint-url", text_stack.url, *pairs],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sentiment, rest = done.stdout.split("ner_bert (version 1):")
    ner, embedding = rest.split("embed_bert_mean (version 1):")
    assert "sentiment_bert (version 1):" in sentiment and ("NEGATIVE" in sentiment or "POSITIVE" in sentiment)
    assert "[" in ner and ":" in ner  # entity word [start:end]
    assert "32-dimensional vector" in embedding and "L2 norm 1.0000" in embedding


def test_a_text_model_archive_loads_answers_and_unloads_on_a_multi_model_endpoint(
    models, small_models, tmp_path, new_stack
):
    """The multi-model contract with a text model: prepared in place (its folder holds its weights),
    packaged as SageMaker takes it (the weights stay out: the archive holds the graph, the config and
    what the router reads), extracted, loaded, invoked (equal to the pipeline), counted in the
    per-model metrics, and unloaded."""

    names, extracted = multi_model_archive(models, "sentiment_bert", tmp_path, small_models.cache)
    assert "sentiment_bert/hf/tokenizer.json" in names and "sentiment_bert/1/model.onnx" in names
    assert not any(name.endswith(".safetensors") for name in names), sorted(names)
    (tmp_path / "empty").mkdir()
    stack = new_stack(
        tmp_path / "empty", SAGEMAKER_MULTI_MODEL="true", MULTI_MODEL_DIR=str(tmp_path / "state"), **ONE_INSTANCE
    )
    stack.wait_healthy(timeout=180)
    loaded = requests.post(f"{stack.url}/models", json={"model_name": "hsent", "url": str(extracted)}, timeout=180)
    assert loaded.status_code == 200, loaded.text
    pipe = reference("text-classification", models, "sentiment_bert")
    r = requests.post(f"{stack.url}/models/hsent/invoke", json={"payload": {"text": CORPUS[3], "topk": 2}}, timeout=60)
    assert r.status_code == 200, r.text
    assert_classes(r.json()["result"], pipe(CORPUS[3], top_k=2))
    assert 'model="hsent"' in requests.get(f"{stack.url}/metrics", timeout=30).text
    assert requests.delete(f"{stack.url}/models/hsent", timeout=60).status_code == 200
    gone = requests.post(f"{stack.url}/models/hsent/invoke", json={"payload": {"text": "a"}}, timeout=60)
    assert gone.status_code == 404, gone.text


def test_the_openai_package_s_embeddings_are_the_envelope_s(text_stack, models):
    """``OpenAI(base_url=".../v1").embeddings.create``: the vectors sentence-transformers makes, as
    floats or base64; the tokens read in ``usage``; a model of another family a 400 in OpenAI's shape."""
    import openai
    from sentence_transformers import SentenceTransformer

    client = openai.OpenAI(base_url=f"{text_stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    model = SentenceTransformer(str(models / "embed_bert_mean" / "hf"), device="cpu")
    texts = list(CORPUS[:3])
    found = client.embeddings.create(model="embed_bert_mean", input=texts, encoding_format="float")
    assert [item.index for item in found.data] == [0, 1, 2] and found.model == "embed_bert_mean"
    np.testing.assert_allclose([item.embedding for item in found.data], model.encode(texts), rtol=0, atol=ATOL)
    tokens = sum(len(model.tokenizer(text).input_ids) for text in texts)
    assert found.usage.prompt_tokens == found.usage.total_tokens == tokens
    # the package's default asks for base64 and decodes it: the same vectors
    decoded = client.embeddings.create(model="embed_bert_mean", input=texts[0])
    np.testing.assert_allclose(decoded.data[0].embedding, found.data[0].embedding, rtol=0, atol=1e-7)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="sentiment_bert", input="hi")
    assert "is a text_classification model" in refused.value.body["message"]
    assert {model.id: model.owned_by for model in client.models.list()}["embed_bert_mean"] == "sentence_embedding"
    r = requests.post(f"{text_stack.url}/v1/embeddings", json={"model": "embed_bert_mean", "input": [1, 2]}, timeout=30)
    assert r.status_code == 400 and "token ids are not taken" in r.json()["error"]["message"]
