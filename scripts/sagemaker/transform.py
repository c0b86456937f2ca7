"""A SageMaker Batch Transform job with the image: JSON Lines in, JSON Lines out, one answer line per
input line, in the container's own execution parameters (``Settings.execution_parameters()``, what
its GET /execution-parameters answers for the same environment) unless overridden.

The concurrency the container answers depends on the environment only when MAX_CONCURRENT_TRANSFORMS
is set; otherwise it is two requests per CPU of the instance, which only the instance knows. The job
then leaves MaxConcurrentTransforms unset, and SageMaker asks the container's GET /execution-parameters
on the instance itself (what CreateTransformJob does when the field is absent).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from app.core.settings import CONCURRENT_TRANSFORMS, MIB, TRANSFORM_MAX_PAYLOAD_MB, Settings
from scripts.sagemaker import resources as common
from scripts.sagemaker.resources import Clients, ContainerSpec, DeployError, Log, Sleep

JSONLINES = "application/jsonlines"
# GET /execution-parameters spells the strategy as SageMaker's container contract does; the API as its enum.
BATCH_STRATEGIES = {"MULTI_RECORD": "MultiRecord", "SINGLE_RECORD": "SingleRecord"}
JOB_FAILED = ("Failed", "Stopped", "Stopping")
JOB_ENDED = ("Completed", "Failed", "Stopped")


@dataclass(frozen=True)
class TransformConfig:
    name: str
    container: ContainerSpec
    input_uri: str  # s3:// prefix of the .jsonl objects
    output_uri: str
    instance_type: str = common.DEFAULT_INSTANCE_TYPE
    instance_count: int = 1
    max_payload_mb: int | None = None  # None: the container's own
    max_concurrent_transforms: int | None = None
    delete_model: bool = False  # delete the model once the job has ended


def execution_parameters(config: TransformConfig) -> dict[str, Any]:
    """MaxPayloadInMB, BatchStrategy and (when the environment or a flag fixes it) MaxConcurrentTransforms
    for the job: the container's answer for its environment, each overridden by the flag given. A
    payload over what the container takes, or over 100 MB in flight, is refused."""
    environment = config.container.environment
    answered = Settings.from_env(environment).execution_parameters()
    payload = config.max_payload_mb or answered["MaxPayloadInMB"]
    if payload > answered["MaxPayloadInMB"]:
        raise DeployError(
            f"--max-payload-mb {payload} is over the {answered['MaxPayloadInMB']} MB the container "
            f"takes: raise its limit too (--env MAX_BODY_BYTES={payload * MIB})"
        )
    parameters = {"MaxPayloadInMB": payload, "BatchStrategy": BATCH_STRATEGIES[answered["BatchStrategy"]]}
    concurrency = config.max_concurrent_transforms or (
        answered["MaxConcurrentTransforms"] if environment.get(CONCURRENT_TRANSFORMS, "").strip() else None
    )
    if concurrency is None:  # the container answers it on the instance (two per CPU)
        return parameters
    if payload * concurrency > TRANSFORM_MAX_PAYLOAD_MB:
        raise DeployError(
            f"{concurrency} concurrent transforms x {payload} MB is over SageMaker's "
            f"{TRANSFORM_MAX_PAYLOAD_MB} MB: lower --max-concurrent-transforms or --max-payload-mb"
        )
    return {**parameters, "MaxConcurrentTransforms": concurrency}


def transform_job_parameters(config: TransformConfig, job_name: str, model_name: str) -> dict[str, Any]:
    return {
        "TransformJobName": job_name,
        "ModelName": model_name,
        **execution_parameters(config),
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": config.input_uri}},
            "ContentType": JSONLINES,
            "SplitType": "Line",
        },
        "TransformOutput": {
            "S3OutputPath": common.folder(config.output_uri),
            "AssembleWith": "Line",
            "Accept": JSONLINES,
        },
        "TransformResources": {"InstanceType": config.instance_type, "InstanceCount": config.instance_count},
    }


def job_watch(sm, job: str) -> common.Watch:
    return common.Watch(
        f"transform job {job}",
        lambda: sm.describe_transform_job(TransformJobName=job),
        "TransformJobStatus",
        ("Completed",),
        JOB_FAILED,
        f"/aws/sagemaker/TransformJobs, streams {job}/...",
    )


def model_prefix(name: str) -> str:
    return f"{name}-transform-"


def transform(
    clients: Clients,
    config: TransformConfig,
    *,
    wait: bool = True,
    poll_s: float = 30,
    timeout_s: float = 86400,
    sleep: Sleep = time.sleep,
    log: Log = print,
) -> dict[str, str]:
    """Create the model and the job; with ``wait``, follow the job to its end (a failure is a DeployError
    naming SageMaker's FailureReason) and delete the model afterwards when the config says so."""
    sm = clients.sagemaker
    job = model = f"{model_prefix(config.name)}{common.timestamp()}"
    parameters = transform_job_parameters(config, job, model)
    log(f"[1/3] model {model} ({config.container.image_uri})")
    config.container.create_model(sm, model)
    fixed = parameters.get("MaxConcurrentTransforms")
    concurrency = f"{fixed} requests at a time" if fixed else "the container's concurrency (2 requests per CPU)"
    log(
        f"[2/3] transform job {job}: {config.instance_count} x {config.instance_type}, "
        f"{parameters['BatchStrategy']}, up to {parameters['MaxPayloadInMB']} MB per request, "
        f"{concurrency} per instance"
    )
    sm.create_transform_job(**parameters)
    names = {"job": job, "model": model, "output": parameters["TransformOutput"]["S3OutputPath"]}
    if not wait:
        log(f"not waiting (--no-wait): aws sagemaker describe-transform-job --transform-job-name {job}")
        return names
    log("[3/3] waiting for the job")
    try:
        common.wait_for(job_watch(sm, job), poll_s, timeout_s, sleep=sleep, log=log)
    finally:
        if config.delete_model:
            _delete_model_if_ended(sm, job, model, log)
    return names


def _delete_model_if_ended(sm, job: str, model: str, log: Log) -> None:
    """A job still running (the wait gave up) keeps its model."""
    status = sm.describe_transform_job(TransformJobName=job)["TransformJobStatus"]
    if status in JOB_ENDED:
        common.delete_models(sm, [model], log)
    else:
        log(
            f"model {model} kept: the job is {status}; `python -m scripts.sagemaker deploy transform --delete` "
            "removes it once it has ended"
        )


def delete(clients: Clients, name: str, log: Log = print) -> None:
    """Delete the models that transform runs under ``name`` left (SageMaker keeps jobs as records)."""
    found = common.models_named(clients.sagemaker, model_prefix(name))
    if not found:
        log(f"no model named {model_prefix(name)}*")
    common.delete_models(clients.sagemaker, found, log)
