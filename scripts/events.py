"""Server-sent events (``text/event-stream``) read from bytes that arrive cut anywhere: what a caller of
a streamed generation reads, whether the bytes come from HTTP chunks or from SageMaker's
``PayloadPart`` events (``scripts.caller.invoke_stream``, the chat benchmark's callers)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

EVENT_END = b"\n\n"
DONE = "[DONE]"


class StreamFailed(RuntimeError):
    """An error event, or a stream that broke after it began."""


def sse_events(parts: Iterable[bytes]) -> Iterator[Any]:
    """The events of a ``text/event-stream`` whose bytes come in ``parts`` cut anywhere: each event's
    ``data:`` lines joined and read as JSON (``[DONE]`` as the string). Bytes after the last blank
    line are an event cut short: an error."""
    pending = b""
    for part in parts:
        pending += part.replace(b"\r\n", b"\n")
        while EVENT_END in pending:
            raw, pending = pending.split(EVENT_END, 1)
            data = [line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
            if not data:  # a comment or a keep-alive
                continue
            text = b"\n".join(data).decode("utf-8")
            yield text if text == DONE else json.loads(text)
    if pending.strip():
        raise StreamFailed(f"the stream ended inside an event: {pending[:200]!r}")


def event_text(event: Any) -> str:
    """The text an event adds (TGI's token, or a chat chunk's delta); an error event raises."""
    if not isinstance(event, Mapping):
        return ""
    if "error" in event:
        raise StreamFailed(f"{event.get('error_type', 'error')}: {event['error']}")
    token = event.get("token")
    if isinstance(token, Mapping):
        return "" if token.get("special") else str(token.get("text", ""))
    choices = event.get("choices")
    if isinstance(choices, list) and choices:
        delta = choices[0].get("delta") or {}
        return str(delta.get("content") or "")
    return ""
