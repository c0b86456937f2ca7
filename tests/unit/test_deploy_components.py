"""deploy --inference-components with botocore's Stubber (moto has no inference components, and no
scalable dimension for their copies): the endpoint configuration without a model, one model and one
inference component per served model, each component's auto scaling of copies, the flags' checks,
and a --delete that removes the components (and waits for them) before the endpoint and the models.
CloudWatch and CloudWatch Logs (the per-model metrics) are moto's."""

from __future__ import annotations

import datetime

import boto3
import pytest
from botocore.stub import ANY, Stubber

from scripts.sagemaker import deploy, monitoring
from scripts.sagemaker.model_metrics import COMPONENTS, MetricsConfig
from tests.support import IMAGE, REGION, ROLE, deploy_argv

PREFIX = "s3://models-bucket/per-model/"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
ARN = "arn:aws:sagemaker:us-east-1:123456789012"
SCALING_ARN = "arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy"
ROLE_FOR_SCALING = "arn:aws:iam::123456789012:role/autoscaling"
MISSING = "ValidationException"


@pytest.fixture
def stubbed(aws):
    """Real clients: SageMaker's and Application Auto Scaling's calls answered in order (and checked)
    by Stubbers, CloudWatch's and CloudWatch Logs' by moto; every call's parameters recorded."""
    session = boto3.session.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    clients = deploy.Clients(
        session.client("sagemaker"),
        session.client("application-autoscaling"),
        session.client("cloudwatch"),
        session.client("logs"),
    )
    calls: list[tuple[str, dict]] = []
    stubbers = [Stubber(c) for c in (clients.sagemaker, clients.autoscaling)]
    for client in (clients.sagemaker, clients.autoscaling, clients.cloudwatch, clients.logs):
        client.meta.events.register(
            "provide-client-params.*.*", lambda params, model, **_: calls.append((model.name, dict(params)))
        )
    for stubber in stubbers:
        stubber.activate()
    yield clients, stubbers, calls
    for stubber in stubbers:
        stubber.assert_no_pending_responses()
        stubber.deactivate()


def sent(calls, operation):
    return [p for name, p in calls if name == operation]


def endpoint(status="InService", config="mm-config-1"):
    return {
        "EndpointName": "mm",
        "EndpointArn": f"{ARN}:endpoint/mm",
        "EndpointStatus": status,
        "EndpointConfigName": config,
        "CreationTime": NOW,
        "LastModifiedTime": NOW,
    }


def component(name, status="InService", model=None):
    answer = {
        "InferenceComponentName": name,
        "InferenceComponentArn": f"{ARN}:inference-component/{name}",
        "EndpointName": "mm",
        "EndpointArn": f"{ARN}:endpoint/mm",
        "CreationTime": NOW,
        "LastModifiedTime": NOW,
        "InferenceComponentStatus": status,
    }
    return {**answer, "Specification": {"ModelName": model}} if model else answer


def missing(stubber, operation, params):
    stubber.add_client_error(operation, MISSING, f"Could not find {operation}", expected_params=params)


def components_argv(*extra: str) -> list[str]:
    return deploy_argv(*extra, models=("--inference-components", PREFIX))


def expect_deploy(sm, aas, instance_type, components, scaling=True):
    """The calls a deploy makes, in order; ``components``: (model, component name, copies, max, requirements)."""
    missing(sm, "describe_endpoint", {"EndpointName": "mm"})
    sm.add_response(
        "create_endpoint_config",
        {"EndpointConfigArn": f"{ARN}:endpoint-config/c"},
        {"EndpointConfigName": ANY, "ExecutionRoleArn": ROLE, "ProductionVariants": ANY},
    )
    sm.add_response(
        "create_endpoint", {"EndpointArn": f"{ARN}:endpoint/mm"}, {"EndpointName": "mm", "EndpointConfigName": ANY}
    )
    sm.add_response("describe_endpoint", endpoint("Creating"), {"EndpointName": "mm"})
    sm.add_response("describe_endpoint", endpoint(), {"EndpointName": "mm"})
    for model, *_ in components:
        sm.add_response(
            "create_model",
            {"ModelArn": f"{ARN}:model/m"},
            {
                "ModelName": ANY,
                "ExecutionRoleArn": ROLE,
                "PrimaryContainer": {
                    "Image": IMAGE,
                    "ModelDataUrl": f"{PREFIX}{model}.tar.gz",
                    "Environment": {
                        "MODEL_SERVER_WORKERS": "2",
                        "ENDPOINT_NAME": "mm",
                        "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": model,
                    },
                },
            },
        )
    for _, name, copies, _, needs in components:
        sm.add_response(
            "create_inference_component",
            {"InferenceComponentArn": f"{ARN}:inference-component/{name}"},
            {
                "InferenceComponentName": name,
                "EndpointName": "mm",
                "VariantName": "AllTraffic",
                "Specification": {
                    "ModelName": ANY,
                    "ComputeResourceRequirements": needs,
                    "StartupParameters": {
                        "ModelDataDownloadTimeoutInSeconds": 600,
                        "ContainerStartupHealthCheckTimeoutInSeconds": 600,
                    },
                },
                "RuntimeConfig": {"CopyCount": copies},
            },
        )
    for _, name, *_ in components:
        sm.add_response("describe_inference_component", component(name), {"InferenceComponentName": name})
    for _, name, copies, most, _ in components if scaling else ():
        target = {
            "ServiceNamespace": "sagemaker",
            "ResourceId": f"inference-component/{name}",
            "ScalableDimension": "sagemaker:inference-component:DesiredCopyCount",
        }
        aas.add_response("register_scalable_target", {}, {**target, "MinCapacity": copies, "MaxCapacity": most})
        aas.add_response(
            "put_scaling_policy",
            {"PolicyARN": f"arn:aws:autoscaling:policy/{name}"},
            {
                **target,
                "PolicyName": f"{name}-invocations-per-copy",
                "PolicyType": "TargetTrackingScaling",
                "TargetTrackingScalingPolicyConfiguration": {
                    "TargetValue": 40.0,
                    "ScaleInCooldown": 300,
                    "ScaleOutCooldown": 60,
                    "PredefinedMetricSpecification": {
                        "PredefinedMetricType": "SageMakerInferenceComponentInvocationsPerCopy"
                    },
                },
            },
        )


def test_a_gpu_endpoint_of_components_gets_the_documented_parameters(stubbed, capsys):
    clients, (sm, aas), calls = stubbed
    gpu = {"NumberOfCpuCoresRequired": 2.0, "MinMemoryRequiredInMb": 4096, "NumberOfAcceleratorDevicesRequired": 1.0}
    expect_deploy(
        sm,
        aas,
        "ml.g5.12xlarge",
        [
            ("resnet", "mm-resnet", 2, 5, gpu),
            (
                "bert_base",
                "mm-bert-base",
                1,
                2,
                {**gpu, "NumberOfCpuCoresRequired": 4.0, "MinMemoryRequiredInMb": 8192},
            ),
        ],
    )
    assert (
        deploy.main(
            components_argv(
                "--instance-type",
                "ml.g5.12xlarge",
                "--max-capacity",
                "3",
                "--invocations-per-copy",
                "40",
                "--component",
                "resnet:copies=2,max=5",
                "--component",
                "bert_base:cpus=4,memory=8192",
            ),
            clients=clients,
            sleep=lambda s: None,
        )
        == 0
    )

    (config,) = sent(calls, "CreateEndpointConfig")
    assert config["ProductionVariants"] == [
        {  # no ModelName: the components bring the models
            "VariantName": "AllTraffic",
            "InstanceType": "ml.g5.12xlarge",
            "InitialInstanceCount": 1,
            "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
            "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 3},
        }
    ]
    models = [p["ModelName"] for p in sent(calls, "CreateModel")]
    assert [p["Specification"]["ModelName"] for p in sent(calls, "CreateInferenceComponent")] == models
    assert all(name.startswith("mm-model-") for name in models)  # what --delete finds after a failed deploy
    out = capsys.readouterr().out
    assert "auto scaling mm-resnet: 2..5 copies, target 40 invocations per copy per minute" in out
    assert "--inference-component mm-resnet resnet=FILE" in out

    # Per-model metrics (moto): each component's log group made before the component, with the filters.
    order = [name for name, _ in calls]
    assert order.index("PutMetricFilter") < order.index("CreateInferenceComponent")
    for group in ("/aws/sagemaker/InferenceComponents/mm-resnet", "/aws/sagemaker/InferenceComponents/mm-bert-base"):
        filters = clients.logs.describe_metric_filters(logGroupName=group)["metricFilters"]
        assert sorted(f["filterName"] for f in filters) == [
            "mm/ConstrainedRequests", "mm/Detections", "mm/GeneratedTokens", "mm/GenerationTokensPerSecond",
            "mm/Invocation4XXErrors", "mm/Invocation5XXErrors", "mm/Invocations", "mm/Latency", "mm/Masks",
            "mm/TimeToFirstToken", "mm/ToolCalls", "mm/TritonLatency",
        ]  # fmt: skip
        assert all(f["metricTransformations"][0]["dimensions"]["Model"] == "$.model" for f in filters)
    alarms = clients.cloudwatch.describe_alarms(AlarmNamePrefix="mm/")["MetricAlarms"]
    assert sorted(a["AlarmName"] for a in alarms) == [
        "mm/bert_base/5xx-rate", "mm/bert_base/p99-latency", "mm/resnet/5xx-rate", "mm/resnet/p99-latency"
    ]  # fmt: skip


def test_a_cpu_endpoint_reserves_no_accelerator_and_may_go_without_scaling(stubbed):
    clients, (sm, aas), calls = stubbed
    expect_deploy(
        sm,
        aas,
        "ml.m5.4xlarge",
        [("yolov5", "mm-yolov5", 1, 2, {"NumberOfCpuCoresRequired": 2.0, "MinMemoryRequiredInMb": 4096})],
        scaling=False,
    )
    assert (
        deploy.main(
            components_argv("--instance-type", "ml.m5.4xlarge", "--no-scaling", "--component", "yolov5"),
            clients=clients,
            sleep=lambda s: None,
        )
        == 0
    )
    (variant,) = sent(calls, "CreateEndpointConfig")[0]["ProductionVariants"]
    assert "ManagedInstanceScaling" not in variant
    assert sent(calls, "RegisterScalableTarget") == []


def test_a_failed_component_is_reported(stubbed, capsys):
    clients, (sm, _), _ = stubbed
    missing(sm, "describe_endpoint", {"EndpointName": "mm"})
    sm.add_response("create_endpoint_config", {"EndpointConfigArn": f"{ARN}:endpoint-config/c"})
    sm.add_response("create_endpoint", {"EndpointArn": f"{ARN}:endpoint/mm"})
    sm.add_response("describe_endpoint", endpoint())
    sm.add_response("create_model", {"ModelArn": f"{ARN}:model/m"})
    sm.add_response("create_inference_component", {"InferenceComponentArn": f"{ARN}:inference-component/x"})
    sm.add_response(
        "describe_inference_component",
        {**component("mm-resnet", "Failed"), "FailureReason": "the container did not pass /ping"},
    )
    assert deploy.main(components_argv("--component", "resnet"), clients=clients, sleep=lambda s: None) == 1
    err = capsys.readouterr().err
    assert "inference component mm-resnet is Failed: the container did not pass /ping" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--component", "resnet:copies=2,max=1"], "max=1 is below copies=2"),
        (["--component", "resnet:replicas=2"], "unknown key 'replicas'"),
        (["--component", "resnet:memory=lots"], "memory='lots': not a number"),
        (["--component", "resnet:cpus=0"], "cpus=0: must be above 0"),
        (["--component", "resnet", "--component", "resnet:copies=2"], "each model once"),
        ([], "needs at least one --component"),
        (["--component", "resnet", "--no-wait"], "does not go with --no-wait"),
        (["--component", "resnet", "--async", "s3://answers/mm/"], "does not go with --async"),
        (["--component", "resnet:gpus=1", "--instance-type", "ml.c5.4xlarge"], "ml.c5.4xlarge has no accelerators"),
    ],
)
def test_the_flags_are_checked_before_any_call(stubbed, capsys, argv, message):
    clients, _, calls = stubbed
    with pytest.raises(SystemExit):
        deploy.main(components_argv(*argv), clients=clients, sleep=lambda s: None)
    assert message in capsys.readouterr().err
    assert calls == []


def test_a_component_needs_the_components_endpoint(stubbed, capsys):
    clients, _, _ = stubbed
    with pytest.raises(SystemExit):
        deploy.main(
            ["--name", "mm", "--image-uri", IMAGE, "--role-arn", ROLE, "--component", "resnet"], clients=clients
        )
    assert "--component needs --inference-components" in capsys.readouterr().err


def expect_component_removal(sm, aas, name, model):
    resource = f"inference-component/{name}"
    target = {
        "ServiceNamespace": "sagemaker",
        "ResourceId": resource,
        "ScalableDimension": "sagemaker:inference-component:DesiredCopyCount",
    }
    aas.add_response(
        "describe_scaling_policies",
        {
            "ScalingPolicies": [
                {
                    **target,
                    "PolicyARN": f"{SCALING_ARN}:{name}",
                    "PolicyName": f"{name}-invocations-per-copy",
                    "PolicyType": "TargetTrackingScaling",
                    "CreationTime": NOW,
                }
            ]
        },
        {"ServiceNamespace": "sagemaker", "ResourceId": resource},
    )
    aas.add_response("delete_scaling_policy", {}, {**target, "PolicyName": f"{name}-invocations-per-copy"})
    aas.add_response(
        "describe_scalable_targets",
        {
            "ScalableTargets": [
                {**target, "MinCapacity": 1, "MaxCapacity": 2, "RoleARN": ROLE_FOR_SCALING, "CreationTime": NOW}
            ]
        },
        {"ServiceNamespace": "sagemaker", "ResourceIds": [resource]},
    )
    aas.add_response("deregister_scalable_target", {}, target)
    sm.add_response("describe_inference_component", component(name, model=model), {"InferenceComponentName": name})
    sm.add_response("delete_inference_component", {}, {"InferenceComponentName": name})


def test_delete_removes_the_components_first_then_the_endpoint_and_every_model(stubbed):
    clients, (sm, aas), calls = stubbed
    config = {
        "EndpointConfigName": "mm-config-1",
        "EndpointConfigArn": f"{ARN}:endpoint-config/mm-config-1",
        "CreationTime": NOW,
        "ProductionVariants": [
            {"VariantName": "AllTraffic", "InstanceType": "ml.g5.12xlarge", "InitialInstanceCount": 1}
        ],
    }
    sm.add_response("describe_endpoint", endpoint(), {"EndpointName": "mm"})
    sm.add_response("describe_endpoint_config", config, {"EndpointConfigName": "mm-config-1"})
    summaries = [
        {**{k: v for k, v in component(n).items() if k != "InferenceComponentStatus"}, "VariantName": "AllTraffic"}
        for n in ("mm-resnet", "mm-yolov5")
    ]
    sm.add_response("list_inference_components", {"InferenceComponents": summaries}, {"EndpointNameEquals": "mm"})
    expect_component_removal(sm, aas, "mm-resnet", "mm-model-resnet-1")
    expect_component_removal(sm, aas, "mm-yolov5", "mm-model-yolov5-1")
    sm.add_response(
        "describe_inference_component", component("mm-resnet", "Deleting"), {"InferenceComponentName": "mm-resnet"}
    )
    missing(sm, "describe_inference_component", {"InferenceComponentName": "mm-resnet"})
    missing(sm, "describe_inference_component", {"InferenceComponentName": "mm-yolov5"})
    # Then what an endpoint's delete does: its scaling, the endpoint, its configuration, the models.
    variant = {"ServiceNamespace": "sagemaker", "ResourceId": "endpoint/mm/variant/AllTraffic"}
    aas.add_response("describe_scaling_policies", {"ScalingPolicies": []}, variant)
    aas.add_response(
        "describe_scalable_targets",
        {"ScalableTargets": []},
        {"ServiceNamespace": "sagemaker", "ResourceIds": [variant["ResourceId"]]},
    )
    sm.add_response("describe_endpoint", endpoint(), {"EndpointName": "mm"})
    sm.add_response("delete_endpoint", {}, {"EndpointName": "mm"})
    missing(sm, "describe_endpoint", {"EndpointName": "mm"})
    sm.add_response("list_endpoint_configs", {"EndpointConfigs": []}, {"NameContains": "mm"})
    sm.add_response("describe_endpoint_config", config, {"EndpointConfigName": "mm-config-1"})
    sm.add_response("delete_endpoint_config", {}, {"EndpointConfigName": "mm-config-1"})
    left = {"ModelName": "mm-model-bert-base-0", "ModelArn": f"{ARN}:model/mm-model-bert-base-0", "CreationTime": NOW}
    sm.add_response("list_models", {"Models": [left]}, {"NameContains": "mm-model-"})  # from a failed deploy
    for model in ("mm-model-resnet-1", "mm-model-yolov5-1", "mm-model-bert-base-0"):
        sm.add_response("delete_model", {}, {"ModelName": model})

    groups = ["/aws/sagemaker/InferenceComponents/mm-resnet", "/aws/sagemaker/InferenceComponents/mm-yolov5"]
    monitoring.create(
        clients, "mm", COMPONENTS, MetricsConfig(models=("resnet", "yolov5")), REGION, ["mm-resnet", "mm-yolov5"]
    )

    assert deploy.main(["--name", "mm", "--delete", "--poll-seconds", "0"], clients=clients, sleep=lambda s: None) == 0
    operations = [name for name, _ in calls]
    assert operations.index("DeleteInferenceComponent") < operations.index("DeleteEndpoint")
    assert operations.index("DeleteEndpoint") < operations.index("DeleteModel")
    # The components' metric filters and the alarms are gone; their log groups (the logs) stay.
    for group in groups:
        assert clients.logs.describe_metric_filters(logGroupName=group)["metricFilters"] == []
    assert clients.cloudwatch.describe_alarms(AlarmNamePrefix="mm/")["MetricAlarms"] == []
    kept = clients.logs.describe_log_groups(logGroupNamePrefix="/aws/sagemaker/InferenceComponents/mm-")["logGroups"]
    assert [g["logGroupName"] for g in kept] == groups
