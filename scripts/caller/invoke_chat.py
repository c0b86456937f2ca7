"""Function calling for ``python -m scripts.caller invoke --tools FILE``: each MODEL=FILE's text asked
as an OpenAI chat body with the file's tools, the answer printed as its text and its calls.

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


def read_tools(path: Path) -> list[Any]:
    """The file's JSON: OpenAI's list of tools (the endpoint checks each one)."""
    try:
        tools = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SystemExit(f"invoke: --tools {path}: not a JSON file ({error})") from None
    if not isinstance(tools, list):
        raise SystemExit(f'invoke: --tools {path}: a JSON list of {{"type": "function", "function": {{...}}}}')
    return tools


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
