"""deploy transform: the Batch Transform job's parameters (moto), the container's execution parameters
for its environment, the wait with its progress, a failure's reason (Stubber: moto's jobs always
complete), and the clean-up of the model."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import ANY, Stubber

from scripts.sagemaker import deploy
from tests.support import DATA, IMAGE, REGION, ROLE, params

INPUT = "s3://in-bucket/requests/"
OUTPUT = "s3://out-bucket/answers"


def transform_argv(*extra: str) -> list[str]:
    return [
        "transform",
        "--name",
        "mm",
        "--input",
        INPUT,
        "--output",
        OUTPUT,
        "--image-uri",
        IMAGE,
        "--role-arn",
        ROLE,
        "--model-data-url",
        DATA,
        "--poll-seconds",
        "0",
        *extra,
    ]


def run(clients, *extra: str) -> int:
    return deploy.main(transform_argv(*extra), clients=clients, sleep=lambda s: None)


def test_the_job_gets_the_documented_parameters(sent, capsys):
    clients, calls = sent
    assert (
        run(
            clients,
            "--env",
            "MAX_BODY_BYTES=20971520",
            "--env",
            "MAX_CONCURRENT_TRANSFORMS=8",
            "--instance-type",
            "ml.g4dn.2xlarge",
            "--instance-count",
            "2",
        )
        == 0
    )

    model = params(calls, "CreateModel")
    assert model["PrimaryContainer"] == {
        "Image": IMAGE,
        "ModelDataUrl": DATA,
        "Environment": {"MAX_BODY_BYTES": "20971520", "MAX_CONCURRENT_TRANSFORMS": "8"},
    }
    assert model["ExecutionRoleArn"] == ROLE
    job = params(calls, "CreateTransformJob")
    assert job["ModelName"] == model["ModelName"]
    assert job["BatchStrategy"] == "MultiRecord"
    # 20 MiB bodies; 8 at a time would be 160 MB, over Batch Transform's 100: the container says 5.
    assert (job["MaxPayloadInMB"], job["MaxConcurrentTransforms"]) == (20, 5)
    assert job["TransformInput"] == {
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": INPUT}},
        "ContentType": "application/jsonlines",
        "SplitType": "Line",
    }
    assert job["TransformOutput"] == {
        "S3OutputPath": OUTPUT + "/",
        "AssembleWith": "Line",
        "Accept": "application/jsonlines",
    }
    assert job["TransformResources"] == {"InstanceType": "ml.g4dn.2xlarge", "InstanceCount": 2}

    stored = clients.sagemaker.describe_transform_job(TransformJobName=job["TransformJobName"])
    assert stored["TransformJobStatus"] == "Completed"
    out = capsys.readouterr().out
    assert f"transform job {job['TransformJobName']}: Completed (0m 00s)" in out
    assert f"answers in {OUTPUT}/" in out
    assert [m["ModelName"] for m in clients.sagemaker.list_models()["Models"]] == [model["ModelName"]]


def test_without_a_fixed_concurrency_the_container_answers_it_on_the_instance(sent, capsys):
    clients, calls = sent
    assert run(clients, "--env", "MODEL_SERVER_WORKERS=3") == 0
    job = params(calls, "CreateTransformJob")
    assert job["MaxPayloadInMB"] == 6  # the container's 6 MiB default body limit
    assert "MaxConcurrentTransforms" not in job  # SageMaker then asks GET /execution-parameters there
    assert "the container's concurrency (2 requests per CPU) per instance" in capsys.readouterr().out


def test_the_flags_override_the_containers_parameters(sent):
    clients, calls = sent
    assert (
        run(clients, "--env", "MAX_BODY_BYTES=20971520", "--max-payload-mb", "10", "--max-concurrent-transforms", "3")
        == 0
    )
    job = params(calls, "CreateTransformJob")
    assert (job["MaxPayloadInMB"], job["MaxConcurrentTransforms"]) == (10, 3)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ("--env", "MAX_BODY_BYTES=41943040", "--max-payload-mb", "30", "--max-concurrent-transforms", "4"),
            "4 concurrent transforms x 30 MB is over SageMaker's 100 MB",
        ),
        (("--max-payload-mb", "10"), "--max-payload-mb 10 is over the 6 MB the container takes"),
    ],
)
def test_what_sagemaker_or_the_container_would_refuse_is_refused_first(sent, capsys, flags, message):
    clients, _ = sent
    assert run(clients, *flags) == 1
    assert capsys.readouterr().err.startswith(f"deploy: {message}")
    assert clients.sagemaker.list_models()["Models"] == []


def test_delete_model_removes_the_model_once_the_job_has_ended(sent, capsys):
    clients, _ = sent
    assert run(clients, "--delete-model") == 0
    assert clients.sagemaker.list_models()["Models"] == []
    assert "deleted model mm-transform-" in capsys.readouterr().out


def test_transform_delete_removes_only_the_models_transform_runs_left(sent):
    clients, _ = sent
    sm = clients.sagemaker
    for name in ("mm-transform-20260101-000000", "mm-model-20260101-000000", "other-transform-20260101-000000"):
        sm.create_model(ModelName=name, PrimaryContainer={"Image": IMAGE}, ExecutionRoleArn=ROLE)
    assert deploy.main(["transform", "--name", "mm", "--delete"], clients=clients) == 0
    assert sorted(m["ModelName"] for m in sm.list_models()["Models"]) == [
        "mm-model-20260101-000000",
        "other-transform-20260101-000000",
    ]


@pytest.fixture
def stubbed():
    """A SageMaker client that answers only what the test queues (moto cannot fail a job)."""
    sm, autoscaling, cloudwatch = (
        boto3.client(service, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
        for service in ("sagemaker", "application-autoscaling", "cloudwatch")
    )
    clients = deploy.Clients(sm, autoscaling, cloudwatch)
    with Stubber(sm) as stubber:
        stubber.add_response(
            "create_model",
            {"ModelArn": "arn:aws:sagemaker:us-east-1:1:model/m"},
            {"ModelName": ANY, "PrimaryContainer": ANY, "ExecutionRoleArn": ROLE},
        )
        stubber.add_response(
            "create_transform_job",
            {"TransformJobArn": "arn:aws:sagemaker:us-east-1:1:job/j"},
            {
                "TransformJobName": ANY,
                "ModelName": ANY,
                "MaxPayloadInMB": 6,
                "BatchStrategy": "MultiRecord",
                "TransformInput": ANY,
                "TransformOutput": ANY,
                "TransformResources": ANY,
            },
        )
        yield clients, stubber


def describe(stubber: Stubber, status: str, **extra) -> None:
    stubber.add_response(
        "describe_transform_job",
        {
            "TransformJobName": "j",
            "TransformJobArn": "arn:aws:sagemaker:us-east-1:1:job/j",
            "ModelName": "m",
            "TransformJobStatus": status,
            "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": INPUT}}},
            "TransformResources": {"InstanceType": "ml.g4dn.xlarge", "InstanceCount": 1},
            "CreationTime": "2026-01-01T00:00:00Z",
            **extra,
        },
        {"TransformJobName": ANY},
    )


def test_a_failed_job_shows_progress_then_its_reason(stubbed, capsys):
    clients, stubber = stubbed
    for status in ("InProgress", "InProgress"):
        describe(stubber, status)
    describe(stubber, "Failed", FailureReason="ClientError: line 3: payload.img is not a decodable image")
    describe(stubber, "Failed")  # --delete-model checks that the job has ended
    stubber.add_response("delete_model", {}, {"ModelName": ANY})

    assert run(clients, "--delete-model") == 1
    captured = capsys.readouterr()
    progress = [
        line.split(":")[1].split()[0] for line in captured.out.splitlines() if line.startswith("  transform job")
    ]
    assert progress == ["InProgress", "InProgress", "Failed"]
    assert "ClientError: line 3: payload.img is not a decodable image" in captured.err
    assert "/aws/sagemaker/TransformJobs" in captured.err and "Traceback" not in captured.err
    assert "deleted model mm-transform-" in captured.out
    stubber.assert_no_pending_responses()


def test_a_job_still_running_when_the_wait_ends_keeps_its_model(stubbed, capsys):
    clients, stubber = stubbed
    describe(stubber, "InProgress")
    describe(stubber, "InProgress")
    assert run(clients, "--delete-model", "--timeout-minutes", "0") == 1
    captured = capsys.readouterr()
    assert "not Completed after 0 s (still InProgress)" in captured.err
    assert "kept: the job is InProgress" in captured.out
    stubber.assert_no_pending_responses()  # and no DeleteModel was sent


def test_a_transform_needs_its_input_and_output(capsys):
    with pytest.raises(SystemExit):
        deploy.main(["transform", "--image-uri", IMAGE, "--role-arn", ROLE, "--input", INPUT])
    assert "needs --output" in capsys.readouterr().err
