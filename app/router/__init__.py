"""The Flask router: SageMaker's ``GET /ping`` and ``POST /invocations`` in front of Triton.

``create_app(settings, registry, triton)`` is the application factory; tests hand it fakes.
Besides the contract's two paths it answers ``GET /openapi.json`` (``app/router/openapi.json``, the
contract as OpenAPI 3) and ``GET /metrics`` (``app/router/observability.py``).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from app.core.errors import (
    HTTP_STATUS_ERRORS,
    ApiError,
    InvalidInput,
    InvalidJson,
    UnknownModel,
    UnsupportedMediaType,
)
from app.core.health import ping_answer
from app.router.observability import install as install_observability
from app.core.settings import Settings

if TYPE_CHECKING:  # clients import app.core.errors and app.core.settings: imported lazily below
    from clients.base import ModelClient

log = logging.getLogger(__name__)

CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
JSON_TYPE = "application/json"
UTF8_NAMES = frozenset({"utf-8", "utf8"})
VERSION_PATTERN = re.compile(r"[1-9][0-9]{0,18}")
# JSON's \uXXXX escapes can spell a lone UTF-16 surrogate, a string no UTF-8 codec will take.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
OPENAPI_PATH = Path(__file__).with_name("openapi.json")


def _json_response(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, ensure_ascii=False, allow_nan=False), status=status, mimetype=JSON_TYPE)


def _error_response(error: ApiError) -> Response:
    return _json_response(error.body(), error.status)


def _reject_constant(name: str) -> Any:
    raise InvalidJson(f"the body is not valid JSON: {name} is not a JSON number")


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; NaN and Infinity, which Python's json accepts, are refused."""
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidJson(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidJson("the body is not usable JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidJson(f"the body must be a JSON object, not {type(value).__name__}")
    if SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(value):  # the scan only when one is possible
        raise InvalidJson("the body is not usable JSON: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return False


def parse_custom_attributes(header: str) -> dict[str, str]:
    """``a=1,b=2`` -> {"a": "1", "b": "2"}; pairs without ``=`` are not ours and are ignored."""
    pairs = (part.partition("=") for part in header.split(","))
    return {key.strip(): value.strip() for key, sep, value in pairs if sep and key.strip()}


def parse_version(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not VERSION_PATTERN.fullmatch(value.strip()):
        raise InvalidInput(f"{where} must be a positive integer version such as \"1\", got {value!r}")
    return value.strip()


def create_app(
    settings: Settings | None = None, registry: Mapping[str, ModelClient] | None = None, triton: Any = None
) -> Flask:
    """The router. ``registry`` maps model names to clients (built from the settings' model
    repository when not given); ``triton`` answers readiness (and inference, for a built registry)."""
    settings = settings or Settings.from_env()
    if triton is None:
        from clients.triton import TritonClient

        triton = TritonClient.from_settings(settings)
    if registry is None:
        from clients.registry import build_registry

        registry = build_registry(settings.model_repository, triton, settings)
    served = sorted(registry)

    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["SETTINGS"] = settings
    app.extensions["registry"] = registry
    app.extensions["triton"] = triton
    install_observability(app)
    openapi = OPENAPI_PATH.read_bytes()

    def lookup(name: Any) -> ModelClient:
        if name is None or name == "":
            raise UnknownModel(f"modelname is missing; served models: {', '.join(served)}")
        if not isinstance(name, str):
            raise InvalidInput(f"modelname must be a string, got {type(name).__name__}")
        client = registry.get(name)
        if client is None:
            raise UnknownModel(f"model {name!r} is not served; served models: {', '.join(served)}")
        g.model = client.name
        return client

    @app.errorhandler(ApiError)
    def api_error(error: ApiError) -> Response:
        g.error_code = error.code
        return _error_response(error)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        ours = HTTP_STATUS_ERRORS.get(error.code or 500)
        if ours is None:
            code = re.sub(r"\W+", "_", (error.name or "error").lower()).strip("_")
            g.error_code = code
            return _json_response({"error": {"code": code, "message": error.description}}, error.code or 500)
        messages = {
            404: f"no such path: {request.path}",
            405: f"{request.method} is not allowed on {request.path}",
            413: f"the body is over the limit of {settings.max_body_bytes} bytes",
        }
        return api_error(ours(messages.get(error.code, error.description or ours.code)))

    @app.errorhandler(Exception)
    def internal_error(error: Exception) -> Response:
        error_id = uuid.uuid4().hex
        g.error_code = "internal_error"
        log.exception(
            "internal error %s on %s %s", error_id, request.method, request.path,
            extra={"fields": {"request_id": g.get("request_id"), "error_id": error_id, "model": g.get("model")}},
        )
        return _json_response(
            {"error": {"code": "internal_error", "message": f"internal error; its id is {error_id}"}}, 500
        )

    @app.get("/ping")
    def ping() -> Response:
        status, body = ping_answer(triton, served)
        return _json_response(body, status)

    @app.get("/openapi.json")
    def openapi_description() -> Response:
        return Response(openapi, mimetype=JSON_TYPE)

    @app.post("/invocations")
    def invocations() -> Response:
        mimetype = request.mimetype or JSON_TYPE
        if mimetype == JSON_TYPE:
            envelope = parse_json_object(request.get_data(cache=False))
            client = lookup(envelope.get("modelname"))
            version = parse_version(envelope.get("version"), "version")
            payload, label = envelope.get("payload"), None
            if not isinstance(payload, dict):
                raise InvalidInput("payload is missing" if payload is None else "payload must be a JSON object")
        else:
            attributes = parse_custom_attributes(request.headers.get(CUSTOM_ATTRIBUTES, ""))
            client = lookup(attributes.get("modelname"))
            if mimetype not in client.content_types:
                accepted = ", ".join(sorted({JSON_TYPE, *client.content_types}))
                raise UnsupportedMediaType(
                    f"model {client.name!r} does not take {mimetype}; it takes {accepted}"
                )
            version = parse_version(attributes.get("version"), f"{CUSTOM_ATTRIBUTES} version")
            options = client.options_from_attributes(attributes, CUSTOM_ATTRIBUTES)
            payload, label = {client.input_field: _raw_item(mimetype), **options}, "the body"
        result, served_version = client.inference(payload, version, label=label, timings=g.timings)
        return _json_response({"modelname": client.name, "version": served_version, "result": result})

    return app


def _raw_item(mimetype: str) -> bytes | str:
    """A raw body as one input item: bytes for images, text (UTF-8) for ``text/*``."""
    body = request.get_data(cache=False)
    if not body:
        raise InvalidInput("the body is empty")
    if not mimetype.startswith("text/"):
        return body
    charset = (request.mimetype_params.get("charset") or "utf-8").lower()
    if charset not in UTF8_NAMES:
        raise UnsupportedMediaType(f"text bodies must be UTF-8, not {charset}")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("the body is not valid UTF-8 text") from None
