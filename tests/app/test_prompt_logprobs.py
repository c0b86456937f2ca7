"""The prompt's log-probabilities through the Flask app with a stand-in for Triton
(``tests.tiny_causal.FakeGenerator``: prompt token i's log-probability -i/2): TGI's
``decoder_input_details`` (``details.prefill``) and OpenAI completions' ``logprobs`` with and without
``echo``, whole and streamed; what asks for them reaches Triton as ``prompt_logprobs``, and what cannot
be answered is a 400 before Triton (what the engine computes: tests/unit/test_causal_lm_scheduler.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from app.core.settings import Settings
from app.router import create_app
from tests.app.test_text_generation import events, post
from tests.support import assert_error
from tests.tiny_causal import FakeGenerator, chat_and_genai

REPLY = [5, 6, 7]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return chat_and_genai(tmp_path_factory.mktemp("prompt-logprobs"))


@pytest.fixture(scope="module")
def tokenizer(repository):
    return Tokenizer.from_file(str(repository / "chat" / "hf" / "tokenizer.json"))


@pytest.fixture
def triton():
    return FakeGenerator({"chat": REPLY, "genai": REPLY})


@pytest.fixture
def client(repository, triton):
    return create_app(Settings(model_repository=repository), triton=triton).test_client()


def text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def test_tgi_s_prefill_is_every_prompt_token_with_its_log_probability(client, triton, tokenizer):
    body = {
        "inputs": "Where is it?",
        "parameters": {"max_new_tokens": 2, "details": True, "decoder_input_details": True},
    }
    answer = post(client, body, "modelname=chat").get_json()[0]
    prompt = triton.streams[-1][1]["input_ids"].tolist()
    assert triton.streams[-1][1]["prompt_logprobs"].tolist() == [0] and len(prompt) > 2
    assert answer["details"]["prefill"] == [
        {"id": token, "text": text(tokenizer, token), "logprob": None if i == 0 else -i / 2}
        for i, token in enumerate(prompt)
    ]
    assert [token["id"] for token in answer["details"]["tokens"]] == REPLY[:2]
    post(client, {**body, "parameters": {"details": True}}, "modelname=chat")
    assert triton.streams[-1][1]["prompt_logprobs"].tolist() == [-1]  # not asked: not computed


def test_completions_logprobs_with_echo_begin_with_the_prompt_s_whole_and_streamed(client, triton, tokenizer):
    body = {"model": "chat", "prompt": "Where is it?", "max_tokens": 3, "logprobs": 2, "echo": True}
    choice = post(client, body).get_json()["choices"][0]
    sent = triton.streams[-1][1]
    prompt = sent["input_ids"].tolist()
    assert sent["prompt_logprobs"].tolist() == [2] and sent["top_logprobs"].tolist() == [2]
    tokens = [*prompt, *REPLY]
    assert choice["text"].startswith("Where is it?") and len(choice["text"]) > len("Where is it?")
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [text(tokenizer, token) for token in tokens]
    assert logprobs["token_logprobs"] == [None, *(-i / 2 for i in range(1, len(prompt))), -0.25, -0.25, -0.25]
    assert logprobs["top_logprobs"][0] is None
    second = prompt[1]  # the stand-in's alternatives: the token itself, then the next id, 1 less likely
    assert logprobs["top_logprobs"][1] == {text(tokenizer, second): -0.5, text(tokenizer, second + 1): -1.5}
    assert logprobs["top_logprobs"][-1] == {text(tokenizer, REPLY[-1]): -0.25, text(tokenizer, REPLY[-1] + 1): -1.25}
    lengths = [len(token) for token in logprobs["tokens"]]
    assert logprobs["text_offset"] == [sum(lengths[:i]) for i in range(len(lengths))]

    chunks = [c for c in events(post(client, {**body, "stream": True})) if isinstance(c, dict) and c["choices"]]
    assert chunks[0]["choices"][0]["text"] == "Where is it?"
    assert chunks[0]["choices"][0]["logprobs"]["tokens"] == logprobs["tokens"][: len(prompt)]
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    assert [token for part in streamed for token in part["tokens"]] == logprobs["tokens"]
    assert [offset for part in streamed for offset in part["text_offset"]] == logprobs["text_offset"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]


def test_completions_logprobs_without_echo_are_the_answer_s_alone(client, triton, tokenizer):
    body = {"model": "chat", "prompt": "Where?", "max_tokens": 3, "logprobs": 0}
    choice = post(client, body).get_json()["choices"][0]
    assert triton.streams[-1][1]["prompt_logprobs"].tolist() == [-1]
    assert choice["logprobs"]["tokens"] == [text(tokenizer, token) for token in REPLY]
    assert choice["logprobs"]["top_logprobs"] == [{text(tokenizer, token): -0.25} for token in REPLY]
    echoed = post(client, {**body, "echo": True, "logprobs": None}).get_json()["choices"][0]
    assert echoed["text"] == "Where?" + choice["text"] and echoed["logprobs"] is None


@pytest.mark.parametrize(
    ("body", "attributes", "fragments"),
    [
        ({"inputs": "x", "parameters": {"decoder_input_details": True}}, "modelname=chat",
         ["parameters.decoder_input_details", "details true"]),
        ({"inputs": "x", "parameters": {"decoder_input_details": True, "details": True}, "stream": True},
         "modelname=chat", ["parameters.decoder_input_details", "stream false"]),
        ({"inputs": "x", "parameters": {"decoder_input_details": True, "details": True}}, "modelname=genai",
         ["the prompt's log-probabilities", "engine (openvino) takes none"]),
        ({"model": "genai", "prompt": "x", "logprobs": 0, "echo": True}, None, ["the prompt's log-probabilities"]),
        ({"model": "chat", "prompt": "x", "logprobs": 21}, None, ["logprobs must be"]),
        ({"model": "chat", "prompt": "x", "echo": "yes"}, None, ["echo must be"]),
    ],
)  # fmt: skip
def test_what_cannot_be_answered_is_a_400_before_triton(client, triton, body, attributes, fragments):
    assert_error(post(client, body, attributes), 400, "invalid_input", *fragments)
    assert triton.streams == []
