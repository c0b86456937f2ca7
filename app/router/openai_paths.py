"""OpenAI's paths, for local use: the ``openai`` package, LangChain's ``ChatOpenAI`` or any
OpenAI-compatible tool pointed at the stack (``base_url="http://localhost:8080/v1"``). SageMaker itself
only sends ``/invocations``; these answer exactly as the same body there does.

- ``POST /v1/chat/completions``: OpenAI's chat completions body (``model`` names the served model,
  as on ``/invocations``), whole or streamed;
- ``GET /v1/models``: every served model, its family in ``owned_by``;
- any error on these paths in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``
  (``app.router.handlers``; ``code`` is this endpoint's own, as ``/invocations`` names it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask, Response, request

from app.core.errors import InvalidInput
from app.router.handlers import json_response
from app.router.parsing import parse_json_object

CREATED = 0  # /v1/models' "created": a model here has no creation time to give


def chat_document(document: Any) -> Mapping[str, Any]:
    """The body of ``/v1/chat/completions``: a JSON object with ``messages`` (other bodies belong on
    ``/invocations``)."""
    if not isinstance(document, Mapping) or "messages" not in document:
        raise InvalidInput(
            "/v1/chat/completions takes OpenAI's chat completions body, a JSON object with messages; "
            "send other bodies to /invocations"
        )
    return document


def model_list(models: Mapping[str, str]) -> dict[str, Any]:
    """``/v1/models``' answer: each served model (name to family) as OpenAI lists one."""
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": CREATED, "owned_by": family}
            for name, family in sorted(models.items())
        ],
    }


def register(
    app: Flask, chat: Callable[[Mapping[str, Any]], Response], models: Callable[[], Mapping[str, str]]
) -> None:
    """The paths on ``app``: ``chat`` answers a chat completions body (checked here first); ``models``
    names the served models and their families."""

    @app.post("/v1/chat/completions")
    def chat_completions() -> Response:
        return chat(chat_document(parse_json_object(request.get_data())))

    @app.get("/v1/models")
    def list_models() -> Response:
        return json_response(model_list(models()))
