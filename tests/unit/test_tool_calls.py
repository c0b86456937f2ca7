"""The tool-call markup a chat model writes, read as its format defines it (``clients.tool_calls``):
Hermes/Qwen's ``<tool_call>`` blocks, Llama 3's JSON answer, Mistral's ``[TOOL_CALLS]``, whole and
streamed (the text streamed and what the end answers equal to the whole answer's reading, however the
text is cut into tokens), markup that does not parse kept as text, and the caller's tools checked."""

from __future__ import annotations

import json
import random

import pytest

from app.core.errors import InvalidInput
from app.core.spec import SpecError
from clients.chat_template import ChatTemplate
from clients.tool_calls import (
    FORMATS,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    ToolCall,
    ToolStream,
    check_tool_choice,
    check_tools,
    format_of_template,
    keeping_markup,
    openai_calls,
    tool_format,
)

WEATHER = {"city": "Paris", "unit": "celsius"}
TIME = {"zone": "Europe/Paris"}
CALLS = [ToolCall("get_weather", json.dumps(WEATHER)), ToolCall("get_time", json.dumps(TIME))]

# (format, the model's text, the text answered, the calls answered)
READINGS = [
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
     None, CALLS[:1]),
    (HERMES, ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
     '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>'),
     "Let me look.\n", CALLS),
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}', None, CALLS[1:]),  # left open
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Eur', ('<tool_call>\n{"name": "get_time", '
     '"arguments": {"zone": "Eur'), []),  # cut short: text
    (HERMES, "No call: a <tool_call> without JSON</tool_call>", "No call: a <tool_call> without JSON</tool_call>", []),
    (HERMES, "Paris is sunny.", "Paris is sunny.", []),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', None, CALLS[:1]),
    (LLAMA3_JSON, ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
     '{"name": "get_time", "parameters": {"zone": "Europe/Paris"}}'), None, CALLS),
    (LLAMA3_JSON, ' {"city": "Paris"}', ' {"city": "Paris"}', []),  # JSON, not a call
    (LLAMA3_JSON, 'It is {"name": "x", "parameters": {}}', 'It is {"name": "x", "parameters": {}}', []),
    (MISTRAL, ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
     '{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}]'), None, CALLS),
    (MISTRAL, 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}', "Sure.", CALLS[:1]),
    (MISTRAL, "[TOOL_CALLS][{\"name\": 3}]", "[TOOL_CALLS][{\"name\": 3}]", []),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "content", "calls"), READINGS)
def test_the_markup_is_read_as_its_format_defines(name, text, content, calls):
    assert FORMATS[name].split(text) == (content, calls)


@pytest.mark.parametrize(("name", "text", "content", "calls"), READINGS)
def test_streamed_however_cut_the_text_and_calls_are_the_whole_answer_s(name, text, content, calls):
    rng = random.Random(7)
    for _ in range(20):
        split, sent, at = ToolStream(FORMATS[name]), [], 0
        while at < len(text):
            step = rng.randint(1, 6)
            sent.append(split.push(text[at : at + step]))
            at += step
        rest, found = split.finish()
        assert found == calls
        assert "".join(sent) + rest == (content or "" if calls else text)


def test_text_before_the_markup_goes_out_before_the_end():
    split = ToolStream(FORMATS[HERMES])
    assert split.push("The weather") == "The weather"
    assert split.push(" now: <tool") == " now: "  # "<tool" may open the markup: held
    assert split.push("_call>") == ""
    split = ToolStream(FORMATS[LLAMA3_JSON])
    assert split.push("  ") == "" and split.push("Paris") == "  Paris" and split.push(" {") == " {"


def test_call_ids_are_openai_s_and_mistral_s():
    hermes = openai_calls(CALLS, FORMATS[HERMES])
    assert [c["function"] for c in hermes] == [{"name": c.name, "arguments": c.arguments} for c in CALLS]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in hermes)
    assert len({c["id"] for c in hermes}) == 2
    mistral = openai_calls(CALLS, FORMATS[MISTRAL])
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in mistral)


def test_the_format_from_the_template_or_model_toml():
    assert format_of_template("{{ '<tool_call>' }}{{ tools }}") == HERMES
    assert format_of_template("{{ '[TOOL_CALLS]' }}") == MISTRAL
    assert format_of_template("<|start_header_id|>ipython<|end_header_id|>") == LLAMA3_JSON
    assert format_of_template("{{ tools }}") is None
    taking = ChatTemplate("{% for t in tools or [] %}{{ t | tojson }}{% endfor %}{{ messages[0].content }}", {})
    assert tool_format(taking, None, "m") is None  # no markup shown, none named: tools refused (a 400)
    assert tool_format(taking, MISTRAL, "m") is FORMATS[MISTRAL]
    assert tool_format(ChatTemplate("{{ messages[0].content }}", {}), MISTRAL, "m") is None
    with pytest.raises(SpecError, match="tool_format = 'json'"):
        tool_format(taking, "json", "m")


def test_markup_written_with_special_tokens_is_kept_in_the_text():
    def decode(ids):  # a decode that skips special tokens (7, 8)
        return "".join(chr(ord("a") + i) for i in ids if i < 7)

    decoded = keeping_markup(decode, FORMATS[MISTRAL], {"[TOOL_CALLS]": 7, "[ARGS]": 8, "</s>": 9})
    assert decoded([0, 7, 1, 2, 8, 3]) == "a[TOOL_CALLS]bc[ARGS]d"
    assert keeping_markup(decode, FORMATS[HERMES], {"</s>": 9}) is decode  # Hermes' markup is text


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("tools", "fragment"),
    [
        ({"type": "function"}, "tools must be a list"),
        ([{"type": "function", "function": {"description": "x"}}], "tools[0].function.name must be"),
        ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name must be"),
        ([{"type": "code_interpreter"}], 'tools[0] must be {"type": "function"'),
        ([TOOL, TOOL], "tools[1].function.name 'get_weather' names two tools"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 3}}}],
            "tools[0].function.parameters.properties is not JSON Schema",
        ),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "thing"}}}], "parameters.type"),
        ([{"type": "function", "function": {"name": "f", "returns": {}}}], "tools[0].function.returns is not taken"),
    ],
)
def test_tools_checked(tools, fragment):
    with pytest.raises(InvalidInput) as raised:
        check_tools(tools)
    assert fragment in raised.value.message


def test_tool_choice_checked():
    assert check_tool_choice("auto", [TOOL]) == "auto"
    assert check_tool_choice({"type": "function", "function": {"name": "get_weather"}}, [TOOL]) == "get_weather"
    for value, fragment in (
        ("sometimes", "must be one of none, auto, required"),
        ("required", "'required' needs tools"),
        ({"type": "function", "function": {"name": "f"}}, "'f' is not one of the tools (get_weather)"),
    ):
        with pytest.raises(InvalidInput) as raised:
            check_tool_choice(value, [TOOL] if "f'" in fragment else [])
        assert fragment in raised.value.message
