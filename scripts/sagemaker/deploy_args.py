"""Deploy the image as a SageMaker endpoint (real-time or asynchronous) with auto scaling, run it as a
Batch Transform job, or delete what either made.

An endpoint: a model (image, ModelDataUrl, execution role, environment), an endpoint configuration
(one variant, GPU instance type by default), the endpoint; waits for InService, showing its status;
then registers the variant with Application Auto Scaling and puts a target-tracking policy on
SageMakerVariantInvocationsPerInstance (invocations per instance per minute).

    python -m scripts.sagemaker deploy --name multi-model \\
        --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG \\
        --model-data-url s3://BUCKET/multi-model/model.tar.gz --role-arn arn:aws:iam::ACCOUNT:role/ROLE
    python -m scripts.sagemaker deploy --name multi-model --delete

--async s3://BUCKET/async/ makes it asynchronous: answers go there, failures under failures/; the
container takes a request of up to 1 GiB and an hour (MAX_BODY_BYTES=1073741824, MODEL_SERVER_TIMEOUT=3600
unless --env says otherwise); auto scaling goes down to zero instances on the backlog
(ApproximateBacklogSizePerInstance) and back to one when requests wait with none running (a CloudWatch
alarm on HasBacklogWithoutCapacity). Call it with python -m scripts.caller invoke --async.

    python -m scripts.sagemaker deploy --name mm-async --async s3://BUCKET/async/ \\
        --image-uri ... --role-arn ...

--capture s3://BUCKET/capture/ records requests and answers (--capture-percent of them), JSON ones as text.

Several models the other ways SageMaker hosts them, from one archive per model (python -m
scripts.sagemaker package-models --per-model --upload s3://BUCKET/models/ writes <NAME>.tar.gz there):

--multi-model s3://BUCKET/models/ makes a multi-model endpoint (a CPU instance type: SageMaker runs
multi-model endpoints on GPUs only with its own Triton image): SageMaker loads NAME.tar.gz on its first
call and unloads models when memory runs short. Call it with python -m scripts.caller invoke
--target-model NAME.tar.gz.

    python -m scripts.sagemaker deploy --name mm-mme --multi-model s3://BUCKET/models/ \\
        --image-uri ... --role-arn ...

--inference-components s3://BUCKET/models/ with one --component NAME[:copies=N,gpus=G,memory=MB,...] per
model makes an endpoint of inference components (GPU instance types work): each model gets its own
copies, compute and auto scaling of copies (SageMakerInferenceComponentInvocationsPerCopy), on instances
that SageMaker adds and removes as the copies need them (between --min-capacity and --max-capacity).
Call one with python -m scripts.caller invoke --inference-component <name>-<NAME>.

    python -m scripts.sagemaker deploy --name mm-ic --inference-components s3://BUCKET/models/ \\
        --component resnet:copies=2 --component yolov5 --component bert_base:cpus=4,memory=8192 \\
        --max-capacity 4 --image-uri ... --role-arn ...

--delete removes the inference components (and their scaling), the scaling policies and target, the
alarm, the endpoint, its endpoint configuration and its models (and any configuration or model this
script left under that name after a failed deploy).

A Batch Transform job over the JSON Lines objects under --input (one envelope per line, see
`python -m scripts.sagemaker deploy transform --help`):

    python -m scripts.sagemaker deploy transform --name multi-model --input s3://BUCKET/requests/ \\
        --output s3://BUCKET/answers/ --image-uri ... --role-arn ... --delete-model
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from app.core.settings import ENDPOINT_NAME
from scripts.sagemaker import components as sagemaker_components
from scripts.sagemaker import metrics_cli
from scripts.sagemaker.endpoint import ASYNC_ENVIRONMENT, DEFAULT_ASYNC_CONCURRENCY
from scripts.sagemaker.resources import (
    add_container_arguments,
    add_wait_arguments,
    archives_prefix,
    check_container_arguments,
    int_range,
    is_accelerated,
    s3_uri,
)

ROLE_ENV = "SAGEMAKER_ROLE_ARN"
MULTI_MODEL_INSTANCE_TYPE = "ml.m5.2xlarge"  # 8 vCPUs, 32 GiB: room to keep several models loaded
PROG = "python -m scripts.sagemaker deploy"
TRANSFORM = "transform"
ENDPOINT = "endpoint"
TRANSFORM_HELP = """Run the image as a SageMaker Batch Transform job over the JSON Lines objects under --input.

Each input line is one envelope ({"modelname": ..., "payload": ...}); each answer object
(<input key>.out under --output) has one line per input line, in order. MaxPayloadInMB and
MaxConcurrentTransforms are what the container's GET /execution-parameters answers for the --env given
(MAX_BODY_BYTES, MAX_CONCURRENT_TRANSFORMS), unless the flags set them; without
MAX_CONCURRENT_TRANSFORMS the job leaves MaxConcurrentTransforms to the container on the instance.

    python -m scripts.sagemaker deploy transform --name multi-model --input s3://BUCKET/requests/ \\
        --output s3://BUCKET/answers/ --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG \\
        --role-arn arn:aws:iam::ACCOUNT:role/ROLE
    python -m scripts.sagemaker deploy transform --name multi-model --delete     # the models earlier runs left
"""


def _common(
    parser: argparse.ArgumentParser, no_wait_help: str, timeout_min: float, instance_type_note: str = ""
) -> None:
    add_container_arguments(parser, ROLE_ENV, os.environ.get(ROLE_ENV), instance_type_note)
    add_wait_arguments(parser, no_wait_help, poll_s=30, timeout_min=timeout_min)


def endpoint_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"{PROG} {TRANSFORM} --help: the flags of a Batch Transform job",
    )
    parser.add_argument(
        "--name", default="multi-model", help="endpoint name; model and configuration names derive from it"
    )
    parser.add_argument(
        "--delete",
        action="store_true",
        help="delete the endpoint and everything this script made for it (alarm included)",
    )
    _common(
        parser,
        "do not wait for InService (and skip auto scaling)",
        timeout_min=60,
        instance_type_note=f"; {MULTI_MODEL_INSTANCE_TYPE} with --multi-model",
    )
    parser.add_argument(
        "--health-check-timeout",
        type=int_range(60, 3600),
        default=600,
        help="ContainerStartupHealthCheckTimeoutInSeconds, 60..3600 (default: 600)",
    )
    parser.add_argument(
        "--download-timeout",
        type=int_range(60, 3600),
        default=600,
        help="ModelDataDownloadTimeoutInSeconds, 60..3600 (default: 600)",
    )
    parser.add_argument(
        "--async",
        dest="async_output",
        type=s3_uri,
        metavar="s3://BUCKET/PREFIX/",
        help="an asynchronous endpoint writing its answers there (failures under failures/), "
        "scaling down to zero instances",
    )
    parser.add_argument(
        "--max-concurrent-invocations",
        type=int_range(1, 1000),
        default=DEFAULT_ASYNC_CONCURRENCY,
        help=f"with --async: requests SageMaker sends one instance at a time (default: {DEFAULT_ASYNC_CONCURRENCY})",
    )
    parser.add_argument(
        "--capture",
        type=s3_uri,
        metavar="s3://BUCKET/PREFIX/",
        help="capture requests and answers there (data capture; JSON kept as text)",
    )
    parser.add_argument(
        "--capture-percent",
        type=int_range(0, 100),
        default=100,
        help="with --capture: the share of requests captured, 0..100 (default: 100)",
    )
    parser.add_argument(
        "--multi-model",
        type=archives_prefix,
        metavar="s3://BUCKET/PREFIX/",
        help="a multi-model endpoint serving the <NAME>.tar.gz archives under this prefix "
        "(python -m scripts.sagemaker package-models --per-model), each loaded on its first "
        "call; CPU instance types only; call with python -m scripts.caller invoke "
        "--target-model NAME.tar.gz",
    )
    parser.add_argument(
        "--no-model-cache",
        action="store_true",
        help="with --multi-model: ModelCacheSetting Disabled, every call loads its model anew "
        "(for many models, each called rarely)",
    )
    sagemaker_components.add_arguments(parser)
    parser.add_argument("--no-scaling", action="store_true", help="no auto scaling")
    parser.add_argument(
        "--min-capacity",
        type=int,
        help="auto scaling minimum instances (default: 1; 0 with --async); with "
        "--inference-components, the bounds of SageMaker's managed instance scaling",
    )
    parser.add_argument("--max-capacity", type=int, default=2, help="auto scaling maximum instances (default: 2)")
    parser.add_argument(
        "--invocations-per-instance",
        type=float,
        default=100.0,
        help="target invocations per instance per minute (default: 100)",
    )
    parser.add_argument(
        "--backlog-per-instance",
        type=float,
        default=5.0,
        help="with --async: target queued requests per instance (default: 5)",
    )
    parser.add_argument("--scale-in-cooldown", type=int, default=300, help="seconds (default: 300)")
    parser.add_argument("--scale-out-cooldown", type=int, default=60, help="seconds (default: 60)")
    metrics_cli.add_arguments(parser)
    parser.set_defaults(command=ENDPOINT, action="deploying")
    return parser


def transform_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} {TRANSFORM}", description=TRANSFORM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", default="multi-model", help="the job's and its model's names start with it")
    parser.add_argument("--delete", action="store_true", help="delete the models transform runs left under --name")
    parser.add_argument(
        "--input", type=s3_uri, metavar="s3://BUCKET/PREFIX/", help="the JSON Lines objects to transform"
    )
    parser.add_argument("--output", type=s3_uri, metavar="s3://BUCKET/PREFIX/", help="where the answers go")
    _common(parser, "start the job and return; follow it in the console", timeout_min=24 * 60)
    parser.add_argument(
        "--max-payload-mb",
        type=int_range(1, 100),
        help="MaxPayloadInMB (default: what the container answers for its --env)",
    )
    parser.add_argument(
        "--max-concurrent-transforms",
        type=int_range(1, 100),
        help="MaxConcurrentTransforms per instance (default: what the container answers for its --env)",
    )
    parser.add_argument("--delete-model", action="store_true", help="delete the job's model when the job has ended")
    parser.set_defaults(command=TRANSFORM, action="a transform job")
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [TRANSFORM]:
        parser = transform_parser()
        args = parser.parse_args(argv[1:])
        if not args.delete:
            _check_transform(parser, args)
        return args
    parser = endpoint_parser()
    args = parser.parse_args(argv)
    if not args.delete:
        _check_endpoint(parser, args)
    return args


def _check_endpoint(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.multi_model:
        _check_multi_model(parser, args)
    check_container_arguments(parser, args, ASYNC_ENVIRONMENT if args.async_output else None)
    # The endpoint's name on every access line: its per-model metrics' EndpointName dimension.
    given = args.environment.setdefault(ENDPOINT_NAME, args.name)
    if given != args.name:
        parser.error(f"--env {ENDPOINT_NAME}={given}: deploy sets it to the endpoint's name ({args.name})")
    sagemaker_components.check_arguments(parser, args)
    lowest = 0 if args.async_output else 1
    if args.min_capacity is None:
        args.min_capacity = lowest
    if not lowest <= args.min_capacity <= args.max_capacity:
        parser.error(f"need {lowest} <= --min-capacity <= --max-capacity")


def _check_multi_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    clashes = [
        flag
        for flag, given in (
            ("--model-data-url", args.model_data_url),
            ("--async", args.async_output),
            ("--inference-components", args.inference_components),
        )
        if given
    ]
    if clashes:
        parser.error(
            f"--multi-model does not go with {', '.join(clashes)} (its prefix is the model data; "
            "InvokeEndpointAsync has no TargetModel)"
        )
    args.instance_type = args.instance_type or MULTI_MODEL_INSTANCE_TYPE
    if is_accelerated(args.instance_type):
        parser.error(
            f"--multi-model on {args.instance_type}: SageMaker runs multi-model endpoints on GPU and "
            "accelerator instances only with AWS's own Triton image, not with this one. Use a CPU instance "
            f"type (e.g. {MULTI_MODEL_INSTANCE_TYPE}), or --inference-components to share GPU instances "
            "between the models"
        )


def _check_transform(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    missing = [flag for flag, value in (("--input", args.input), ("--output", args.output)) if not value]
    if missing:
        parser.error(f"a transform job needs {' and '.join(missing)}")
    if args.delete_model and args.no_wait:
        parser.error("--delete-model waits for the job's end: drop --no-wait")
    check_container_arguments(parser, args)
