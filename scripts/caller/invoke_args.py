"""The command line of ``python -m scripts.caller invoke`` (its description: ``scripts.caller.invoke``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from scripts.caller import invoke_async
from scripts.sagemaker.resources import int_range, s3_uri

DEFAULT_TEXT = "The capital of France is [MASK]."
IMAGE_MODELS = ("resnet", "yolov5")
TEXT_MODELS = ("bert_base",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("calls", nargs="*", metavar="MODEL=FILE", help="a model and the file to send it")
    parser.add_argument("--endpoint-name", default="local", help="SageMaker endpoint (default: local)")
    parser.add_argument("--endpoint-url", help="e.g. http://localhost:8080: the local stack instead of SageMaker")
    parser.add_argument("--region", help="AWS region (default: the AWS configuration)")
    parser.add_argument("--image", type=Path, help=f"without MODEL=FILE: the image for {', '.join(IMAGE_MODELS)}")
    parser.add_argument(
        "--text",
        default=DEFAULT_TEXT,
        help=f"without MODEL=FILE: the text for {', '.join(TEXT_MODELS)} (default: {DEFAULT_TEXT!r})",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a model option sent in the custom attributes, e.g. topk=3 (repeatable)",
    )
    parser.add_argument(
        "--draw",
        type=Path,
        metavar="PATH.png",
        help="write each image model's answer drawn on its image (boxes, labels, scores; top-k; masks): "
        "JPEG for a name ending .jpg or .jpeg, else PNG",
    )
    parser.add_argument(
        "--target-model",
        metavar="NAME.tar.gz",
        help="a multi-model endpoint's model to call: its archive under the endpoint's prefix (TargetModel)",
    )
    parser.add_argument(
        "--inference-component",
        metavar="NAME",
        help="the inference component to call (InferenceComponentName; python -m scripts.sagemaker "
        "deploy --inference-components names them <endpoint>-<model>)",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="a text_generation model's answer streamed: each MODEL=FILE's text sent as "
        '{"modelname", "payload": {"text", "stream": true}} (with each --option), tokens printed as they arrive',
    )
    parser.add_argument(
        "--tools",
        type=Path,
        metavar="FILE.json",
        help="a text_generation model's function calling: each MODEL=FILE's text asked as an OpenAI chat body "
        "with these tools (a JSON list; each --option a field of the body), its text and calls printed",
    )
    parser.add_argument(
        "--json-schema",
        type=Path,
        metavar="FILE.json",
        help="a text_generation model's structured output: each MODEL=FILE's text sent in the envelope with "
        "this JSON Schema as payload.json_schema (each --option a field of the payload)",
    )
    parser.add_argument(
        "--async",
        dest="async_prefix",
        type=s3_uri,
        metavar="s3://BUCKET/PREFIX/",
        help="call an asynchronous endpoint: upload each body under this prefix, wait for the answer",
    )
    parser.add_argument(
        "--invocation-timeout",
        type=int_range(1, invoke_async.MAX_INVOCATION_TIMEOUT_S),
        default=invoke_async.DEFAULT_INVOCATION_TIMEOUT_S,
        help="with --async: InvocationTimeoutSeconds, how long the endpoint may work on one request, "
        f"1..{invoke_async.MAX_INVOCATION_TIMEOUT_S} "
        f"(default: {invoke_async.DEFAULT_INVOCATION_TIMEOUT_S})",
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=invoke_async.DEFAULT_WAIT_TIMEOUT_S,
        help="with --async: seconds to wait for each answer, queueing included "
        f"(default: {invoke_async.DEFAULT_WAIT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=invoke_async.DEFAULT_POLL_S,
        help=f"with --async: how often S3 is checked for the answer (default: {invoke_async.DEFAULT_POLL_S:g})",
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.stream and args.async_prefix:
        parser.error("--stream does not go with --async: an asynchronous endpoint writes its answer to S3 whole")
    if args.tools and (args.stream or args.async_prefix or not args.calls):
        parser.error(
            "--tools needs MODEL=FILE pairs (a text_generation model and a text file), not --stream or --async"
        )
    if args.stream and not args.calls:
        parser.error("--stream needs MODEL=FILE pairs: a text_generation model and a text file")
    if args.async_prefix and args.endpoint_url:
        parser.error("--async needs a SageMaker asynchronous endpoint: the local stack (--endpoint-url) has no queue")
    _check_route(parser, args)


def route(args: argparse.Namespace) -> dict[str, str]:
    """InvokeEndpoint's parameters that pick a model of the endpoint: TargetModel or InferenceComponentName."""
    chosen = {"TargetModel": args.target_model, "InferenceComponentName": args.inference_component}
    return {key: value for key, value in chosen.items() if value}


def _check_route(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.target_model and args.inference_component:
        parser.error(
            "--target-model (a multi-model endpoint) and --inference-component (an endpoint of inference "
            "components) do not go together"
        )
    flag = "--target-model" if args.target_model else "--inference-component" if args.inference_component else None
    if flag and args.async_prefix:
        parser.error(
            f"{flag} does not go with --async: InvokeEndpointAsync has no "
            f"{'TargetModel' if args.target_model else 'InferenceComponentName'} parameter"
        )
    if flag and not args.calls:
        parser.error(f"{flag} needs MODEL=FILE pairs: every call goes to that one model")
