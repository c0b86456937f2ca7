"""The text2text family through the whole stack (NGINX, gunicorn, the router, a real Triton whose
python backend runs ``generate`` over ONNX Runtime) against Hugging Face's ``model.generate`` on the
same folders: a small trained T5 (SentencePiece / Unigram) and BART (byte-level BPE), the
"text2text_stack" set of scripts.model_prep.small_models (built once per run, prepared by
``python -m scripts.model_prep``), served from a copy of their own.

Equal means the decoded text of ``generate`` for that text alone (``skip_special_tokens=True``),
exactly. Both request forms, JSON Lines, eight callers at once with different texts (each compared
with its own reference; Triton's statistics show them batched), bad input (400s naming the field,
the endpoint keeps serving), a generation past its deadline (504 naming it, then the next request
is served), the tokens generated on /metrics, and a multi-model endpoint's load and unload."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from scripts.devtools import Stack
from scripts.model_prep.small_models.encoders import CORPUS
from scripts.model_prep.small_models.sets import SETS, Built
from scripts.sagemaker.model_archives import multi_model_archive
from tests.references import served_copy
from tests.support import ONE_INSTANCE, assert_conforms, assert_error, post

pytestmark = pytest.mark.integration

MODELS = {name: options["kind"] for name, (_, options) in SETS["text2text_stack"].models.items()}
# Triton's deadline for a call, and so the longest a text may generate (less the router's margin):
# short enough that the deadline test is quick, long enough for every other request here.
TRITON_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def models(small_models: Built) -> Path:
    return small_models.models("text2text_stack")


# A Triton model as AWS's T5 example on a SageMaker multi-model endpoint writes it: the python
# backend running the PyTorch model's generate, no model.toml; callers send v2 JSON token ids.
SEED_CONFIG = """name: "t5_pytorch"
backend: "python"
max_batch_size: 8
input: [ { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "attention_mask" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "output" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group { count: 1 kind: KIND_CPU }
dynamic_batching { }
"""
SEED_MODEL = """
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModelForSeq2SeqLM


class TritonPythonModel:
    def initialize(self, args):
        self.model = AutoModelForSeq2SeqLM.from_pretrained(Path(__file__).parent / "hf").eval()

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            with torch.no_grad():
                out = self.model.generate(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long())
            tensor = pb_utils.Tensor("output", out.numpy().astype(np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
"""


@pytest.fixture(scope="module")
def gen_stack(models: Path, small_models: Built, tmp_path_factory, stopping: list[Stack]):
    repository = served_copy(small_models.repository("text2text_stack"), MODELS, tmp_path_factory.mktemp("repository"))
    seed = repository / "t5_pytorch"
    shutil.copytree(models / "t5_gen" / "hf", seed / "1" / "hf")
    (seed / "config.pbtxt").write_text(SEED_CONFIG)
    (seed / "1" / "model.py").write_text(SEED_MODEL)
    started = Stack(repository, env_extra={"TRITON_TIMEOUT_S": str(TRITON_TIMEOUT_S), **ONE_INSTANCE})
    started.start(tmp_path_factory.mktemp("text2text-stack-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


@pytest.fixture(scope="module")
def references(models: Path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return {
        name: (
            AutoModelForSeq2SeqLM.from_pretrained(models / name / "hf").eval(),
            AutoTokenizer.from_pretrained(models / name / "hf"),
        )
        for name in MODELS
    }


def generated(references, name: str, text: str, **settings) -> str:
    import torch

    model, tokenizer = references[name]
    with torch.no_grad():
        ids = model.generate(**tokenizer(text, return_tensors="pt"), **settings)[0]
    return tokenizer.decode(ids, skip_special_tokens=True)


def causal_generated(folder: Path, text: str, max_new_tokens: int) -> str:
    """A decoder-only model's ``generate`` for ``text``: its new tokens, decoded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False)[0]
    return tokenizer.decode(ids[encoded.input_ids.shape[1] :], skip_special_tokens=True)


def result(stack: Stack, model: str, payload: dict):
    r = post(stack, {"modelname": model, "payload": payload})
    assert_conforms(r, "/invocations", "POST")
    assert r.status_code == 200, r.text[:500]
    return r.json()["result"]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    "settings",
    [{}, {"num_beams": 4, "max_new_tokens": 12}, {"num_beams": 3, "no_repeat_ngram_size": 2, "length_penalty": 0.6}],
    ids=["defaults", "beam", "penalties"],
)
def test_answers_equal_generate(gen_stack, references, name, settings):
    texts = CORPUS[:5]
    answers = result(gen_stack, name, {"text": texts, **settings})
    assert answers == [{"generated_text": generated(references, name, t, **settings)} for t in texts]
    assert result(gen_stack, name, {"text": texts[0], **settings}) == answers[0]


def test_a_raw_text_body_takes_its_settings_from_the_custom_attributes(gen_stack, references):
    r = post(
        gen_stack, CORPUS[2], content_type="text/plain", attributes="modelname=t5_gen,num_beams=2,max_new_tokens=6"
    )
    assert r.status_code == 200, r.text
    assert r.json()["result"] == {
        "generated_text": generated(references, "t5_gen", CORPUS[2], num_beams=2, max_new_tokens=6)
    }


def test_json_lines_answer_each_line_with_its_own_settings(gen_stack, references):
    lines = [
        {"modelname": "bart_gen", "payload": {"text": CORPUS[0], "num_beams": 2}},
        {"modelname": "bart_gen", "payload": {"text": [CORPUS[1], CORPUS[3]], "max_new_tokens": 3}},
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines)
    r = post(gen_stack, body, content_type="application/jsonlines")
    assert r.status_code == 200, r.text
    answers = [json.loads(line)["result"] for line in r.text.splitlines()]
    assert answers == [
        {"generated_text": generated(references, "bart_gen", CORPUS[0], num_beams=2)},
        [{"generated_text": generated(references, "bart_gen", t, max_new_tokens=3)} for t in (CORPUS[1], CORPUS[3])],
    ]


def test_callers_at_once_each_get_their_own_answer_and_meet_in_one_batch(gen_stack, references):
    """Eight callers, each a different text, at once: each answer equals that text's own generate,
    whoever it was batched with; Triton ran them in fewer executions than inferences."""
    stats = f"http://127.0.0.1:{gen_stack.triton_ports[0]}/v2/models/t5_gen/stats"

    def counts() -> tuple[int, int]:
        entry = requests.get(stats, timeout=10).json()["model_stats"][0]
        return int(entry["inference_count"]), int(entry["execution_count"])

    texts = [" ".join(line.split()[i % 3 :]) for i, line in enumerate(CORPUS[:8])]
    before = counts()
    for _ in range(3):  # three rounds: the batcher joins callers when they arrive together
        with ThreadPoolExecutor(len(texts)) as pool:
            answers = list(pool.map(lambda t: result(gen_stack, "t5_gen", {"text": t, "num_beams": 2}), texts))
        assert answers == [{"generated_text": generated(references, "t5_gen", t, num_beams=2)} for t in texts]
    inferences, executions = (after - then for after, then in zip(counts(), before))
    print(f"{inferences} texts from {len(texts)} callers x 3 rounds: {executions} executions")
    assert inferences == 3 * len(texts) and executions < inferences


@pytest.mark.parametrize(
    "payload, fragments",
    [
        ({"text": " ".join(CORPUS * 3)}, ["payload.text is", "over the model's limit of 64", '"truncation": true']),
        ({"text": 5}, ["payload.text must be a string"]),
        ({"text": "a", "do_sample": True}, ["payload.do_sample", "sampling is not served"]),
        ({"text": "a", "num_beams": 9}, ["payload.num_beams must be between 1 and 8"]),
        ({"text": "a", "max_new_tokens": 513}, ["payload.max_new_tokens must be between 1 and 512"]),
        ({"text": "a", "max_new_tokens": 2, "min_new_tokens": 3}, ["payload.min_new_tokens (3)"]),
        ({"text": "a", "top_k": 5}, ["payload.top_k is not an option"]),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_the_endpoint_keeps_serving(gen_stack, payload, fragments):
    r = post(gen_stack, {"modelname": "t5_gen", "payload": payload})
    assert_conforms(r, "/invocations", "POST")
    assert_error(r, 400, "invalid_input", *fragments)
    assert requests.get(f"{gen_stack.url}/ping", timeout=10).status_code == 200
    assert result(gen_stack, "t5_gen", {"text": CORPUS[0], "max_new_tokens": 4})


def test_a_generation_past_its_deadline_is_a_504_naming_it_and_the_next_request_is_served(gen_stack, references):
    # 16 texts x 8 beams x 512 tokens with n-gram blocking: many seconds of work, stopped at the deadline
    texts = [CORPUS[i % len(CORPUS)] for i in range(16)]
    long = {"text": texts, "max_new_tokens": 512, "min_new_tokens": 512, "num_beams": 8, "no_repeat_ngram_size": 3}
    r = post(gen_stack, {"modelname": "t5_gen", "payload": long})
    assert_conforms(r, "/invocations", "POST")
    assert_error(r, 504, "inference_timeout", "generation stopped at its deadline", "TRITON_TIMEOUT_S")
    assert result(gen_stack, "t5_gen", {"text": CORPUS[1]}) == {
        "generated_text": generated(references, "t5_gen", CORPUS[1])
    }


def test_the_tokens_generated_are_counted_per_model(gen_stack):
    def counted() -> float:
        for line in requests.get(f"{gen_stack.url}/metrics", timeout=30).text.splitlines():
            if line.startswith('router_generated_tokens_total{model="bart_gen"}'):
                return float(line.split()[-1])
        return 0.0

    before = counted()
    result(gen_stack, "bart_gen", {"text": CORPUS[5], "max_new_tokens": 7, "min_new_tokens": 7})
    assert counted() - before == 7


def test_invoke_prints_the_generated_text(gen_stack, references, tmp_path):
    """python -m scripts.caller invoke MODEL=FILE with a setting: a raw text body, the text printed."""
    import subprocess
    import sys

    from app.core.settings import PROJECT_ROOT

    text = tmp_path / "text.txt"
    text.write_text(CORPUS[6])
    done = subprocess.run(
        [sys.executable, "-m", "scripts.caller", "invoke", "--endpoint-url", gen_stack.url]
        + ["--option", "num_beams=2", f"t5_gen={text}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "t5_gen (version 1):" in done.stdout
    assert generated(references, "t5_gen", CORPUS[6], num_beams=2) in done.stdout


def test_a_python_backend_t5_folder_as_aws_example_writes_it_is_served_unchanged_through_kserve_v2(
    gen_stack, references
):
    tokenizer = references["t5_gen"][1]
    ids = tokenizer(CORPUS[6]).input_ids
    body = {
        "inputs": [
            {"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT32", "data": ids},
            {"name": "attention_mask", "shape": [1, len(ids)], "datatype": "INT32", "data": [1] * len(ids)},
        ]
    }
    r = requests.post(
        f"{gen_stack.url}/invocations",
        json=body,
        headers={"X-Amzn-SageMaker-Custom-Attributes": "modelname=t5_pytorch"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    output = r.json()["outputs"][0]
    answer = tokenizer.decode(output["data"], skip_special_tokens=True)
    assert answer == generated(references, "t5_gen", CORPUS[6]) == " ".join(CORPUS[6].split()[:3])


def test_a_kserve_v2_body_of_the_tokens_alone_is_generated_with_the_folders_settings(gen_stack, references):
    """Our text2text model through KServe v2: the settings and timeout_ms are optional inputs, so a
    body may send the tokens alone; the answer is what ``generate`` gives the text with no settings."""
    tokenizer = references["t5_gen"][1]
    for text in (CORPUS[6], CORPUS[1]):
        one = tokenizer(text).input_ids
        body = {
            "inputs": [
                {"name": "input_ids", "shape": [1, len(one)], "datatype": "INT64", "data": one},
                {"name": "attention_mask", "shape": [1, len(one)], "datatype": "INT64", "data": [1] * len(one)},
            ]
        }
        headers = {"X-Amzn-SageMaker-Custom-Attributes": "modelname=t5_gen"}
        r = requests.post(f"{gen_stack.url}/invocations", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        (output,) = r.json()["outputs"]
        answer = tokenizer.decode([t for t in output["data"] if t >= 0], skip_special_tokens=True)
        assert answer == generated(references, "t5_gen", text) != ""


def test_generation_archives_load_answer_and_unload_on_a_multi_model_endpoint(
    models, small_models, references, tmp_path, new_stack
):
    """A text2text archive and a text_generation one (a decoupled model, streamed as on a single-model
    endpoint when called locally), each loaded, called and unloaded."""
    names, extracted = multi_model_archive(models, "t5_gen", tmp_path / "t5", small_models.cache)
    causal_names, causal = multi_model_archive(
        small_models.models("causal"), "llama_trained", tmp_path / "causal", small_models.cache
    )
    assert {
        "llama_trained/1/decoder.onnx",
        "llama_trained/1/model.py",
        "llama_trained/hf/tokenizer.json",
    } <= causal_names
    assert {"t5_gen/1/encoder.onnx", "t5_gen/1/decoder_init.onnx", "t5_gen/1/decoder_step.onnx"} <= names
    assert "t5_gen/1/model.py" in names and "t5_gen/hf/tokenizer.json" in names
    assert not any(name.endswith(".safetensors") for name in names), sorted(names)
    (tmp_path / "empty").mkdir()
    stack = new_stack(
        tmp_path / "empty", SAGEMAKER_MULTI_MODEL="true", MULTI_MODEL_DIR=str(tmp_path / "state"), **ONE_INSTANCE
    )
    stack.wait_healthy(timeout=180)
    loaded = requests.post(
        f"{stack.url}/models",
        json={"model_name": "translator", "url": str(extracted)},
        timeout=180,
    )
    assert loaded.status_code == 200, loaded.text
    r = requests.post(f"{stack.url}/models/translator/invoke", json={"payload": {"text": CORPUS[3]}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["result"] == {"generated_text": generated(references, "t5_gen", CORPUS[3])}
    assert 'router_generated_tokens_total{model="translator"}' in requests.get(f"{stack.url}/metrics", timeout=30).text
    assert requests.delete(f"{stack.url}/models/translator", timeout=60).status_code == 200
    gone = requests.post(f"{stack.url}/models/translator/invoke", json={"payload": {"text": "a"}}, timeout=60)
    assert gone.status_code == 404, gone.text
    loaded = requests.post(f"{stack.url}/models", json={"model_name": "writer", "url": str(causal)}, timeout=180)
    assert loaded.status_code == 200, loaded.text
    body = {"payload": {"text": "The quick brown fox", "max_new_tokens": 30}}
    r = requests.post(f"{stack.url}/models/writer/invoke", json=body, timeout=60)
    assert r.status_code == 200, r.text
    whole = r.json()["result"]["generated_text"]
    assert whole == causal_generated(small_models.models("causal") / "llama_trained" / "hf", "The quick brown fox", 30)
    body["payload"]["stream"] = True
    streamed = requests.post(f"{stack.url}/models/writer/invoke", json=body, timeout=60)
    assert streamed.headers["Content-Type"].startswith("text/event-stream")
    events = [json.loads(block[len("data: ") :]) for block in streamed.text.split("\n\n")[:-1]]
    assert events[-1]["generated_text"] == whole
    # TGI's, OpenAI's chat and completions bodies, as SageMaker passes them to a loaded model
    tgi = {
        "inputs": "The quick brown fox",
        "parameters": {"max_new_tokens": 30, "details": True, "decoder_input_details": True},
    }
    r = requests.post(f"{stack.url}/models/writer/invoke", json=tgi, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()[0]["generated_text"] == whole and r.json()[0]["details"]["prefill"][1]["logprob"] < 0
    completion = {"prompt": "The quick brown fox", "max_tokens": 30, "temperature": 0, "echo": True, "logprobs": 2}
    r = requests.post(f"{stack.url}/models/writer/invoke", json=completion, timeout=60)
    assert r.status_code == 200, r.text
    assert (
        r.json()["choices"][0]["text"] == "The quick brown fox" + whole and r.json()["model"] == "llama_trained"
    )  # the folder's name, as the envelope's modelname
    chat = {
        "messages": [{"role": "user", "content": "A man is riding"}],
        "max_tokens": 5,
        "response_format": {"type": "json_object"},
    }
    r = requests.post(f"{stack.url}/models/writer/invoke", json=chat, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion" and r.json()["choices"][0]["message"]["content"].startswith("{")
    assert requests.delete(f"{stack.url}/models/writer", timeout=60).status_code == 200
