"""invoke --target-model / --inference-component: the InvokeEndpoint parameter each sets (Stubber),
the header botocore sends for it to the local stack (--endpoint-url), and what is refused: both at
once, either with --async (InvokeEndpointAsync takes neither), either without MODEL=FILE pairs."""

from __future__ import annotations

import io
import json

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from urllib3.response import HTTPResponse

from scripts.caller import invoke
from tests.support import REGION

ANSWER = {
    "modelname": "resnet",
    "version": "1",
    "result": [{"label": "malamute, malemute, Alaskan malamute", "index": 249, "score": 0.41}],
}


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "sentence.txt"
    path.write_text("The capital of France is [MASK].")
    return path


def runtime():
    return boto3.client(
        "sagemaker-runtime", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def body(answer: dict) -> StreamingBody:
    raw = json.dumps(answer).encode()
    return StreamingBody(io.BytesIO(raw), len(raw))


@pytest.mark.parametrize(
    "flag, value, parameter",
    [
        ("--target-model", "resnet.tar.gz", "TargetModel"),
        ("--inference-component", "mm-resnet", "InferenceComponentName"),
    ],
)
def test_the_flag_becomes_the_invoke_endpoint_parameter(text_file, capsys, flag, value, parameter):
    client = runtime()
    with Stubber(client) as stubber:
        stubber.add_response(
            "invoke_endpoint",
            {"Body": body(ANSWER), "ContentType": "application/json"},
            {
                "EndpointName": "mm",
                "ContentType": "text/plain; charset=utf-8",
                "Accept": "application/json",
                "Body": text_file.read_bytes(),
                "CustomAttributes": "modelname=resnet",
                parameter: value,
            },
        )
        assert invoke.main(["--endpoint-name", "mm", flag, value, f"resnet={text_file}"], client=client) == 0
        stubber.assert_no_pending_responses()
    assert "malamute, malemute, Alaskan malamute (index 249) 0.410" in capsys.readouterr().out


def test_without_a_flag_no_model_is_picked(text_file):
    client = runtime()
    with Stubber(client) as stubber:
        stubber.add_response(
            "invoke_endpoint",
            {"Body": body(ANSWER)},
            {
                "EndpointName": "mm",
                "ContentType": "text/plain; charset=utf-8",
                "Accept": "application/json",
                "Body": text_file.read_bytes(),
                "CustomAttributes": "modelname=resnet",
            },
        )
        assert invoke.main(["--endpoint-name", "mm", f"resnet={text_file}"], client=client) == 0


@pytest.mark.parametrize(
    "flag, value, header",
    [
        ("--target-model", "resnet.tar.gz", "X-Amzn-SageMaker-Target-Model"),
        ("--inference-component", "mm-resnet", "X-Amzn-SageMaker-Inference-Component"),
    ],
)
def test_against_the_local_stack_botocore_sends_the_header(text_file, flag, value, header):
    client = invoke.make_client(None, "http://localhost:8080")
    seen = []

    def answer(request, **_):
        """What the local stack would answer, in place of the network."""
        from botocore.awsrequest import AWSResponse

        seen.append(request)
        raw = json.dumps(ANSWER).encode()
        return AWSResponse(
            request.url,
            200,
            {"Content-Type": "application/json"},
            HTTPResponse(body=io.BytesIO(raw), preload_content=False),
        )

    client.meta.events.register("before-send.sagemaker-runtime.InvokeEndpoint", answer)
    assert (
        invoke.main(["--endpoint-url", "http://localhost:8080", flag, value, f"resnet={text_file}"], client=client) == 0
    )
    (request,) = seen
    assert request.url == "http://localhost:8080/endpoints/local/invocations"
    assert request.headers[header] == value.encode()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target-model", "resnet.tar.gz", "--inference-component", "mm-resnet"], "do not go together"),
        (["--target-model", "resnet.tar.gz", "--async", "s3://bucket/in/"], "InvokeEndpointAsync has no TargetModel"),
        (
            ["--inference-component", "mm-resnet", "--async", "s3://bucket/in/"],
            "InvokeEndpointAsync has no InferenceComponentName",
        ),
    ],
)
def test_what_is_refused(text_file, capsys, argv, message):
    with pytest.raises(SystemExit):
        invoke.main(["--endpoint-name", "mm", *argv, f"resnet={text_file}"], client=runtime())
    assert message in capsys.readouterr().err


def test_a_target_needs_model_file_pairs(capsys, tmp_path):
    with pytest.raises(SystemExit):
        invoke.main(
            ["--endpoint-name", "mm", "--target-model", "resnet.tar.gz", "--image", str(tmp_path / "x.jpg")],
            client=runtime(),
        )
    assert "--target-model needs MODEL=FILE pairs" in capsys.readouterr().err


def test_invoke_async_really_takes_neither_parameter():
    """The refusal above rests on the service model botocore ships."""
    members = runtime().meta.service_model.operation_model("InvokeEndpointAsync").input_shape.members
    assert "TargetModel" not in members and "InferenceComponentName" not in members
    members = runtime().meta.service_model.operation_model("InvokeEndpoint").input_shape.members
    assert "TargetModel" in members and "InferenceComponentName" in members
