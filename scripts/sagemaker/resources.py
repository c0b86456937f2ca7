"""What deploy's endpoint and Batch Transform paths share (``scripts.sagemaker.deploy``): the AWS
clients, the model (image, model data, role, container environment; a multi-model container too),
the status wait with its progress line, the wait for a deletion, the clean-up of models, and the
command-line value types."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.settings import Settings

DEFAULT_INSTANCE_TYPE = "ml.g4dn.xlarge"
# Instance families with GPUs (g, p) or AWS's accelerators (inf, trn): ml.<family><generation>.<size>.
ACCELERATED_FAMILIES = ("g", "p", "inf", "trn")
ARCHIVE_SUFFIX = ".tar.gz"  # one model's archive under a prefix: <prefix><name>.tar.gz

Log = Callable[[str], None]
Sleep = Callable[[float], None]


class DeployError(RuntimeError):
    """A condition the user can act on; main prints its text after "deploy: " and exits 1."""


@dataclass
class Clients:
    sagemaker: Any
    autoscaling: Any
    cloudwatch: Any = None  # alarms (scaling from zero, per model) and the per-model dashboard
    logs: Any = None  # CloudWatch Logs: the log groups and the per-model metric filters

    def __post_init__(self) -> None:
        # Clients not given are made in the SageMaker client's region.
        for name, service in (("cloudwatch", "cloudwatch"), ("logs", "logs")):
            if getattr(self, name) is None:
                import boto3

                setattr(self, name, boto3.client(service, region_name=self.sagemaker.meta.region_name))

    @property
    def region(self) -> str:
        return self.sagemaker.meta.region_name


def make_clients(region: str | None = None, endpoint_url: str | None = None) -> Clients:
    import boto3

    return Clients(
        *(
            boto3.client(service, region_name=region, endpoint_url=endpoint_url)
            for service in ("sagemaker", "application-autoscaling", "cloudwatch", "logs")
        )
    )


@dataclass(frozen=True)
class ContainerSpec:
    """The model SageMaker runs: the image, its model data, the execution role, the environment."""

    image_uri: str
    role_arn: str
    model_data_url: str | None = None  # with multi_model: the S3 prefix of the models' archives
    environment: dict[str, str] = field(default_factory=dict)
    multi_model: bool = False  # Mode MultiModel: SageMaker loads <prefix><TargetModel> on demand
    model_cache: bool = True  # with multi_model: keep loaded models (ModelCacheSetting)

    def create_model(self, sm, model_name: str) -> None:
        container: dict[str, Any] = {"Image": self.image_uri, "Environment": dict(self.environment)}
        if self.model_data_url:
            container["ModelDataUrl"] = self.model_data_url
        if self.multi_model:  # SageMaker itself sets SAGEMAKER_MULTI_MODEL=true in such a container
            container["Mode"] = "MultiModel"
            container["MultiModelConfig"] = {"ModelCacheSetting": "Enabled" if self.model_cache else "Disabled"}
        sm.create_model(ModelName=model_name, PrimaryContainer=container, ExecutionRoleArn=self.role_arn)


def is_accelerated(instance_type: str) -> bool:
    """True for an instance type with GPUs or AWS accelerators (ml.g4dn.xlarge, ml.p4d.24xlarge, ml.inf2.xlarge)."""
    family = instance_type.removeprefix("ml.").split(".")[0]
    return family.startswith(ACCELERATED_FAMILIES)


def timestamp() -> str:
    """The suffix that makes the names of one run unique (UTC, to the second)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def is_missing(error: Exception) -> bool:
    """SageMaker answers a missing resource with a ValidationException saying 'Could not find'."""
    response = getattr(error, "response", {}) or {}
    return "Could not find" in response.get("Error", {}).get("Message", "")


def list_all(client, operation: str, key: str, **kwargs) -> list[dict]:
    """Every item of a paginated list call (``operation``: boto3's name, "list_models"), all its pages
    fetched by the client's own paginator."""
    return [item for page in client.get_paginator(operation).paginate(**kwargs) for item in page.get(key, [])]


def delete_models(sm, names: Sequence[str], log: Log) -> None:
    """Delete each model that still exists."""
    for model_name in dict.fromkeys(names):
        try:
            sm.delete_model(ModelName=model_name)
        except sm.exceptions.ClientError as e:
            if not is_missing(e):
                raise
            continue
        log(f"deleted model {model_name}")


def models_named(sm, prefix: str) -> list[str]:
    """The models whose names start with ``prefix`` (what this script names ``<name>-<kind>-<stamp>``)."""
    return [
        m["ModelName"]
        for m in list_all(sm, "list_models", "Models", NameContains=prefix)
        if m["ModelName"].startswith(prefix)
    ]


def elapsed_text(seconds: float) -> str:
    return f"{int(seconds // 60)}m {int(seconds % 60):02d}s"


@dataclass(frozen=True)
class Watch:
    """How to follow one resource's status: ``describe()`` answers a dict with ``status_key``."""

    label: str  # "endpoint multi-model", "transform job multi-model-transform-..."
    describe: Callable[[], dict]
    status_key: str
    done: Collection[str]
    failed: Collection[str]
    logs: str  # where the container's logs are, named in a failure's message


def wait_for(watch: Watch, poll_s: float, timeout_s: float, sleep: Sleep = time.sleep, log: Log = print) -> dict:
    """Poll until the status is one of ``done`` (the description is returned), showing status and
    elapsed time on each poll; a ``failed`` status or the timeout is a DeployError."""
    start = time.monotonic()
    while True:
        described = watch.describe()
        status = described[watch.status_key]
        elapsed = time.monotonic() - start
        log(f"  {watch.label}: {status} ({elapsed_text(elapsed)})")
        if status in watch.done:
            return described
        if status in watch.failed:
            raise DeployError(
                f"{watch.label} is {status}: {described.get('FailureReason', 'no reason given')}"
                f" (the container's logs are in CloudWatch, {watch.logs})"
            )
        if elapsed > timeout_s:
            raise DeployError(f"{watch.label} not {'/'.join(watch.done)} after {timeout_s:.0f} s (still {status})")
        sleep(poll_s)


def wait_gone(
    label: str,
    describe: Callable[[], dict],
    status_key: str,
    poll_s: float,
    timeout_s: float,
    sleep: Sleep = time.sleep,
    log: Log = print,
) -> None:
    """Poll ``describe`` (showing the status) until SageMaker answers that ``label`` is not found."""
    from botocore.exceptions import ClientError

    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            status = describe()[status_key]
        except ClientError as e:
            if is_missing(e):
                log(f"deleted {label}")
                return
            raise
        log(f"  {label}: {status}")
        sleep(poll_s)
    raise DeployError(f"{label} still exists after {timeout_s:.0f} s")


# Command-line value types.


def environment_pairs(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def int_range(low: int, high: int):
    """An argparse type: an integer within low..high."""

    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value

    return parse


def split_s3(uri: str, form: str = "s3://BUCKET/KEY") -> tuple[str, str]:
    """s3://bucket/key -> (bucket, key); anything else is a ValueError naming ``form``."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket:
        raise ValueError(f"{uri!r} is not an {form} URL")
    return bucket, key


def s3_uri(text: str) -> str:
    """An argparse type: an s3://bucket/prefix URL."""
    try:
        split_s3(text, "s3://BUCKET/PREFIX")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def folder(uri: str) -> str:
    """An S3 prefix as a folder: with one trailing slash."""
    return uri.rstrip("/") + "/"


def archives_prefix(text: str) -> str:
    """An argparse type: the s3:// prefix holding one <name>.tar.gz per model, as a folder (trailing /)."""
    s3_uri(text)
    if text.endswith(ARCHIVE_SUFFIX):
        raise argparse.ArgumentTypeError(
            f"{text!r} is one archive: give the prefix holding the <name>{ARCHIVE_SUFFIX} "
            "archives (python -m scripts.sagemaker package-models --per-model "
            "--upload PREFIX)"
        )
    return folder(text)


def add_container_arguments(
    parser: argparse.ArgumentParser, role_env: str, role_default: str | None, instance_type_note: str = ""
) -> None:
    """The flags that describe the model and its instances, the same for an endpoint and a job;
    ``instance_type_note`` adds to --instance-type's help (another default in some mode)."""
    parser.add_argument("--image-uri", help="the ECR image (scripts/sagemaker/build_and_push.py prints it)")
    parser.add_argument(
        "--model-data-url",
        help="s3:// URL of model.tar.gz (scripts/sagemaker/package_models.py); "
        "without it the image's own models/ are served",
    )
    parser.add_argument("--role-arn", default=role_default, help=f"SageMaker execution role (default: ${role_env})")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="container environment, e.g. MODEL_SERVER_WORKERS=4 (repeatable)",
    )
    parser.add_argument("--instance-type", help=f"default: {DEFAULT_INSTANCE_TYPE}{instance_type_note}")
    parser.add_argument("--instance-count", type=int_range(1, 100), default=1, help="instances (default: 1)")


def add_wait_arguments(parser: argparse.ArgumentParser, no_wait_help: str, poll_s: float, timeout_min: float) -> None:
    parser.add_argument("--no-wait", action="store_true", help=no_wait_help)
    parser.add_argument(
        "--poll-seconds", type=float, default=poll_s, help=f"status poll interval (default: {poll_s:g})"
    )
    parser.add_argument(
        "--timeout-minutes",
        type=float,
        default=timeout_min,
        help=f"give up waiting after this long (default: {timeout_min:g})",
    )
    parser.add_argument("--region", help="AWS region (default: the AWS configuration)")
    parser.add_argument(
        "--endpoint-url",
        help="AWS endpoint for SageMaker, Application Auto Scaling, CloudWatch and CloudWatch Logs (tests)",
    )


def check_container_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace, defaults: Mapping[str, str] | None = None
) -> None:
    """--image-uri and --role-arn are needed; --env must be KEY=VALUE pairs that the container's
    settings accept. ``args.environment`` is then ``defaults`` overridden by what --env says."""
    missing = [flag for flag, value in (("--image-uri", args.image_uri), ("--role-arn", args.role_arn)) if not value]
    if missing:
        parser.error(f"{args.action} needs {' and '.join(missing)}")
    args.instance_type = args.instance_type or DEFAULT_INSTANCE_TYPE
    try:
        args.environment = {**(defaults or {}), **environment_pairs(args.env)}
        Settings.from_env(args.environment)  # what the container would refuse to start with
    except (argparse.ArgumentTypeError, ValueError) as e:
        parser.error(f"--env: {e}")


def container_spec(args: argparse.Namespace) -> ContainerSpec:
    return ContainerSpec(
        image_uri=args.image_uri,
        role_arn=args.role_arn,
        model_data_url=args.model_data_url,
        environment=args.environment,
    )
