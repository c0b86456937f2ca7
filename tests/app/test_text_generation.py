"""The text_generation family through the Flask app, with a stand-in for Triton's token stream
(``tests.tiny_causal.FakeGenerator``): the envelope, TGI's and OpenAI's chat forms, whole and streamed
(server-sent events), their shapes, stop sequences, a caller that leaves mid-stream, errors before and
after the stream starts, and the checks that refuse a request before Triton sees it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from app.core.errors import InferenceTimeout, TritonUnavailable
from app.core.settings import Settings
from app.router import create_app
from tests.support import ATTRIBUTES, assert_error
from tests.tiny_causal import FakeGenerator, write_folder

REPLY = "Paris is the capital of France. 日本 🚀"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]


EOS = {"chat": "<|im_end|>", "plain": "</s>"}


def reply_ids(tokenizer, eos: str) -> list[int]:
    return [*tokenizer.encode(REPLY, add_special_tokens=False).ids, tokenizer.token_to_id(eos)]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("generation")
    write_folder(root, "chat", "byte_level", "chatml", positions=64, generation={"max_new_tokens": 40})
    write_folder(root, "plain", "byte_fallback", None, positions=48)
    return root


@pytest.fixture(scope="module")
def tokenizers(repository):
    """Each model's own tokenizer (a training is not repeatable: the folder's file is the one)."""
    return {name: Tokenizer.from_file(str(repository / name / "hf" / "tokenizer.json")) for name in EOS}


@pytest.fixture
def triton(tokenizers):
    return FakeGenerator({name: reply_ids(tokenizers[name], EOS[name]) for name in EOS}, delay=0.001)


@pytest.fixture
def app(repository, triton):
    return create_app(Settings(model_repository=repository, max_batch_items=8), triton=triton)


@pytest.fixture
def client(app):
    return app.test_client()


def post(client, body, attributes=None, **kwargs):
    headers = {ATTRIBUTES: attributes} if attributes else {}
    return client.post(
        "/invocations", data=json.dumps(body), content_type="application/json", headers=headers, **kwargs
    )


def events(response) -> list:
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "text/event-stream"
    assert response.headers["X-Accel-Buffering"] == "no"
    text = response.get_data(as_text=True)
    response.close()  # as a WSGI server closes a body it has sent
    assert text.endswith("\n\n")
    found = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: ")
        data = block[len("data: ") :]
        found.append(data if data == "[DONE]" else json.loads(data))
    return found


def test_the_envelope_whole_and_streamed(client, triton, tokenizers):
    tokenizer = tokenizers["chat"]
    response = post(client, {"modelname": "chat", "payload": {"text": "Capital of France?"}})
    assert response.status_code == 200, response.get_data(as_text=True)
    result = response.get_json()["result"]
    prompt, generated = len(tokenizer.encode("Capital of France?").ids), len(reply_ids(tokenizer, EOS["chat"]))
    assert result == {
        "generated_text": REPLY,
        "finish_reason": "eos_token",
        "prompt_tokens": prompt,
        "generated_tokens": generated,
    }
    _, inputs, stream = triton.streams[-1]
    assert inputs["input_ids"].tolist() == tokenizer.encode("Capital of France?").ids
    assert inputs["input_ids"].dtype == np.int64 and inputs["max_new_tokens"].tolist() == [40]  # the folder's
    assert inputs["seed"].tolist() == [-1] and inputs["do_sample"].dtype == np.bool_
    assert 0 < inputs["timeout_ms"][0] <= 30_000 and not stream.cancelled
    streamed = events(post(client, {"modelname": "chat", "payload": {"text": "Capital of France?", "stream": True}}))
    assert "".join(e["token"]["text"] for e in streamed) == REPLY
    assert [e["generated_text"] for e in streamed] == [None] * (len(streamed) - 1) + [REPLY]
    assert set(streamed[0]) == {"index", "token", "generated_text", "details"}
    assert set(streamed[0]["token"]) == {"id", "text", "logprob", "special"}


def test_a_list_is_generated_together_in_order(client, triton, tokenizers):
    texts = ["hello", "hello world, the quick", "Paris"]
    body = {"modelname": "plain", "payload": {"text": texts, "max_new_tokens": 3, "return_full_text": True}}
    response = post(client, body)
    assert response.status_code == 200, response.get_data(as_text=True)
    results = response.get_json()["result"]
    tokenizer = tokenizers["plain"]
    first = tokenizer.decode(reply_ids(tokenizer, EOS["plain"])[:3], skip_special_tokens=True)
    assert [r["generated_text"] for r in results] == [text + first for text in texts]
    assert [r["finish_reason"] for r in results] == ["length"] * 3
    assert [inputs["input_ids"].tolist() for _, inputs, _ in triton.streams] == [
        tokenizer.encode(text).ids
        for text in texts  # each with its BOS
    ]


def test_tgi_whole_streamed_and_stopped(client, triton):
    body = {"inputs": "Capital of France?", "parameters": {"max_new_tokens": 30, "details": True, "stop": ["capital"]}}
    (answer,) = post(client, body, "modelname=chat").get_json()
    assert answer["generated_text"] == "Paris is the capital"  # TGI keeps the stop sequence
    details = answer["details"]
    assert details["finish_reason"] == "stop_sequence" and details["seed"] is None
    assert "".join(t["text"] for t in details["tokens"]) == answer["generated_text"]
    assert details["generated_tokens"] == len(details["tokens"]) < 20
    assert triton.streams[-1][2].cancelled  # the generation ended at the stop
    streamed = events(post(client, {**body, "stream": True}, "modelname=chat"))
    assert "".join(e["token"]["text"] for e in streamed) == answer["generated_text"]
    assert streamed[-1]["generated_text"] == answer["generated_text"]
    assert streamed[-1]["details"] == {
        "finish_reason": "stop_sequence",
        "generated_tokens": len(streamed),
        "seed": None,
    }
    plain = post(client, {"inputs": "Capital?", "parameters": {"temperature": 0.5, "seed": 7}}, "modelname=chat")
    assert plain.get_json() == [{"generated_text": REPLY}]
    inputs = triton.streams[-1][1]
    assert inputs["do_sample"].tolist() == [True] and inputs["seed"].tolist() == [7]  # TGI: a warper samples


def test_chat_whole_and_streamed(client, triton, app, tokenizers):
    generated = len(reply_ids(tokenizers["chat"], EOS["chat"]))
    response = post(client, {"model": "chat", "messages": CHAT, "max_tokens": 20, "stop": ". 日"})
    completion = response.get_json()
    assert response.status_code == 200, completion
    assert completion["object"] == "chat.completion" and completion["model"] == "chat"
    assert completion["id"].startswith("chatcmpl-") and isinstance(completion["created"], int)
    (choice,) = completion["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Paris is the capital of France"}  # OpenAI: cut
    assert choice["finish_reason"] == "stop"
    prompt = app.extensions["registry"]["chat"].encode_chat(CHAT)
    assert triton.streams[-1][1]["input_ids"].tolist() == prompt
    usage = completion["usage"]
    assert usage["prompt_tokens"] == len(prompt) and usage["total_tokens"] == len(prompt) + usage["completion_tokens"]
    body = {"model": "chat", "messages": CHAT, "stream": True, "stream_options": {"include_usage": True}}
    streamed = events(post(client, body))
    assert streamed[-1] == "[DONE]" and streamed[-2]["usage"]["completion_tokens"] == generated
    chunks = streamed[:-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == REPLY
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    whole = post(client, {"model": "chat", "messages": CHAT}).get_json()
    assert whole["choices"][0]["message"]["content"] == REPLY


def test_the_model_a_body_names(client, repository, triton):
    assert_error(post(client, {"inputs": "hi"}), 400, "invalid_input", "names no model", "chat, plain")
    assert_error(post(client, {"model": "nope", "messages": CHAT}), 404, "unknown_model", "nope")
    assert_error(post(client, {"model": "plain", "messages": CHAT}), 400, "invalid_input", "no chat template")
    alone = create_app(Settings(model_repository=repository / "alone"), registry={}, triton=triton).test_client()
    assert_error(post(alone, {"inputs": "hi"}), 400, "invalid_input", "no text_generation model is served")


def test_the_only_generation_model_answers_a_body_without_a_name(tmp_path, triton):
    write_folder(tmp_path, "chat", "byte_level", "chatml")
    app = create_app(Settings(model_repository=tmp_path), triton=triton)
    assert post(app.test_client(), {"messages": CHAT}).get_json()["model"] == "chat"


@pytest.mark.parametrize(
    ("body", "attributes", "fragments"),
    [
        ({"inputs": "word " * 70}, "modelname=chat", ["inputs is", "tokens", "context of 64"]),
        (
            {"inputs": "hello world, the quick brown fox", "parameters": {"max_new_tokens": 60}},
            "modelname=chat",
            ["parameters.max_new_tokens 60 is over the context left", "of the model's 64"],
        ),
        ({"inputs": "hi", "parameters": {"max_new_tokens": 64}}, "modelname=chat", ["parameters.max_new_tokens", "63"]),
        ({"model": "chat", "messages": [{"role": "robot", "content": "x"}]}, None, ["messages[0].role"]),
        ({"model": "chat", "messages": [{"role": "user", "content": 5}]}, None, ["messages[0].content"]),
        ({"model": "chat", "messages": CHAT, "stop": ["a", "b", "c", "d", "e"]}, None, ["stop has 5", "limit of 4"]),
        ({"model": "chat", "messages": CHAT, "stop": [""]}, None, ["stop[0] must be a non-empty string"]),
        ({"model": "chat", "messages": CHAT, "temperature": 3}, None, ["temperature must be between 0 and 2"]),
        ({"model": "chat", "messages": CHAT, "functions": []}, None, ["functions is not taken"]),
        ({"inputs": "hi", "parameters": {"top_p": 0}}, "modelname=chat", ["parameters.top_p"]),
        ({"inputs": "hi", "parameters": {"best_of": 2}}, "modelname=chat", ["parameters.best_of"]),
        ({"inputs": "hi", "parameters": {"typo": 1}}, "modelname=chat", ["parameters.typo is not taken"]),
        ({"modelname": "chat", "payload": {"text": ["a", "b"], "stream": True}}, None, ["payload.stream", "list"]),
        ({"modelname": "chat", "payload": {"text": "a", "stream": True, "num_beams": 2}}, None, ["beam search"]),
        ({"modelname": "chat", "payload": {"text": "a", "repetition_penalty": 0}}, None, ["repetition_penalty"]),
        ({"modelname": "chat", "payload": {"text": "a", "top_k": 100000}}, None, ["payload.top_k"]),
    ],
)
def test_refused_before_triton(client, triton, body, attributes, fragments):
    assert_error(post(client, body, attributes), 400, "invalid_input", *fragments)
    assert triton.streams == []
    assert client.get("/ping").status_code == 200


def test_truncation_keeps_the_last_tokens(client, triton, tokenizers):
    tokenizer = tokenizers["chat"]
    text = "word " * 70
    body = {"modelname": "chat", "payload": {"text": text, "truncation": True, "max_new_tokens": 10}}
    assert post(client, body).status_code == 200
    assert triton.streams[-1][1]["input_ids"].tolist() == tokenizer.encode(text).ids[-54:]
    assert post(client, {"inputs": text, "parameters": {"truncate": 20}}, "modelname=chat").status_code == 200
    assert triton.streams[-1][1]["input_ids"].tolist() == tokenizer.encode(text).ids[-20:]


def test_a_caller_that_leaves_cancels_the_generation(client, triton):
    triton.delay = 0.01
    response = post(client, {"inputs": "hi", "stream": True}, "modelname=chat", buffered=False)
    body = iter(response.response)
    first = next(body)
    assert first.startswith(b"data: ")
    response.close()  # what gunicorn does when a write to the caller fails
    _, _, stream = triton.streams[-1]
    assert stream.cancelled and stream.sent < len(stream.tokens)
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'router_generation_cancelled_total{model="chat"} 1.0' in metrics


def test_errors_before_and_after_the_stream_starts(client, triton):
    triton.fail_at, triton.error = 0, InferenceTimeout("model 'chat': generation stopped at its deadline")
    assert_error(post(client, {"inputs": "hi", "stream": True}, "modelname=chat"), 504, "inference_timeout")
    triton.fail_at, triton.error = 3, TritonUnavailable("Triton cannot be reached: gone")
    streamed = events(post(client, {"inputs": "hi", "stream": True}, "modelname=chat"))
    assert len(streamed) == 4 and streamed[-1] == {
        "error": "Triton cannot be reached: gone",
        "error_type": "triton_unavailable",
    }
    assert_error(post(client, {"inputs": "hi"}, "modelname=chat"), 503, "triton_unavailable")
    assert client.get("/ping").status_code == 200


def test_a_streamed_request_is_measured_when_it_ends(client, caplog, tokenizers):
    generated = len(reply_ids(tokenizers["chat"], EOS["chat"]))
    with caplog.at_level("INFO", logger="app.access"):
        events(post(client, {"inputs": "hi", "stream": True}, "modelname=chat"))
    (line,) = [r for r in caplog.records if r.name == "app.access"]
    fields = line.fields
    assert fields["status"] == 200 and fields["generated_tokens"] == generated and fields["time_to_first_token_s"] >= 0
    metrics = client.get("/metrics").get_data(as_text=True)
    for name in ("router_time_to_first_token_seconds_count", "router_generation_tokens_per_second_count"):
        assert f'{name}{{model="chat"}} 1.0' in metrics
    assert f'router_generated_tokens_total{{model="chat"}} {generated:.1f}' in metrics


def test_a_v2_body_is_still_v2():
    from app.router.parsing import is_v2

    assert is_v2({"inputs": [{"name": "x"}]}) and not is_v2({"inputs": "a text"})


def payload_parts_of(response) -> tuple[bytes, list[dict]]:
    """The bytes of a response-stream answer's PayloadParts, read by botocore's own parser."""
    from botocore.eventstream import EventStreamBuffer

    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "application/vnd.amazon.eventstream"
    buffer = EventStreamBuffer()
    buffer.add_data(response.get_data())
    response.close()
    messages = list(buffer)
    assert {m.headers[":event-type"] for m in messages} == {"PayloadPart"}
    return b"".join(m.payload for m in messages), messages


def test_the_response_stream_path_answers_in_payload_parts(repository, triton):
    """What boto3's invoke_endpoint_with_response_stream reads from the local stack: the same events,
    in PayloadParts that may cut an event or a UTF-8 character (LOCAL_STREAM_PART_BYTES=5)."""
    app = create_app(Settings(model_repository=repository, local_stream_part_bytes=5), triton=triton)
    body = {"modelname": "chat", "payload": {"text": "Capital of France?", "stream": True}}
    response = app.test_client().post("/invocations-response-stream", json=body)
    assert response.headers["X-Amzn-SageMaker-Content-Type"].startswith("text/event-stream")
    joined, messages = payload_parts_of(response)
    assert max(len(m.payload) for m in messages) == 5
    texts = [json.loads(block[len(b"data: ") :])["token"]["text"] for block in joined.split(b"\n\n")[:-1]]
    assert "".join(texts) == REPLY
    whole = app.test_client().post(
        "/invocations-response-stream", json={"inputs": "hi"}, headers={ATTRIBUTES: "modelname=chat"}
    )
    assert json.loads(payload_parts_of(whole)[0]) == [{"generated_text": REPLY}]


def test_the_response_stream_path_answers_an_error_as_it_is(client):
    response = client.post(
        "/invocations-response-stream",
        json={"inputs": "hi", "parameters": {"top_p": 2}},
        headers={ATTRIBUTES: "modelname=chat"},
    )
    assert response.status_code == 400
    assert "top_p" in response.get_json()["error"]["message"]


def test_openai_s_paths_answer_as_invocations_does_and_err_in_openai_s_shape(client):
    body = {"model": "chat", "messages": CHAT, "max_tokens": 20}
    direct, v1 = client.post("/invocations", json=body).get_json(), client.post("/v1/chat/completions", json=body)
    assert v1.status_code == 200
    answer = v1.get_json()
    assert answer["choices"] == direct["choices"] and answer["usage"] == direct["usage"]
    assert client.get("/v1/models").get_json() == {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "text_generation"} for name in ("chat", "plain")
        ],
    }
    # errors: OpenAI's shape on /v1/, this endpoint's own code in it; /invocations keeps its shape
    for path, sent, status, code in (
        ("/v1/chat/completions", {"model": "plain", "messages": CHAT}, 400, "invalid_input"),
        ("/v1/chat/completions", {"modelname": "chat", "payload": {"text": "hi"}}, 400, "invalid_input"),
        ("/v1/responses", {"model": "chat", "input": "hi"}, 404, "not_found"),
    ):
        r = client.post(path, json=sent)
        assert r.status_code == status, r.get_data(as_text=True)
        error = r.get_json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert error["code"] == code, error
    assert "messages" in client.post("/v1/chat/completions", json={"prompt": "hi"}).get_json()["error"]["message"]
    assert set(client.post("/invocations", json={"model": "plain", "messages": CHAT}).get_json()["error"]) == {
        "code",
        "message",
    }


@pytest.mark.parametrize(
    ("status", "kind"), [(400, "invalid_request_error"), (429, "rate_limit_error"), (503, "server_error")]
)
def test_an_error_in_openai_s_shape_says_whose_it_is(status, kind):
    from app.core.errors import ApiError

    error = ApiError.for_status(status, "some condition", "what happened")
    assert error.openai_body() == {
        "error": {"message": "what happened", "type": kind, "param": None, "code": "some_condition"}
    }


def test_a_chat_body_takes_top_k_and_repetition_penalty_as_vllm_does(client, triton):
    body = {"model": "chat", "messages": CHAT, "max_tokens": 4}
    assert client.post("/invocations", json={**body, "top_k": 5}).status_code == 200
    assert client.post("/invocations", json={**body, "repetition_penalty": 1.3, "temperature": 0}).status_code == 200
    (_, sampled, _), (_, penalised, _) = triton.streams[-2:]
    assert sampled["top_k"].tolist() == [5] and sampled["do_sample"].tolist() == [True]  # a top-k samples
    assert penalised["repetition_penalty"].tolist() == [1.3] and penalised["do_sample"].tolist() == [False]
    for wrong, field in (({"top_k": -1}, "top_k"), ({"repetition_penalty": 0}, "repetition_penalty")):
        assert_error(client.post("/invocations", json={**body, **wrong}), 400, "invalid_input", field)


def test_openai_s_completions_a_choice_a_prompt_whole_and_streamed(client, triton, tokenizers):
    """The legacy completions form on /invocations and /v1/completions: each prompt encoded as the
    envelope's text (its own row), a text_completion choice each in order, streamed as chunks."""
    body = {"model": "plain", "prompt": ["Capital of France?", "Hello"], "max_tokens": 5, "temperature": 0}
    answer = client.post("/v1/completions", json=body).get_json()
    assert answer["object"] == "text_completion" and answer["model"] == "plain"
    assert [choice["index"] for choice in answer["choices"]] == [0, 1]
    envelope = client.post(
        "/invocations", json={"modelname": "plain", "payload": {"text": "Capital of France?", "max_new_tokens": 5}}
    )
    assert answer["choices"][0]["text"] == envelope.get_json()["result"]["generated_text"]
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 10
    rows = [inputs["input_ids"].tolist() for _, inputs, _ in triton.streams[-3:-1]]
    assert rows == [tokenizers["plain"].encode(text).ids for text in body["prompt"]]
    whole = client.post("/invocations", json={**body, "prompt": "Hello"}).get_json()["choices"][0]["text"]
    streamed = client.post(
        "/v1/completions", json={**body, "prompt": "Hello", "stream": True, "stream_options": {"include_usage": True}}
    )
    events = [line[6:] for line in streamed.get_data(as_text=True).split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks) and chunks[-1]["usage"]["completion_tokens"] == 5
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole
    for wrong, fragment in (
        ({"suffix": "!"}, "suffix is not served"),
        ({"n": 9}, "n must be"),
        ({"logprobs": 21}, "logprobs must be"),
        ({"stream": True}, "stream takes one prompt"),
        ({"prompt": ["a"] * 9}, "a list of 1 to 8 texts"),
        ({"prompt": 5}, "prompt must be a text"),
        ({"functions": []}, "functions is not taken"),
        ({"n": 3, "best_of": 2}, "best_of 2 is under n 3"),
        ({"best_of": 2, "stream": True}, "stream takes one prompt and one choice (and best_of 1)"),
        ({"best_of": 9}, "best_of must be"),
    ):
        assert_error(client.post("/invocations", json={**body, **wrong}), 400, "invalid_input", fragment)


def test_openai_s_n_choices_are_rows_of_one_prompt_seeded_one_after_another(client, triton):
    """``n``: each choice its own row of the same prompt; with a seed, choice i draws with seed + i (the
    same body answers the same choices); the prompt's tokens counted once in the usage."""
    body = {"model": "chat", "messages": CHAT, "max_tokens": 3, "temperature": 0.8, "seed": 40, "n": 3}
    answer = client.post("/v1/chat/completions", json=body).get_json()
    assert [choice["index"] for choice in answer["choices"]] == [0, 1, 2]
    rows = triton.streams[-3:]
    assert [inputs["seed"].tolist() for _, inputs, _ in rows] == [[40], [41], [42]]
    assert len({tuple(inputs["input_ids"].tolist()) for _, inputs, _ in rows}) == 1
    assert (
        answer["usage"]["prompt_tokens"] == len(rows[0][1]["input_ids"]) and answer["usage"]["completion_tokens"] == 9
    )
    two = {"model": "plain", "prompt": ["Capital of France?", "Hello"], "max_tokens": 2, "n": 2, "temperature": 0}
    found = client.post("/v1/completions", json=two).get_json()
    assert [choice["index"] for choice in found["choices"]] == [0, 1, 2, 3]
    prompts = [inputs["input_ids"].tolist() for _, inputs, _ in triton.streams[-4:]]
    assert prompts[0] == prompts[1] != prompts[2] == prompts[3]  # a prompt's choices together, in order
    assert found["usage"]["prompt_tokens"] == len(prompts[0]) + len(prompts[2])
    for wrong, fragment in (({"n": 9}, "n must be"), ({"n": 2, "stream": True}, "stream takes one choice")):
        assert_error(client.post("/invocations", json={**body, **wrong}), 400, "invalid_input", fragment)


def test_a_chat_body_s_logprobs_are_each_chosen_token_s_whole_and_streamed(client, tokenizers):
    body = {"model": "chat", "messages": CHAT, "max_tokens": 6, "logprobs": True}
    answer = client.post("/invocations", json=body).get_json()
    content = answer["choices"][0]["logprobs"]["content"]
    assert len(content) == answer["usage"]["completion_tokens"] == 6
    ids = tokenizers["chat"].encode(REPLY, add_special_tokens=False).ids[:6]
    assert [entry["token"] for entry in content] == [
        tokenizers["chat"].decode([i], skip_special_tokens=False) for i in ids
    ]
    assert all(entry["logprob"] == -0.25 and entry["top_logprobs"] == [] for entry in content)  # the stand-in's
    assert all(bytes(entry["bytes"]).decode() == entry["token"] for entry in content)
    assert client.post("/invocations", json={**body, "logprobs": False}).get_json()["choices"][0]["logprobs"] is None
    streamed = client.post("/invocations", json={**body, "stream": True}).get_data(as_text=True)
    chunks = [json.loads(line[6:]) for line in streamed.split("\n\n") if line.startswith("data: {")]
    entries = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert entries == content
    for wrong, fragment in (
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 0}, "top_logprobs is taken with logprobs true"),
    ):
        assert_error(client.post("/invocations", json={**body, **wrong}), 400, "invalid_input", fragment)
