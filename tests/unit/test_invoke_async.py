"""invoke --async against moto (S3, and sagemaker-runtime's queue of asynchronous results): the
upload and the InvokeEndpointAsync parameters, the wait with its progress, the answer printed as a
real-time one, a failure object, the wait's timeout, and --draw on the answer."""

from __future__ import annotations

import io
import json

import boto3
import pytest
import requests
from botocore.stub import ANY, Stubber
from PIL import Image

from scripts.caller import invoke, invoke_async
from tests.support import REGION

BUCKET = "inputs-bucket"
PREFIX = f"s3://{BUCKET}/queue/"
ANSWER = {
    "modelname": "resnet",
    "version": "1",
    "result": [
        {"label": "malamute, malemute, Alaskan malamute", "index": 249, "score": 0.41},
        {"label": "Siberian husky", "index": 250, "score": 0.2},
    ],
}
ERROR = {"error": {"code": "invalid_input", "message": "payload.img[0] is not a decodable image"}}


def queue_results(*results: dict) -> None:
    """What moto's sagemaker-runtime writes to S3 for the next InvokeEndpointAsync calls."""
    requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/sagemaker/async-endpoint-results",
        json={"region": REGION, "results": list(results)},
    )


@pytest.fixture
def clients(aws):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    sent: list[dict] = []
    runtime.meta.events.register(
        "provide-client-params.sagemaker-runtime.InvokeEndpointAsync", lambda params, **_: sent.append(dict(params))
    )
    return runtime, s3, sent


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "photo.png"
    Image.radial_gradient("L").convert("RGB").resize((320, 240)).save(path, "PNG")
    return path


def run_async(runtime, s3, *argv: str) -> int:
    return invoke.main(
        ["--endpoint-name", "mm", "--async", PREFIX, "--poll-seconds", "0", *argv], client=runtime, s3=s3
    )


def test_the_body_is_uploaded_queued_and_its_answer_printed(clients, photo, capsys):
    runtime, s3, sent = clients
    queue_results({"data": json.dumps(ANSWER)})
    assert run_async(runtime, s3, "--option", "topk=2", "--invocation-timeout", "1200", f"resnet={photo}") == 0

    (call,) = sent
    location = call.pop("InputLocation")
    assert call == {
        "EndpointName": "mm",
        "ContentType": "image/png",
        "Accept": "application/json",
        "CustomAttributes": "modelname=resnet,topk=2",
        "InvocationTimeoutSeconds": 1200,
    }
    assert location.startswith(f"{PREFIX}resnet-") and location.endswith(".png")
    key = location.removeprefix(f"s3://{BUCKET}/")
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == photo.read_bytes()

    captured = capsys.readouterr()
    assert captured.out == (
        "resnet (version 1):\n"
        "  malamute, malemute, Alaskan malamute (index 249) 0.410\n"
        "  Siberian husky (index 250) 0.200\n"
    )
    assert "resnet: answer at s3://sagemaker-output-" in captured.err


def test_a_failure_object_is_printed_and_the_status_is_1(clients, photo, capsys):
    runtime, s3, _ = clients
    queue_results({"is_failure": True, "data": json.dumps(ERROR)})
    assert run_async(runtime, s3, f"resnet={photo}") == 1
    out = capsys.readouterr().out
    assert out.startswith("resnet: failed (s3://sagemaker-output-") and "/failure.json)" in out
    assert '  "code": "invalid_input"' in out
    assert "payload.img[0] is not a decodable image" in out


def test_the_wait_shows_its_progress_until_the_answer_appears(clients):
    _, s3, _ = clients
    output = f"s3://{BUCKET}/answers/one.out"
    now, shown = [0.0], []

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 15:
            s3.put_object(Bucket=BUCKET, Key="answers/one.out", Body=b'{"result": 1}')

    outcome = invoke_async.wait_for_answer(
        s3,
        output,
        f"s3://{BUCKET}/failures/one.out",
        label="resnet",
        poll_s=5,
        sleep=sleep,
        clock=lambda: now[0],
        progress=lambda text, end=False: shown.append(text),
    )
    assert outcome == invoke_async.Outcome(True, output, b'{"result": 1}')
    assert shown == [
        f"  resnet: waiting for {output} (0 s)",
        f"  resnet: waiting for {output} (5 s)",
        f"  resnet: waiting for {output} (10 s)",
        f"  resnet: answer at {output} after 15 s",
    ]


def test_no_answer_within_the_wait_timeout_is_a_failure(aws, photo, capsys):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    never = f"s3://{BUCKET}/answers/never.out"
    with Stubber(runtime) as stubber:  # an answer location nothing will ever write
        stubber.add_response(
            "invoke_endpoint_async",
            {"OutputLocation": never, "InferenceId": "id-1"},
            {
                "EndpointName": "mm",
                "InputLocation": ANY,
                "ContentType": "image/png",
                "Accept": "application/json",
                "CustomAttributes": "modelname=yolov5",
                "InvocationTimeoutSeconds": 900,
            },
        )
        assert run_async(runtime, s3, "--wait-timeout", "0", f"yolov5={photo}") == 1
    out = capsys.readouterr().out
    assert out.startswith(f"yolov5: no answer at {never} after 0 s (--wait-timeout)")


def test_draw_works_on_an_asynchronous_answer(clients, photo, tmp_path, capsys):
    runtime, s3, _ = clients
    detections = {
        "width": 320,
        "height": 240,
        "detections": [{"label": "dog", "class_id": 16, "score": 0.9, "box": [20.0, 30.0, 200.0, 220.0]}],
    }
    queue_results({"data": json.dumps({"modelname": "yolov5", "version": "1", "result": detections})})
    drawing = tmp_path / "drawn.png"
    assert run_async(runtime, s3, "--draw", str(drawing), f"yolov5={photo}") == 0
    assert f"drawn: {drawing}" in capsys.readouterr().out
    drawn = Image.open(io.BytesIO(drawing.read_bytes()))
    assert drawn.size == (320, 240)
    assert drawn.getpixel((20, 120)) != Image.open(photo).convert("RGB").getpixel((20, 120))  # the box's edge


def test_an_aws_error_is_the_callers_message_not_a_traceback(clients, photo, capsys):
    runtime, s3, _ = clients
    assert (
        invoke.main(
            ["--endpoint-name", "mm", "--async", "s3://no-such-bucket/queue/", f"resnet={photo}"], client=runtime, s3=s3
        )
        == 1
    )
    out = capsys.readouterr().out
    assert out.startswith("resnet: failed with status 404 (NoSuchBucket)") and "Traceback" not in out


def test_async_needs_a_sagemaker_endpoint(photo, capsys):
    with pytest.raises(SystemExit):
        invoke.main(["--endpoint-url", "http://localhost:8080", "--async", PREFIX, f"resnet={photo}"])
    assert "the local stack (--endpoint-url) has no queue" in capsys.readouterr().err
