#!/usr/bin/env python3
"""Deploy the image as a SageMaker real-time endpoint with auto scaling, or delete it all again.

Creates a model (image, ModelDataUrl, execution role, environment), an endpoint configuration
(one variant, GPU instance type by default), the endpoint; waits for InService, showing its status;
then registers the variant with Application Auto Scaling and puts a target-tracking policy on
SageMakerVariantInvocationsPerInstance (invocations per instance per minute).

    scripts/deploy.py --name multi-model --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG \\
        --model-data-url s3://BUCKET/multi-model/model.tar.gz --role-arn arn:aws:iam::ACCOUNT:role/ROLE
    scripts/deploy.py --name multi-model --delete

--delete removes the scaling policy and target, the endpoint, its endpoint configuration and its
model (and any configuration or model this script left under that name after a failed deploy).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

DEFAULT_INSTANCE_TYPE = "ml.g4dn.xlarge"
VARIANT = "AllTraffic"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
METRIC = "SageMakerVariantInvocationsPerInstance"
ROLE_ENV = "SAGEMAKER_ROLE_ARN"


@dataclass
class Clients:
    sagemaker: Any
    autoscaling: Any


def make_clients(region: str | None = None, endpoint_url: str | None = None) -> Clients:
    import boto3

    session = boto3.session.Session(region_name=region)
    return Clients(
        sagemaker=session.client("sagemaker", endpoint_url=endpoint_url),
        autoscaling=session.client("application-autoscaling", endpoint_url=endpoint_url),
    )


@dataclass(frozen=True)
class DeployConfig:
    name: str
    image_uri: str
    role_arn: str
    model_data_url: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_count: int = 1
    health_check_timeout_s: int = 600
    download_timeout_s: int = 600
    scaling: bool = True
    min_capacity: int = 1
    max_capacity: int = 2
    invocations_per_instance: float = 100.0
    scale_in_cooldown_s: int = 300
    scale_out_cooldown_s: int = 60


def resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{VARIANT}"


def policy_name(endpoint: str) -> str:
    return f"{endpoint}-invocations-per-instance"


def _missing(error: Exception) -> bool:
    """SageMaker answers a missing resource with a ValidationException saying 'Could not find'."""
    response = getattr(error, "response", {}) or {}
    return "Could not find" in response.get("Error", {}).get("Message", "")


class DeployError(RuntimeError):
    pass


def wait_in_service(sm, endpoint: str, poll_s: float, timeout_s: float,
                    sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> None:
    start = time.monotonic()
    while True:
        described = sm.describe_endpoint(EndpointName=endpoint)
        status = described["EndpointStatus"]
        elapsed = time.monotonic() - start
        log(f"  endpoint {endpoint}: {status} ({int(elapsed // 60)}m {int(elapsed % 60):02d}s)")
        if status == "InService":
            return
        if status in ("Failed", "OutOfService", "Deleting", "RollingBack"):
            raise DeployError(f"endpoint {endpoint} is {status}: {described.get('FailureReason', 'no reason given')}"
                              " (the container's logs are in CloudWatch, /aws/sagemaker/Endpoints/" + endpoint + ")")
        if elapsed > timeout_s:
            raise DeployError(f"endpoint {endpoint} not InService after {timeout_s:.0f} s (still {status})")
        sleep(poll_s)


def configure_scaling(aas, config: DeployConfig, log: Callable[[str], None] = print) -> None:
    target = resource_id(config.name)
    aas.register_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=target, ScalableDimension=SCALABLE_DIMENSION,
        MinCapacity=config.min_capacity, MaxCapacity=config.max_capacity,
    )
    aas.put_scaling_policy(
        PolicyName=policy_name(config.name), ServiceNamespace="sagemaker", ResourceId=target,
        ScalableDimension=SCALABLE_DIMENSION, PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": float(config.invocations_per_instance),
            "PredefinedMetricSpecification": {"PredefinedMetricType": METRIC},
            "ScaleInCooldown": config.scale_in_cooldown_s,
            "ScaleOutCooldown": config.scale_out_cooldown_s,
        },
    )
    log(f"auto scaling: {config.min_capacity}..{config.max_capacity} instances, target "
        f"{config.invocations_per_instance:g} invocations per instance per minute")


def deploy(clients: Clients, config: DeployConfig, *, wait: bool = True, poll_s: float = 30,
           timeout_s: float = 3600, sleep: Callable[[float], None] = time.sleep,
           log: Callable[[str], None] = print) -> dict[str, str]:
    sm = clients.sagemaker
    try:
        sm.describe_endpoint(EndpointName=config.name)
    except sm.exceptions.ClientError as e:
        if not _missing(e):
            raise
    else:
        raise DeployError(f"endpoint {config.name} exists already: delete it first (--delete) or pick another --name")

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    model_name, config_name = f"{config.name}-model-{stamp}", f"{config.name}-config-{stamp}"
    container: dict[str, Any] = {"Image": config.image_uri, "Environment": dict(config.environment)}
    if config.model_data_url:
        container["ModelDataUrl"] = config.model_data_url
    log(f"[1/4] model {model_name} ({config.image_uri})")
    sm.create_model(ModelName=model_name, PrimaryContainer=container, ExecutionRoleArn=config.role_arn)
    log(f"[2/4] endpoint configuration {config_name} ({config.instance_count} x {config.instance_type})")
    sm.create_endpoint_config(EndpointConfigName=config_name, ProductionVariants=[{
        "VariantName": VARIANT,
        "ModelName": model_name,
        "InstanceType": config.instance_type,
        "InitialInstanceCount": config.instance_count,
        "ContainerStartupHealthCheckTimeoutInSeconds": config.health_check_timeout_s,
        "ModelDataDownloadTimeoutInSeconds": config.download_timeout_s,
    }])
    log(f"[3/4] endpoint {config.name}")
    sm.create_endpoint(EndpointName=config.name, EndpointConfigName=config_name)
    names = {"endpoint": config.name, "endpoint_config": config_name, "model": model_name}
    if not wait:
        log("not waiting for InService (--no-wait); auto scaling needs it: run again without --no-wait later")
        return names
    wait_in_service(sm, config.name, poll_s, timeout_s, sleep=sleep, log=log)
    if config.scaling:
        log("[4/4] auto scaling")
        configure_scaling(clients.autoscaling, config, log=log)
    else:
        log("[4/4] auto scaling: off (--no-scaling)")
    return names


def delete(clients: Clients, name: str, *, poll_s: float = 10, timeout_s: float = 900,
           sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> None:
    """Remove, in order: scaling policy and target, endpoint, endpoint configuration, models."""
    sm, aas = clients.sagemaker, clients.autoscaling
    target = resource_id(name)
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=target)["ScalingPolicies"]
    for policy in policies:
        aas.delete_scaling_policy(PolicyName=policy["PolicyName"], ServiceNamespace="sagemaker",
                                  ResourceId=target, ScalableDimension=policy["ScalableDimension"])
        log(f"deleted scaling policy {policy['PolicyName']}")
    targets = aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[target])["ScalableTargets"]
    for found in targets:
        aas.deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=target,
                                       ScalableDimension=found["ScalableDimension"])
        log(f"deregistered scalable target {target}")

    config_names: list[str] = []
    try:
        config_names.append(sm.describe_endpoint(EndpointName=name)["EndpointConfigName"])
    except sm.exceptions.ClientError as e:
        if not _missing(e):
            raise
        log(f"endpoint {name}: not found")
    else:
        sm.delete_endpoint(EndpointName=name)
        log(f"deleting endpoint {name}")
        _wait_gone(sm, name, poll_s, timeout_s, sleep, log)

    prefix_configs = [c["EndpointConfigName"] for c in _all(sm.list_endpoint_configs, "EndpointConfigs", NameContains=name)
                      if c["EndpointConfigName"].startswith(f"{name}-config-")]
    model_names: list[str] = []
    for config_name in dict.fromkeys(config_names + prefix_configs):
        try:
            variants = sm.describe_endpoint_config(EndpointConfigName=config_name)["ProductionVariants"]
        except sm.exceptions.ClientError as e:
            if not _missing(e):
                raise
            continue
        model_names += [v["ModelName"] for v in variants]
        sm.delete_endpoint_config(EndpointConfigName=config_name)
        log(f"deleted endpoint configuration {config_name}")
    model_names += [m["ModelName"] for m in _all(sm.list_models, "Models", NameContains=name)
                    if m["ModelName"].startswith(f"{name}-model-")]
    for model_name in dict.fromkeys(model_names):
        try:
            sm.delete_model(ModelName=model_name)
        except sm.exceptions.ClientError as e:
            if not _missing(e):
                raise
            continue
        log(f"deleted model {model_name}")


def _all(call, key: str, **kwargs) -> list[dict]:
    items, token = [], None
    while True:
        page = call(**kwargs, **({"NextToken": token} if token else {}))
        items += page.get(key, [])
        token = page.get("NextToken")
        if not token:
            return items


def _wait_gone(sm, name: str, poll_s: float, timeout_s: float, sleep, log) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            status = sm.describe_endpoint(EndpointName=name)["EndpointStatus"]
        except sm.exceptions.ClientError as e:
            if _missing(e):
                log(f"deleted endpoint {name}")
                return
            raise
        log(f"  endpoint {name}: {status}")
        sleep(poll_s)
    raise DeployError(f"endpoint {name} still exists after {timeout_s:.0f} s")


def _environment(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def _seconds(low: int, high: int):
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value
    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="multi-model", help="endpoint name; model and configuration names derive from it")
    parser.add_argument("--delete", action="store_true", help="delete the endpoint and everything this script made for it")
    parser.add_argument("--image-uri", help="the ECR image (scripts/build_and_push.py prints it)")
    parser.add_argument("--model-data-url", help="s3:// URL of model.tar.gz (scripts/package_models.py); "
                                                 "without it the image's own models/ are served")
    parser.add_argument("--role-arn", default=os.environ.get(ROLE_ENV),
                        help=f"SageMaker execution role (default: ${ROLE_ENV})")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="container environment, e.g. MODEL_SERVER_WORKERS=4 (repeatable)")
    parser.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE, help=f"default: {DEFAULT_INSTANCE_TYPE}")
    parser.add_argument("--instance-count", type=int, default=1, help="initial instances (default: 1)")
    parser.add_argument("--health-check-timeout", type=_seconds(60, 3600), default=600,
                        help="ContainerStartupHealthCheckTimeoutInSeconds, 60..3600 (default: 600)")
    parser.add_argument("--download-timeout", type=_seconds(60, 3600), default=600,
                        help="ModelDataDownloadTimeoutInSeconds, 60..3600 (default: 600)")
    parser.add_argument("--no-scaling", action="store_true", help="no auto scaling")
    parser.add_argument("--min-capacity", type=int, default=1, help="auto scaling minimum instances (default: 1)")
    parser.add_argument("--max-capacity", type=int, default=2, help="auto scaling maximum instances (default: 2)")
    parser.add_argument("--invocations-per-instance", type=float, default=100.0,
                        help="target invocations per instance per minute (default: 100)")
    parser.add_argument("--scale-in-cooldown", type=int, default=300, help="seconds (default: 300)")
    parser.add_argument("--scale-out-cooldown", type=int, default=60, help="seconds (default: 60)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for InService (and skip auto scaling)")
    parser.add_argument("--poll-seconds", type=float, default=30, help="status poll interval (default: 30)")
    parser.add_argument("--timeout-minutes", type=float, default=60, help="give up waiting after this long (default: 60)")
    parser.add_argument("--region", help="AWS region (default: the AWS configuration)")
    parser.add_argument("--endpoint-url", help="AWS endpoint for SageMaker and Application Auto Scaling (tests)")
    args = parser.parse_args(argv)
    if not args.delete:
        missing = [flag for flag, value in (("--image-uri", args.image_uri), ("--role-arn", args.role_arn)) if not value]
        if missing:
            parser.error(f"deploying needs {' and '.join(missing)}")
        if not 1 <= args.min_capacity <= args.max_capacity:
            parser.error("need 1 <= --min-capacity <= --max-capacity")
        try:
            args.environment = _environment(args.env)
        except argparse.ArgumentTypeError as e:
            parser.error(str(e))
    return args


def main(argv: Sequence[str] | None = None, clients: Clients | None = None,
         sleep: Callable[[float], None] = time.sleep) -> int:
    from botocore.exceptions import ClientError

    args = parse_args(argv)
    clients = clients or make_clients(args.region, args.endpoint_url)
    try:
        if args.delete:
            delete(clients, args.name, poll_s=min(args.poll_seconds, 10), sleep=sleep)
            return 0
        config = DeployConfig(
            name=args.name, image_uri=args.image_uri, role_arn=args.role_arn, model_data_url=args.model_data_url,
            environment=args.environment, instance_type=args.instance_type, instance_count=args.instance_count,
            health_check_timeout_s=args.health_check_timeout, download_timeout_s=args.download_timeout,
            scaling=not args.no_scaling, min_capacity=args.min_capacity, max_capacity=args.max_capacity,
            invocations_per_instance=args.invocations_per_instance, scale_in_cooldown_s=args.scale_in_cooldown,
            scale_out_cooldown_s=args.scale_out_cooldown,
        )
        names = deploy(clients, config, wait=not args.no_wait, poll_s=args.poll_seconds,
                       timeout_s=args.timeout_minutes * 60, sleep=sleep)
    except DeployError as e:
        print(f"deploy: {e}", file=sys.stderr)
        return 1
    except ClientError as e:  # what AWS said, in one line
        print(f"deploy: {e}", file=sys.stderr)
        return 1
    state = "created (not waited for)" if args.no_wait else "InService"
    print(f"endpoint {names['endpoint']} is {state}: scripts/invoke.py --endpoint-name {names['endpoint']} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
