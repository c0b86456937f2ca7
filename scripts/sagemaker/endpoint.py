"""A SageMaker endpoint for the image, real-time (one model, or a multi-model container) or
asynchronous, with data capture when asked, and its deletion: model, endpoint configuration,
endpoint, then auto scaling (scripts/sagemaker/scaling.py). An endpoint of inference components
builds on these steps in scripts/sagemaker/components.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.settings import ASYNC_MAX_BODY_BYTES, ASYNC_MAX_TIMEOUT_S, BODY_LIMIT, SERVER_TIMEOUT
from scripts.sagemaker import monitoring
from scripts.sagemaker.model_metrics import MULTI_MODEL, REAL_TIME, MetricsConfig
from scripts.sagemaker.resources import (
    DEFAULT_INSTANCE_TYPE,
    Clients,
    ContainerSpec,
    DeployError,
    Log,
    Sleep,
    Watch,
    delete_models,
    folder,
    is_missing,
    list_all,
    models_named,
    timestamp,
    wait_for,
    wait_gone,
)
from scripts.sagemaker.scaling import VARIANT, ScalingConfig, configure_scaling, remove_scaling

# An asynchronous endpoint's container takes what SageMaker lets such an endpoint take (a 1 GB
# request, an hour's processing), so that the request's own InvocationTimeoutSeconds and SageMaker's
# limits decide, never the container. --env MAX_BODY_BYTES=... / MODEL_SERVER_TIMEOUT=... lower them.
ASYNC_ENVIRONMENT = {BODY_LIMIT: str(ASYNC_MAX_BODY_BYTES), SERVER_TIMEOUT: str(int(ASYNC_MAX_TIMEOUT_S))}
DEFAULT_ASYNC_CONCURRENCY = 4  # requests SageMaker hands one instance at a time; the rest wait queued
# The JSON types the container takes and answers: captured as JSON text instead of base64.
JSON_CONTENT_TYPES = ("application/json", "application/jsonlines")
ENDPOINT_FAILED = ("Failed", "OutOfService", "Deleting", "RollingBack")


@dataclass(frozen=True)
class AsyncConfig:
    output_path: str  # s3://bucket/prefix/: answers; failures go to <output_path>failures/
    max_concurrent_invocations: int = DEFAULT_ASYNC_CONCURRENCY

    @property
    def failure_path(self) -> str:
        return folder(self.output_path) + "failures/"

    def parameters(self) -> dict[str, Any]:
        return {
            "OutputConfig": {"S3OutputPath": folder(self.output_path), "S3FailurePath": self.failure_path},
            "ClientConfig": {"MaxConcurrentInvocationsPerInstance": self.max_concurrent_invocations},
        }


@dataclass(frozen=True)
class CaptureConfig:
    destination: str  # s3://bucket/prefix
    sampling_percent: int = 100

    def parameters(self) -> dict[str, Any]:
        return {
            "EnableCapture": True,
            "InitialSamplingPercentage": self.sampling_percent,
            "DestinationS3Uri": self.destination,
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
            "CaptureContentTypeHeader": {"JsonContentTypes": list(JSON_CONTENT_TYPES)},
        }


@dataclass(frozen=True)
class DeployConfig:
    name: str
    container: ContainerSpec
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_count: int = 1
    health_check_timeout_s: int = 600
    download_timeout_s: int = 600
    scaling: ScalingConfig | None = field(default_factory=ScalingConfig)  # None: no auto scaling
    asynchronous: AsyncConfig | None = None
    capture: CaptureConfig | None = None
    metrics: MetricsConfig | None = None  # per-model metrics, dashboard and alarms; None: none


def endpoint_config_parameters(config: DeployConfig, config_name: str, model_name: str) -> dict[str, Any]:
    """CreateEndpointConfig's parameters: one variant, and the asynchronous and capture parts when asked."""
    parameters: dict[str, Any] = {
        "EndpointConfigName": config_name,
        "ProductionVariants": [
            {
                "VariantName": VARIANT,
                "ModelName": model_name,
                "InstanceType": config.instance_type,
                "InitialInstanceCount": config.instance_count,
                "ContainerStartupHealthCheckTimeoutInSeconds": config.health_check_timeout_s,
                "ModelDataDownloadTimeoutInSeconds": config.download_timeout_s,
            }
        ],
    }
    if config.asynchronous:
        parameters["AsyncInferenceConfig"] = config.asynchronous.parameters()
    if config.capture:
        parameters["DataCaptureConfig"] = config.capture.parameters()
    return parameters


def endpoint_watch(sm, endpoint: str) -> Watch:
    return Watch(
        f"endpoint {endpoint}",
        lambda: sm.describe_endpoint(EndpointName=endpoint),
        "EndpointStatus",
        ("InService",),
        ENDPOINT_FAILED,
        f"/aws/sagemaker/Endpoints/{endpoint}",
    )


def wait_in_service(
    sm, endpoint: str, poll_s: float, timeout_s: float, sleep: Sleep = time.sleep, log: Log = print
) -> None:
    wait_for(endpoint_watch(sm, endpoint), poll_s, timeout_s, sleep=sleep, log=log)


def refuse_existing(sm, endpoint: str) -> None:
    """A DeployError when the endpoint exists: a name in use is never overwritten."""
    try:
        sm.describe_endpoint(EndpointName=endpoint)
    except sm.exceptions.ClientError as e:
        if not is_missing(e):
            raise
    else:
        raise DeployError(f"endpoint {endpoint} exists already: delete it first (--delete) or pick another --name")


def deploy(
    clients: Clients,
    config: DeployConfig,
    *,
    wait: bool = True,
    poll_s: float = 30,
    timeout_s: float = 3600,
    sleep: Sleep = time.sleep,
    log: Log = print,
) -> dict[str, str]:
    sm = clients.sagemaker
    refuse_existing(sm, config.name)
    stamp = timestamp()
    model_name, config_name = f"{config.name}-model-{stamp}", f"{config.name}-config-{stamp}"
    log(f"[1/4] model {model_name} ({config.container.image_uri})")
    config.container.create_model(sm, model_name)
    kind = "asynchronous, answers in " + config.asynchronous.output_path if config.asynchronous else "real-time"
    if config.container.multi_model:
        kind += f", multi-model: the archives under {config.container.model_data_url}, loaded on demand"
    log(f"[2/4] endpoint configuration {config_name} ({config.instance_count} x {config.instance_type}, {kind})")
    sm.create_endpoint_config(**endpoint_config_parameters(config, config_name, model_name))
    log(f"[3/4] endpoint {config.name}")
    # The log group first, so that the filters count the first lines.
    form = MULTI_MODEL if config.container.multi_model else REAL_TIME
    monitoring.create(clients, config.name, form, config.metrics, clients.region, log=log)
    sm.create_endpoint(EndpointName=config.name, EndpointConfigName=config_name)
    names = {"endpoint": config.name, "endpoint_config": config_name, "model": model_name}
    if not wait:
        log("not waiting for InService (--no-wait); auto scaling needs it: run again without --no-wait later")
        return names
    wait_in_service(sm, config.name, poll_s, timeout_s, sleep=sleep, log=log)
    if config.scaling:
        log("[4/4] auto scaling")
        configure_scaling(clients, config.name, config.scaling, asynchronous=config.asynchronous is not None, log=log)
    else:
        log("[4/4] auto scaling: off (--no-scaling)")
    return names


def delete(
    clients: Clients,
    name: str,
    *,
    poll_s: float = 10,
    timeout_s: float = 900,
    sleep: Sleep = time.sleep,
    log: Log = print,
    models: Sequence[str] = (),
) -> None:
    """Remove, in order: auto scaling (policies, target, alarm), the per-model metric filters,
    dashboard and alarms, endpoint, endpoint configurations, models (theirs, those named
    ``<name>-model-*``, and ``models``)."""
    sm = clients.sagemaker
    remove_scaling(clients, name, log=log)
    monitoring.remove(clients, name, log=log)
    config_names: list[str] = []
    try:
        config_names.append(sm.describe_endpoint(EndpointName=name)["EndpointConfigName"])
    except sm.exceptions.ClientError as e:
        if not is_missing(e):
            raise
        log(f"endpoint {name}: not found")
    else:
        sm.delete_endpoint(EndpointName=name)
        log(f"deleting endpoint {name}")
        wait_gone(
            f"endpoint {name}",
            lambda: sm.describe_endpoint(EndpointName=name),
            "EndpointStatus",
            poll_s,
            timeout_s,
            sleep=sleep,
            log=log,
        )

    prefix_configs = [
        c["EndpointConfigName"]
        for c in list_all(sm, "list_endpoint_configs", "EndpointConfigs", NameContains=name)
        if c["EndpointConfigName"].startswith(f"{name}-config-")
    ]
    model_names: list[str] = []
    for config_name in dict.fromkeys(config_names + prefix_configs):
        try:
            variants = sm.describe_endpoint_config(EndpointConfigName=config_name)["ProductionVariants"]
        except sm.exceptions.ClientError as e:
            if not is_missing(e):
                raise
            continue
        model_names += [v["ModelName"] for v in variants if "ModelName" in v]  # none with inference components
        sm.delete_endpoint_config(EndpointConfigName=config_name)
        log(f"deleted endpoint configuration {config_name}")
    delete_models(sm, [*model_names, *models, *models_named(sm, f"{name}-model-")], log)
