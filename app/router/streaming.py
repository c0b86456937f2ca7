"""Answering a text_generation call (``app.router.generation_forms``, ``app.router.generation_answers``):
whole, or streamed as it is made.

Whole, the call's prompts are generated together and answered as JSON. Streamed (``"stream":
true``), the answer is ``text/event-stream``: one ``data: <JSON>\\n\\n`` event at a time, written as
each token comes, in chunks (HTTP/1.1 chunked transfer encoding: the body has no length). Neither
NGINX nor gunicorn holds it back: the answer carries ``X-Accel-Buffering: no``, which turns NGINX's
proxy buffering off for it alone (nginx.conf buffers every other answer), and gunicorn writes each
chunk as the body's iterator gives it.

The first token is awaited before the answer starts, so an error before it (a model not ready, a
deadline) is the usual JSON error with its status; one after it is a last event, ``{"error",
"error_type"}`` (TGI's). A caller that goes away (gunicorn closes the body's iterator when a write
fails, or when the body is dropped) cancels the generation's Triton stream, so Triton stops
generating for it; it is counted (``router_generation_cancelled_total{model}``). The request's access
line and metrics are written when the body ends (``Trace.streamed``), with its tokens, its time to
the first token and its tokens per second.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from itertools import chain
from typing import Any

from flask import Response

from app.core import access
from app.core.errors import ApiError, InternalError
from app.router.generation_answers import DONE, answer, events, tool_calls_in
from app.router.generation_call import GenerationCall
from app.router.handlers import json_bytes, json_response
from app.router.observability import Trace
from clients.base import timed
from clients.generation import Generation, account, collect

EVENT_STREAM_TYPE = "text/event-stream"
# NGINX passes such an answer on as it comes (proxy_buffering off for it alone); no cache keeps it.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

log = logging.getLogger("app.router")


def event(data: Any) -> bytes:
    """One server-sent event: ``data: <JSON>`` (or ``data: [DONE]``) and the blank line that ends it."""
    return b"data: " + (DONE.encode() if data == DONE else json_bytes(data)) + b"\n\n"


def answer_generation(call: GenerationCall, deadline: float, trace: Trace) -> Response:
    """The answer of a TGI, chat or completions call, or of a streamed envelope (its tool calls and
    whether a grammar constrained it counted on the request's line and metrics)."""
    if any(ask.grammar for ask in call.asks):
        trace.timings[access.CONSTRAINED] = 1
    if not call.stream:
        with timed(trace.timings, "triton"):
            (generations,) = collect([[call.client.start(ask, deadline, call.version) for ask in call.asks]])
        account(trace.timings, generations)
        body = answer(call, generations)
        counted(trace, tool_calls_in(body))
        return json_response(body)
    generation = call.client.start(call.asks[0], deadline, call.version)
    tokens = iter(generation)
    try:
        first = next(tokens)  # an error before the first token is answered as JSON, with its status
    except BaseException:
        generation.close()
        raise
    trace.streamed = True
    body = streamed_body(call, generation, chain([first], tokens), trace)
    return Response(body, mimetype=EVENT_STREAM_TYPE, headers=STREAM_HEADERS)


def streamed_body(call: GenerationCall, generation: Generation, tokens: Iterator[Any], trace: Trace) -> Iterator[bytes]:
    """The events of a streamed answer; closed early (the caller gone), the generation is cancelled."""
    ended = False
    try:
        for data in events(call, generation, tokens):
            counted(trace, tool_calls_in(data))
            yield event(data)
        ended = True
    except ApiError as error:
        ended = True
        trace.error_code = error.code
        yield event({"error": error.message, "error_type": error.code})
    except Exception:
        ended = True
        error = InternalError(uuid.uuid4().hex)
        trace.error_code = error.code
        log.exception(
            "internal error %s in a streamed answer",
            error.error_id,
            extra={
                "fields": {access.REQUEST_ID: trace.request_id, "error_id": error.error_id, access.MODEL: trace.model}
            },
        )
        yield event({"error": error.message, "error_type": error.code})
    finally:
        if generation.finish_reason is None:
            generation.close()
        if generation.elapsed_s is not None:
            trace.timings["triton"] = trace.timings.get("triton", 0.0) + generation.elapsed_s
        account(trace.timings, [generation], cancelled=not ended)


def counted(trace: Trace, calls: int) -> None:
    """``calls`` tool calls more on the request's line (none: no field)."""
    if calls:
        trace.timings[access.TOOL_CALLS] = trace.timings.get(access.TOOL_CALLS, 0) + calls
