"""The router's error classes, each knowing its HTTP status and code.

Every failure a caller can act on is one of these, and every ``{"error": {"code", "message"}}``
body the endpoint answers comes from ``ApiError.body``: the router's handlers
(``app/router/handlers.py``), ``serve``'s ping server, and the answers NGINX gives on its own
(``nginx_errors``, written into ``nginx.conf`` by ``app/serve/nginx.py``). Anything else is a bug
and answers an opaque 500 (``InternalError``) with an id that points at the logged traceback.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.core.settings import BODY_LIMIT, MIB


class ApiError(Exception):
    """Base class: a condition with an HTTP status, a stable code and a message for the caller."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}

    def openai_body(self) -> dict[str, Any]:
        """The error in OpenAI's shape (the ``/v1/`` paths): its ``type`` the caller's mistake, a bound
        reached or the server's; its ``code`` this endpoint's own."""
        kind = "rate_limit_error" if self.status == 429 else "invalid_request_error"
        kind = "server_error" if self.status >= 500 else kind
        return {"error": {"message": self.message, "type": kind, "param": None, "code": self.code}}

    def json(self) -> str:
        return json.dumps(self.body(), ensure_ascii=False)

    @classmethod
    def for_status(cls, status: int, name: str, message: str) -> ApiError:
        """An HTTP status none of the classes below stands for; its code is made from its name."""
        error = cls(message)
        error.status, error.code = status, re.sub(r"\W+", "_", name.lower()).strip("_") or "error"
        return error


class InternalError(ApiError):
    """A bug: the caller gets only the id under which the traceback was logged."""

    status, code = 500, "internal_error"

    def __init__(self, error_id: str) -> None:
        super().__init__(f"internal error; its id is {error_id}")
        self.error_id = error_id


class InvalidJson(ApiError):
    status, code = 400, "invalid_json"


class InvalidInput(ApiError):
    status, code = 400, "invalid_input"


class InvalidItem(InvalidInput):
    """One item of a batch that a step of a Triton pipeline refused (an image that does not decode).

    The step answers Triton's error with ``InvalidItem.encode(row, message)``, its message naming
    the item ``WHERE``; the router finds it in Triton's error (``decode``) and names the item as the
    caller did (``payload.img[3]``)."""

    WHERE = "{item}"
    _PATTERN = re.compile(r"item (\d+) refused: (.*)", re.DOTALL)

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index

    @staticmethod
    def encode(index: int, message: str) -> str:
        return f"item {index} refused: {message}"

    @classmethod
    def decode(cls, text: str) -> InvalidItem | None:
        found = cls._PATTERN.search(text)
        return cls(int(found.group(1)), found.group(2).strip()) if found else None


class LineError(ApiError):
    """A JSON Lines request refused because of one line: that line's error, with its number (from
    1) in the message and in the body's ``line``; the status and code are the line's own."""

    def __init__(self, line: int, error: ApiError) -> None:
        super().__init__(f"line {line}: {error.message}")
        self.status, self.code, self.line = error.status, error.code, line

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["line"] = self.line
        return body


class NotFound(ApiError):
    status, code = 404, "not_found"


class UnknownModel(ApiError):
    status, code = 404, "unknown_model"


class MethodNotAllowed(ApiError):
    status, code = 405, "method_not_allowed"


class PayloadTooLarge(ApiError):
    status, code = 413, "payload_too_large"


def payload_too_large(limit_bytes: int) -> PayloadTooLarge:
    """The 413 for a body over the configured limit: the router's and NGINX's alike."""
    return PayloadTooLarge(
        f"request body is over {limit_bytes / MIB:.4g} MiB ({limit_bytes} bytes), the limit {BODY_LIMIT} sets "
        "(SageMaker allows 6 MiB on a real-time endpoint, 1 GB on an asynchronous one)"
    )


class ModelAlreadyLoaded(ApiError):
    """Multi-model mode: ``POST /models`` for a name that is loaded (or being loaded)."""

    status, code = 409, "model_already_loaded"


class InsufficientMemory(ApiError):
    """Multi-model mode: a load the instance has not the memory for; SageMaker then unloads others."""

    status, code = 507, "insufficient_memory"


class NotAcceptable(ApiError):
    status, code = 406, "not_acceptable"


class UnsupportedMediaType(ApiError):
    status, code = 415, "unsupported_media_type"


class ModelNotReady(ApiError):
    status, code = 503, "model_not_ready"


class RouterUnavailable(ApiError):
    """Answered by NGINX when the router's socket does not answer (starting, restarting)."""

    status, code = 503, "router_unavailable"


class TritonUnavailable(ApiError):
    status, code = 503, "triton_unavailable"


class ModelOverloaded(ApiError):
    """A generation model whose waiting queue is full refused the request on arrival: retry after a
    moment (SageMaker's callers see a ``ModelError`` carrying this body)."""

    status, code = 429, "model_overloaded"


class InferenceTimeout(ApiError):
    status, code = 504, "inference_timeout"


class InferenceFailed(ApiError):
    """A model that Triton ran failed on a request that was checked (a KServe v2 body passed to a
    model of the caller's own): Triton's message, not a fault of the router."""

    status, code = 500, "inference_failed"


# Werkzeug's HTTP exceptions that can reach the app, by status, mapped onto ours.
HTTP_STATUS_ERRORS: dict[int, type[ApiError]] = {
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
}


def nginx_errors(max_body_bytes: int) -> dict[str, ApiError]:
    """What NGINX answers by itself, without the router: the nginx.conf field each fills
    (``{{<name>_BODY}}``), and the error whose body it is."""
    return {
        "PING_METHOD_NOT_ALLOWED": MethodNotAllowed("/ping takes GET only"),
        "NOT_FOUND": NotFound("no such path; the endpoint serves POST /invocations and GET /ping"),
        "PAYLOAD_TOO_LARGE": payload_too_large(max_body_bytes),
        "ROUTER_UNAVAILABLE": RouterUnavailable("the router is not running yet or is restarting; try again shortly"),
    }
