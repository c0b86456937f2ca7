"""The router's error classes, each knowing its HTTP status and code.

Every failure a caller can act on is one of these; the Flask handlers in ``app/router/__init__.py``
turn them into ``{"error": {"code": ..., "message": ...}}``. Anything else is a bug and answers
an opaque 500 (``internal_error``) with an id that points at the logged traceback.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Base class: a condition with an HTTP status, a stable code and a message for the caller."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidJson(ApiError):
    status, code = 400, "invalid_json"


class InvalidInput(ApiError):
    status, code = 400, "invalid_input"


class NotFound(ApiError):
    status, code = 404, "not_found"


class UnknownModel(ApiError):
    status, code = 404, "unknown_model"


class MethodNotAllowed(ApiError):
    status, code = 405, "method_not_allowed"


class PayloadTooLarge(ApiError):
    status, code = 413, "payload_too_large"


class UnsupportedMediaType(ApiError):
    status, code = 415, "unsupported_media_type"


class ModelNotReady(ApiError):
    status, code = 503, "model_not_ready"


class TritonUnavailable(ApiError):
    status, code = 503, "triton_unavailable"


class InferenceTimeout(ApiError):
    status, code = 504, "inference_timeout"


# Werkzeug's HTTP exceptions that can reach the app, by status, mapped onto ours.
HTTP_STATUS_ERRORS: dict[int, type[ApiError]] = {
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
}
