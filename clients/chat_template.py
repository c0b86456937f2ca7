"""A chat model's prompt: its folder's chat template, rendered as transformers renders it.

``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`` is the
reference: the template (``tokenizer_config.json``'s ``chat_template``, a string or a list of named
templates of which ``default`` is used, else the folder's ``chat_template.jinja``) runs in Jinja2's
immutable sandbox with what transformers gives it: ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, the globals ``raise_exception``, ``strftime_now``, ``dict`` and
``namespace``, a ``tojson`` filter that keeps non-ASCII text, and the variables ``messages``,
``tools`` (the caller's, else None) and ``documents`` (None), ``add_generation_prompt`` and the tokenizer's named special tokens
(``bos_token``, ``eos_token``, ...). The rendered text is encoded without the tokenizer's own special
tokens (``apply_chat_template(tokenize=True)`` encodes it with ``add_special_tokens=False``): the
template writes them. transformers itself is never imported here.

The messages are checked before rendering: a list of objects with a known ``role`` (``system``,
``user``, ``assistant``, ``tool``) and a string ``content``; an assistant's message may carry OpenAI's
``tool_calls`` instead of content (their ``arguments``, a JSON string, reach the template as the object
it holds, as vLLM passes them: the templates write them with ``tojson``), a ``tool`` message answers
one by its ``tool_call_id``. The caller's ``tools`` (``clients.tool_calls``) reach the template as
``apply_chat_template(messages, tools=tools)`` passes them; a template that never reads ``tools``
refuses them. A template that refuses a conversation (``raise_exception``, a role order it does not
take) is a 400 carrying its message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.core.errors import InvalidInput
from app.core.grammar import json_object
from app.core.spec import SpecError

TEMPLATE_FILE = "chat_template.jinja"
ROLES = ("system", "user", "assistant", "tool")
# The message keys passed to the template besides role and content (OpenAI's, strings), and tool_calls.
MESSAGE_STRINGS = ("name", "tool_call_id")
TOOL_CALLS = "tool_calls"
MAX_MESSAGES = 1024
# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named special tokens every template may read.
TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` inside a template, without the class itself (as transformers gives it)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace, refusing underscore-prefixed attributes (as transformers' does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attributes = dict(*args, **kwargs)
        for name in attributes:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template cannot set the underscore-prefixed attribute {name!r}")


def environment() -> ImmutableSandboxedEnvironment:
    """The sandbox a template runs in: transformers' settings, globals and filters."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


def template_source(folder: Path) -> str | None:
    """The folder's chat template: tokenizer_config.json's ``chat_template`` (a string, or a list of
    ``{"name", "template"}`` of which ``default`` is used), else ``chat_template.jinja``; None: none."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    value = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
        if value is None:
            raise SpecError(f"{config_path}: chat_template lists named templates but none is named 'default'")
    if isinstance(value, str) and value:
        return value
    path = folder / TEMPLATE_FILE
    return path.read_text(encoding="utf-8") if path.is_file() else None


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The named special tokens the template reads, from tokenizer_config.json (an AddedToken's content)."""
    found = {}
    for name in TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[name] = value
    return found


class ChatTemplate:
    """A folder's chat template, compiled once; ``render`` is safe to call from many threads."""

    def __init__(self, source: str, tokens: Mapping[str, str], where: str = "chat template") -> None:
        env = environment()
        try:
            self.template = env.from_string(source)
            read = jinja2.meta.find_undeclared_variables(env.parse(source))
        except TemplateError as error:
            raise SpecError(f"{where}: the chat template does not compile: {error}") from None
        self.tokens = dict(tokens)
        self.source = source
        self.takes_tools = "tools" in read  # a template that never reads tools cannot show them

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTemplate | None:
        """The folder's template with its special tokens; None where the folder has no template."""
        source = template_source(folder)
        if source is None:
            return None
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        return cls(source, special_tokens(config), str(folder))

    def render(
        self, messages: Sequence[Mapping[str, Any]], where: str = "messages", tools: list[Any] | None = None
    ) -> str:
        """The prompt for ``messages`` (checked first) with the assistant's turn opened, the ``tools``
        (checked by the caller) shown to the model where given."""
        chat = check_messages(messages, where)
        if tools and not self.takes_tools:
            raise InvalidInput("tools: the model's chat template does not take tools (it never reads them)")
        try:
            return self.template.render(
                messages=chat, tools=tools or None, documents=None, add_generation_prompt=True, **self.tokens
            )
        except TemplateError as error:
            raise InvalidInput(f"{where}: the model's chat template refused the conversation: {error}") from None


def check_messages(messages: Any, where: str = "messages") -> list[dict[str, Any]]:
    """OpenAI's messages, checked: a non-empty list of ``{"role", "content"}`` objects, the role one of
    ``ROLES``, the content a string; ``name`` (a string) passes along; an assistant's ``tool_calls``
    (its content then may be null), a tool's ``tool_call_id`` (needed)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInput(f"{where} must be a non-empty list of {{role, content}} objects")
    if len(messages) > MAX_MESSAGES:
        raise InvalidInput(f"{where} has {len(messages)} messages, over the limit of {MAX_MESSAGES}")
    chat = []
    for index, message in enumerate(messages):
        at = f"{where}[{index}]"
        if not isinstance(message, dict):
            raise InvalidInput(f"{at} must be an object with role and content")
        unknown = sorted(set(message) - {"role", "content", TOOL_CALLS, *MESSAGE_STRINGS})
        if unknown:
            raise InvalidInput(
                f"{at}.{unknown[0]} is not taken (a message has role, content, name, tool_calls, tool_call_id)"
            )
        role = message.get("role")
        if role not in ROLES:
            raise InvalidInput(f"{at}.role must be one of {', '.join(ROLES)}, got {role!r}")
        chat_message = dict(message)
        if message.get(TOOL_CALLS) is not None:
            if role != "assistant":
                raise InvalidInput(f"{at}.tool_calls: only an assistant's message makes tool calls")
            chat_message[TOOL_CALLS] = check_tool_calls(message[TOOL_CALLS], f"{at}.tool_calls")
        content = message.get("content")
        if not isinstance(content, str) and not (content is None and chat_message.get(TOOL_CALLS)):
            raise InvalidInput(f"{at}.content must be a string, not {type(content).__name__}")
        for key in MESSAGE_STRINGS:
            if key in message and not isinstance(message[key], str):
                raise InvalidInput(f"{at}.{key} must be a string")
        if role == "tool" and "tool_call_id" not in message:
            raise InvalidInput(f"{at}.tool_call_id is needed: a tool message answers the call of that id")
        chat.append(chat_message)
    return chat


def check_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's OpenAI ``tool_calls``: ``{"id", "type": "function", "function": {"name",
    "arguments"}}`` each, the arguments a JSON object as a string (or the object), passed to the template
    as the object."""
    if not isinstance(calls, list) or not calls:
        raise InvalidInput(f"{where} must be a non-empty list of tool calls")
    found = []
    for index, call in enumerate(calls):
        at = f"{where}[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise InvalidInput(f'{at} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
        if not isinstance(call.get("id"), str):
            raise InvalidInput(f"{at}.id must be a string")
        if not isinstance(function.get("name"), str):
            raise InvalidInput(f"{at}.function.name must be a string")
        arguments = json_object(function.get("arguments"))
        if arguments is None:
            raise InvalidInput(f"{at}.function.arguments must be a JSON object (as a string)")
        found.append({**call, "type": "function", "function": {**function, "arguments": arguments}})
    return found
