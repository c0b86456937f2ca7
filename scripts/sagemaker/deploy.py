"""Deploy the image as a SageMaker endpoint (real-time or asynchronous) with auto scaling, run it as a
Batch Transform job, or delete what either made: ``python -m scripts.sagemaker deploy`` (its command
line, with every way to call it, is ``scripts.sagemaker.deploy_args``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from scripts.sagemaker import components as sagemaker_components
from scripts.sagemaker import metrics_cli
from scripts.sagemaker import transform as sagemaker_transform
from scripts.sagemaker.deploy_args import MULTI_MODEL_INSTANCE_TYPE, ROLE_ENV, TRANSFORM, parse_args
from scripts.sagemaker.endpoint import (
    AsyncConfig,
    CaptureConfig,
    DeployConfig,
    delete,
    deploy,
    wait_in_service,
)
from scripts.sagemaker.model_metrics import COMPONENTS, MULTI_MODEL, REAL_TIME
from scripts.sagemaker.resources import (
    Clients,
    DeployError,
    container_spec,
    make_clients,
)
from scripts.sagemaker.scaling import ScalingConfig, policy_name, resource_id

__all__ = [
    "MULTI_MODEL_INSTANCE_TYPE",
    "ROLE_ENV",
    "Clients",
    "DeployConfig",
    "DeployError",
    "delete",
    "deploy",
    "main",
    "policy_name",
    "resource_id",
    "wait_in_service",
]


def _waiting(args: argparse.Namespace, sleep: Callable[[float], None]) -> dict[str, Any]:
    """How long and how often the command waits on SageMaker, as --poll-seconds and --timeout-minutes say."""
    return {"poll_s": args.poll_seconds, "timeout_s": args.timeout_minutes * 60, "sleep": sleep}


def endpoint_config(args: argparse.Namespace) -> DeployConfig:
    scaling = (
        None
        if args.no_scaling
        else ScalingConfig(
            min_capacity=args.min_capacity,
            max_capacity=args.max_capacity,
            invocations_per_instance=args.invocations_per_instance,
            backlog_per_instance=args.backlog_per_instance,
            scale_in_cooldown_s=args.scale_in_cooldown,
            scale_out_cooldown_s=args.scale_out_cooldown,
            invocations_per_copy=args.invocations_per_copy,
        )
    )
    container = container_spec(args)
    if args.multi_model:
        container = replace(
            container, model_data_url=args.multi_model, multi_model=True, model_cache=not args.no_model_cache
        )
    return DeployConfig(
        name=args.name,
        container=container,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        health_check_timeout_s=args.health_check_timeout,
        download_timeout_s=args.download_timeout,
        scaling=scaling,
        asynchronous=AsyncConfig(args.async_output, args.max_concurrent_invocations) if args.async_output else None,
        capture=CaptureConfig(args.capture, args.capture_percent) if args.capture else None,
        metrics=metrics_cli.metrics_config(
            args,
            endpoint_form(args),
            [component.model for component in args.component] if args.inference_components else (),
        ),
    )


def endpoint_form(args: argparse.Namespace) -> str:
    if args.inference_components:
        return COMPONENTS
    return MULTI_MODEL if args.multi_model else REAL_TIME


def run_endpoint(clients: Clients, args: argparse.Namespace, sleep: Callable[[float], None]) -> str | None:
    if args.delete:
        sagemaker_components.delete(clients, args.name, poll_s=min(args.poll_seconds, 10), sleep=sleep)
        return None
    config = endpoint_config(args)
    if args.inference_components:
        return _run_components(clients, args, config, sleep)
    names = deploy(clients, config, wait=not args.no_wait, **_waiting(args, sleep))
    state = "created (not waited for)" if args.no_wait else "InService"
    if config.asynchronous:
        return (
            f"endpoint {names['endpoint']} is {state}, asynchronous (answers in {config.asynchronous.output_path}, "
            f"failures in {config.asynchronous.failure_path}): python -m scripts.caller invoke --endpoint-name "
            f"{names['endpoint']} --async s3://BUCKET/inputs/ MODEL=FILE"
        )
    if config.container.multi_model:
        return (
            f"endpoint {names['endpoint']} is {state}, multi-model (archives under "
            f"{config.container.model_data_url}): python -m scripts.caller invoke --endpoint-name "
            f"{names['endpoint']} --target-model NAME.tar.gz NAME=FILE"
        )
    return (
        f"endpoint {names['endpoint']} is {state}: python -m scripts.caller invoke --endpoint-name "
        f"{names['endpoint']} ..."
    )


def _run_components(
    clients: Clients, args: argparse.Namespace, config: DeployConfig, sleep: Callable[[float], None]
) -> str:
    components = sagemaker_components.Components(args.inference_components, tuple(args.component))
    names = sagemaker_components.deploy(clients, config, components, **_waiting(args, sleep))
    first = args.component[0].model
    return (
        f"endpoint {names['endpoint']} is InService with inference components {', '.join(names['components'])}: "
        f"python -m scripts.caller invoke --endpoint-name {names['endpoint']} --inference-component "
        f"{sagemaker_components.component_name(names['endpoint'], first)} {first}=FILE"
    )


def run_transform(clients: Clients, args: argparse.Namespace, sleep: Callable[[float], None]) -> str | None:
    if args.delete:
        sagemaker_transform.delete(clients, args.name)
        return None
    config = sagemaker_transform.TransformConfig(
        name=args.name,
        container=container_spec(args),
        input_uri=args.input,
        output_uri=args.output,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        max_payload_mb=args.max_payload_mb,
        max_concurrent_transforms=args.max_concurrent_transforms,
        delete_model=args.delete_model,
    )
    names = sagemaker_transform.transform(clients, config, wait=not args.no_wait, **_waiting(args, sleep))
    state = "started" if args.no_wait else "Completed"
    return (
        f"transform job {names['job']} {state}: answers in {names['output']} "
        f"(<input object name>.out, one line per input line)"
    )


def main(
    argv: Sequence[str] | None = None, clients: Clients | None = None, sleep: Callable[[float], None] = time.sleep
) -> int:
    from botocore.exceptions import ClientError

    args = parse_args(argv)
    clients = clients or make_clients(args.region, args.endpoint_url)
    try:
        run = run_transform if args.command == TRANSFORM else run_endpoint
        done = run(clients, args, sleep)
    except (DeployError, ClientError) as e:  # what went wrong, or what AWS said, in one line
        print(f"deploy: {e}", file=sys.stderr)
        return 1
    if done:
        print(done)
    return 0
