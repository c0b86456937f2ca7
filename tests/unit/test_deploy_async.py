"""deploy --async and --capture against moto: the endpoint configuration, the container's limits,
scaling to zero on the backlog (two policies and the alarm), and a --delete that leaves nothing."""

from __future__ import annotations

import pytest

from scripts.sagemaker import deploy
from tests.support import RESOURCE, deploy_argv, params

OUT = "s3://answers-bucket/mm/async"
CAPTURE = "s3://capture-bucket/mm/"


def run(clients, *extra) -> int:
    return deploy.main(deploy_argv(*extra), clients=clients, sleep=lambda s: None)


def test_async_endpoint_configuration_and_container_limits(sent):
    clients, calls = sent
    assert run(clients, "--async", OUT, "--max-concurrent-invocations", "2") == 0

    config = params(calls, "CreateEndpointConfig")
    assert config["AsyncInferenceConfig"] == {
        "OutputConfig": {
            "S3OutputPath": "s3://answers-bucket/mm/async/",
            "S3FailurePath": "s3://answers-bucket/mm/async/failures/",
        },
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 2},
    }
    assert "DataCaptureConfig" not in config
    # SageMaker's asynchronous limits (1 GiB, an hour), beside what --env gave.
    assert params(calls, "CreateModel")["PrimaryContainer"]["Environment"] == {
        "MODEL_SERVER_WORKERS": "2",
        "MAX_BODY_BYTES": str(1024**3),
        "MODEL_SERVER_TIMEOUT": "3600",
        "ENDPOINT_NAME": "mm",
    }
    stored = clients.sagemaker.describe_endpoint_config(EndpointConfigName=config["EndpointConfigName"])
    assert stored["AsyncInferenceConfig"]["OutputConfig"]["S3FailurePath"].endswith("/failures/")


def test_the_users_limits_win_and_are_checked(sent, capsys):
    clients, calls = sent
    assert run(clients, "--async", OUT, "--env", "MAX_BODY_BYTES=104857600", "--env", "MODEL_SERVER_TIMEOUT=900") == 0
    environment = params(calls, "CreateModel")["PrimaryContainer"]["Environment"]
    assert environment["MAX_BODY_BYTES"] == "104857600" and environment["MODEL_SERVER_TIMEOUT"] == "900"

    with pytest.raises(SystemExit):  # above what an asynchronous endpoint allows: refused before any call
        run(clients, "--async", OUT, "--env", "MODEL_SERVER_TIMEOUT=7200")
    assert "MODEL_SERVER_TIMEOUT=7200.0 is above its maximum 3600" in capsys.readouterr().err


def test_a_real_time_endpoint_keeps_the_containers_defaults(sent):
    clients, calls = sent
    assert run(clients) == 0
    assert params(calls, "CreateModel")["PrimaryContainer"]["Environment"] == {
        "MODEL_SERVER_WORKERS": "2",
        "ENDPOINT_NAME": "mm",
    }
    assert "AsyncInferenceConfig" not in params(calls, "CreateEndpointConfig")


def test_async_scales_to_zero_on_the_backlog_and_back_from_zero_on_an_alarm(sent, capsys):
    clients, calls = sent
    assert (
        run(
            clients,
            "--async",
            OUT,
            "--max-capacity",
            "3",
            "--backlog-per-instance",
            "8",
            "--scale-in-cooldown",
            "600",
            "--scale-out-cooldown",
            "120",
        )
        == 0
    )

    assert params(calls, "RegisterScalableTarget") == {
        "ServiceNamespace": "sagemaker",
        "ResourceId": RESOURCE,
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "MinCapacity": 0,
        "MaxCapacity": 3,
    }
    policies = {p["PolicyType"]: p for name, p in calls if name == "PutScalingPolicy"}
    tracking = policies["TargetTrackingScaling"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking == {
        "TargetValue": 8.0,
        "CustomizedMetricSpecification": {
            "MetricName": "ApproximateBacklogSizePerInstance",
            "Namespace": "AWS/SageMaker",
            "Statistic": "Average",
            "Dimensions": [{"Name": "EndpointName", "Value": "mm"}],
        },
        "ScaleInCooldown": 600,
        "ScaleOutCooldown": 120,
    }
    step = policies["StepScaling"]
    assert step["ResourceId"] == RESOURCE
    assert step["StepScalingPolicyConfiguration"] == {
        "AdjustmentType": "ChangeInCapacity",
        "MetricAggregationType": "Average",
        "Cooldown": 120,
        "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
    }

    alarm = params(calls, "PutMetricAlarm")
    assert {
        k: alarm[k] for k in ("Namespace", "MetricName", "Dimensions", "Statistic", "Threshold", "ComparisonOperator")
    } == {
        "Namespace": "AWS/SageMaker",
        "MetricName": "HasBacklogWithoutCapacity",
        "Dimensions": [{"Name": "EndpointName", "Value": "mm"}],
        "Statistic": "Average",
        "Threshold": 1.0,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
    }
    # The alarm fires the step policy moto created.
    stored = clients.autoscaling.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=RESOURCE)
    step_arn = next(p["PolicyARN"] for p in stored["ScalingPolicies"] if p["PolicyType"] == "StepScaling")
    (held,) = clients.cloudwatch.describe_alarms(AlarmNames=[alarm["AlarmName"]])["MetricAlarms"]
    assert held["AlarmActions"] == [step_arn]
    out = capsys.readouterr().out
    assert "0..3 instances" in out and "--async s3://BUCKET/inputs/" in out


def test_the_minimum_may_be_zero_only_when_asynchronous(sent, capsys):
    clients, _ = sent
    with pytest.raises(SystemExit):
        run(clients, "--min-capacity", "0")
    assert "need 1 <= --min-capacity" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(clients, "--async", "answers-bucket/no-scheme")
    assert "is not an s3://BUCKET/PREFIX URL" in capsys.readouterr().err


def test_data_capture_keeps_json_readable(sent):
    clients, calls = sent
    assert run(clients, "--capture", CAPTURE, "--capture-percent", "25") == 0
    capture = params(calls, "CreateEndpointConfig")["DataCaptureConfig"]
    assert capture == {
        "EnableCapture": True,
        "InitialSamplingPercentage": 25,
        "DestinationS3Uri": CAPTURE,
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json", "application/jsonlines"]},
    }


def test_capture_samples_everything_by_default_and_goes_with_async(sent):
    clients, calls = sent
    assert run(clients, "--async", OUT, "--capture", CAPTURE) == 0
    config = params(calls, "CreateEndpointConfig")
    assert config["DataCaptureConfig"]["InitialSamplingPercentage"] == 100
    assert "AsyncInferenceConfig" in config


def test_delete_removes_the_alarm_and_both_policies(sent, capsys):
    clients, calls = sent
    assert run(clients, "--async", OUT) == 0
    assert len(clients.autoscaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]) == 2
    assert deploy.main(["--name", "mm", "--delete", "--poll-seconds", "0"], clients=clients, sleep=lambda s: None) == 0

    assert clients.cloudwatch.describe_alarms()["MetricAlarms"] == []
    assert clients.autoscaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    assert clients.autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert clients.sagemaker.list_endpoints()["Endpoints"] == []
    assert clients.sagemaker.list_endpoint_configs()["EndpointConfigs"] == []
    assert clients.sagemaker.list_models()["Models"] == []
    assert "deleted alarm mm-has-backlog-without-capacity" in capsys.readouterr().out
    operations = [name for name, _ in calls]
    assert operations.index("DeleteAlarms") < operations.index("DeleteEndpoint")
