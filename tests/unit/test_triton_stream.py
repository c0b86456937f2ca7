"""``TritonClient.stream`` without a Triton: the service stub's ``ModelStreamInfer`` replaced by a
fake call that answers scripted responses. Checked: one request with the final-flag parameter, the
outputs of each response, the end at the final flag (the call then cancelled: a no-op once ended),
a Triton error in the stream and a gRPC error translated as ``infer``'s, and ``close()`` cancelling."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from app.core.errors import InferenceTimeout, TritonUnavailable
from app.core.generation_contract import DEADLINE_MARKER
from clients.triton import EMPTY_FINAL, FINAL, TritonClient


def response(token: int | None, final: bool = False) -> service_pb2.ModelStreamInferResponse:
    answer = service_pb2.ModelStreamInferResponse()
    infer = answer.infer_response
    infer.model_version = "1"
    if token is not None:
        for name, dtype, array in (("token_id", "INT64", np.int64), ("logprob", "FP32", np.float32)):
            infer.outputs.add(name=name, datatype=dtype, shape=[1])
            infer.raw_output_contents.append(np.array([token], dtype=array).tobytes())
    infer.parameters[FINAL].bool_param = final
    return answer


class RpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class FakeCall:
    def __init__(self, answers):
        self.answers = list(answers)
        self.cancelled = False
        self.requests = []
        self.waited_for_its_end = False

    def code(self):  # gRPC's: blocks until the call has ended
        self.waited_for_its_end = True
        return grpc.StatusCode.OK

    def __next__(self):
        if not self.answers:
            raise StopIteration
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def client(monkeypatch):
    triton = TritonClient("localhost:1", 5.0, 1.0)
    calls = []

    class Stub:
        def ModelStreamInfer(self, requests, timeout):
            call = calls[-1]
            call.requests, call.timeout = list(requests), timeout
            call.cancel = lambda: setattr(call, "cancelled", True)
            return call

    monkeypatch.setattr(triton, "_stub", lambda: Stub())
    triton.calls = calls
    return triton


def stream(client, answers, timeout_s=2.0):
    client.calls.append(FakeCall(answers))
    inputs = {"input_ids": np.array([1, 2, 3], dtype=np.int64)}
    return client.stream("gen", inputs, ("token_id", "logprob"), timeout_s), client.calls[-1]


def test_tokens_until_the_final_flag(client):
    found, call = stream(client, [response(5), response(6), response(7, final=True), response(8)])
    assert [int(outputs["token_id"][0]) for outputs in found] == [5, 6, 7]
    (request,) = call.requests
    assert request.model_name == "gen" and request.parameters[EMPTY_FINAL].bool_param
    assert [t.name for t in request.inputs] == ["input_ids"] and call.timeout == 2.0
    assert found.version == "1" and not call.cancelled  # ended by Triton: nothing to cancel
    assert call.waited_for_its_end  # read to its end, not dropped (gRPC cancels a call dropped unfinished)
    found.close()
    assert not call.cancelled


def test_closing_a_stream_still_running_cancels_it(client):
    found, call = stream(client, [response(5), response(6), response(7, final=True)])
    next(found)
    found.close()
    assert call.cancelled


def test_an_empty_final_response_ends_it(client):
    found, _ = stream(client, [response(5), response(None, final=True)])
    assert [int(outputs["token_id"][0]) for outputs in found] == [5]


def test_errors_are_translated(client):
    found, call = stream(client, [response(5), service_pb2.ModelStreamInferResponse(error_message=DEADLINE_MARKER)])
    next(found)
    with pytest.raises(InferenceTimeout):
        next(found)
    assert call.cancelled
    refused = RpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")
    found, _ = stream(client, [refused, refused])  # started once more on a new channel: refused again
    with pytest.raises(TritonUnavailable):
        next(found)
    found, call = stream(client, [refused, response(5, final=True)])  # back: the second start answers
    assert [int(outputs["token_id"][0]) for outputs in found] == [5]
    found, _ = stream(client, [response(5), refused, response(6)])  # once answered, never sent twice
    next(found)
    with pytest.raises(TritonUnavailable):
        next(found)
    found, _ = stream(client, [RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline")])
    with pytest.raises(InferenceTimeout, match="within 2 s"):
        next(found)


def test_close_cancels(client):
    found, call = stream(client, [response(5), response(6)])
    next(found)
    found.close()
    assert call.cancelled
    assert list(found) == []
