"""clients.triton: gRPC and Triton failures become the router's errors, in that one module."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from app.core.causal_lm_contract import BUSY_MARKER
from app.core.errors import (
    InferenceTimeout,
    InsufficientMemory,
    InvalidInput,
    ModelNotReady,
    ModelOverloaded,
    TritonUnavailable,
    UnknownModel,
)
from clients import triton as triton_module
from clients.kserve import TritonHttp, refusal
from clients.triton import CHANNEL_ARGS, HARD_STOP_GRACE_S, TritonClient, translate_error
from scripts.devtools import free_ports


def server_error(status: str, message: str) -> InferenceServerException:
    return InferenceServerException(msg=message, status=f"StatusCode.{status}")


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    "error, version, expected, fragment",
    [
        (
            server_error("DEADLINE_EXCEEDED", "Deadline Exceeded"),
            None,
            InferenceTimeout,
            "within 30 s (the router's TRITON_TIMEOUT_S or MODEL_SERVER_TIMEOUT)",
        ),
        (
            server_error(
                "UNAVAILABLE",
                "failed to connect to all addresses; last error: UNKNOWN: "
                "ipv4:127.0.0.1:8001: Failed to connect to remote host: Connection refused",
            ),
            None,
            TritonUnavailable,
            "Connection refused",
        ),
        (server_error("UNAVAILABLE", "Socket closed"), None, TritonUnavailable, "Socket closed"),
        (server_error("CANCELLED", "Cancelled"), None, TritonUnavailable, "Cancelled"),
        (
            server_error("UNAVAILABLE", "Request for unknown model: 'resnet' version 1 is not at ready state"),
            None,
            ModelNotReady,
            "not at ready state",
        ),
        (
            server_error("UNAVAILABLE", "Request for unknown model: 'resnet' version 1 is not at ready state"),
            "1",
            ModelNotReady,
            "'resnet'",
        ),
        (
            server_error("NOT_FOUND", "Request for unknown model: 'resnet' is not found"),
            None,
            ModelNotReady,
            "'resnet' is not ready",
        ),
        (
            server_error("NOT_FOUND", "Request for unknown model: 'resnet' has no available versions"),
            None,
            ModelNotReady,
            "no available versions",
        ),
        (
            server_error("NOT_FOUND", "Request for unknown model: 'resnet' version 7 is not found"),
            "7",
            InvalidInput,
            "version '7' of model 'resnet' is not served",
        ),
        (
            server_error("INTERNAL", f"{BUSY_MARKER}: 64 requests wait for their first token"),
            None,
            ModelOverloaded,
            "model 'resnet': the model's waiting queue is full",
        ),
        (FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), None, InferenceTimeout, "resnet"),
        (FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect"), None, TritonUnavailable, "failed to connect"),
    ],
)
def test_translation(error, version, expected, fragment):
    translated = translate_error(error, "resnet", version, 30.0)
    assert type(translated) is expected
    assert fragment in translated.message


@pytest.mark.parametrize(
    "error",
    [
        server_error("INVALID_ARGUMENT", "inference request batch-size must be <= 8"),
        server_error("INTERNAL", "onnx runtime error"),
        InferenceServerException(msg="unsupported datatype"),
        FakeRpcError(grpc.StatusCode.UNKNOWN, "boom"),
    ],
)
def test_bugs_are_not_translated(error):
    assert translate_error(error, "resnet") is None


class HangingStub:
    """A service whose readiness calls never answer within their deadline."""

    def RepositoryIndex(self, request, timeout):
        time.sleep(5)

    def ServerReady(self, request, timeout):
        time.sleep(5)


def test_a_readiness_call_whose_deadline_does_not_fire_is_stopped_all_the_same(monkeypatch):
    client = TritonClient("127.0.0.1:1", timeout_s=0.2, ping_timeout_s=0.1)
    monkeypatch.setattr(client, "_stub", lambda: HangingStub())
    started = time.monotonic()
    with pytest.raises(TritonUnavailable):
        client.model_states()
    assert time.monotonic() - started < 0.1 + HARD_STOP_GRACE_S + 0.3


class RaisingStub:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def ModelInfer(self, request, timeout):
        raise self.error

    def RepositoryIndex(self, request, timeout):
        raise self.error

    def ServerReady(self, request, timeout):
        raise self.error


def test_client_raises_translated_errors_with_their_cause(monkeypatch):
    client = TritonClient("127.0.0.1:1", timeout_s=30, ping_timeout_s=0.5)
    cause = FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    monkeypatch.setattr(client, "_stub", lambda: RaisingStub(cause))
    with pytest.raises(InferenceTimeout) as raised:
        client.infer("resnet", {"input": np.zeros((1, 3), np.float32)}, ["logits"])
    assert raised.value.__cause__ is cause
    with pytest.raises(InferenceTimeout):
        client.model_states()
    bug = FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "unexpected shape")
    monkeypatch.setattr(client, "_stub", lambda: RaisingStub(bug))
    with pytest.raises(grpc.RpcError):
        client.infer("resnet", {"input": np.zeros((1, 3), np.float32)}, ["logits"])


class Index:
    class Entry:
        def __init__(self, name, version, state):
            self.name, self.version, self.state = name, version, state

    def __init__(self, entries):
        self.models = [self.Entry(*e) for e in entries]


def test_model_states_prefers_a_ready_version(monkeypatch):
    client = TritonClient("127.0.0.1:1", timeout_s=30, ping_timeout_s=0.5)

    class Stub:
        def RepositoryIndex(self, request, timeout):
            assert timeout == 0.5
            return Index(
                [
                    ("resnet", "1", "UNAVAILABLE"),
                    ("resnet", "2", "READY"),
                    ("bert_base", "", ""),
                    ("yolov5", "1", "LOADING"),
                ]
            )

    monkeypatch.setattr(client, "_stub", lambda: Stub())
    assert client.model_states() == {"resnet": "READY", "bert_base": "UNAVAILABLE", "yolov5": "LOADING"}


def test_one_channel_per_process(monkeypatch):
    created = []

    def channel(url, options):
        created.append((url, options))
        return object()

    monkeypatch.setattr(triton_module.grpc, "insecure_channel", channel)
    monkeypatch.setattr(triton_module.service_pb2_grpc, "GRPCInferenceServiceStub", lambda channel: object())
    client = TritonClient("127.0.0.1:9", timeout_s=30, ping_timeout_s=0.5)
    first = client._stub()
    assert client._stub() is first and len(created) == 1
    monkeypatch.setattr(triton_module.os, "getpid", lambda: -1)  # as in a forked worker
    assert client._stub() is not first and len(created) == 2
    args = dict(created[0][1])
    assert args["grpc.max_reconnect_backoff_ms"] <= 1000 and args["grpc.initial_reconnect_backoff_ms"] <= 100
    assert dict(CHANNEL_ARGS)["grpc.max_receive_message_length"] == -1


def test_a_readiness_call_that_finds_no_triton_renews_the_channel(monkeypatch):
    created = []

    class Channel:
        def __init__(self, url, options):
            created.append(self)

    class Stub:
        def __init__(self, channel):
            self.channel = channel

        def ServerReady(self, request, timeout):
            if len(created) == 1:
                raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
            return type("Answer", (), {"ready": True})()

        def RepositoryIndex(self, request, timeout):
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    monkeypatch.setattr(triton_module.grpc, "insecure_channel", Channel)
    monkeypatch.setattr(triton_module.service_pb2_grpc, "GRPCInferenceServiceStub", Stub)
    client = TritonClient("127.0.0.1:9", timeout_s=30, ping_timeout_s=0.5)
    with pytest.raises(TritonUnavailable):
        client.server_ready()
    assert client.server_ready() is True and len(created) == 2  # a fresh channel answered
    with pytest.raises(InferenceTimeout):  # a Triton that is there but slow keeps its channel
        client.model_states()
    assert client._stub().channel is created[1] and len(created) == 2
    assert dict(CHANNEL_ARGS)["grpc.use_local_subchannel_pool"] == 1  # fresh means a connection of its own


class ReadyServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)


def test_readiness_answers_at_once_when_triton_comes_back():
    port = free_ports(1)[0]
    client = TritonClient(f"127.0.0.1:{port}", timeout_s=0.5, ping_timeout_s=0.5)
    for _ in range(3):  # nothing listens yet: refused, and gRPC backs off before its next attempt
        with pytest.raises(TritonUnavailable):
            client.server_ready()
    server = grpc.server(ThreadPoolExecutor(2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(ReadyServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        assert client.server_ready() is True  # the first call after it is back, not one a backoff later
    finally:
        server.stop(0)


class InferServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ModelInfer(self, request, context):
        answer = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
        answer.outputs.add(name="logits", datatype="FP32", shape=[1, 3])
        answer.raw_output_contents.append(np.arange(3, dtype=np.float32).tobytes())
        return answer


def test_an_inference_answers_at_once_when_triton_comes_back():
    port = free_ports(1)[0]
    client = TritonClient(f"127.0.0.1:{port}", timeout_s=5, ping_timeout_s=0.5)
    inputs = {"input": np.zeros((1, 3), np.float32)}
    for _ in range(4):  # nothing listens yet: refused, and the channel backs off before its next attempt
        with pytest.raises(TritonUnavailable):
            client.infer("resnet", inputs, ["logits"])
    server = grpc.server(ThreadPoolExecutor(2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:  # the first call after it is back answers, not one a backoff later
        outputs, version = client.infer("resnet", inputs, ["logits"])
        assert outputs["logits"].tolist() == [[0.0, 1.0, 2.0]] and version == "1"
    finally:
        server.stop(0)


class StreamServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ModelStreamInfer(self, request_iterator, context):
        for request in request_iterator:
            answer = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
            answer.outputs.add(name="token_id", datatype="INT64", shape=[1])
            answer.raw_output_contents.append(np.array([7], dtype=np.int64).tobytes())
            answer.parameters["triton_final_response"].bool_param = True
            yield service_pb2.ModelStreamInferResponse(infer_response=answer)


def test_a_stream_answers_at_once_when_triton_comes_back():
    port = free_ports(1)[0]
    client = TritonClient(f"127.0.0.1:{port}", timeout_s=5, ping_timeout_s=0.5)
    inputs = {"input_ids": np.array([1, 2], np.int64)}
    for _ in range(4):  # nothing listens yet: refused (started twice each), and the channel backs off
        with pytest.raises(TritonUnavailable):
            list(client.stream("chat", inputs, ["token_id"]))
    server = grpc.server(ThreadPoolExecutor(2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(StreamServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:  # the first stream after it is back answers, not one a backoff later
        assert [answer["token_id"].tolist() for answer in client.stream("chat", inputs, ["token_id"])] == [[7]]
    finally:
        server.stop(0)


def test_real_channel_refused_and_hanging():
    port = free_ports(1)[0]
    client = TritonClient(f"127.0.0.1:{port}", timeout_s=0.5, ping_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(TritonUnavailable):
        client.infer("resnet", {"input": np.zeros((1, 3), np.float32)}, ["logits"])
    with pytest.raises(TritonUnavailable):
        client.server_ready()
    assert time.monotonic() - started < 2.0
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        hanging = TritonClient(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5, ping_timeout_s=0.3)
        started = time.monotonic()
        with pytest.raises((InferenceTimeout, TritonUnavailable)):
            hanging.model_states()
        with pytest.raises((InferenceTimeout, TritonUnavailable)):
            hanging.infer("resnet", {"input": np.zeros((1, 3), np.float32)}, ["logits"])
        assert time.monotonic() - started < 2.0


def test_a_connection_that_times_out_is_a_timeout_not_a_missing_triton():
    hung = server_error(
        "UNAVAILABLE",
        "failed to connect to all addresses; last error: UNKNOWN: "
        "ipv4:127.0.0.1:8001: connection attempt timed out before receiving SETTINGS frame",
    )
    assert isinstance(translate_error(hung, "yolov5"), InferenceTimeout)
    refused = server_error(
        "UNAVAILABLE",
        "failed to connect to all addresses; last error: UNKNOWN: "
        "ipv4:127.0.0.1:8001: Failed to connect to remote host: Connection refused",
    )
    assert isinstance(translate_error(refused, "yolov5"), TritonUnavailable)


def test_kserve_refusals_become_the_routers_errors():
    failed = refusal(404, "Request for unknown model: 'detector' has no available versions", "detector")
    assert isinstance(failed, ModelNotReady) and "detector" in failed.message
    assert isinstance(refusal(404, "Request for unknown model: 'nope' is not found", "nope"), UnknownModel)
    shape = refusal(400, "unexpected shape for input 'input' for model 'resnet'", "resnet")
    assert isinstance(shape, InvalidInput) and "unexpected shape" in shape.message


class _Repository(BaseHTTPRequestHandler):
    """Triton's repository endpoint, answering every load with the message it is given."""

    answers: ClassVar[dict[str, tuple[int, str]]] = {}

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, message = self.answers.get(self.path, (200, ""))
        body = json.dumps({"error": message} if status != 200 else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.mark.parametrize(
    ("message", "expected", "status"),
    [
        (
            (
                "load failed for model 'big': version 1 is at UNAVAILABLE state: Internal: onnx runtime error 6: "
                "Exception during initialization: bad_alloc"
            ),
            InsufficientMemory,
            507,
        ),
        ("failed to load 'big': CUDA out of memory. Tried to allocate 2.00 GiB", InsufficientMemory, 507),
        ("failed to load 'big', failed to poll from model repository", InvalidInput, 400),
    ],
)
def test_a_failed_load_for_want_of_memory_is_a_507(message, expected, status):
    _Repository.answers = {"/v2/repository/models/big/load": (400, message)}
    server = HTTPServer(("127.0.0.1", 0), _Repository)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        triton = TritonHttp(f"127.0.0.1:{server.server_address[1]}", timeout_s=5)
        triton.load("small", timeout_s=5)  # 200: loaded
        with pytest.raises(expected) as raised:
            triton.load("big", timeout_s=5)
        assert raised.value.status == status and message in raised.value.message
    finally:
        server.shutdown()
        server.server_close()
