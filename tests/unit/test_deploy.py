"""deploy, auto scaling, invoke and --delete against moto: the parameters sent, and nothing left after;
and a list call that reads every page (botocore's Stubber)."""

from __future__ import annotations

import datetime
import json

import boto3
import pytest
import requests
from botocore.stub import Stubber

from scripts.caller import invoke
from scripts.sagemaker import deploy, resources
from tests.support import DATA, IMAGE, REGION, RESOURCE, ROLE, deploy_argv, params


def test_deploy_sends_the_parameters_and_scales(sent, capsys):
    clients, calls = sent
    assert (
        deploy.main(
            deploy_argv(
                "--health-check-timeout",
                "900",
                "--min-capacity",
                "1",
                "--max-capacity",
                "4",
                "--invocations-per-instance",
                "250",
            ),
            clients=clients,
            sleep=lambda s: None,
        )
        == 0
    )

    model = params(calls, "CreateModel")
    assert model["PrimaryContainer"] == {
        "Image": IMAGE,
        "ModelDataUrl": DATA,
        "Environment": {"MODEL_SERVER_WORKERS": "2", "ENDPOINT_NAME": "mm"},
    }
    assert model["ExecutionRoleArn"] == ROLE
    (variant,) = params(calls, "CreateEndpointConfig")["ProductionVariants"]
    assert variant["InstanceType"] == "ml.g4dn.xlarge"
    assert variant["InitialInstanceCount"] == 1
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 900
    assert variant["ModelDataDownloadTimeoutInSeconds"] == 600
    assert variant["ModelName"] == model["ModelName"]
    assert params(calls, "CreateEndpoint")["EndpointName"] == "mm"

    target = params(calls, "RegisterScalableTarget")
    assert target == {
        "ServiceNamespace": "sagemaker",
        "ResourceId": RESOURCE,
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "MinCapacity": 1,
        "MaxCapacity": 4,
    }
    policy = params(calls, "PutScalingPolicy")
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert policy["ResourceId"] == RESOURCE
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 250.0
    assert tracking["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
    }

    # What moto now holds.
    sm, aas = clients.sagemaker, clients.autoscaling
    assert sm.describe_endpoint(EndpointName="mm")["EndpointStatus"] == "InService"
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[RESOURCE])["ScalableTargets"]
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=RESOURCE)["ScalingPolicies"]
    out = capsys.readouterr().out
    assert "endpoint mm: InService" in out and "[4/4] auto scaling" in out


def test_instance_type_and_options_are_parameters(sent):
    clients, calls = sent
    assert (
        deploy.main(
            deploy_argv("--instance-type", "ml.g4dn.2xlarge", "--no-scaling"), clients=clients, sleep=lambda s: None
        )
        == 0
    )
    assert params(calls, "CreateEndpointConfig")["ProductionVariants"][0]["InstanceType"] == "ml.g4dn.2xlarge"
    assert not [name for name, _ in calls if name == "RegisterScalableTarget"]


def test_an_existing_endpoint_is_not_overwritten(sent, capsys):
    clients, _ = sent
    assert deploy.main(deploy_argv(), clients=clients, sleep=lambda s: None) == 0
    assert deploy.main(deploy_argv(), clients=clients, sleep=lambda s: None) == 1
    assert "exists already" in capsys.readouterr().err


def test_wait_shows_progress_and_reports_a_failure():
    states = iter(
        [
            {"EndpointStatus": "Creating"},
            {"EndpointStatus": "Creating"},
            {"EndpointStatus": "Failed", "FailureReason": "ping did not pass"},
        ]
    )

    class FakeSageMaker:
        def describe_endpoint(self, EndpointName):
            return next(states)

    lines: list[str] = []
    with pytest.raises(deploy.DeployError, match="ping did not pass"):
        deploy.wait_in_service(FakeSageMaker(), "mm", 0, 60, sleep=lambda s: None, log=lines.append)
    assert [line.split(":")[1].split()[0] for line in lines] == ["Creating", "Creating", "Failed"]


def test_invoke_against_the_deployed_endpoint(sent, tmp_path, capsys):
    clients, _ = sent
    assert deploy.main(deploy_argv(), clients=clients, sleep=lambda s: None) == 0
    answer = {
        "modelname": "resnet",
        "version": "1",
        "result": [{"label": "malamute, malemute, Alaskan malamute", "index": 249, "score": 0.41}],
    }
    # moto's own API queues what its sagemaker-runtime answers.
    requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/sagemaker/endpoint-results",
        json={
            "region": REGION,
            "results": [
                {
                    "Body": json.dumps(answer),
                    "ContentType": "application/json",
                    "InvokedProductionVariant": "AllTraffic",
                    "CustomAttributes": "",
                }
            ],
        },
    )
    sentence = tmp_path / "sentence.txt"  # moto's runtime takes text bodies only
    sentence.write_text("The world has [MASK] people.")
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    assert invoke.main(["--endpoint-name", "mm", f"resnet={sentence}"], client=runtime) == 0
    out = capsys.readouterr().out
    assert "resnet (version 1):" in out
    assert "malamute, malemute, Alaskan malamute (index 249) 0.410" in out


def test_delete_leaves_nothing(sent, capsys):
    clients, calls = sent
    assert deploy.main(deploy_argv(), clients=clients, sleep=lambda s: None) == 0
    assert deploy.main(["--name", "mm", "--delete", "--poll-seconds", "0"], clients=clients, sleep=lambda s: None) == 0

    sm, aas = clients.sagemaker, clients.autoscaling
    assert sm.list_endpoints()["Endpoints"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert sm.list_models()["Models"] == []
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    operations = [name for name, _ in calls]
    order = [
        operations.index(op)
        for op in (
            "DeleteScalingPolicy",
            "DeregisterScalableTarget",
            "DeleteEndpoint",
            "DeleteEndpointConfig",
            "DeleteModel",
        )
    ]
    assert order == sorted(order)
    # A second delete finds nothing and still succeeds.
    assert deploy.main(["--name", "mm", "--delete"], clients=clients, sleep=lambda s: None) == 0
    assert "endpoint mm: not found" in capsys.readouterr().out


def test_delete_cleans_up_after_a_deploy_that_failed_half_way(sent):
    clients, _ = sent
    sm = clients.sagemaker
    sm.create_model(ModelName="mm-model-20260101-000000", PrimaryContainer={"Image": IMAGE}, ExecutionRoleArn=ROLE)
    sm.create_endpoint_config(
        EndpointConfigName="mm-config-20260101-000000",
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": "mm-model-20260101-000000",
                "InstanceType": "ml.g4dn.xlarge",
                "InitialInstanceCount": 1,
            }
        ],
    )
    sm.create_model(ModelName="other-model", PrimaryContainer={"Image": IMAGE}, ExecutionRoleArn=ROLE)
    assert deploy.main(["--name", "mm", "--delete"], clients=clients, sleep=lambda s: None) == 0
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["other-model"]


def test_deploy_needs_an_image_and_a_role(monkeypatch, capsys):
    monkeypatch.delenv(deploy.ROLE_ENV, raising=False)
    with pytest.raises(SystemExit):
        deploy.main(["--name", "mm"])
    assert "--image-uri and --role-arn" in capsys.readouterr().err


def test_an_aws_error_is_one_line_not_a_traceback(sent, capsys):
    clients, _ = sent
    assert (
        deploy.main(deploy_argv("--instance-type", "ml.nonexistent.xlarge"), clients=clients, sleep=lambda s: None) == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("deploy: ") and "CreateEndpointConfig" in err and "Traceback" not in err


def test_a_model_error_shows_the_containers_json_error():
    from botocore.exceptions import ClientError

    body = '{"error": {"code": "invalid_input", "message": "payload.img[0] is not a decodable image"}}'
    error = ClientError(
        {
            "Error": {"Code": "ModelError", "Message": "Received client error (400)"},
            "OriginalStatusCode": 400,
            "OriginalMessage": body,
            "ResponseMetadata": {"HTTPStatusCode": 424},
        },
        "InvokeEndpoint",
    )
    lines = invoke.error_lines("resnet", error)
    assert lines[0] == "resnet: failed with status 400 (ModelError)"
    assert '"code": "invalid_input"' in "\n".join(lines)
    assert "payload.img[0] is not a decodable image" in "\n".join(lines)


def test_a_list_call_reads_every_page():
    """resources.list_all follows NextToken with boto3's paginator: the names on the second page count too."""
    sm = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    first, second = (
        {
            "ModelName": name,
            "ModelArn": f"arn:aws:sagemaker:{REGION}:123456789012:model/{name}",
            "CreationTime": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        }
        for name in ("mm-model-resnet-1", "mm-model-yolov5-1")
    )
    with Stubber(sm) as stub:
        stub.add_response("list_models", {"Models": [first], "NextToken": "2"}, {"NameContains": "mm-model-"})
        stub.add_response("list_models", {"Models": [second]}, {"NameContains": "mm-model-", "NextToken": "2"})
        assert resources.models_named(sm, "mm-model-") == ["mm-model-resnet-1", "mm-model-yolov5-1"]
        stub.assert_no_pending_responses()
