"""Function calling and structured output for ``python -m scripts.caller invoke``: with ``--tools
FILE``, each MODEL=FILE's text asked as an OpenAI chat body with the file's tools, the answer printed
as its text and its calls; with ``--json-schema FILE``, the text sent in the envelope with the file's
schema as ``payload.json_schema`` (every answer a JSON text valid against it).

The body is ``{"model", "messages": [{"role": "user", "content": <the text>}], "tools": <FILE's JSON
list>, ...options}`` (each ``--option KEY=VALUE`` a field of the body, its value JSON where it reads
as JSON), sent with boto3's ``invoke_endpoint`` as any SageMaker caller sends it. Each call the model
makes is printed as ``name(arguments)`` with its id; ``finish_reason`` says whether it called.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts.caller.invoke_stream import option_value


def read_json(path: Path, flag: str, kind: type, what: str) -> Any:
    """The file's JSON, of ``kind`` (the endpoint checks the rest)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SystemExit(f"invoke: {flag} {path}: not a JSON file ({error})") from None
    if not isinstance(found, kind):
        raise SystemExit(f"invoke: {flag} {path}: {what}")
    return found


def read_tools(path: Path) -> list[Any]:
    """OpenAI's list of tools."""
    return read_json(path, "--tools", list, 'a JSON list of {"type": "function", "function": {...}}')


def schema_body(model: str, text: str, schema: Any, options: Sequence[str] = ()) -> bytes:
    """The envelope of ``text`` whose answer follows ``schema`` (each option a field of the payload)."""
    payload: dict[str, Any] = {"text": text, "json_schema": schema}
    for option in options:
        key, _, value = option.partition("=")
        payload[key] = option_value(value)
    return json.dumps({"modelname": model, "payload": payload}).encode()


def chat_body(model: str, text: str, tools: list[Any], options: Sequence[str] = ()) -> bytes:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}], "tools": tools}
    for option in options:
        key, _, value = option.partition("=")
        body[key] = option_value(value)
    return json.dumps(body).encode()


def chat_lines(model: str, answer: Mapping[str, Any]) -> list[str]:
    """A chat.completion's choices: each its text, its calls, its finish reason."""
    lines = [f"{model}:"]
    for choice in answer.get("choices", []):
        message = choice.get("message", {})
        if message.get("content"):
            lines.append(f"  {message['content']}")
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            lines.append(f"  tool call {function.get('name')}({function.get('arguments')})  id {call.get('id')}")
        lines.append(f"  finish_reason: {choice.get('finish_reason')}")
    return lines
