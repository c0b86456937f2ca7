"""KServe v2 requests passed to Triton's HTTP endpoint untouched, for clients of AWS's SageMaker
Triton image (its ``/invocations`` takes exactly these bodies).

A v2 JSON body goes to ``POST /v2/models/<model>/infer`` as it came; a
``application/vnd.sagemaker-triton.binary+json;json-header-size=N`` body goes with Triton's own
``Inference-Header-Content-Length: N``, and an answer that carries binary outputs comes back with
its JSON header's size, which the router turns back into the SageMaker media type. Triton's
refusals become the router's error classes, carrying Triton's message.
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from urllib.parse import quote

from app.core.errors import ApiError, InferenceTimeout, InvalidInput, ModelNotReady, TritonUnavailable, UnknownModel
from app.core.settings import Settings
from clients.triton import NOT_SERVING_HINTS

HEADER_LENGTH = "Inference-Header-Content-Length"
# Fragments of Triton's messages for a model it has never heard of ("Request for unknown model:
# 'x' is not found"); one that failed to load or is unloaded says "... has no available versions".
_UNKNOWN_HINTS = ("unknown model", "not found")


@dataclass(frozen=True)
class Answer:
    """Triton's answer: its bytes, and the size of its JSON header when binary outputs follow it."""

    body: bytes
    json_size: int | None


def refusal(status: int, message: str, model: str) -> ApiError:
    """The router's error for Triton's non-200 answer to a v2 request."""
    lowered = message.lower()
    if status == 503 or any(hint in lowered for hint in NOT_SERVING_HINTS):
        return ModelNotReady(f"model {model!r} is not ready in Triton: {message}")
    if status == 404 or any(hint in lowered for hint in _UNKNOWN_HINTS):
        return UnknownModel(f"Triton serves no model {model!r}: {message}")
    if 400 <= status < 500:
        return InvalidInput(f"Triton refused the request for {model!r}: {message}")
    return TritonUnavailable(f"Triton failed the request for {model!r} ({status}): {message}")


class TritonHttp:
    """Triton's HTTP endpoint, one connection per request (on loopback a connection costs little)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        host, _, port = url.rpartition(":")
        self.host, self.port, self.timeout_s = host or "127.0.0.1", int(port), timeout_s

    @classmethod
    def from_settings(cls, settings: Settings) -> "TritonHttp":
        return cls(settings.triton_http_url, settings.triton_timeout_s)

    def infer(self, model: str, body: bytes, json_size: int | None = None) -> Answer:
        headers = {"Content-Type": "application/json" if json_size is None else "application/octet-stream"}
        if json_size is not None:
            headers[HEADER_LENGTH] = str(json_size)
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            connection.request("POST", f"/v2/models/{quote(model, safe='')}/infer", body, headers)
            response = connection.getresponse()
            data = response.read()
        except (TimeoutError, socket.timeout):
            raise InferenceTimeout(f"model {model!r} did not answer within {self.timeout_s:g} s") from None
        except OSError as error:
            raise TritonUnavailable(f"Triton cannot be reached at {self.host}:{self.port}: {error}") from None
        finally:
            connection.close()
        if response.status == 200:
            size = response.getheader(HEADER_LENGTH)
            return Answer(data, int(size) if size else None)
        try:
            message = str(json.loads(data).get("error", "")) or data.decode("utf-8", "replace")
        except (ValueError, AttributeError):
            message = data.decode("utf-8", "replace")
        raise refusal(response.status, message, model)
