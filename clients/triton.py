"""The one owner of the gRPC client to Triton.

One channel and stub of Triton's gRPC service per worker process, created on first use (gunicorn
forks the workers before any request, and a gRPC channel must not cross a fork), with reconnect backoff
capped so that a Triton that restarts or starts late is found again within a second. A readiness call
that finds Triton unreachable renews the channel, so that the next one connects afresh instead of
failing fast on a connection state gRPC may keep stale (a Triton stopped and continued). Every call
carries a deadline. Transport and server errors become the router's error classes here, and
nowhere else.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import (
    InferenceServerException,
    deserialize_bytes_tensor,
    np_to_triton_dtype,
    serialize_byte_tensor,
    triton_to_np_dtype,
)

from app.core.causal_lm_contract import BUSY_MARKER
from app.core.errors import (
    ApiError,
    InferenceTimeout,
    InvalidInput,
    InvalidItem,
    ModelNotReady,
    ModelOverloaded,
    TritonUnavailable,
)
from app.core.generation_contract import DEADLINE_MARKER
from app.core.settings import SERVER_TIMEOUT, TRITON_TIMEOUT, Settings
from app.core.states import READY, UNAVAILABLE

# tritonclient's own defaults are replaced wholesale when channel_args is given, so the
# message size limits are repeated here; the backoff caps are the reason to pass them at all.
CHANNEL_ARGS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Subchannels are otherwise shared process-wide by address: a renewed channel would inherit
    # the old one's connection state, the thing renewing it is meant to leave behind.
    ("grpc.use_local_subchannel_pool", 1),
)

# A readiness call (what /ping waits on) also has a hard stop this much after its deadline,
# enforced here, should gRPC's deadline not fire. An inference call is a blocking call whose deadline
# gRPC enforces: tests/unit/test_triton_errors.py (a port that accepts and never speaks) and
# tests/integration/test_faults.py (Triton stopped with SIGSTOP) check that it ends on time.
HARD_STOP_GRACE_S = 0.5
READINESS_THREADS = 4
# A streamed request's parameter asking for the final flag alone, and the flag on a response.
EMPTY_FINAL, FINAL = "triton_enable_empty_final_response", "triton_final_response"

# Fragments of Triton's messages for a model that exists in the repository but cannot serve (over
# gRPC such a model is also an "unknown model"; over HTTP that phrase starts "is not found" too).
NOT_SERVING_HINTS = ("not ready", "not at ready state", "no available versions")
_NOT_READY_HINTS = ("unknown model", *NOT_SERVING_HINTS)


def _status_and_message(error: InferenceServerException | grpc.RpcError) -> tuple[str, str]:
    if isinstance(error, InferenceServerException):
        return str(error.status() or ""), str(error.message() or "")
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = error.details() if callable(getattr(error, "details", None)) else None
    return str(code or ""), str(details or error)


def translate_error(
    error: InferenceServerException | grpc.RpcError,
    model: str | None = None,
    version: str | None = None,
    timeout_s: float | None = None,
) -> ApiError | None:
    """The router's error for a Triton failure, or None for one that is a bug (answered as a 500)."""
    status, message = _status_and_message(error)
    status = status.rsplit(".", 1)[-1]  # "StatusCode.UNAVAILABLE" -> "UNAVAILABLE"
    lowered = message.lower()
    subject = f"model {model!r}" if model else "Triton"
    refused = InvalidItem.decode(message)
    if refused is not None:  # a pipeline step refused one item of the batch
        return refused
    if BUSY_MARKER in message:  # a text_generation model's waiting queue is full
        return ModelOverloaded(f"{subject}: {message}")
    if DEADLINE_MARKER in message:  # a text2text model ended a generation at the deadline it was given
        return InferenceTimeout(f"{subject}: {message} (the router's {TRITON_TIMEOUT} or {SERVER_TIMEOUT})")
    if status == "DEADLINE_EXCEEDED":
        within = f" within {timeout_s:g} s" if timeout_s else " before the deadline"
        return InferenceTimeout(f"{subject} did not answer{within} (the router's {TRITON_TIMEOUT} or {SERVER_TIMEOUT})")
    if status == "NOT_FOUND":
        # "'resnet' version 7 is not found": a version the repository does not hold
        if version and f"version {version} " in message:
            return InvalidInput(f"version {version!r} of {subject} is not served: {message}")
        # "'resnet' is not found", "'resnet' has no available versions": it failed to load
        return ModelNotReady(f"{subject} is not ready in Triton: {message}")
    if status == "UNAVAILABLE" and any(h in lowered for h in _NOT_READY_HINTS):
        # "'resnet' version 1 is not at ready state": loading or unloading
        return ModelNotReady(f"{subject} is not ready in Triton: {message}")
    if status == "UNAVAILABLE" and "timed out" in lowered:
        # The port accepted the connection but Triton never spoke (it hangs): a timeout, not a
        # Triton that is gone.
        return InferenceTimeout(f"{subject} did not answer: Triton accepted the connection but is not responding")
    if status in ("UNAVAILABLE", "CANCELLED"):
        return TritonUnavailable(f"Triton cannot be reached: {message}")
    return None


def unreachable(error: grpc.RpcError) -> bool:
    """Whether a call failed because Triton could not be reached (gRPC's UNAVAILABLE, not a model's)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    return code == grpc.StatusCode.UNAVAILABLE and isinstance(translate_error(error), TritonUnavailable)


class TritonClient:
    """Inference and readiness calls to one Triton over gRPC, safe to share between threads."""

    def __init__(self, url: str, timeout_s: float, ping_timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.ping_timeout_s = ping_timeout_s
        self._lock = threading.Lock()
        self._service: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._channel: grpc.Channel | None = None
        self._retired: grpc.Channel | None = None  # the channel before a renewal: its calls in flight end
        self._pid: int | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> TritonClient:
        return cls(settings.triton_grpc_url, settings.triton_timeout_s, settings.ping_timeout_s)

    def _stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        pid = os.getpid()
        stub = self._service
        if stub is not None and self._pid == pid:
            return stub
        with self._lock:
            if self._service is None or self._pid != pid:
                # A channel inherited through a fork is dropped, not closed: it belongs to the parent.
                self._channel = grpc.insecure_channel(self.url, options=list(CHANNEL_ARGS))
                self._service = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
                self._pid = pid
            return self._service

    def _renew(self, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
        """The next call gets a new channel, unless another thread has renewed ``stub``'s already.
        The old channel is kept until the next renewal so that its calls in flight are not cut."""
        with self._lock:
            if self._service is stub and self._pid == os.getpid():
                self._retired, self._channel, self._service = self._channel, None, None

    def _readiness_pool(self) -> ThreadPoolExecutor:
        pid = os.getpid()
        with self._lock:
            if self._pool is None or self._pool_pid != pid:
                self._pool = ThreadPoolExecutor(READINESS_THREADS, thread_name_prefix="triton-readiness")
                self._pool_pid = pid
            return self._pool

    def _raise(self, error: Exception, model: str | None, version: str | None, timeout_s: float) -> None:
        translated = translate_error(error, model, version, timeout_s)  # type: ignore[arg-type]
        if translated is None:
            raise error
        raise translated from error

    def _readiness_call(self, method: str, request: Any) -> Any:
        """A readiness call with its deadline, and a hard stop should the deadline not fire; when
        Triton cannot be reached, the channel is renewed for the next call."""
        stub = self._stub()
        future = self._readiness_pool().submit(getattr(stub, method), request, timeout=self.ping_timeout_s)
        try:
            return future.result(timeout=self.ping_timeout_s + HARD_STOP_GRACE_S)
        except FutureTimeout:
            future.cancel()
            self._renew(stub)
            raise TritonUnavailable(f"Triton did not answer within {self.ping_timeout_s:g} s") from None
        except grpc.RpcError as error:
            if isinstance(translate_error(error), TritonUnavailable):
                self._renew(stub)
            self._raise(error, None, None, self.ping_timeout_s)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        version: str | None = None,
    ) -> tuple[dict[str, np.ndarray], str]:
        """One inference call; returns the named outputs and the version that served it.

        A blocking call on the service's own stub, with the request built straight from the arrays
        (``raw_input_contents``): no per-call client objects, no callback thread. Its deadline is
        gRPC's own, which fires whatever the channel's state (a Triton that hangs included).

        A call that finds Triton unreachable is made once more, at once, on a new channel: a
        channel whose connection failed waits out gRPC's backoff before it tries again, and until
        then fails its calls at once, though Triton may be back (stopped, then continued). A Triton
        that is gone refuses the new channel's connection just as fast."""
        request = _request(model, inputs, output_names, version)
        for last in (False, True):
            stub = self._stub()
            try:
                response = stub.ModelInfer(request, timeout=self.timeout_s)
                break
            except grpc.RpcError as error:
                if not last and unreachable(error):
                    self._renew(stub)
                    continue
                self._raise(error, model, version, self.timeout_s)
        return _arrays(response, output_names), response.model_version

    def stream(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        timeout_s: float | None = None,
        version: str | None = None,
    ) -> TritonStream:
        """A decoupled model's answers to one request, as they come: an iterator of output dicts,
        started now (several streams started together run together in Triton). ``close()`` cancels
        the call, which ends the request in Triton; errors are translated as ``infer``'s are, and a
        stream that finds Triton unreachable before its first answer is started once more on a new
        channel, as ``infer`` calls again."""
        request = _request(model, inputs, output_names, version)
        # the final flag comes even where the model sends it without a response of its own
        request.parameters[EMPTY_FINAL].bool_param = True
        timeout = self.timeout_s if timeout_s is None else timeout_s
        stub = self._stub()

        def again() -> Any:
            self._renew(stub)
            return self._stub().ModelStreamInfer(iter([request]), timeout=timeout)

        call = stub.ModelStreamInfer(iter([request]), timeout=timeout)
        return TritonStream(call, self, model, output_names, version, timeout, again)

    def model_states(self) -> dict[str, str]:
        """Each model in Triton's repository index with its state; READY when any version is."""
        index = self._readiness_call("RepositoryIndex", service_pb2.RepositoryIndexRequest())
        states: dict[str, str] = {}
        for entry in index.models:
            if states.get(entry.name) != READY:
                states[entry.name] = entry.state or UNAVAILABLE
        return states

    def server_ready(self) -> bool:
        return bool(self._readiness_call("ServerReady", service_pb2.ServerReadyRequest()).ready)

    def server_live(self) -> bool:
        return bool(self._readiness_call("ServerLive", service_pb2.ServerLiveRequest()).live)


class TritonStream:
    """The answers of one streamed request (``TritonClient.stream``): output dicts until the one that
    carries Triton's final flag; ``version`` is the version that answered (known from the first)."""

    def __init__(
        self,
        call: Any,
        client: TritonClient,
        model: str,
        output_names: Sequence[str],
        version: str | None,
        timeout_s: float,
        again: Callable[[], Any] | None = None,
    ) -> None:
        self.call = call
        self.client = client
        self.model = model
        self.output_names = tuple(output_names)
        self.version = version or ""
        self.timeout_s = timeout_s
        self.done = False
        self.again = again  # the call started once more on a new channel (Triton unreachable, nothing answered)

    def __iter__(self) -> TritonStream:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        while not self.done:
            try:
                answer = next(self.call)
            except StopIteration:
                self.done = True
                break
            except grpc.RpcError as error:
                if self.again is not None and unreachable(error):
                    self.call, self.again = self.again(), None
                    continue
                self.done = True
                self.client._raise(error, self.model, self.version or None, self.timeout_s)
            self.again = None  # an answer came: the request reached Triton, it is never sent twice
            if answer.error_message:
                self.close()
                error = InferenceServerException(answer.error_message, status="StatusCode.INTERNAL")
                self.client._raise(error, self.model, self.version or None, self.timeout_s)
            response = answer.infer_response
            self.version = response.model_version or self.version
            final = response.parameters[FINAL].bool_param if FINAL in response.parameters else False
            if final:  # the request is complete: the call is read to its end, nothing cancelled
                self.done = True
                self.call.code()  # Triton ends it at once; dropped before, gRPC would cancel it
            if response.outputs:
                return _arrays(response, self.output_names)
        raise StopIteration

    def close(self) -> None:
        """Cancels the call while its request runs (Triton sees it cancelled). A call whose final
        answer came was read to its end instead: a cancellation racing the call's own end (as gRPC
        cancels a call dropped unfinished) left the model counted in use in Triton, and a multi-model
        unload waited for it forever (``python -m scripts.soak.model_cycles``)."""
        if not self.done:
            self.done = True
            self.call.cancel()


def _request(
    model: str, inputs: Mapping[str, np.ndarray], output_names: Sequence[str], version: str | None
) -> service_pb2.ModelInferRequest:
    """An inference request built straight from the arrays (``raw_input_contents``)."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version or "")
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype), shape=array.shape)
        request.raw_input_contents.append(_raw(array))
    for name in output_names:
        request.outputs.add(name=name)
    return request


def _raw(array: np.ndarray) -> bytes:
    """A tensor's bytes as Triton reads them: BYTES elements length-prefixed, others row-major."""
    if array.dtype == np.object_ or array.dtype.type == np.bytes_:
        serialized = serialize_byte_tensor(array)  # one element: the whole tensor's bytes
        return serialized.item() if serialized.size else b""
    return np.ascontiguousarray(array).tobytes()


def _arrays(response: service_pb2.ModelInferResponse, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The named outputs of a response as arrays (views of its bytes where the type allows)."""
    found = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        if tensor.name not in names:
            continue
        shape = tuple(tensor.shape)
        if tensor.datatype == "BYTES":
            found[tensor.name] = deserialize_bytes_tensor(raw).reshape(shape)
        else:
            found[tensor.name] = np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype)).reshape(shape)
    missing = [name for name in names if name not in found]
    if missing:
        raise RuntimeError(f"Triton's answer lacks the outputs {missing} (it has {[t.name for t in response.outputs]})")
    return found
