"""Asynchronous inference for ``python -m scripts.caller invoke --async``: the body goes to S3,
InvokeEndpointAsync queues it, and SageMaker writes the answer (or the failure) to S3 later; this
waits for that object, showing the wait on stderr."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from scripts.sagemaker.resources import folder, split_s3

DEFAULT_INVOCATION_TIMEOUT_S = 900  # SageMaker's own default for InvocationTimeoutSeconds
MAX_INVOCATION_TIMEOUT_S = 3600
DEFAULT_WAIT_TIMEOUT_S = 1800.0  # room for an endpoint at zero instances to start one, then for the request
DEFAULT_POLL_S = 5.0
ACCEPT = "application/json"


class NoAnswer(Exception):
    """Neither the answer nor a failure appeared in time."""


@dataclass(frozen=True)
class Outcome:
    ok: bool  # the answer (OutputLocation), or the failure (FailureLocation)
    location: str
    body: bytes


def make_s3_client(region: str | None):
    import boto3

    return boto3.client("s3", region_name=region)


def input_location(prefix: str, model: str, suffix: str) -> str:
    """A new object under ``prefix`` for one request: <prefix>/<model>-<random id><suffix>."""
    return f"{folder(prefix)}{model}-{uuid.uuid4().hex}{suffix}"


def submit(
    runtime, s3, endpoint: str, location: str, body: bytes, ctype: str, attributes: str, invocation_timeout_s: int
) -> dict:
    """Upload the body to ``location`` and queue it: InvokeEndpointAsync's answer (OutputLocation,
    FailureLocation, InferenceId)."""
    bucket, key = split_s3(location)
    s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=ctype)
    return runtime.invoke_endpoint_async(
        EndpointName=endpoint,
        InputLocation=location,
        ContentType=ctype,
        Accept=ACCEPT,
        CustomAttributes=attributes,
        InvocationTimeoutSeconds=invocation_timeout_s,
    )


def read_if_there(s3, uri: str) -> bytes | None:
    bucket, key = split_s3(uri)
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def show(text: str, end: bool = False) -> None:
    """One progress line on stderr, rewritten in place on a terminal."""
    if sys.stderr.isatty():
        print(f"\r{text}\033[K", end="\n" if end else "", file=sys.stderr, flush=True)
    else:
        print(text, file=sys.stderr, flush=True)


def wait_for_answer(
    s3,
    output: str,
    failure: str | None,
    *,
    label: str,
    timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    poll_s: float = DEFAULT_POLL_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[..., None] = show,
) -> Outcome:
    """Poll for the answer object, or the failure object, until one appears or ``timeout_s`` passes."""
    start = clock()
    while True:
        elapsed = clock() - start
        for ok, location in ((True, output), (False, failure)):
            body = read_if_there(s3, location) if location else None
            if body is not None:
                progress(f"  {label}: {'answer' if ok else 'failure'} at {location} after {elapsed:.0f} s", end=True)
                return Outcome(ok, location, body)
        if elapsed >= timeout_s:
            progress(f"  {label}: gave up after {elapsed:.0f} s", end=True)
            raise NoAnswer(
                f"no answer at {output} after {timeout_s:g} s (--wait-timeout): the request may still "
                "be queued (an endpoint at zero instances takes minutes to start one) or running"
            )
        progress(f"  {label}: waiting for {output} ({elapsed:.0f} s)")
        sleep(poll_s)
