"""The chat template rendered by the router (``clients.chat_template``, Jinja2's sandbox, no
transformers) against transformers' ``apply_chat_template(messages, add_generation_prompt=True)``:
the same text, and the same ids once encoded, for a ChatML template, a Llama-2-style one and Qwen's
with tools (the caller's tools shown, an assistant's tool calls and the tools' answers in the history)."""

from __future__ import annotations

import pytest

from app.core.errors import InvalidInput
from app.core.settings import Settings
from app.core.spec import SpecError
from clients.chat_template import ChatTemplate, check_messages, template_source
from clients.families import load_spec, make_client
from scripts.model_prep.small_models.causal import CHATML, LLAMA2_CHAT, QWEN_TOOLS
from tests.tiny_causal import CALLED, TOOLS, FakeGenerator, as_transformers_takes, write_folder

CONVERSATIONS = [
    [{"role": "user", "content": "hello wörld 🙂"}],
    [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": " Paris. "},
        {"role": "user", "content": "And of Japan, 日本?"},
    ],
]
TEMPLATES = {
    "chatml": ("byte_level", CHATML),
    "llama2": ("byte_fallback", LLAMA2_CHAT),
    "qwen_tools": ("byte_level", QWEN_TOOLS),
}


@pytest.fixture(scope="module", params=list(TEMPLATES))
def folder(request, tmp_path_factory):
    kind, template = TEMPLATES[request.param]
    return write_folder(tmp_path_factory.mktemp(request.param), "chat", kind, template)


@pytest.fixture(scope="module")
def client(folder):
    return make_client(load_spec(folder), FakeGenerator({}), Settings(model_repository=folder.parent))


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_rendered_and_encoded_as_transformers_does(folder, client, messages):
    from transformers import PreTrainedTokenizerFast

    reference = PreTrainedTokenizerFast.from_pretrained(folder / "hf")
    text = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ChatTemplate.from_folder(folder / "hf").render(messages) == text
    ids = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert client.encode_chat(messages) == list(ids)


def test_a_template_that_refuses_the_conversation_is_a_400(tmp_path):
    folder = write_folder(tmp_path, "chat", "byte_fallback", LLAMA2_CHAT)
    template = ChatTemplate.from_folder(folder / "hf")
    with pytest.raises(InvalidInput, match="roles must alternate"):
        template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_the_template_file_and_named_templates(tmp_path):
    hf = write_folder(tmp_path, "chat", "byte_level", None) / "hf"
    assert template_source(hf) is None
    (hf / "chat_template.jinja").write_text(CHATML)
    assert template_source(hf) == CHATML
    (hf / "tokenizer_config.json").write_text('{"chat_template": [{"name": "tool_use", "template": "x"}]}')
    with pytest.raises(SpecError, match="default"):
        template_source(hf)


def test_the_sandbox_holds():
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(Exception, match="unsafe|access"):
        template.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "non-empty list"),
        ([{"role": "robot", "content": "x"}], "messages[0].role must be one of system, user, assistant, tool"),
        ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "messages[0].content must be a string"),
        ([{"role": "user", "content": "x", "image": 1}], "messages[0].image"),
        (["hi"], "messages[0] must be an object"),
    ],
)
def test_messages_checked(messages, fragment):
    with pytest.raises(InvalidInput) as raised:
        check_messages(messages)
    assert fragment in raised.value.message


@pytest.mark.parametrize("messages", [CONVERSATIONS[1], CALLED], ids=["no-calls", "calls-answered"])
def test_tools_are_shown_as_transformers_shows_them(tmp_path, messages):
    from transformers import PreTrainedTokenizerFast

    folder = write_folder(tmp_path, "chat", "byte_level", "qwen_tools")
    reference = PreTrainedTokenizerFast.from_pretrained(folder / "hf")
    text = reference.apply_chat_template(
        as_transformers_takes(messages), tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    template = ChatTemplate.from_folder(folder / "hf")
    assert template.takes_tools and "<tools>" in text and "get_time" in text
    assert template.render(messages, tools=TOOLS) == text
    if messages is CALLED:
        assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text and "<tool_response>" in text
    assert template.render(CONVERSATIONS[1]) == reference.apply_chat_template(
        CONVERSATIONS[1], add_generation_prompt=True, tokenize=False
    )  # without tools, ChatML's


def test_a_template_that_never_reads_tools_refuses_them(tmp_path):
    template = ChatTemplate.from_folder(write_folder(tmp_path, "chat", "byte_level", "chatml") / "hf")
    assert not template.takes_tools
    with pytest.raises(InvalidInput, match="does not take tools"):
        template.render(CONVERSATIONS[0], tools=TOOLS)


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"role": "tool", "content": "18 °C"}, "messages[0].tool_call_id is needed"),
        ({"role": "assistant", "content": None}, "messages[0].content must be a string"),
        ({"role": "user", "content": "x", "tool_calls": CALLED[1]["tool_calls"]}, "only an assistant's message"),
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{"}}]},
         "messages[0].tool_calls[0].function.arguments must be a JSON object"),
        ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
         "messages[0].tool_calls[0].id must be a string"),
    ],
)  # fmt: skip
def test_tool_messages_checked(message, fragment):
    with pytest.raises(InvalidInput) as raised:
        check_messages([message])
    assert fragment in raised.value.message
