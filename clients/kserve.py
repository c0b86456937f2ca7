"""Triton's HTTP endpoint: KServe v2 requests passed to it untouched, for clients of AWS's SageMaker
Triton image (its ``/invocations`` takes exactly these bodies), and the repository calls that load
and unload models in multi-model mode (``app.router.models_api``).

A v2 JSON body goes to ``POST /v2/models/<model>/infer`` as it came; a
``application/vnd.sagemaker-triton.binary+json;json-header-size=N`` body goes with Triton's own
``Inference-Header-Content-Length: N``, and an answer that carries binary outputs comes back with
its JSON header's size, which the router turns back into the SageMaker media type. Triton's
refusals become the router's error classes, carrying Triton's message. Before any of that, the
router checks the body against the model's configuration (``clients.v2_checks``), which this
client reads from Triton once per model and load (``contract``).
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from urllib.parse import quote

from app.core.errors import (
    ApiError,
    InferenceFailed,
    InferenceTimeout,
    InsufficientMemory,
    InvalidInput,
    InvalidItem,
    ModelNotReady,
    TritonUnavailable,
    UnknownModel,
)
from app.core.settings import Settings
from clients.triton import NOT_SERVING_HINTS
from clients.v2_checks import ModelContract

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_HEADERS = {"Content-Type": "application/json"}
# Fragments of the messages backends give when a model does not fit in memory (the stock
# SageMaker Triton image answers a load that fails with one of them 507, as here).
OUT_OF_MEMORY_HINTS = (
    "CUDA out of memory",
    "CUDA_OUT_OF_MEMORY",
    "Out of memory",
    "Out Of Memory",
    "out of memory",
    "MemoryError",
    "OutOfMemory",
    "bad_alloc",
    "Failed to allocate memory",
    "failed to allocate memory",
    "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "No space left on device",
)
# Fragments of Triton's messages for a model it has never heard of ("Request for unknown model:
# 'x' is not found"); one that failed to load or is unloaded says "... has no available versions".
_UNKNOWN_HINTS = ("unknown model", "not found")
# Triton answers some faults of the request itself with 500 (its JSON reader's errors are INTERNAL):
# "Unable to parse 'data': Shape does not match true shape of 'data' field".
_REQUEST_FAULT_HINTS = (
    "unable to parse",
    "failed to parse",
    "shape does not match",
    "invalid_argument",
    "invalid argument",
    "unexpected shape",
    "unexpected datatype",
)


@dataclass(frozen=True)
class Answer:
    """Triton's answer: its bytes, and the size of its JSON header when binary outputs follow it."""

    body: bytes
    json_size: int | None


def error_message(data: bytes) -> str:
    """Triton's ``{"error": ...}`` answer's message (its raw text when it is not that)."""
    try:
        return str(json.loads(data).get("error", "")) or data.decode("utf-8", "replace")
    except (ValueError, AttributeError):
        return data.decode("utf-8", "replace")


def refusal(status: int, message: str, model: str) -> ApiError:
    """The router's error for Triton's non-200 answer to a v2 request."""
    lowered = message.lower()
    if status == 503 or any(hint in lowered for hint in NOT_SERVING_HINTS):
        return ModelNotReady(f"model {model!r} is not ready in Triton: {message}")
    if status == 404 or (status < 500 and any(hint in lowered for hint in _UNKNOWN_HINTS)):
        return UnknownModel(f"Triton serves no model {model!r}: {message}")
    refused = InvalidItem.decode(message)
    if refused is not None:  # a pipeline step refused an item: "item 0 refused: {item} is not a decodable image"
        return InvalidInput(
            f"Triton refused the request for {model!r}: item {refused.index} of the batch: "
            f"{refused.message.replace(InvalidItem.WHERE, 'it')}"
        )
    if 400 <= status < 500 or any(hint in lowered for hint in _REQUEST_FAULT_HINTS):
        return InvalidInput(f"Triton refused the request for {model!r}: {message}")
    if status == 500:
        return InferenceFailed(f"model {model!r} failed the request in Triton: {message}")
    return TritonUnavailable(f"Triton failed the request for {model!r} ({status}): {message}")


class TritonHttp:
    """Triton's HTTP endpoint, one connection per request (on loopback a connection costs little)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        host, _, port = url.rpartition(":")
        self.host, self.port, self.timeout_s = host or "127.0.0.1", int(port), timeout_s
        self._contracts: dict[str, tuple[object, ModelContract]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> TritonHttp:
        return cls(settings.triton_http_url, settings.triton_timeout_s)

    def _request(
        self, path: str, body: bytes | None, headers: dict[str, str], timeout_s: float, what: str, method: str = "POST"
    ) -> tuple[int, bytes, str | None]:
        """(status, body, the answer's JSON header size if any) of one request to Triton."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        try:
            connection.request(method, path, body, headers)
            response = connection.getresponse()
            return response.status, response.read(), response.getheader(HEADER_LENGTH)
        except TimeoutError:
            raise InferenceTimeout(f"{what} did not answer within {timeout_s:g} s") from None
        except OSError as error:
            raise TritonUnavailable(f"Triton cannot be reached at {self.host}:{self.port}: {error}") from None
        finally:
            connection.close()

    def infer(self, model: str, body: bytes, json_size: int | None = None) -> Answer:
        headers = {"Content-Type": "application/json" if json_size is None else "application/octet-stream"}
        if json_size is not None:
            headers[HEADER_LENGTH] = str(json_size)
        status, data, size = self._request(
            f"/v2/models/{quote(model, safe='')}/infer", body, headers, self.timeout_s, f"model {model!r}"
        )
        if status == 200:
            return Answer(data, int(size) if size else None)
        raise refusal(status, error_message(data), model)

    def contract(self, model: str, load: object = None) -> ModelContract:
        """What ``model`` takes and gives, read from Triton's config of it once per ``load`` (multi-model
        mode: the load's time; one load for ever otherwise). A model Triton does not serve is refused
        here, as its inference would be."""
        kept = self._contracts.get(model)
        if kept is not None and kept[0] == load:
            return kept[1]
        status, data, _ = self._request(
            f"/v2/models/{quote(model, safe='')}/config", None, {}, self.timeout_s, f"model {model!r}", method="GET"
        )
        if status != 200:
            raise refusal(status, error_message(data), model)
        contract = ModelContract.from_config(model, json.loads(data))
        self._contracts[model] = (load, contract)
        return contract

    def load(self, model: str, timeout_s: float) -> None:
        """Load ``model`` from the repository (explicit model control); a failure for want of
        memory is a 507, any other a 400 with Triton's message."""
        status, data, _ = self._request(
            f"/v2/repository/models/{quote(model, safe='')}/load", b"{}", JSON_HEADERS, timeout_s, f"loading {model!r}"
        )
        if status != 200:
            message = error_message(data)
            if any(hint in message for hint in OUT_OF_MEMORY_HINTS):
                raise InsufficientMemory(f"Triton could not load {model!r} for want of memory: {message}")
            raise InvalidInput(f"Triton could not load {model!r}: {message}")

    def unload(self, model: str) -> None:
        """Unload ``model`` and the models only it used (an ensemble's steps)."""
        body = json.dumps({"parameters": {"unload_dependents": True}}).encode()
        status, data, _ = self._request(
            f"/v2/repository/models/{quote(model, safe='')}/unload",
            body,
            JSON_HEADERS,
            self.timeout_s,
            f"unloading {model!r}",
        )
        if status != 200:
            raise TritonUnavailable(f"Triton could not unload {model!r}: {error_message(data)}")
