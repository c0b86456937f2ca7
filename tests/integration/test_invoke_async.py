"""python -m scripts.caller invoke --async end to end: moto's S3 holds the objects, the real stack
answers, and the test plays SageMaker's asynchronous fabric in between. On InvokeEndpointAsync it
reads the input object, posts it to the stack's /invocations with the content type and the custom
attributes the call carried, and a moment later writes the answer to the output location (a refusal
to the failure location), as SageMaker does. What invoke prints must be what a real-time call prints."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import boto3
import pytest
import requests
from botocore.awsrequest import AWSResponse

from app.router.parsing import CUSTOM_ATTRIBUTES
from scripts.caller import invoke
from scripts.caller.invoke_async import split_s3
from tests.references import real_photos
from tests.support import REGION

pytestmark = pytest.mark.integration

BUCKET = "async-bucket"
PREFIX = f"s3://{BUCKET}/inputs/"
ANSWER_DELAY_S = 1.0  # the answer appears after invoke has started waiting
# How boto3 sends InvokeEndpointAsync's parameters (botocore's sagemaker-runtime model).
INPUT_LOCATION, CONTENT_TYPE, ACCEPT = (
    "X-Amzn-SageMaker-InputLocation",
    "X-Amzn-SageMaker-Content-Type",
    "X-Amzn-SageMaker-Accept",
)


class Fabric:
    """SageMaker's queue and its instance, played by threads over moto's S3 and the real stack."""

    def __init__(self, s3, stack_url: str) -> None:
        self.s3, self.stack_url = s3, stack_url
        self.workers: list[threading.Thread] = []
        self.forwarded: list[dict[str, str]] = []  # the headers each request reached the stack with

    def attach(self, runtime) -> None:
        runtime.meta.events.register("before-call.sagemaker-runtime.InvokeEndpointAsync", self.on_invoke)

    def on_invoke(self, params, **_):
        """``params`` is the request as sent; answering here stands in for SageMaker's reply."""
        sent = params["headers"]
        inference_id = uuid.uuid4().hex
        output = f"s3://{BUCKET}/answers/{inference_id}.out"
        failure = f"s3://{BUCKET}/answers/failures/{inference_id}-error.out"
        headers = {
            "Content-Type": sent[CONTENT_TYPE],
            CUSTOM_ATTRIBUTES: sent[CUSTOM_ATTRIBUTES],
            "Accept": sent[ACCEPT],
        }
        worker = threading.Thread(target=self.answer, args=(sent[INPUT_LOCATION], headers, output, failure))
        worker.start()
        self.workers.append(worker)
        reply = {"OutputLocation": output, "FailureLocation": failure, "InferenceId": inference_id}
        return AWSResponse(params["url"], 200, {}, None), reply

    def answer(self, input_location: str, headers: dict[str, str], output: str, failure: str) -> None:
        bucket, key = split_s3(input_location)
        body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        self.forwarded.append(headers)
        time.sleep(ANSWER_DELAY_S)
        response = requests.post(f"{self.stack_url}/invocations", data=body, headers=headers, timeout=120)
        bucket, key = split_s3(output if response.ok else failure)
        self.s3.put_object(Bucket=bucket, Key=key, Body=response.content)

    def join(self) -> None:
        for worker in self.workers:
            worker.join(timeout=120)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    photos = real_photos()
    made = {}
    for name in ("dog.jpg", "chelsea.png"):
        made[name] = tmp_path / name
        made[name].write_bytes(photos[name])
    made["sentence.txt"] = tmp_path / "sentence.txt"
    made["sentence.txt"].write_text("The capital of France is [MASK].")
    return made


def run_async(stack, argv: list[str]) -> tuple[int, Fabric]:
    """invoke --async, with moto behind boto3 (the ``aws`` fixture) and the fabric answering."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    fabric = Fabric(s3, stack.url)
    fabric.attach(runtime)
    status = invoke.main(
        ["--endpoint-name", "mm-async", "--async", PREFIX, "--poll-seconds", "0.2", "--wait-timeout", "120", *argv],
        client=runtime,
        s3=s3,
    )
    fabric.join()
    return status, fabric


def test_async_answers_print_as_the_real_time_ones(stack, files, aws, capsys):
    calls = [
        "--option",
        "topk=2",
        f"resnet={files['dog.jpg']}",
        f"yolov5={files['chelsea.png']}",
        f"bert_base={files['sentence.txt']}",
    ]
    assert invoke.main(["--endpoint-url", stack.url, *calls]) == 0
    real_time = capsys.readouterr().out

    status, fabric = run_async(stack, calls)
    captured = capsys.readouterr()
    assert status == 0, captured.out + captured.err
    assert captured.out == real_time
    assert "resnet (version 1):" in real_time and "detections in " in real_time and "france" in real_time
    assert [h[CUSTOM_ATTRIBUTES] for h in fabric.forwarded] == [
        "modelname=resnet,topk=2",
        "modelname=yolov5,topk=2",
        "modelname=bert_base,topk=2",
    ]
    assert [h["Content-Type"] for h in fabric.forwarded] == ["image/jpeg", "image/png", "text/plain; charset=utf-8"]
    assert "waiting for s3://async-bucket/answers/" in captured.err  # it waited: the answer came later


def test_a_refused_request_lands_in_the_failure_location(stack, files, aws, capsys):
    status, _ = run_async(stack, [f"resnet={files['sentence.txt']}"])
    out = capsys.readouterr().out
    assert status == 1
    assert out.startswith("resnet: failed (s3://async-bucket/answers/failures/")
    assert '"code": "unsupported_media_type"' in out
