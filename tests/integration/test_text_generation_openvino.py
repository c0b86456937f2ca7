"""The text_generation family on OpenVINO GenAI (``[export] engine = "openvino"``) through the whole
stack (NGINX, gunicorn, the router, a real Triton whose decoupled python-backend model steps GenAI's
continuous-batching pipeline) against Hugging Face's ``model.generate`` on the same folders: the
small-model set ``causal_openvino``, a tiny random-weight folder of each architecture the engine serves.

Greedy answers are ``generate``'s token for token in the payload, TGI and chat forms, streamed or
whole; eight callers at once each get their own; a conversation's next turn (its start already in the
prefix cache) answers as ``generate`` does; a caller that leaves ends its generation in Triton;
bad input is a 400 naming the field and the stack keeps serving."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from scripts.devtools import Stack
from scripts.model_prep.small_models.sets import SETS, Built
from tests.causal_serving import (
    assert_greedy_is_generate,
    generate,
    long_copy,
    references_of,
    result,
    streamed,
    triton_metric,
)
from tests.references import served_copy
from tests.support import assert_error, post

pytestmark = pytest.mark.integration

MODELS = tuple(name for name in SETS["causal_openvino"].models if name.endswith("_openvino"))
INT8 = "llama_int8"  # the trained Llama with int8 weights
LONG = "llama_openvino_long"  # llama_openvino with 2,048 positions: a generation long enough to leave
PROMPTS = ("The quick brown fox", "Hello there, how are", "Le café est")


@pytest.fixture(scope="module")
def models(small_models: Built) -> Path:
    return small_models.models("causal_openvino")


@pytest.fixture(scope="module")
def stack(small_models: Built, tmp_path_factory, stopping: list[Stack]):
    shared = small_models.repository("causal_openvino")
    repository = served_copy(shared, (*MODELS, INT8), tmp_path_factory.mktemp("repository"))
    long_copy(shared, repository, "llama_openvino", LONG, 2048)
    started = Stack(repository).start(tmp_path_factory.mktemp("openvino-stack-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


@pytest.fixture(scope="module")
def references(models: Path):
    return references_of(models, MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_greedy_answers_equal_generate_token_for_token(stack, references, name):
    wanted = assert_greedy_is_generate(stack, references, name, PROMPTS)
    events, _, _ = streamed(
        stack, {"modelname": name, "payload": {"text": PROMPTS[2], "max_new_tokens": 12, "stream": True}}
    )
    assert "".join(e["token"]["text"] for e in events) == wanted[2][1] == events[-1]["generated_text"]


def chat_generate(references, name: str, messages: list[dict], new: int) -> tuple[str, int]:
    """``generate`` over the folder's chat template: the answer's text and the prompt's tokens."""
    import torch

    model, tokenizer = references[name]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        found = model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=tokenizer.pad_token_id or 0)
    return tokenizer.decode(found[0, ids.shape[1] :], skip_special_tokens=True), ids.shape[1]


def test_a_conversation_s_turns_answer_as_generate_with_their_start_in_the_prefix_cache(stack, references):
    """Each turn's prompt starts as the one before did (the earlier turns and their answers): GenAI
    reads that start from its prefix cache, and the answer is still ``generate``'s for the whole."""
    name = "qwen2_openvino"
    messages = [{"role": "system", "content": "Be brief."}]
    for turn in ("Où est le café?", "And the fox?", "Merci!"):
        messages.append({"role": "user", "content": turn})
        r = post(stack, {"model": name, "messages": messages, "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        text, prompt_tokens = chat_generate(references, name, messages, 8)
        answer = r.json()
        assert answer["choices"][0]["message"] == {"role": "assistant", "content": text}
        assert answer["usage"]["prompt_tokens"] == prompt_tokens
        messages.append({"role": "assistant", "content": text})


def test_eight_callers_at_once_each_get_their_own_answer(stack, references):
    prompts = [f"{PROMPTS[i % 3]} {i}" for i in range(8)]
    wanted = [generate(references, "llama_openvino", p, max_new_tokens=20, do_sample=False)[1] for p in prompts]

    def one(i: int) -> str:
        payload = {"text": prompts[i], "max_new_tokens": 20, "do_sample": False}
        if i % 2:
            events, _, _ = streamed(stack, {"modelname": "llama_openvino", "payload": {**payload, "stream": True}})
            return events[-1]["generated_text"]
        return result(stack, "llama_openvino", payload)["generated_text"]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, range(8))) == wanted


def test_a_seeded_sample_repeats_itself_whoever_it_runs_beside(stack):
    payload = {"text": PROMPTS[0], "max_new_tokens": 16, "do_sample": True, "temperature": 1.5, "seed": 7}
    alone = result(stack, "phi3_openvino", payload)["generated_text"]
    with ThreadPoolExecutor(4) as pool:
        others = [pool.submit(result, stack, "phi3_openvino", {**payload, "seed": s}) for s in (1, 2, 3)]
        again = result(stack, "phi3_openvino", payload)["generated_text"]
        differing = {f.result()["generated_text"] for f in others}
    assert again == alone
    assert len(differing | {alone}) > 1


def test_a_caller_that_leaves_ends_its_generation_in_triton(stack):
    model = LONG
    before = triton_metric(stack, "cancelled", model)
    body = json.dumps({"modelname": model, "payload": {"text": "hello", "max_new_tokens": 1000, "stream": True}})
    with socket.create_connection(("127.0.0.1", stack.port), timeout=30) as connection:
        head = f"POST /invocations HTTP/1.1\r\nHost: local\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        connection.sendall(head.encode() + body.encode())
        received = b""
        while b"data: " not in received:
            chunk = connection.recv(4096)
            assert chunk, received
            received += chunk
    deadline = time.monotonic() + 20
    while triton_metric(stack, "cancelled", model) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    finished = triton_metric(stack, "finished", model)
    assert triton_metric(stack, "cancelled", model) == before + 1, finished
    events, _, _ = streamed(stack, {"modelname": model, "payload": {"text": "hi", "max_new_tokens": 5, "stream": True}})
    assert len(events) == 5
    # the engine's gauges: nothing running or waiting once the last stream ended, its cache's use a share
    text = requests.get(f"http://127.0.0.1:{stack.triton_ports[2]}/metrics", timeout=10).text
    gauges = {
        line.split("{")[0] + ("/" + line.split('state="')[1].split('"')[0] if "state=" in line else ""): float(
            line.split()[-1]
        )
        for line in text.splitlines()
        if f'model="{model}"' in line and line.startswith(("text_generation_requests_now", "text_generation_kv_cache"))
    }
    assert gauges["text_generation_requests_now/running"] == 0 and gauges["text_generation_requests_now/waiting"] == 0
    assert 0 <= gauges["text_generation_kv_cache_usage_ratio"] <= 1, gauges


@pytest.mark.parametrize(
    "payload, fragments",
    [
        ({"text": "hi", "max_new_tokens": 500}, ["max_new_tokens"]),
        ({"text": "hi " * 200}, ["tokens", "128"]),
        ({"text": "hi", "top_p": 1.5}, ["top_p"]),
    ],
    ids=["max_new_tokens", "context", "top_p"],
)
def test_bad_input_is_a_400_and_the_stack_keeps_serving(stack, payload, fragments):
    r = post(stack, {"modelname": "llama_openvino", "payload": payload})
    assert_error(r, 400, "invalid_input", *fragments)
    assert requests.get(f"{stack.url}/ping", timeout=10).status_code == 200
    assert result(stack, "llama_openvino", {"text": "hi", "max_new_tokens": 3})["generated_tokens"] == 3


def test_the_int8_model_still_continues_its_trained_sentences(stack):
    """The trained Llama learnt to finish a few sentences; with int8 weights it still finishes them (its
    agreement with float32 was checked at preparation, at least MIN_AGREEMENT)."""
    from scripts.model_prep.small_models.causal import SENTENCES

    for start in ("The quick brown fox", "Tokyo is the capital"):
        found = result(stack, INT8, {"text": start, "max_new_tokens": 30, "do_sample": False})
        sentence = next(s for s in SENTENCES if s.startswith(start))
        assert f"{start} {found['generated_text']}".startswith(sentence[: len(start) + 12]), found
        assert found["finish_reason"] == "eos_token"
