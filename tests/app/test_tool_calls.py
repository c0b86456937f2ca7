"""OpenAI's tools through the Flask app, with a stand-in for Triton's token stream that answers a
model's Hermes markup (``tests.tiny_causal.FakeGenerator``): the tools shown through the folder's
template, the calls read out of the answer into ``message.tool_calls``, whole and streamed as OpenAI
streams them (``delta.tool_calls``, the markup never as content), ``tool_choice`` (``required`` and a
named function: the grammar of that call sent to Triton) and ``parallel_tool_calls``, and the bodies
refused before Triton sees them."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from app.core.settings import Settings
from app.router import create_app
from clients.chat_template import ChatTemplate
from scripts.model_prep.small_models.encoders import update_json_files
from tests.app.test_text_generation import events, post
from tests.support import assert_error
from tests.tiny_causal import TOOLS, FakeGenerator, write_folder

SAID = "Let me look that up.\n"
MARKUP = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)
ASKED = [{"role": "user", "content": "Weather in Paris, and the time?"}]
WANTED = [("get_weather", {"city": "Paris"}), ("get_time", {})]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    for name, template in (("tools", "qwen_tools"), ("chatml", "chatml")):  # the tools' prompt: 500 tokens
        folder = write_folder(root, name, "byte_level", template, positions=1024, generation={"max_new_tokens": 200})
        update_json_files(folder / "hf", {"tokenizer_config.json": {"model_max_length": 1024}})
    return root


@pytest.fixture(scope="module")
def tokenizer(repository):
    return Tokenizer.from_file(str(repository / "tools" / "hf" / "tokenizer.json"))


@pytest.fixture
def triton(tokenizer):
    ids = [*tokenizer.encode(SAID + MARKUP, add_special_tokens=False).ids, tokenizer.token_to_id("<|im_end|>")]
    return FakeGenerator({"tools": ids, "chatml": ids})


@pytest.fixture
def client(repository, triton):
    return create_app(Settings(model_repository=repository, max_batch_items=8), triton=triton).test_client()


def called(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_the_tools_reach_the_model_through_its_template(client, triton, repository, tokenizer):
    r = post(client, {"model": "tools", "messages": ASKED, "tools": TOOLS})
    assert r.status_code == 200, r.get_json()
    prompt = ChatTemplate.from_folder(repository / "tools" / "hf").render(ASKED, tools=TOOLS)
    sent = triton.streams[-1][1]["input_ids"].tolist()
    assert sent == tokenizer.encode(prompt, add_special_tokens=False).ids and "get_time" in prompt


def test_the_calls_are_read_out_of_the_answer(client):
    answer = post(client, {"model": "tools", "messages": ASKED, "tools": TOOLS, "n": 2}).get_json()
    for choice in answer["choices"]:
        message = choice["message"]
        assert choice["finish_reason"] == "tool_calls" and message["content"] == SAID
        assert called(message["tool_calls"]) == WANTED
        assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"])
    one = post(client, {"model": "tools", "messages": ASKED, "tools": TOOLS, "parallel_tool_calls": False})
    assert called(one.get_json()["choices"][0]["message"]["tool_calls"]) == WANTED[:1]


def test_streamed_the_calls_come_as_delta_tool_calls_and_the_markup_never_as_content(client):
    found = events(post(client, {"model": "tools", "messages": ASKED, "tools": TOOLS, "stream": True}))
    assert found[-1] == "[DONE]"
    deltas = [event["choices"][0]["delta"] for event in found[:-1]]
    content = "".join(delta.get("content") or "" for delta in deltas)
    calls = [call for delta in deltas for call in delta.get("tool_calls", [])]
    assert content == SAID and "<tool_call>" not in content
    assert [call["index"] for call in calls] == [0, 1] and called(calls) == WANTED
    assert found[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_without_tools_or_with_tool_choice_none_the_answer_is_text(client):
    for extra in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        choice = post(client, {"model": "tools", "messages": ASKED, **extra}).get_json()["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": SAID + MARKUP}
        assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "chatml", "tools": TOOLS}, "does not take tools"),
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "'x' is not one of the tools",
        ),
        ({"messages": [*ASKED, {"role": "tool", "content": "18"}]}, "messages[1].tool_call_id"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format and tool_choice both constrain the answer",
        ),
    ],
)
def test_refused_before_triton(client, triton, body, fragment):
    r = post(client, {"model": "tools", "messages": ASKED, **body})
    assert_error(r, 400, "invalid_input", fragment)
    assert triton.streams == []


@pytest.mark.parametrize(("choice", "names"), [("required", ["get_weather", "get_time"]), ("get_time", ["get_time"])])
def test_a_call_the_model_must_make_is_a_grammar_of_that_call(client, triton, choice, names):
    named = {"type": "function", "function": {"name": choice}} if choice != "required" else choice
    body = {"model": "tools", "messages": ASKED, "tools": TOOLS, "tool_choice": named, "parallel_tool_calls": False}
    answer = post(client, body).get_json()
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    grammar = json.loads(triton.streams[-1][1]["grammar"].tobytes())
    assert grammar["kind"] == "lark" and grammar["value"].startswith('start: "<tool_call>" "\\n" %json {')
    assert [name for name in ("get_weather", "get_time") if f'"const": "{name}"' in grammar["value"]] == names


def test_tool_calls_and_constrained_requests_are_counted_whole_and_streamed(client, caplog):
    with caplog.at_level("INFO", logger="app.access"):
        post(client, {"model": "tools", "messages": ASKED, "tools": TOOLS, "n": 2})  # 2 calls a choice
        required = {"model": "tools", "messages": ASKED, "tools": TOOLS, "tool_choice": "required", "stream": True}
        events(post(client, required))  # 2 calls, constrained
        post(client, {"model": "tools", "messages": ASKED})  # neither
    lines = [r.fields for r in caplog.records if r.name == "app.access"]
    assert [(line.get("tool_calls"), line.get("constrained")) for line in lines] == [(4, None), (2, 1), (None, None)]
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'router_tool_calls_total{model="tools"} 6.0' in metrics
    assert 'router_constrained_requests_total{model="tools"} 1.0' in metrics
