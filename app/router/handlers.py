"""Every error the router answers, turned into its JSON body in one place.

- ``ApiError`` (``app.core.errors``): its status and body;
- Werkzeug's HTTP errors (no such path, wrong method, body over the limit): mapped onto ours by
  status, or, for a status we have no class for, an error made from its name;
- anything else is a bug: logged with a fresh id, answered as an opaque 500 that names the id.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from app.core import access
from app.core.errors import HTTP_STATUS_ERRORS, ApiError, InternalError, payload_too_large
from app.core.settings import Settings
from app.router.observability import TRACE_KEY
from app.router.parsing import JSON_TYPE

OPENAI_PREFIX = "/v1/"  # OpenAI's paths (app.router.openai_paths), whose errors take OpenAI's shape

log = logging.getLogger("app.router")


def json_bytes(body: Any) -> bytes:
    """``body`` as compact UTF-8 JSON (orjson: an embedding's 384 floats in 10 us, against json.dumps'
    200 us); NaN or an infinity anywhere in it is a ValueError, as json.dumps(allow_nan=False) makes it
    (orjson would write null)."""
    text = orjson.dumps(body)
    if b"null" in text:  # a None, or a NaN orjson wrote as null: json.dumps tells them apart
        json.dumps(body, allow_nan=False)
    return text


def json_response(body: Any, status: int = 200) -> Response:
    return Response(json_bytes(body), status=status, mimetype=JSON_TYPE)


def register_error_handlers(app: Flask, settings: Settings) -> None:
    @app.errorhandler(ApiError)
    def api_error(error: ApiError) -> Response:
        trace = request.environ.get(TRACE_KEY)
        if trace is not None:
            trace.error_code = error.code
        openai = request.path.startswith(OPENAI_PREFIX)  # app.router.openai_paths: OpenAI's shape there
        return json_response(error.openai_body() if openai else error.body(), error.status)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if status == 413:
            return api_error(payload_too_large(settings.max_body_bytes))
        ours = HTTP_STATUS_ERRORS.get(status)
        if ours is None:
            return api_error(ApiError.for_status(status, error.name or "error", error.description or ""))
        messages = {
            404: f"no such path: {request.path}",
            405: f"{request.method} is not allowed on {request.path}",
        }
        return api_error(ours(messages.get(status, error.description or ours.code)))

    @app.errorhandler(Exception)
    def internal_error(error: Exception) -> Response:
        answer = InternalError(uuid.uuid4().hex)
        trace = request.environ.get(TRACE_KEY)
        log.exception(
            "internal error %s on %s %s",
            answer.error_id,
            request.method,
            request.path,
            extra={
                "fields": {
                    access.REQUEST_ID: trace and trace.request_id,
                    "error_id": answer.error_id,
                    access.MODEL: trace and trace.model,
                }
            },
        )
        return api_error(answer)
