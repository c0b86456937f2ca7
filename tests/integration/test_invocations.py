"""The three models through port 8080: JSON envelope, raw body, boto3, lists, and batching."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
import requests
from botocore.config import Config

from tests.support import b64, noise_image

pytestmark = pytest.mark.integration

TEXT = "The capital of France is [MASK]."
TWO_MASKS = "The [MASK] sat on the [MASK]."


def invoke(stack, body: dict) -> requests.Response:
    return requests.post(f"{stack.url}/invocations", json=body, timeout=120)


def assert_classification(result, topk: int = 3):
    assert isinstance(result, list) and len(result) == topk
    scores = [c["score"] for c in result]
    assert scores == sorted(scores, reverse=True)
    for c in result:
        assert set(c) == {"label", "index", "score"}
        assert isinstance(c["label"], str) and c["label"]
        assert 0 <= c["index"] < 1000 and 0.0 <= c["score"] <= 1.0


def assert_detection(result, width: int, height: int):
    assert set(result) == {"width", "height", "detections"}
    assert (result["width"], result["height"]) == (width, height)
    scores = [d["score"] for d in result["detections"]]
    assert scores == sorted(scores, reverse=True)
    for d in result["detections"]:
        assert set(d) == {"label", "class_id", "score", "box"}
        x1, y1, x2, y2 = d["box"]
        assert 0 <= x1 <= x2 <= width and 0 <= y1 <= y2 <= height
        assert 0 <= d["class_id"] < 80 and d["score"] >= 0.25 - 1e-6


def assert_fill_mask(result, topk: int = 5, masks: int = 1):
    assert isinstance(result, list) and len(result) == topk
    for c in result:
        assert set(c) == {"score", "token", "token_str", "sequence"}
        # As Hugging Face's pipeline: with one mask the sequence is plain text; with several,
        # each candidate fills its own mask and the sequence keeps the special tokens.
        assert c["sequence"].count("[MASK]") == masks - 1
        assert c["token_str"].removeprefix("##") in c["sequence"]  # a word piece joins the word before it
    scores = [c["score"] for c in result]
    assert scores == sorted(scores, reverse=True)


def test_resnet_json_envelope(stack):
    r = invoke(stack, {"modelname": "resnet", "payload": {"img": b64(noise_image(768, 576, 1))}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["modelname"] == "resnet" and body["version"] == "1"
    assert_classification(body["result"])


def test_a_list_of_three_images_gives_three_results_in_order(stack):
    images = [noise_image(300 + 100 * i, 200 + 50 * i, seed=i) for i in range(3)]
    single = [
        invoke(stack, {"modelname": "yolov5", "payload": {"img": b64(im), "conf_threshold": 0.01}}).json()
        for im in images
    ]
    listed = invoke(
        stack, {"modelname": "yolov5", "payload": {"img": [b64(im) for im in images], "conf_threshold": 0.01}}
    )
    assert listed.status_code == 200, listed.text
    results = listed.json()["result"]
    assert len(results) == 3
    for i, result in enumerate(results):
        assert_detection(result, 300 + 100 * i, 200 + 50 * i)
        # Each list item gets exactly the answer it gets alone (same image size, same order).
        alone = single[i]["result"]["detections"]
        assert len(result["detections"]) == len(alone)
        for got, want in zip(result["detections"], alone):
            assert got["class_id"] == want["class_id"]
            assert got["score"] == pytest.approx(want["score"], abs=1e-4)
            assert got["box"] == pytest.approx(want["box"], abs=1e-2)

    resnet = invoke(stack, {"modelname": "resnet", "payload": {"img": [b64(im) for im in images], "topk": 2}})
    assert resnet.status_code == 200
    assert len(resnet.json()["result"]) == 3
    for result in resnet.json()["result"]:
        assert_classification(result, topk=2)


def test_yolov5_json_envelope(stack):
    r = invoke(
        stack,
        {
            "modelname": "yolov5",
            "payload": {"img": b64(noise_image(768, 576, 2)), "conf_threshold": 0.01, "max_detections": 20},
        },
    )
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert_detection(result, 768, 576)
    assert len(result["detections"]) <= 20


def test_bert_json_envelope_one_and_two_masks(stack):
    r = invoke(stack, {"modelname": "bert_base", "payload": {"text": [TEXT, TWO_MASKS]}})
    assert r.status_code == 200, r.text
    one, two = r.json()["result"]
    assert_fill_mask(one)
    assert isinstance(two, list) and len(two) == 2
    for per_mask in two:
        assert_fill_mask(per_mask, masks=2)
    single = invoke(stack, {"modelname": "bert_base", "payload": {"text": TEXT, "topk": 3}}).json()["result"]
    assert_fill_mask(single, topk=3)


@pytest.mark.parametrize(
    "fmt,content_type", [("JPEG", "image/jpeg"), ("PNG", "image/png"), ("JPEG", "application/octet-stream")]
)
def test_image_models_raw_body(stack, fmt: str, content_type: str):
    data = noise_image(500, 400, 3, fmt)
    r = requests.post(
        f"{stack.url}/invocations",
        data=data,
        timeout=60,
        headers={
            "Content-Type": content_type,
            "X-Amzn-SageMaker-Custom-Attributes": "modelname=resnet,topk=4,trace=abc",
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["modelname"] == "resnet"
    assert_classification(r.json()["result"], topk=4)

    r = requests.post(
        f"{stack.url}/invocations",
        data=data,
        timeout=60,
        headers={
            "Content-Type": content_type,
            "X-Amzn-SageMaker-Custom-Attributes": "modelname=yolov5,conf_threshold=0.01",
        },
    )
    assert r.status_code == 200, r.text
    assert_detection(r.json()["result"], 500, 400)


def test_bert_raw_body(stack):
    r = requests.post(
        f"{stack.url}/invocations",
        data=TEXT.encode(),
        timeout=60,
        headers={
            "Content-Type": "text/plain; charset=utf-8",
            "X-Amzn-SageMaker-Custom-Attributes": "modelname=bert_base,topk=7",
        },
    )
    assert r.status_code == 200, r.text
    assert_fill_mask(r.json()["result"], topk=7)


@pytest.fixture(scope="module")
def runtime(stack):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=stack.url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"max_attempts": 1}, read_timeout=120),
    )


@pytest.mark.parametrize(
    "modelname,payload",
    [
        ("resnet", {"img": b64(noise_image(640, 480, 4))}),
        ("yolov5", {"img": b64(noise_image(640, 480, 5)), "conf_threshold": 0.01}),
        ("bert_base", {"text": TEXT}),
    ],
)
def test_boto3_invoke_endpoint_json(runtime, modelname: str, payload: dict):
    response = runtime.invoke_endpoint(
        EndpointName="local",
        ContentType="application/json",
        Body=json.dumps({"modelname": modelname, "payload": payload}),
    )
    body = json.loads(response["Body"].read())
    assert body["modelname"] == modelname and body["version"] == "1"
    {"resnet": assert_classification, "bert_base": assert_fill_mask}.get(
        modelname, lambda result: assert_detection(result, 640, 480)
    )(body["result"])


def test_boto3_invoke_endpoint_raw_with_custom_attributes(runtime):
    response = runtime.invoke_endpoint(
        EndpointName="local",
        ContentType="image/jpeg",
        Body=noise_image(320, 240, 6),
        CustomAttributes="modelname=yolov5",
    )
    assert_detection(json.loads(response["Body"].read())["result"], 320, 240)
    response = runtime.invoke_endpoint(
        EndpointName="local",
        ContentType="text/plain; charset=utf-8",
        Body=TWO_MASKS.encode(),
        CustomAttributes="modelname=bert_base,topk=2",
    )
    result = json.loads(response["Body"].read())["result"]
    assert len(result) == 2 and all(len(per_mask) == 2 for per_mask in result)


def model_stats(stack, model: str) -> tuple[int, int]:
    url = f"http://127.0.0.1:{stack.triton_ports[0]}/v2/models/{model}/stats"
    stats = requests.get(url, timeout=5).json()["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_sixteen_concurrent_requests_are_batched(stack):
    body = {"modelname": "resnet", "payload": {"img": b64(noise_image(400, 300, 7))}}
    before = model_stats(stack, "resnet")
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda _: invoke(stack, body).status_code, range(16)))
    # Triton records an execution's statistics just after its responses are sent: let them land.
    deadline = time.monotonic() + 5
    while (after := model_stats(stack, "resnet"))[0] - before[0] < 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    print(f"16 concurrent requests: {inferences} inferences in {executions} executions")
    assert statuses == [200] * 16
    assert inferences == 16
    assert executions < inferences
