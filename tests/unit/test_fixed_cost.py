"""The benchmark's fixed-cost section (scripts.bench.fixed_cost): its rows, ratios and table, and
the identity model that waits; the raw gRPC request and answer of clients.triton."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor

from clients.triton import _arrays, _raw
from scripts.bench import fixed_cost
from scripts.bench.constants import IDENTITY, IDENTITY_WAIT, IDENTITY_WAIT_MS
from scripts.bench.peers import identity_config
from scripts.model_prep import triton_config


def test_figures_are_router_cpu_over_the_floors():
    rows = {
        "floor": {"router_cpu_ms": 0.4},
        "bert_base text": {"router_cpu_ms": 0.8},
        "resnet JPEG": {"router_cpu_ms": 1.2},
    }
    figures = {f.name: f for f in fixed_cost.fixed_cost_figures(rows)}
    assert figures["router CPU per request / floor's, bert_base text"].value == pytest.approx(2.0)
    assert figures["router CPU per request / floor's, bert_base text"].passed is True
    assert figures["router CPU per request / floor's, resnet JPEG"].passed is False
    assert figures["router CPU per request / floor's, yolov5 JPEG"].passed is None  # not measured


def test_rows_are_interleaved_and_cpu_is_per_request(monkeypatch):
    order, spent = [], {"a": 0.0, "b": 0.0}

    class Load:
        def __init__(self, name):
            self.latencies_s, self.errors, self.window_s, self.first_error = [0.01] * 10, 0, 1.0, ""

    def run_load(call, concurrency, seconds):
        name = call()
        order.append(name)
        spent[name] += 0.02  # 20 ms of CPU for the 10 requests of a step
        return Load(name)

    monkeypatch.setattr(fixed_cost, "run_load", run_load)
    monkeypatch.setattr(fixed_cost, "cpu_seconds", lambda pid: spent["a" if pid == 1 else "b"])
    rows = {
        "a": (lambda: "a", lambda: {"router": [1], "nginx": []}),
        "b": (lambda: "b", lambda: {"router": [2], "nginx": []}),
    }
    measured = fixed_cost.measure_rows(rows, 8, 2, 1.0, 0, lambda *_: None)
    assert order == ["a", "b", "b", "a"]  # the second round starts with the other row
    assert measured["a"]["requests"] == 20 and measured["a"]["router_cpu_ms"] == pytest.approx(2.0)
    assert measured["b"]["nginx_cpu_ms"] == 0.0


def test_table_names_each_row_with_its_ratio_and_target():
    row = {"requests": 10, "errors": 0, "throughput": 5.0, "p50_ms": 2.0, "nginx_cpu_ms": 0.1}
    text = fixed_cost.format_fixed_cost(
        {"floor": {**row, "router_cpu_ms": 0.5}, "bert_base text": {**row, "router_cpu_ms": 1.5}}, 8
    )
    assert "c=8" in text
    bert = next(line for line in text.splitlines() if line.startswith("bert_base text"))
    assert "3.00" in bert and "<= 2.0" in bert and "1.600" in bert  # ratio, target, gunicorn + NGINX


def test_the_row_that_waits_is_set_against_the_floor_that_waits():
    row = {"requests": 10, "errors": 0, "throughput": 5.0, "p50_ms": 2.0, "nginx_cpu_ms": 0.1}
    rows = {
        "floor": {**row, "router_cpu_ms": 0.5},
        fixed_cost.FLOOR_WAIT: {**row, "router_cpu_ms": 0.8},
        fixed_cost.IDENTITY_WAIT_ROW: {**row, "router_cpu_ms": 2.0},
        "identity envelope": {**row, "router_cpu_ms": 1.5},
    }
    assert fixed_cost.floor_ratio(rows, fixed_cost.IDENTITY_WAIT_ROW) == pytest.approx(2.5)
    assert fixed_cost.floor_ratio(rows, fixed_cost.FLOOR_WAIT) == pytest.approx(1.6)  # the wait alone
    assert fixed_cost.floor_ratio(rows, "identity envelope") == pytest.approx(3.0)
    assert fixed_cost.floor_ratio(rows, "floor") is None
    lines = fixed_cost.format_fixed_cost(rows, 8).splitlines()
    waiting = next(line for line in lines if line.startswith(fixed_cost.IDENTITY_WAIT_ROW))
    assert "2.50 (waiting floor)" in waiting
    body = json.loads(fixed_cost.floor_request(8080, IDENTITY_WAIT_MS).body)
    assert body["wait_ms"] == IDENTITY_WAIT_MS and json.loads(fixed_cost.floor_request(8080).body)["wait_ms"] == 0


def test_the_rows_requests_name_their_models():
    tensors = {"input_ids": np.arange(16).reshape(1, 16), "attention_mask": np.ones((1, 16), np.int64)}
    requests = fixed_cost.router_requests(8080, b"\xff\xd8jpeg", "a [MASK].", tensors)
    assert set(requests) == set(fixed_cost.FIXED_COST_ROWS)
    assert json.loads(requests["bert_base text"].body) == {"modelname": "bert_base", "payload": {"text": "a [MASK]."}}
    assert requests["resnet JPEG"].body == b"\xff\xd8jpeg"
    assert requests["yolov5 JPEG"].headers["X-Amzn-SageMaker-Custom-Attributes"] == "modelname=yolov5"
    v2 = json.loads(requests["identity v2"].body)
    assert "modelname" not in v2 and v2["inputs"][0]["data"] == list(range(16))
    waiting = json.loads(requests[f"identity, {IDENTITY_WAIT_MS} ms in Triton"].body)
    assert waiting["modelname"] == IDENTITY_WAIT


def test_the_waiting_identity_is_the_identity_batched_with_a_wait():
    plain = triton_config.parse(identity_config())
    waiting = triton_config.parse(identity_config(IDENTITY_WAIT, IDENTITY_WAIT_MS))
    assert plain.name == IDENTITY and not plain.HasField("dynamic_batching")
    assert waiting.name == IDENTITY_WAIT and waiting.HasField("dynamic_batching")
    assert waiting.parameters["wait_ms"].string_value == str(IDENTITY_WAIT_MS)
    assert [i.name for i in waiting.input] == [i.name for i in plain.input]


def test_raw_tensors_round_trip_through_a_response():
    scores = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    names = np.array([[b"cat", b"dog"]], dtype=np.object_)
    response = service_pb2.ModelInferResponse(model_version="1")
    for name, array, datatype in (("scores", scores, "FP32"), ("names", names, "BYTES")):
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        response.raw_output_contents.append(_raw(array))
    assert list(deserialize_bytes_tensor(_raw(names))) == [b"cat", b"dog"]
    arrays = _arrays(response, ("scores", "names"))
    np.testing.assert_array_equal(arrays["scores"], scores)
    assert arrays["names"].tolist() == [[b"cat", b"dog"]]
    assert set(_arrays(response, ("scores",))) == {"scores"}
    with pytest.raises(RuntimeError, match="lacks the outputs"):
        _arrays(response, ("scores", "boxes"))
