"""An endpoint of inference components, and its deletion.

Each served model is one inference component with its own SageMaker model (the image, that model's
archive ``<prefix><name>.tar.gz`` from python -m scripts.sagemaker package-models --per-model, and
SAGEMAKER_TRITON_DEFAULT_MODEL_NAME naming the model), its own copies, the compute each copy
reserves (CPU cores, accelerators, memory), and its own auto scaling of copies, on the instances the
endpoint shares. The endpoint configuration names no model: ExecutionRoleArn sits on it, and its one
variant has the instance type and count, managed instance scaling (instances follow what the
components' copies need) and least-outstanding-requests routing.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass, replace
from typing import Any

from app.core.settings import DEFAULT_MODEL_NAME
from scripts.sagemaker import monitoring
from scripts.sagemaker.endpoint import DeployConfig, refuse_existing, wait_in_service
from scripts.sagemaker.endpoint import delete as delete_endpoint
from scripts.sagemaker.model_metrics import COMPONENTS
from scripts.sagemaker.resources import (
    ARCHIVE_SUFFIX,
    Clients,
    Log,
    Sleep,
    Watch,
    archives_prefix,
    environment_pairs,
    is_accelerated,
    is_missing,
    list_all,
    timestamp,
    wait_for,
    wait_gone,
)
from scripts.sagemaker.scaling import VARIANT, component_target, configure_component_scaling, remove_target_scaling
from scripts.terminal import positive

DEFAULT_CPUS = 2.0
DEFAULT_MEMORY_MB = 4096
DEFAULT_INVOCATIONS_PER_COPY = 100.0
ROUTING = {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}  # to the copy with the fewest requests in flight
COMPONENT_FAILED = ("Failed", "Deleting")
COMPONENT_HELP = (
    "with --inference-components: one served model and what each of its copies reserves, e.g. "
    "resnet:copies=2,gpus=1,memory=4096 (repeatable). Keys: copies (started with and kept at least; "
    "default 1), max (the most auto scaling adds up to; default twice copies), cpus (CPU cores a copy; "
    f"default {DEFAULT_CPUS:g}), gpus (accelerators a copy; default 1 on a GPU instance type, none on a "
    f"CPU one), memory (MB a copy, at least; default {DEFAULT_MEMORY_MB})"
)


@dataclass(frozen=True)
class Component:
    """One served model as an inference component: its copies and what each copy reserves."""

    model: str  # the served model's name: its archive is <prefix><model>.tar.gz
    copies: int = 1
    max_copies: int | None = None  # None: twice copies
    cpus: float = DEFAULT_CPUS
    gpus: float | None = None  # None: 1 on an accelerated instance type, none on a CPU one
    memory_mb: int = DEFAULT_MEMORY_MB

    @property
    def most(self) -> int:
        return self.max_copies or 2 * self.copies

    def accelerators(self, instance_type: str) -> float | None:
        if self.gpus is not None:
            return self.gpus or None
        return 1.0 if is_accelerated(instance_type) else None

    def requirements(self, instance_type: str) -> dict[str, Any]:
        """ComputeResourceRequirements: what SageMaker reserves on an instance for each copy."""
        needs: dict[str, Any] = {"NumberOfCpuCoresRequired": float(self.cpus), "MinMemoryRequiredInMb": self.memory_mb}
        accelerators = self.accelerators(instance_type)
        if accelerators:
            needs["NumberOfAcceleratorDevicesRequired"] = float(accelerators)
        return needs


@dataclass(frozen=True)
class Components:
    prefix: str  # s3://bucket/prefix/ holding <model>.tar.gz
    items: tuple[Component, ...]

    def archive(self, component: Component) -> str:
        return f"{self.prefix}{component.model}{ARCHIVE_SUFFIX}"


def slug(model: str) -> str:
    """A model's name as SageMaker names allow it: letters, digits and single hyphens (bert_base -> bert-base)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", model).strip("-")


def component_name(endpoint: str, model: str) -> str:
    return f"{endpoint}-{slug(model)}"


def _positive(key: str, text: str, kind: type) -> Any:
    """A --component value as ``kind``, above 0 (gpus may be 0: a copy without accelerators)."""
    try:
        return positive(kind, zero=key == "gpus")(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{key}={error}") from None


def parse_component(text: str) -> Component:
    """An argparse type: NAME[:copies=N,max=M,cpus=C,gpus=G,memory=MB]."""
    model, _, options = text.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", model):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME[:copies=N,max=M,cpus=C,gpus=G,memory=MB]")
    keys = {
        "copies": ("copies", int),
        "max": ("max_copies", int),
        "cpus": ("cpus", float),
        "gpus": ("gpus", float),
        "memory": ("memory_mb", int),
    }
    values = {}
    for key, value in environment_pairs([o for o in options.split(",") if o]).items():
        if key not in keys:
            raise argparse.ArgumentTypeError(f"{text!r}: unknown key {key!r} (keys: {', '.join(keys)})")
        field, kind = keys[key]
        values[field] = _positive(key, value, kind)
    component = Component(model, **values)
    if component.most < component.copies:
        raise argparse.ArgumentTypeError(f"{text!r}: max={component.most} is below copies={component.copies}")
    return component


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inference-components",
        type=archives_prefix,
        metavar="s3://BUCKET/PREFIX/",
        help="an endpoint of inference components, one per --component, each serving "
        "<PREFIX><NAME>.tar.gz (python -m scripts.sagemaker package-models --per-model) with "
        "its own copies, compute and auto scaling on the shared instances (GPU instance types "
        "work); call one with python -m scripts.caller invoke --inference-component "
        "<endpoint>-<NAME>",
    )
    parser.add_argument(
        "--component",
        action="append",
        type=parse_component,
        default=[],
        metavar="NAME[:KEY=VALUE,...]",
        help=COMPONENT_HELP,
    )
    parser.add_argument(
        "--invocations-per-copy",
        type=float,
        default=DEFAULT_INVOCATIONS_PER_COPY,
        help="with --inference-components: each component's auto scaling target, invocations per "
        f"copy per minute (default: {DEFAULT_INVOCATIONS_PER_COPY:g})",
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What an endpoint of inference components cannot be combined with, and what its components need
    (``args.instance_type`` resolved)."""
    if not args.inference_components:
        if args.component:
            parser.error("--component needs --inference-components s3://BUCKET/PREFIX/")
        return
    given = {
        "--async": args.async_output,
        "--multi-model": args.multi_model,
        "--model-data-url": args.model_data_url,
        "--no-wait": args.no_wait,
    }
    clashes = [flag for flag, value in given.items() if value]
    if clashes:
        parser.error(
            f"--inference-components does not go with {', '.join(clashes)} (each component has its own "
            "model data; the components are added once the endpoint is InService)"
        )
    if not args.component:
        parser.error("--inference-components needs at least one --component NAME[:copies=N,...]")
    names = [slug(c.model) for c in args.component]
    if len(set(names)) < len(names):
        parser.error("--component: each model once")
    if not is_accelerated(args.instance_type) and any(c.gpus for c in args.component):
        parser.error(f"--component ...gpus=...: {args.instance_type} has no accelerators")


def endpoint_config_parameters(config: DeployConfig, config_name: str) -> dict[str, Any]:
    """CreateEndpointConfig's parameters: a variant with no model, the role on the configuration."""
    variant: dict[str, Any] = {
        "VariantName": VARIANT,
        "InstanceType": config.instance_type,
        "InitialInstanceCount": config.instance_count,
        "RoutingConfig": dict(ROUTING),
    }
    if config.scaling:
        variant["ManagedInstanceScaling"] = {
            "Status": "ENABLED",
            "MinInstanceCount": config.scaling.min_capacity,
            "MaxInstanceCount": config.scaling.max_capacity,
        }
    parameters: dict[str, Any] = {
        "EndpointConfigName": config_name,
        "ExecutionRoleArn": config.container.role_arn,
        "ProductionVariants": [variant],
    }
    if config.capture:
        parameters["DataCaptureConfig"] = config.capture.parameters()
    return parameters


def component_parameters(config: DeployConfig, component: Component, model_name: str) -> dict[str, Any]:
    """CreateInferenceComponent's parameters for one served model."""
    return {
        "InferenceComponentName": component_name(config.name, component.model),
        "EndpointName": config.name,
        "VariantName": VARIANT,
        "Specification": {
            "ModelName": model_name,
            "StartupParameters": {
                "ModelDataDownloadTimeoutInSeconds": config.download_timeout_s,
                "ContainerStartupHealthCheckTimeoutInSeconds": config.health_check_timeout_s,
            },
            "ComputeResourceRequirements": component.requirements(config.instance_type),
        },
        "RuntimeConfig": {"CopyCount": component.copies},
    }


def component_watch(sm, component: str) -> Watch:
    return Watch(
        f"inference component {component}",
        lambda: sm.describe_inference_component(InferenceComponentName=component),
        "InferenceComponentStatus",
        ("InService",),
        COMPONENT_FAILED,
        f"/aws/sagemaker/InferenceComponents/{component}",
    )


def _create_models(sm, config: DeployConfig, components: Components, stamp: str, log: Log) -> dict[str, str]:
    """One SageMaker model per component (its archive, the environment naming it): component -> model."""
    models = {}
    for component in components.items:
        model_name = f"{config.name}-model-{slug(component.model)}-{stamp}"
        container = replace(
            config.container,
            model_data_url=components.archive(component),
            environment={**config.container.environment, DEFAULT_MODEL_NAME: component.model},
        )
        log(f"  model {model_name} ({container.model_data_url})")
        container.create_model(sm, model_name)
        models[component.model] = model_name
    return models


def deploy(
    clients: Clients,
    config: DeployConfig,
    components: Components,
    *,
    poll_s: float = 30,
    timeout_s: float = 3600,
    sleep: Sleep = time.sleep,
    log: Log = print,
) -> dict[str, Any]:
    """Endpoint configuration and endpoint (waited for), then a model and an inference component per
    served model (waited for), then each component's auto scaling."""
    sm = clients.sagemaker
    refuse_existing(sm, config.name)
    stamp = timestamp()
    config_name = f"{config.name}-config-{stamp}"
    log(
        f"[1/5] endpoint configuration {config_name} ({config.instance_count} x {config.instance_type}, "
        f"inference components)"
    )
    sm.create_endpoint_config(**endpoint_config_parameters(config, config_name))
    log(f"[2/5] endpoint {config.name}")
    sm.create_endpoint(EndpointName=config.name, EndpointConfigName=config_name)
    wait_in_service(sm, config.name, poll_s, timeout_s, sleep=sleep, log=log)
    log(f"[3/5] {len(components.items)} models ({config.container.image_uri})")
    models = _create_models(sm, config, components, stamp, log)
    log("[4/5] inference components")
    # Their log groups first, so that the filters count the first lines.
    planned = [component_name(config.name, c.model) for c in components.items]
    monitoring.create(clients, config.name, COMPONENTS, config.metrics, clients.region, planned, log=log)
    names = []
    for component in components.items:
        parameters = component_parameters(config, component, models[component.model])
        needs = ", ".join(f"{k} {v:g}" for k, v in parameters["Specification"]["ComputeResourceRequirements"].items())
        log(f"  {parameters['InferenceComponentName']}: {component.copies} copies, each {needs}")
        sm.create_inference_component(**parameters)
        names.append(parameters["InferenceComponentName"])
    for name in names:
        wait_for(component_watch(sm, name), poll_s, timeout_s, sleep=sleep, log=log)
    _scale(clients, config, components, log)
    return {"endpoint": config.name, "endpoint_config": config_name, "components": names}


def _scale(clients: Clients, config: DeployConfig, components: Components, log: Log) -> None:
    if not config.scaling:
        log("[5/5] auto scaling: off (--no-scaling)")
        return
    log(
        f"[5/5] auto scaling: instances {config.scaling.min_capacity}..{config.scaling.max_capacity} "
        "(managed by SageMaker), copies per component"
    )
    for component in components.items:
        scaling = replace(config.scaling, min_capacity=component.copies, max_capacity=component.most)
        configure_component_scaling(clients, component_name(config.name, component.model), scaling, log=log)


def components_of(sm, endpoint: str) -> list[str]:
    """The inference components on the endpoint: none when it is gone, or when its configuration's
    variants each name a model (such an endpoint holds no components)."""
    try:
        config = sm.describe_endpoint(EndpointName=endpoint)["EndpointConfigName"]
        variants = sm.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"]
    except sm.exceptions.ClientError as e:
        if not is_missing(e):
            raise
        return []
    if all("ModelName" in v for v in variants):
        return []
    found = list_all(sm, "list_inference_components", "InferenceComponents", EndpointNameEquals=endpoint)
    return [c["InferenceComponentName"] for c in found]


def delete(
    clients: Clients,
    name: str,
    *,
    poll_s: float = 10,
    timeout_s: float = 900,
    sleep: Sleep = time.sleep,
    log: Log = print,
) -> None:
    """The endpoint's inference components first (their auto scaling, then each component, waited
    for until gone), then what scripts/sagemaker/endpoint.py's delete removes, the components'
    models included."""
    sm = clients.sagemaker
    components = components_of(sm, name)
    models = []
    for component in components:
        remove_target_scaling(clients.autoscaling, component_target(component).resource_id, log)
        spec = sm.describe_inference_component(InferenceComponentName=component).get("Specification", {})
        models += [spec["ModelName"]] if "ModelName" in spec else []
        sm.delete_inference_component(InferenceComponentName=component)
        log(f"deleting inference component {component}")
    for component in components:
        wait_gone(
            f"inference component {component}",
            lambda c=component: sm.describe_inference_component(InferenceComponentName=c),
            "InferenceComponentStatus",
            poll_s,
            timeout_s,
            sleep=sleep,
            log=log,
        )
    delete_endpoint(clients, name, poll_s=poll_s, timeout_s=timeout_s, sleep=sleep, log=log, models=models)
