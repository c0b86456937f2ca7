"""OpenAI's tools for a chat model: the caller's function definitions checked, and the model's
tool-call markup parsed out of its text into OpenAI's ``tool_calls``, whole or as it streams.

A model writes its calls in the markup it was trained on; three are read (``FORMATS``), chosen from
the folder's chat template (the markup it shows the model) or named in model.toml (``[export]
tool_format``):

- ``hermes`` (Hermes, Qwen2.5, Qwen3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block a call, anywhere after the answer's text;
- ``llama3_json`` (Llama 3.1 and later): the whole answer is ``{"name": ..., "parameters": {...}}``
  (after an optional ``<|python_tag|>``), several calls separated by ``;``;
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` (or, in the later
  tokenizers' form, ``[TOOL_CALLS]name[ARGS]{...}`` a call).

A call's ``arguments`` reach the caller as a JSON string, OpenAI's. Markup that does not parse as its
format defines (a JSON cut short by ``max_tokens``, a name missing) is answered as the text it is:
nothing the model wrote is lost. Streamed (``ToolStream``), text before the markup goes out as it
comes; from the markup's first character on, the text is held and answered as calls at the end.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import InvalidInput
from app.core.grammar import JSON_OPTIONS, LARK, Grammar
from app.core.spec import SpecError
from clients.chat_template import ChatTemplate

HERMES, LLAMA3_JSON, MISTRAL = "hermes", "llama3_json", "mistral"
FORMAT_KEY = "tool_format"  # model.toml [export] tool_format: the markup, where the template does not show it
MAX_TOOLS = 128  # OpenAI's bound
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's function names
TOOL_CHOICES = ("none", "auto", "required")
PYTHON_TAG = "<|python_tag|>"
ALPHANUMERIC = string.ascii_letters + string.digits
HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as a JSON string."""

    name: str
    arguments: str


def _call(document: Any, arguments_key: str) -> ToolCall | None:
    if not isinstance(document, dict) or not isinstance(document.get("name"), str):
        return None
    arguments = document.get(arguments_key, document.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string already
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(document["name"], json.dumps(arguments, ensure_ascii=False))


def _json_values(text: str, separators: str = ";") -> list[Any] | None:
    """The JSON values of ``text`` one after the other (between them only spaces and ``separators``);
    None where anything else is found."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] in separators):
            at += 1
        if at == len(text):
            return values
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)


def parse_hermes(markup: str) -> list[ToolCall] | None:
    """``<tool_call>{json}</tool_call>`` blocks (the last may be left open at the end)."""
    blocks = HERMES_BLOCK.findall(markup)
    rest = HERMES_BLOCK.sub("", markup)
    if not blocks or rest.strip():
        return None
    calls = [
        _call(values[0], "arguments") if (values := _json_values(b)) and len(values) == 1 else None for b in blocks
    ]
    return None if None in calls else calls


def parse_llama3_json(markup: str) -> list[ToolCall] | None:
    """``{"name", "parameters"}`` objects, separated by ``;``, after an optional ``<|python_tag|>``."""
    text = markup.strip().removeprefix(PYTHON_TAG)
    values = _json_values(text)
    if not values:
        return None
    calls = [_call(value, "parameters") for value in values]
    return None if None in calls else calls


def parse_mistral(markup: str) -> list[ToolCall] | None:
    """``[TOOL_CALLS][{"name", "arguments"}, ...]``, or ``[TOOL_CALLS]name[ARGS]{...}`` a call."""
    parts = [part.strip() for part in markup.split("[TOOL_CALLS]")[1:]]
    if len(parts) == 1 and parts[0].startswith("["):
        values = _json_values(parts[0])
        if not values or len(values) != 1 or not isinstance(values[0], list):
            return None
        calls = [_call(value, "arguments") for value in values[0]]
    else:
        calls = []
        for part in parts:
            name, marker, arguments = part.partition("[ARGS]")
            values = _json_values(arguments) if marker else None
            calls.append(_call({"name": name.strip(), "arguments": values[0]}, "arguments") if values else None)
    return None if not calls or None in calls else calls


@dataclass(frozen=True)
class ToolFormat:
    """A markup: where it starts (``start``; ``at_start_only``: only as the answer's first text, after
    spaces), how its calls parse, the special tokens it is written with (kept in the decoded text:
    a decode skipping special tokens would drop them), and its call ids."""

    name: str
    starts: tuple[str, ...]
    parse: Callable[[str], list[ToolCall] | None]
    markers: tuple[str, ...]
    at_start_only: bool = False
    id_length: int = 0  # Mistral's templates take ids of 9 letters and digits; else OpenAI's call_<hex>

    def call_id(self) -> str:
        if self.id_length:
            return "".join(secrets.choice(ALPHANUMERIC) for _ in range(self.id_length))
        return f"call_{secrets.token_hex(12)}"

    def start_of(self, text: str) -> int | None:
        """Where the markup starts in ``text`` (None: not in it)."""
        if self.at_start_only:
            stripped = text.lstrip()
            begins = any(stripped.startswith(start) for start in self.starts)
            return len(text) - len(stripped) if begins else None
        found = [text.find(start) for start in self.starts if start in text]
        return min(found) if found else None

    def split(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The answer's text before the markup (None where it is only spaces) and the calls; text that
        does not parse is all text."""
        at = self.start_of(text)
        calls = self.parse(text[at:]) if at is not None else None
        if not calls:
            return text, []
        content = text[:at]
        return (content if content.strip() else None), calls


FORMATS = {
    HERMES: ToolFormat(HERMES, ("<tool_call>",), parse_hermes, ("<tool_call>", "</tool_call>")),
    LLAMA3_JSON: ToolFormat(LLAMA3_JSON, (PYTHON_TAG, "{"), parse_llama3_json, (PYTHON_TAG,), at_start_only=True),
    MISTRAL: ToolFormat(MISTRAL, ("[TOOL_CALLS]",), parse_mistral, ("[TOOL_CALLS]", "[ARGS]"), id_length=9),
}


def format_of_template(source: str) -> str | None:
    """The markup a chat template shows its model: Hermes' ``<tool_call>``, Mistral's ``[TOOL_CALLS]``,
    Llama 3's ``ipython`` role or ``<|python_tag|>``; None where it shows none of them."""
    if "<tool_call>" in source:
        return HERMES
    if "[TOOL_CALLS]" in source:
        return MISTRAL
    if PYTHON_TAG in source or "ipython" in source:
        return LLAMA3_JSON
    return None


def tool_format(chat: ChatTemplate | None, named: Any, where: str) -> ToolFormat | None:
    """A model's markup: model.toml's ``[export] tool_format`` (``named``), else the one its chat
    template shows; None where its template takes no tools (or shows no markup known here)."""
    if named is not None and named not in FORMATS:
        raise SpecError(f"{where}: [export] {FORMAT_KEY} = {named!r}: one of {', '.join(FORMATS)}")
    if chat is None or not chat.takes_tools:
        return None
    name = named or format_of_template(chat.source)
    return FORMATS[name] if name else None


def keeping_markup(
    decode: Callable[[list[int]], str], form: ToolFormat | None, special: Mapping[str, int]
) -> Callable[[list[int]], str]:
    """``decode`` (which skips special tokens) keeping the markup's special tokens (``[TOOL_CALLS]``,
    ``<|python_tag|>``: ``special``, a tokenizer's special tokens' ids) as their text."""
    markup = {special[marker]: marker for marker in (form.markers if form else ()) if marker in special}
    if not markup:
        return decode

    def decoded(ids: list[int]) -> str:
        pieces, run = [], []
        for token in ids:
            if token in markup:
                pieces += [decode(run), markup[token]]
                run = []
            else:
                run.append(token)
        return "".join([*pieces, decode(run)])

    return decoded


# -- the caller's tools ------------------------------------------------------------------------------

FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def check_schema(schema: Any, where: str) -> None:
    """A JSON Schema (its draft's meta-schema, as ``jsonschema`` reads it), else a 400 naming the part."""
    import jsonschema

    if not isinstance(schema, dict):
        raise InvalidInput(f"{where} must be a JSON Schema object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
        raise InvalidInput(f"{where}{path} is not JSON Schema: {error.message}") from None


def check_tools(tools: Any, where: str = "tools") -> list[dict[str, Any]]:
    """OpenAI's tools: a list of ``{"type": "function", "function": {"name", "description"?,
    "parameters"?, "strict"?}}``, a name of letters, digits, ``_`` and ``-`` (64 at most), once each,
    the parameters a JSON Schema."""
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise InvalidInput(f"{where} must be a list of at most {MAX_TOOLS} function definitions")
    names = set()
    for index, tool in enumerate(tools):
        at = f"{where}[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) - {"type", "function"}:
            raise InvalidInput(f'{at} must be {{"type": "function", "function": {{...}}}}')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidInput(f"{at}.function must be an object with name, description, parameters")
        unknown = sorted(set(function) - set(FUNCTION_KEYS))
        if unknown:
            raise InvalidInput(f"{at}.function.{unknown[0]} is not taken (taken: {', '.join(FUNCTION_KEYS)})")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise InvalidInput(f"{at}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r}")
        if name in names:
            raise InvalidInput(f"{at}.function.name {name!r} names two tools")
        names.add(name)
        if "description" in function and not isinstance(function["description"], str):
            raise InvalidInput(f"{at}.function.description must be a string")
        if "parameters" in function:
            check_schema(function["parameters"], f"{at}.function.parameters")
        if "strict" in function and not isinstance(function["strict"], bool):
            raise InvalidInput(f"{at}.function.strict must be true or false")
    return tools


def check_tool_choice(value: Any, tools: Sequence[Mapping[str, Any]], where: str = "tool_choice") -> str | None:
    """``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name"}}`` naming
    one of the tools: answered as the choice, or the function's name."""
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise InvalidInput(f"{where} must be one of {', '.join(TOOL_CHOICES)} or a named function")
        if value != "none" and not tools:
            raise InvalidInput(f"{where} {value!r} needs tools")
        return value
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidInput(
            f'{where} must be one of {", ".join(TOOL_CHOICES)} or {{"type": "function", "function": {{"name"}}}}'
        )
    names = [tool["function"]["name"] for tool in tools]
    if name not in names:
        raise InvalidInput(f"{where}.function.name {name!r} is not one of the tools ({', '.join(names) or 'none'})")
    return name


def call_schema(tools: Sequence[Mapping[str, Any]], arguments_key: str) -> dict[str, Any]:
    """The JSON Schema of one call of any of ``tools``: ``{"name": <its name>, <arguments_key>: <its
    parameters>}``."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                arguments_key: tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def call_grammar(
    form: ToolFormat, tools: Sequence[Mapping[str, Any]], parallel: bool, special: Mapping[str, int]
) -> Grammar:
    """A Lark grammar of the answer that is one call of ``tools`` (``parallel``: one or more) in the
    format's markup; a marker that is a special token (``special``: their ids) is that token."""

    def literal(text: str) -> str:
        return f"<[{special[text]}]>" if text in special else json.dumps(text)

    def inline(schema: dict[str, Any]) -> str:  # written with app.core.grammar's separators
        return f"%json {json.dumps({'x-guidance': dict(JSON_OPTIONS), **schema})}"

    if form.name == MISTRAL:
        calls = {"type": "array", "items": call_schema(tools, "arguments"), "minItems": 1}
        if not parallel:
            calls["maxItems"] = 1
        return Grammar(LARK, f"start: {literal('[TOOL_CALLS]')} {inline(calls)}")
    if form.name == LLAMA3_JSON:
        call, between = inline(call_schema(tools, "parameters")), '"; "'
    else:
        schema = inline(call_schema(tools, "arguments"))
        call, between = f'{literal("<tool_call>")} "\\n" {schema} "\\n" {literal("</tool_call>")}', '"\\n"'
    return Grammar(LARK, f"start: call ({between} call)*\ncall: {call}" if parallel else f"start: {call}")


def openai_calls(calls: Sequence[ToolCall], form: ToolFormat) -> list[dict[str, Any]]:
    """The calls as OpenAI's ``message.tool_calls``, each its own id."""
    return [
        {"id": form.call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


class ToolStream:
    """A streamed answer's text split as it comes: ``push`` answers the text that is the answer's,
    holding back what may be markup; ``finish`` answers what is left (text, and the calls)."""

    def __init__(self, form: ToolFormat) -> None:
        self.form = form
        self.text = ""  # everything so far
        self.sent = 0  # of which this much went out as text

    def push(self, piece: str) -> str:
        self.text += piece
        free = self._free_until()
        out, self.sent = self.text[self.sent : free], max(self.sent, free)
        return out

    def _free_until(self) -> int:
        """How much of the text cannot be part of the markup, whatever comes next."""
        text, form = self.text, self.form
        at = form.start_of(text)
        if at is not None:
            return at
        if form.at_start_only:
            stripped = text.lstrip()
            maybe = not stripped or any(start.startswith(stripped) for start in form.starts)
            return 0 if maybe and self.sent == 0 else len(text)
        held = max((n for start in form.starts for n in range(1, len(start)) if text.endswith(start[:n])), default=0)
        return len(text) - held

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The text not sent yet and the calls (the held markup, where it parses; else its text)."""
        content, calls = self.form.split(self.text)
        if calls:
            return (content or "")[self.sent :], calls
        return self.text[self.sent :], []
