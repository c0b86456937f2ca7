"""What each text_generation form asks of the generation besides its prompt, through the Flask app with
a stand-in for Triton (``tests.tiny_causal.FakeGenerator``):

- constrained generation: OpenAI's ``response_format``, TGI's ``grammar`` and the envelope's
  ``json_schema`` each reach Triton as the grammar tensor (``app.core.grammar``), compiled against the
  model's tokenizer first; what cannot be followed is a 400 naming the field and the reason, and Triton
  never sees it (what the model then makes: tests/unit/test_causal_lm_grammar.py);
- the sampling settings: ``min_p``, ``typical_p``, OpenAI's ``presence_penalty`` and
  ``frequency_penalty``, ``min_new_tokens`` (vLLM's ``min_tokens``) and ``ignore_eos`` reach Triton as
  their tensors; out of bounds, on the openvino engine or with beam search, a 400 naming the field
  (what the engine does with them: tests/unit/test_causal_lm_settings.py)."""

from __future__ import annotations

import json

import pytest

from app.core.settings import Settings
from app.router import create_app
from tests.app.test_text_generation import post
from tests.support import assert_error
from tests.tiny_causal import TOOLS, FakeGenerator, chat_and_genai

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ASKED = [{"role": "user", "content": "Where?"}]
GIVEN = {"min_p": 0.05, "typical_p": 0.9, "presence_penalty": 0.5, "frequency_penalty": -1.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return chat_and_genai(tmp_path_factory.mktemp("options"))


@pytest.fixture
def triton():
    return FakeGenerator({"chat": [5, 6, 7], "genai": [5, 6, 7]})


@pytest.fixture
def client(repository, triton):
    return create_app(Settings(model_repository=repository, max_batch_items=8), triton=triton).test_client()


def sent(triton) -> dict | None:
    data = triton.streams[-1][1]["grammar"].tobytes()
    return json.loads(data) if data else None


@pytest.mark.parametrize(
    ("body", "attributes", "grammar"),
    [
        ({"model": "chat", "messages": ASKED}, None, None),
        ({"model": "chat", "messages": ASKED, "response_format": {"type": "text"}}, None, None),
        ({"model": "chat", "messages": ASKED, "response_format": {"type": "json_object"}}, None,
         {"kind": "json_schema", "value": {"type": "object"}}),
        ({"model": "chat", "messages": ASKED,
          "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}},
         None, {"kind": "json_schema", "value": SCHEMA}),
        ({"inputs": "Where?", "parameters": {"grammar": {"type": "json", "value": json.dumps(SCHEMA)}}}, "modelname=chat",
         {"kind": "json_schema", "value": SCHEMA}),
        ({"inputs": "Where?", "parameters": {"grammar": {"type": "regex", "value": "(yes|no)"}}}, "modelname=chat",
         {"kind": "regex", "value": "(yes|no)"}),
        ({"modelname": "chat", "payload": {"text": "Where?", "json_schema": SCHEMA}}, None,
         {"kind": "json_schema", "value": SCHEMA}),
        ({"modelname": "chat", "payload": {"text": "Where?", "json_schema": SCHEMA, "stream": True}}, None,
         {"kind": "json_schema", "value": SCHEMA}),
    ],
)  # fmt: skip
def test_each_form_s_grammar_reaches_triton(client, triton, body, attributes, grammar):
    r = post(client, body, attributes)
    assert r.status_code == 200, r.get_data(as_text=True)
    r.close()
    assert sent(triton) == grammar


LOOKAROUND = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}}


@pytest.mark.parametrize(
    ("body", "attributes", "fragments"),
    [
        ({"model": "chat", "messages": ASKED, "response_format": {"type": "xml"}}, None, ["response_format.type"]),
        ({"model": "chat", "messages": ASKED, "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
         None, ["response_format.json_schema", "name"]),
        ({"model": "chat", "messages": ASKED,
          "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "thing"}}}},
         None, ["response_format.json_schema.schema.type is not JSON Schema"]),
        ({"model": "chat", "messages": ASKED,
          "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": LOOKAROUND}}},
         None, ["response_format: the grammar cannot be followed", "look-around"]),
        ({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "(?<=a)b"}}}, "modelname=chat",
         ["parameters.grammar: the grammar cannot be followed", "look-around"]),
        ({"inputs": "x", "parameters": {"grammar": {"type": "ebnf", "value": "x"}}}, "modelname=chat",
         ["parameters.grammar must be"]),
        ({"modelname": "chat", "payload": {"text": "x", "json_schema": "{not json"}}, None, ["payload.json_schema"]),
        ({"modelname": "chat", "payload": {"text": "x", "json_schema": SCHEMA, "num_beams": 2}}, None, ["beam search"]),
        ({"model": "genai", "messages": ASKED, "response_format": {"type": "json_object"}}, None,
         ["engine (openvino) follows no grammar"]),
        ({"model": "chat", "messages": ASKED, "response_format": {"type": "json_object"}, "tools": TOOLS,
          "tool_choice": "required"}, None, ["does not take tools"]),
    ],
)  # fmt: skip
def test_a_grammar_that_cannot_be_followed_is_a_400_before_triton(client, triton, body, attributes, fragments):
    assert_error(post(client, body, attributes), 400, "invalid_input", *fragments)
    assert triton.streams == []
    assert post(client, {"modelname": "chat", "payload": {"text": "x"}}).status_code == 200  # still serving


def sent_settings(triton) -> dict:
    return {name: value.item() for name, value in triton.streams[-1][1].items() if value.size == 1}


@pytest.mark.parametrize(
    ("body", "attributes", "wanted"),
    [
        ({"model": "chat", "messages": ASKED, **GIVEN, "min_tokens": 3, "temperature": 0.8}, None,
         {**GIVEN, "min_new_tokens": 3, "do_sample": True}),
        ({"model": "chat", "prompt": "Where?", **GIVEN, "min_tokens": 2}, None, {**GIVEN, "min_new_tokens": 2}),
        ({"modelname": "chat", "payload": {"text": "Where?", **GIVEN, "min_new_tokens": 4}}, None,
         {**GIVEN, "min_new_tokens": 4}),
        ({"inputs": "Where?", "parameters": {"typical_p": 0.7}}, "modelname=chat", {"typical_p": 0.7, "do_sample": True}),
        ({"model": "chat", "messages": ASKED}, None,
         {"min_p": 0.0, "typical_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_new_tokens": 0,
          "ignore_eos": False}),
    ],
)  # fmt: skip
def test_each_form_s_settings_reach_triton(client, triton, body, attributes, wanted):
    r = post(client, body, attributes)
    assert r.status_code == 200, r.get_data(as_text=True)
    found = sent_settings(triton)
    assert {name: found[name] for name in wanted} == pytest.approx(wanted)


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        ({"model": "chat", "messages": ASKED, "presence_penalty": 2.5}, ["presence_penalty"]),
        ({"model": "chat", "messages": ASKED, "min_p": -0.1}, ["min_p"]),
        ({"model": "chat", "messages": ASKED, "min_tokens": 5000}, ["min_tokens"]),
        ({"model": "genai", "messages": ASKED, "min_p": 0.1}, ["min_p", "engine (openvino) takes only 0"]),
        ({"modelname": "genai", "payload": {"text": "x", "frequency_penalty": 1.0}}, ["frequency_penalty", "openvino"]),
        ({"modelname": "chat", "payload": {"text": "x", "num_beams": 2, "ignore_eos": True}},
         ["payload.ignore_eos: beam search"]),
    ],
)  # fmt: skip
def test_a_setting_out_of_its_bounds_or_its_engine_is_a_400_before_triton(client, triton, body, fragments):
    assert_error(post(client, body), 400, "invalid_input", *fragments)
    assert triton.streams == []


@pytest.mark.parametrize(
    "body",
    [
        {"model": "chat", "messages": ASKED, "logit_bias": {"5": 2.5, "9": -100}, "stop_token_ids": [7, 8]},
        {"model": "chat", "prompt": "Where?", "logit_bias": {"5": 2.5, "9": -100}, "stop_token_ids": [7, 8]},
        {
            "modelname": "chat",
            "payload": {"text": "Where?", "logit_bias": {"5": 2.5, "9": -100}, "stop_token_ids": [7, 8]},
        },
    ],
)
def test_each_form_s_token_lists_reach_triton(client, triton, body):
    assert post(client, body).status_code == 200
    inputs = triton.streams[-1][1]
    assert inputs["logit_bias_ids"].tolist() == [5, 9] and inputs["logit_bias"].tolist() == [2.5, -100.0]
    assert inputs["stop_token_ids"].tolist() == [7, 8]
    post(client, {"model": "chat", "messages": ASKED})
    assert {name: triton.streams[-1][1][name].size for name in ("logit_bias_ids", "logit_bias", "stop_token_ids")} == {
        "logit_bias_ids": 0,
        "logit_bias": 0,
        "stop_token_ids": 0,
    }


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        ({"model": "chat", "messages": ASKED, "logit_bias": {"5": 200}}, ["logit_bias['5']", "-100 to 100"]),
        ({"model": "chat", "messages": ASKED, "logit_bias": {"five": 1}}, ["logit_bias: token ids", "'five'"]),
        ({"model": "chat", "messages": ASKED, "logit_bias": {"99999": 1}}, ["logit_bias: token ids"]),
        ({"model": "chat", "messages": ASKED, "stop_token_ids": 7}, ["stop_token_ids must be a list"]),
        ({"modelname": "chat", "payload": {"text": "x", "stop_token_ids": ["a"]}}, ["payload.stop_token_ids"]),
        ({"model": "genai", "messages": ASKED, "logit_bias": {"5": 1}}, ["logit_bias: this model's engine (openvino)"]),
        ({"modelname": "chat", "payload": {"text": "x", "num_beams": 2, "stop_token_ids": [5]}},
         ["payload.stop_token_ids: beam search"]),
    ],
)  # fmt: skip
def test_a_token_list_out_of_its_bounds_is_a_400_before_triton(client, triton, body, fragments):
    assert_error(post(client, body), 400, "invalid_input", *fragments)
    assert triton.streams == []


def test_each_token_s_alternatives_in_openai_s_and_tgi_s_answers(client, triton):
    chat = {"model": "chat", "messages": ASKED, "logprobs": True, "top_logprobs": 3, "max_tokens": 2}
    content = post(client, chat).get_json()["choices"][0]["logprobs"]["content"]
    assert sent_settings(triton)["top_logprobs"] == 3
    for entry in content:  # the stand-in's: the chosen token, then the next ids, each 1 less likely
        assert [alternative["logprob"] for alternative in entry["top_logprobs"]] == [-0.25, -1.25, -2.25]
        assert entry["top_logprobs"][0]["token"] == entry["token"] and set(entry["top_logprobs"][1]) == {
            "token",
            "logprob",
            "bytes",
        }
    tgi = {"inputs": "Where?", "parameters": {"max_new_tokens": 2, "details": True, "top_n_tokens": 2}}
    details = post(client, tgi, "modelname=chat").get_json()[0]["details"]
    assert [[top["id"] for top in tops] for tops in details["top_tokens"]] == [[5, 6], [6, 7]]
    assert all(set(top) == {"id", "text", "logprob", "special"} for tops in details["top_tokens"] for top in tops)
    for body, fragment in (
        ({"model": "genai", "messages": ASKED, "logprobs": True, "top_logprobs": 2}, "top_logprobs"),
        ({"inputs": "x", "parameters": {"top_n_tokens": 21}}, "parameters.top_n_tokens"),
        ({"modelname": "chat", "payload": {"text": "x", "top_logprobs": 2}}, "top_logprobs"),
    ):
        assert_error(post(client, body, "modelname=chat" if "inputs" in body else None), 400, "invalid_input", fragment)


def test_tgi_s_best_of_answers_the_draw_of_highest_log_probability(client, triton):
    """TGI's ``best_of``: that many rows of the prompt (a seed: row i draws with seed + i), the one whose
    tokens' log-probabilities sum highest answered, the others in ``details.best_of_sequences``."""
    triton.seed_logprobs = {10: -0.5, 11: -0.125, 12: -1.0}
    parameters = {"max_new_tokens": 2, "do_sample": True, "seed": 10, "best_of": 3, "details": True}
    answer = post(client, {"inputs": "Where?", "parameters": parameters}, "modelname=chat").get_json()[0]
    assert [inputs["seed"].tolist() for _, inputs, _ in triton.streams] == [[10], [11], [12]]
    details = answer["details"]
    assert details["seed"] == 11 and [token["logprob"] for token in details["tokens"]] == [-0.125, -0.125]
    assert [other["seed"] for other in details["best_of_sequences"]] == [10, 12]
    assert all(set(other) >= {"generated_text", "finish_reason", "tokens"} for other in details["best_of_sequences"])
    plain = post(client, {"inputs": "Where?", "parameters": {**parameters, "details": False}}, "modelname=chat")
    assert set(plain.get_json()[0]) == {"generated_text"}
    for wrong, fragment in (
        ({"best_of": 2}, "parameters.best_of"),  # greedy
        ({"best_of": 2, "do_sample": True, "stream": True}, "parameters.best_of"),
        ({"best_of": 9, "do_sample": True}, "parameters.best_of must be"),
    ):
        stream = wrong.pop("stream", False)
        body = {"inputs": "x", "parameters": wrong, "stream": stream}
        assert_error(post(client, body, "modelname=chat"), 400, "invalid_input", fragment)
