"""What operators see, through port 8080: /metrics adds up every worker, request ids round-trip,
and each request leaves one JSON log line on serve's stdout."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support import assert_conforms, b64, noise_image, openapi_description

pytestmark = pytest.mark.integration

JPEG = noise_image(96, 64, 3)


def metric_samples(stack) -> dict[tuple[str, tuple], float]:
    r = requests.get(f"{stack.url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def requests_by_model_and_status(samples) -> Counter:
    counts: Counter = Counter()
    for (name, labels), value in samples.items():
        if name == "router_requests_total":
            labels = dict(labels)
            counts[(labels["model"], labels["status"])] += value
    return counts


# (model label, status, request): what the test sends and how /metrics must count it.
SENT = [
    ("resnet", "200", {"json": {"modelname": "resnet", "payload": {"img": b64(JPEG)}}}),
    (
        "resnet",
        "200",
        {
            "data": JPEG,
            "headers": {"Content-Type": "image/jpeg", "X-Amzn-SageMaker-Custom-Attributes": "modelname=resnet"},
        },
    ),
    ("yolov5", "200", {"json": {"modelname": "yolov5", "payload": {"img": [b64(JPEG)] * 2}}}),
    ("bert_base", "200", {"json": {"modelname": "bert_base", "payload": {"text": "The [MASK] is blue."}}}),
    ("resnet", "400", {"json": {"modelname": "resnet", "payload": {"img": "%%%"}}}),
    ("yolov5", "400", {"json": {"modelname": "yolov5", "payload": {"img": b64(JPEG), "conf_threshold": 2}}}),
    (
        "bert_base",
        "415",
        {
            "data": JPEG,
            "headers": {"Content-Type": "image/jpeg", "X-Amzn-SageMaker-Custom-Attributes": "modelname=bert_base"},
        },
    ),
    ("none", "404", {"json": {"modelname": "vgg", "payload": {}}}),
    ("none", "400", {"data": b"{oops", "headers": {"Content-Type": "application/json"}}),
]


def test_metrics_count_the_requests_sent_per_model_and_status(stack):
    before = metric_samples(stack)
    rounds = 4  # enough requests that both workers serve some: /metrics must add them up
    for _ in range(rounds):
        for _, status, kwargs in SENT:
            r = requests.post(f"{stack.url}/invocations", timeout=60, **kwargs)
            assert str(r.status_code) == status, r.text
            assert_conforms(r, "/invocations", "POST")
    after = metric_samples(stack)
    expected = Counter()
    for model, status, _ in SENT:
        expected[(model, status)] += rounds
    delta = requests_by_model_and_status(after) - requests_by_model_and_status(before)
    print("counted by /metrics:", dict(delta))
    assert delta == expected
    for model in ("resnet", "yolov5", "bert_base"):
        for stage in ("preprocess", "triton", "postprocess"):
            key = ("router_stage_duration_seconds_count", (("model", model), ("stage", stage)))
            assert after.get(key, 0) > before.get(key, 0), key
    assert after[("router_requests_in_flight", ())] == 0


def test_request_id_round_trips_and_the_log_has_one_line_per_request(stack):
    ours = f"sm-{uuid.uuid4().hex}"
    theirs = f"rq-{uuid.uuid4().hex}"
    image = b64(noise_image(80, 60, 11))
    r = requests.post(
        f"{stack.url}/invocations",
        timeout=60,
        json={"modelname": "yolov5", "payload": {"img": image}},
        headers={"X-Amzn-SageMaker-Inference-Id": ours},
    )
    assert r.status_code == 200 and r.headers["X-Request-Id"] == ours
    bad = requests.post(
        f"{stack.url}/invocations",
        timeout=60,
        json={"modelname": "nope", "payload": {}},
        headers={"X-Request-Id": theirs},
    )
    assert bad.status_code == 404 and bad.headers["X-Request-Id"] == theirs
    made = requests.post(
        f"{stack.url}/invocations", timeout=60, json={"modelname": "bert_base", "payload": {"text": "a [MASK] b"}}
    ).headers["X-Request-Id"]
    assert len(made) == 32 and made not in (ours, theirs)

    wanted = {ours, theirs, made}
    lines: dict[str, list[dict]] = {}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and set(lines) != wanted:
        lines = {}
        for raw in stack.log_path.read_text(errors="replace").splitlines():
            if any(rid in raw for rid in wanted):
                entry = json.loads(raw)  # every line of serve's log is one JSON object
                lines.setdefault(entry.get("request_id"), []).append(entry)
        time.sleep(0.1)
    assert set(lines) == wanted, lines
    assert all(len(entries) == 1 for entries in lines.values()), lines
    ok, missing, filled = lines[ours][0], lines[theirs][0], lines[made][0]
    assert (ok["model"], ok["status"], ok["path"]) == ("yolov5", 200, "/invocations")
    assert ok["duration_ms"] >= ok["preprocess_ms"] + ok["triton_ms"] + ok["postprocess_ms"] - 1.0
    # No served model, no `model` field (a metric filter's `$.model = *` then leaves the line out).
    assert (missing.get("model", "absent"), missing["status"], missing["error"]) == ("absent", 404, "unknown_model")
    assert (filled["model"], filled["status"]) == ("bert_base", 200)
    assert image[:64] not in json.dumps(ok), "the payload must never be logged"


def test_openapi_description_through_nginx(stack):
    r = requests.get(f"{stack.url}/openapi.json", timeout=10)
    assert r.status_code == 200 and r.json() == openapi_description()  # built from the families
    ping = stack.ping()
    assert_conforms(ping, "/ping", "GET")
