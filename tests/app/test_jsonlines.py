"""JSON Lines bodies (Batch Transform), the Accept header, and GET /execution-parameters."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from app.core.settings import Settings
from app.router import create_app
from tests.support import assert_error, b64, solid_image

JSONL = "application/jsonlines"


def envelope(modelname, **payload) -> dict:
    return {"modelname": modelname, "payload": payload}


def post_lines(client, lines, content_type=JSONL, accept=None, end="\n"):
    body = end.join(line if isinstance(line, str) else json.dumps(line) for line in lines) + end
    headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
    return client.post("/invocations", data=body.encode(), headers=headers)


def answer_lines(response) -> list[dict]:
    text = response.get_data(as_text=True)
    assert text.endswith("\n")
    return [json.loads(line) for line in text[:-1].split("\n")]


def mixed_lines() -> list[dict]:
    colors = [(i * 40, 255 - i * 30, 90) for i in range(6)]
    return [
        envelope("resnet", img=b64(solid_image(color=colors[0]))),
        envelope("bert_base", text="paris is the [MASK] of france."),
        envelope("yolov5", img=[b64(solid_image(320, 200, colors[1])), b64(solid_image(200, 320, colors[2]))]),
        envelope("resnet", img=[b64(solid_image(color=colors[3])), b64(solid_image(color=colors[4]))], topk=2),
        envelope("bert_base", text=["a [MASK] b", "the [MASK] sat"], topk=3),
        envelope("yolov5", img=b64(solid_image(color=colors[5])), conf_threshold=0.7),
    ]


def test_execution_parameters_are_the_configured_ones(settings, triton):
    cases = [
        (replace(settings, max_concurrent_transforms=4), {"MaxConcurrentTransforms": 4, "MaxPayloadInMB": 6}),
        (
            replace(settings, max_body_bytes=20 * 2**20, max_concurrent_transforms=4),
            {"MaxConcurrentTransforms": 4, "MaxPayloadInMB": 20},
        ),
        # Batch Transform allows MaxPayloadInMB <= 100 and MaxConcurrentTransforms * MaxPayloadInMB <= 100.
        (
            replace(settings, max_body_bytes=64 * 2**20, max_concurrent_transforms=4),
            {"MaxConcurrentTransforms": 1, "MaxPayloadInMB": 64},
        ),
        (
            replace(settings, max_body_bytes=2**30, max_concurrent_transforms=4),
            {"MaxConcurrentTransforms": 1, "MaxPayloadInMB": 100},
        ),
    ]
    for configured, expected in cases:
        response = create_app(configured, triton=triton).test_client().get("/execution-parameters")
        assert response.status_code == 200 and response.mimetype == "application/json"
        assert response.get_json() == {**expected, "BatchStrategy": "MULTI_RECORD"}


def test_each_line_is_answered_as_its_single_call_in_order(client):
    lines = mixed_lines()
    singles = [client.post("/invocations", json=line).get_json() for line in lines]
    response = post_lines(client, lines)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == JSONL
    assert answer_lines(response) == singles
    assert [a["modelname"] for a in singles] == ["resnet", "bert_base", "yolov5", "resnet", "bert_base", "yolov5"]


def test_x_jsonlines_and_crlf_lines_are_taken(client):
    lines = mixed_lines()[:2]
    response = post_lines(client, lines, content_type="application/x-jsonlines", end="\r\n")
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "application/x-jsonlines"
    assert answer_lines(response) == [client.post("/invocations", json=line).get_json() for line in lines]


def test_items_of_one_model_across_lines_share_triton_calls(client, triton):
    lines = [envelope("resnet", img=b64(solid_image(color=(i, 2 * i, 3 * i)))) for i in range(10)]
    lines.insert(4, envelope("bert_base", text="a [MASK] here"))
    lines.insert(6, envelope("resnet", img=[b64(solid_image(color=(9, 9, 9)))] * 3, topk=1))
    response = post_lines(client, lines)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert len(answer_lines(response)) == 12
    resnet_batches = [call[1]["image"][0] for call in triton.calls if call[0] == "resnet_pipeline"]
    assert resnet_batches == [8, 5]  # 13 images in two calls of max_batch_size 8, not 11 calls
    assert [call[0] for call in triton.calls].count("bert_base") == 1
    assert len(answer_lines(response)[6]["result"]) == 3 and len(answer_lines(response)[6]["result"][0]) == 1


@pytest.mark.parametrize(
    ("bad", "status", "code", "fragment"),
    [
        ('{"modelname": "resnet", "payload": ', 400, "invalid_json", "not valid JSON"),
        ("", 400, "invalid_input", "empty"),
        ('["not", "an", "object"]', 400, "invalid_json", "JSON object"),
        (json.dumps(envelope("nope", img="x")), 404, "unknown_model", "'nope'"),
        (json.dumps(envelope("resnet", img="not base64!")), 400, "invalid_input", "payload.img"),
        (
            json.dumps(envelope("yolov5", img=b64(solid_image()), conf_threshold=3)),
            400,
            "invalid_input",
            "conf_threshold",
        ),
        (json.dumps(envelope("bert_base", text="no mask")), 400, "invalid_input", "[MASK]"),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_answered(client, triton, bad, status, code, fragment):
    lines = [json.dumps(line) for line in mixed_lines()]
    lines.insert(3, bad)  # line 4
    error = assert_error(post_lines(client, lines), status, code, "line 4: ", fragment)
    assert error["line"] == 4
    assert post_lines(client, mixed_lines()).status_code == 200  # and it keeps serving


def test_an_image_refused_inside_triton_names_its_line_and_item(client, triton):
    noise = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="JPEG")
    broken = buffer.getvalue()[: len(buffer.getvalue()) // 2]  # the header reads, the pixels do not
    lines = mixed_lines()
    lines.insert(2, envelope("resnet", img=[b64(solid_image()), b64(broken)]))
    error = assert_error(post_lines(client, lines), 400, "invalid_input", "line 3: payload.img[1]", "decodable")
    assert error["line"] == 3


def test_an_empty_body_is_refused(client):
    response = client.post("/invocations", data=b"\n", headers={"Content-Type": JSONL})
    assert_error(response, 400, "invalid_input", "no lines")


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("application/json", "application/json"),
        ("application/jsonlines", JSONL),
        ("*/*", "application/json"),
        ("text/csv, application/jsonlines;q=0.5", JSONL),
        ("application/json;q=0.2, application/jsonlines", JSONL),
    ],
)
def test_accept_picks_the_answer_of_one_envelope(client, accept, expected):
    line = mixed_lines()[0]
    single = client.post("/invocations", json=line).get_json()
    response = client.post("/invocations", json=line, headers={"Accept": accept})
    assert response.status_code == 200 and response.mimetype == expected
    got = response.get_json() if expected == "application/json" else answer_lines(response)
    assert got == (single if expected == "application/json" else [single])


def test_accept_json_answers_lines_as_a_json_list(client):
    lines = mixed_lines()
    response = post_lines(client, lines, accept="application/json")
    assert response.status_code == 200 and response.mimetype == "application/json"
    assert response.get_json() == [client.post("/invocations", json=line).get_json() for line in lines]


def test_a_raw_body_can_be_answered_in_json_lines(client):
    headers = {"Content-Type": "image/png", "Accept": JSONL, "X-Amzn-SageMaker-Custom-Attributes": "modelname=resnet"}
    response = client.post("/invocations", data=solid_image(), headers=headers)
    assert response.status_code == 200 and response.mimetype == JSONL
    assert [a["modelname"] for a in answer_lines(response)] == ["resnet"]


@pytest.mark.parametrize("accept", ["text/csv", "application/json;q=0", "image/png, text/html"])
def test_an_accept_that_cannot_be_answered_is_406(client, triton, accept):
    assert_error(
        client.post("/invocations", json=mixed_lines()[0], headers={"Accept": accept}),
        406,
        "not_acceptable",
        accept,
        "application/json",
        "application/jsonlines",
    )
    assert triton.calls == []


def test_a_request_past_its_deadline_is_504_before_triton_is_called(settings, triton):
    late = create_app(replace(settings, server_timeout_s=1e-9), triton=triton).test_client()
    assert_error(post_lines(late, mixed_lines()), 504, "inference_timeout", "MODEL_SERVER_TIMEOUT")
    assert triton.calls == []


def test_the_default_concurrency_is_two_requests_per_router_worker():
    assert Settings.from_env({"MODEL_SERVER_WORKERS": "3"}).execution_parameters()["MaxConcurrentTransforms"] == 6
    assert (
        Settings.from_env({"MODEL_SERVER_WORKERS": "3", "MAX_CONCURRENT_TRANSFORMS": "5"}).execution_parameters()[
            "MaxConcurrentTransforms"
        ]
        == 5
    )


@pytest.mark.parametrize("bad", ["not base64!", b64(b"GIF89a not ours"), ""], ids=["base64", "format", "empty"])
def test_an_image_refused_by_its_header_stops_the_body_before_any_inference(client, triton, bad):
    lines = mixed_lines()
    lines.append(envelope("yolov5", img=[b64(solid_image()), bad]))  # line 7: yolov5's lines run last
    error = assert_error(post_lines(client, lines), 400, "invalid_input", "line 7: payload.img[1]")
    assert error["line"] == 7
    assert triton.calls == []  # no line's inference was spent on a body that is refused
