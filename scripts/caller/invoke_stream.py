"""Streamed generation for ``python -m scripts.caller invoke --stream``: tokens printed as they arrive.

The call is boto3's ``invoke_endpoint_with_response_stream`` for a SageMaker endpoint and for the
local stack alike (which answers its path as SageMaker's front end does: ``app.router.event_stream``).
The body is the JSON envelope ``{"modelname", "payload": {"text", "stream": true, ...options}}``.
The endpoint's bytes arrive as ``PayloadPart`` events that may end anywhere, in the middle of a
server-sent event or of a UTF-8 character: ``sse_events`` joins them and reads an event only once
its blank line has arrived. Each event's text is printed at once: a text_generation event
(``{"token": {"text"}, "generated_text"}``, Hugging Face TGI's shape) or a chat chunk
(``{"choices": [{"delta": {"content"}}]}``); an error event ends the call with its message.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from scripts.events import StreamFailed, event_text, sse_events


@dataclass
class Progress:
    """What a streamed call printed, and when (seconds since the call)."""

    started: float = field(default_factory=time.monotonic)
    times: list[float] = field(default_factory=list)
    text: str = ""

    def add(self, piece: str) -> None:
        self.times.append(time.monotonic() - self.started)
        self.text += piece

    def summary(self) -> str:
        if not self.times:
            return "no token arrived"
        total = self.times[-1]
        rate = (len(self.times) - 1) / (total - self.times[0]) if total > self.times[0] else 0.0
        return f"{len(self.times)} events; the first after {self.times[0]:.2f} s, the last after {total:.2f} s ({rate:.1f} events/s)"


def option_value(text: str) -> Any:
    """An --option's value as JSON where it reads as JSON (numbers, true, lists), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def envelope(model: str, text: str, options: Sequence[str]) -> bytes:
    payload: dict[str, Any] = {"text": text}
    for option in options:
        key, _, value = option.partition("=")
        payload[key] = option_value(value)
    payload["stream"] = True
    return json.dumps({"modelname": model, "payload": payload}).encode()


def payload_bytes(events: Iterable[Mapping[str, Any]]) -> Iterator[bytes]:
    """The bytes of boto3's response stream: each ``PayloadPart``'s; a ``ModelStreamError`` raises."""
    for event in events:
        if "PayloadPart" in event:
            yield event["PayloadPart"]["Bytes"]
        for failure in ("ModelStreamError", "InternalStreamFailure"):
            if failure in event:
                raise StreamFailed(f"{failure}: {event[failure].get('Message', '')}")


def invoke_streamed(
    client,
    endpoint_name: str,
    model: str,
    text: str,
    options: Sequence[str] = (),
    route: Mapping[str, str] | None = None,
    out: TextIO | None = None,
) -> tuple[bool, list[str], Any]:
    """One streamed call: its text printed to ``out`` as it arrives; (ok, lines to print after, the text).
    An error answered before the stream (the container's JSON error) is raised as boto3 raises it."""
    from botocore.exceptions import EventStreamError

    from scripts.caller.errors import keep_error_bodies

    keep_error_bodies(client, "InvokeEndpointWithResponseStream")
    out = out or sys.stdout
    progress = Progress()
    print(f"{model}:", file=out, flush=True)
    try:
        response = client.invoke_endpoint_with_response_stream(
            EndpointName=endpoint_name,
            ContentType="application/json",
            Body=envelope(model, text, options),
            **(route or {}),
        )
        for event in sse_events(payload_bytes(response["Body"])):
            piece = event_text(event)
            if piece:
                progress.add(piece)
                print(piece, end="", file=out, flush=True)
    except (StreamFailed, EventStreamError) as error:
        print(file=out)
        return False, [f"  stream failed: {error}", f"  ({progress.summary()})"], progress.text
    print(file=out)
    return True, [f"  ({progress.summary()})"], progress.text
