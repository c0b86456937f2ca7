"""OpenAI's paths, for local use: the ``openai`` package, LangChain's ``ChatOpenAI`` or any
OpenAI-compatible tool pointed at the stack (``base_url="http://localhost:8080/v1"``). SageMaker itself
only sends ``/invocations``; these answer exactly as the same body there does.

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI's chat completions and
  completions bodies (``model`` names the served model, as on ``/invocations``), whole or streamed;
- ``POST /v1/embeddings``: OpenAI's ``{"input", "model", "encoding_format"}`` for a ``sentence_embedding``
  model, answered with the vectors the envelope's ``{"text": input}`` answers (``float``, or
  ``base64``: each vector's little-endian float32 bytes, as OpenAI's);
- ``GET /v1/models``: every served model, its family in ``owned_by``;
- any error on these paths in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``
  (``app.router.handlers``; ``code`` is this endpoint's own, as ``/invocations`` names it).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flask import Flask, Response, request

from app.core.errors import InvalidInput
from app.router.handlers import json_response
from app.router.parsing import parse_json_object

CREATED = 0  # /v1/models' "created": a model here has no creation time to give
EMBEDDING_KEYS = ("input", "model", "encoding_format", "user")
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingAsk:
    """A checked ``/v1/embeddings`` body: the model, its texts and the encoding of their vectors."""

    model: str
    texts: tuple[str, ...]
    encoding: str = "float"


def generation_document(document: Any, path: str, key: str) -> Mapping[str, Any]:
    """The body of ``/v1/chat/completions`` (``key`` ``messages``) or ``/v1/completions`` (``prompt``):
    a JSON object with ``key`` (other bodies belong on ``/invocations``)."""
    if not isinstance(document, Mapping) or key not in document:
        kind = "chat completions" if key == "messages" else "completions"
        raise InvalidInput(
            f"{path} takes OpenAI's {kind} body, a JSON object with {key}; send other bodies to /invocations"
        )
    return document


def embedding_ask(document: Mapping[str, Any]) -> EmbeddingAsk:
    """``/v1/embeddings``' body checked: ``input`` a text or a list of texts (token ids are not taken),
    ``model`` named, ``encoding_format`` ``float`` or ``base64``; any other key refused."""
    given = {key: value for key, value in document.items() if value is not None}
    unknown = sorted(set(given) - set(EMBEDDING_KEYS))
    if unknown:
        raise InvalidInput(f"{unknown[0]} is not taken by /v1/embeddings (taken: {', '.join(EMBEDDING_KEYS)})")
    model = given.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput("model must name the sentence_embedding model to call")
    texts = given.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise InvalidInput("input must be a text or a non-empty list of texts (token ids are not taken)")
    encoding = given.get("encoding_format", ENCODINGS[0])
    if encoding not in ENCODINGS:
        raise InvalidInput(f"encoding_format must be one of {', '.join(ENCODINGS)}, not {encoding!r}")
    return EmbeddingAsk(model, tuple(texts), encoding)


def encoded(vector: Sequence[float], encoding: str) -> list[float] | str:
    """A vector as ``encoding_format`` asks: the floats, or their little-endian float32 bytes in base64."""
    if encoding == "float":
        return list(vector)
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def embedding_list(ask: EmbeddingAsk, vectors: Sequence[Sequence[float]], tokens: int) -> dict[str, Any]:
    """``/v1/embeddings``' answer: each text's vector at its index, and the tokens the model read."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": encoded(vector, ask.encoding)}
            for index, vector in enumerate(vectors)
        ],
        "model": ask.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


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
    app: Flask,
    chat: Callable[[Mapping[str, Any]], Response],
    embed: Callable[[EmbeddingAsk], tuple[Sequence[Sequence[float]], int]],
    models: Callable[[], Mapping[str, str]],
) -> None:
    """The paths on ``app``: ``chat`` answers a chat completions or completions body (checked here first,
    then answered as ``/invocations`` answers it); ``embed``
    answers an embeddings ask with its vectors and the tokens read; ``models`` names the served models
    and their families."""

    @app.post("/v1/chat/completions")
    def chat_completions() -> Response:
        return chat(generation_document(parse_json_object(request.get_data()), request.path, "messages"))

    @app.post("/v1/completions")
    def completions() -> Response:
        return chat(generation_document(parse_json_object(request.get_data()), request.path, "prompt"))

    @app.post("/v1/embeddings")
    def embeddings() -> Response:
        ask = embedding_ask(parse_json_object(request.get_data()))
        vectors, tokens = embed(ask)
        return json_response(embedding_list(ask, vectors, tokens))

    @app.get("/v1/models")
    def list_models() -> Response:
        return json_response(model_list(models()))
