"""Request ids, the access log line, /metrics and /openapi.json, on the app with a fake Triton."""

from __future__ import annotations

import base64
import io
import json
import logging
from dataclasses import replace

import numpy as np
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from app.core.logs import JsonFormatter
from app.router import create_app
from scripts.sagemaker.filter_pattern import publish
from scripts.sagemaker.model_metrics import REAL_TIME, metric_filters


def jpeg() -> str:
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), 90, dtype=np.uint8)).save(buf, format="JPEG")
    return base64.b64encode(buf.getvalue()).decode()


def samples(client) -> dict[tuple[str, tuple], float]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.mimetype == "text/plain"
    found = {}
    for family in text_string_to_metric_families(r.get_data(as_text=True)):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def test_request_id_is_taken_from_the_caller_or_made(client):
    r = client.post(
        "/invocations",
        json={"modelname": "resnet", "payload": {"img": jpeg()}},
        headers={"X-Amzn-SageMaker-Inference-Id": "sm-123"},
    )
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "sm-123"
    assert client.get("/ping", headers={"X-Request-Id": "mine.1"}).headers["X-Request-Id"] == "mine.1"
    made = client.get("/ping").headers["X-Request-Id"]
    assert len(made) == 32
    # An id that could forge log lines or headers is replaced, not echoed.
    odd = client.get("/ping", headers={"X-Request-Id": 'a b"c'}).headers["X-Request-Id"]
    assert odd != 'a b"c' and len(odd) == 32
    assert client.get("/nope").headers["X-Request-Id"]


def test_metrics_count_by_model_and_status_with_stage_latencies(client):
    before = samples(client)
    client.post("/invocations", json={"modelname": "resnet", "payload": {"img": jpeg()}})
    client.post("/invocations", json={"modelname": "resnet", "payload": {"img": "%%"}})
    client.post("/invocations", json={"modelname": "resnet", "version": "v1", "payload": {}})  # after the lookup
    client.post("/invocations", json={"modelname": "vgg", "payload": {}})
    client.post(
        "/invocations",
        data=b"The [MASK] sat.",
        content_type="text/plain",
        headers={"X-Amzn-SageMaker-Custom-Attributes": "modelname=bert_base"},
    )
    after = samples(client)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("router_requests_total", model="resnet", status="200") == 1
    assert delta("router_requests_total", model="resnet", status="400") == 2
    assert delta("router_requests_total", model="none", status="404") == 1
    assert delta("router_requests_total", model="bert_base", status="200") == 1
    # The bad image failed in preprocessing: its time there counts, it never reached Triton.
    assert delta("router_stage_duration_seconds_count", model="resnet", stage="preprocess") == 2
    for stage in ("triton", "postprocess"):
        assert delta("router_stage_duration_seconds_count", model="resnet", stage=stage) == 1
    assert delta("router_request_duration_seconds_count", model="resnet") == 3
    assert after[("router_requests_in_flight", ())] == 0


def test_one_access_line_per_request_without_the_payload(client, caplog):
    secret = jpeg()
    with caplog.at_level(logging.INFO, logger="app.access"):
        client.post(
            "/invocations",
            json={"modelname": "resnet", "payload": {"img": secret}},
            headers={"X-Request-Id": "trace-me"},
        )
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "app.access"]
    assert len(lines) == 1
    line = lines[0]
    assert line["request_id"] == "trace-me" and line["model"] == "resnet" and line["status"] == 200
    assert {"duration_ms", "preprocess_ms", "triton_ms", "postprocess_ms"} <= set(line)
    assert secret[:40] not in json.dumps(line)
    assert "target_model" not in line


def test_the_access_line_names_sagemakers_target_model(client, caplog):
    with caplog.at_level(logging.INFO, logger="app.access"):
        client.post(
            "/invocations",
            json={"modelname": "resnet", "payload": {"img": jpeg()}},
            headers={"X-Amzn-SageMaker-Target-Model": "resnet-v2.tar.gz"},
        )
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "app.access"]
    assert [line["target_model"] for line in lines] == ["resnet-v2.tar.gz"]


def test_a_bug_logs_its_traceback_once_with_the_request_id(client, triton, caplog):
    triton.error = RuntimeError("boom")
    with caplog.at_level(logging.INFO):
        r = client.post(
            "/invocations", json={"modelname": "resnet", "payload": {"img": jpeg()}}, headers={"X-Request-Id": "bug-1"}
        )
    assert r.status_code == 500
    lines = [json.loads(JsonFormatter().format(rec)) for rec in caplog.records]
    with_traceback = [line for line in lines if "traceback" in line]
    assert len(with_traceback) == 1 and with_traceback[0]["request_id"] == "bug-1"
    access = [line for line in lines if line["logger"] == "app.access"]
    assert access[0]["status"] == 500 and access[0]["error"] == "internal_error"


def test_openapi_description_is_served(client):
    r = client.get("/openapi.json")
    assert r.status_code == 200 and r.mimetype == "application/json"
    spec = r.get_json()
    assert spec["openapi"].startswith("3.") and {"/ping", "/invocations", "/metrics"} <= set(spec["paths"])


def test_no_debug_mode(app):
    assert not app.debug


def test_the_access_line_is_what_the_per_model_filters_read(settings, triton, caplog):
    """The line the router writes (with ENDPOINT_NAME set) gives every filter what it reads: the
    fields are app.core.access's on both sides."""
    client = create_app(replace(settings, endpoint_name="mm"), triton=triton).test_client()
    with caplog.at_level(logging.INFO, logger="app.access"):
        client.post("/invocations", json={"modelname": "resnet", "payload": {"img": jpeg()}})
        client.post("/invocations", json={"modelname": "resnet", "payload": {"img": "%%%"}})
    ok, bad = [JsonFormatter().format(r) for r in caplog.records if r.name == "app.access"]
    assert json.loads(ok)["endpoint"] == "mm"
    published = {
        (f["filterName"], line): [(p.value, p.dimensions) for p in publish(f, text)]
        for f in metric_filters("mm", REAL_TIME)
        for line, text in (("ok", ok), ("bad", bad))
    }
    dims = {"EndpointName": "mm", "Model": "resnet"}
    assert published[("mm/Invocations", "ok")] == [(1.0, dims)] == published[("mm/Invocations", "bad")]
    assert (
        published[("mm/Invocation4XXErrors", "bad")] == [(1.0, dims)]
        and not published[("mm/Invocation4XXErrors", "ok")]
    )
    assert published[("mm/Latency", "ok")] == [(json.loads(ok)["duration_ms"], dims)]
    assert published[("mm/TritonLatency", "ok")] == [(json.loads(ok)["triton_ms"], dims)]
    assert not published[("mm/TritonLatency", "bad")] and not published[("mm/Invocation5XXErrors", "ok")]
