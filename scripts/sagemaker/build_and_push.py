"""Build the serving image and push it to Amazon ECR.

Steps: log Docker in to the account's ECR registry, create the ECR repository if it is missing,
build the image, tag it with its ECR name, push it. Each step is one shell command (the AWS CLI and
Docker); --dry-run prints them without running anything. The account comes from --account,
$AWS_ACCOUNT_ID, or `sts get-caller-identity`; the region from --region, $AWS_REGION,
$AWS_DEFAULT_REGION or the AWS configuration.

    python -m scripts.sagemaker build-and-push --repository multi-model --tag v1
    python -m scripts.sagemaker build-and-push --dry-run
    python -m scripts.sagemaker build-and-push --repository multi-model --tag cpu-v1 --flavor cpu
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from app.core.settings import PROJECT_ROOT

DEFAULT_REPOSITORY = "sagemaker-multi-model-triton"


def registry_host(account: str, region: str) -> str:
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{domain}"


def image_uri(account: str, region: str, repository: str, tag: str) -> str:
    return f"{registry_host(account, region)}/{repository}:{tag}"


def resolve_region(explicit: str | None) -> str:
    region = explicit or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        import boto3

        region = boto3.session.Session().region_name
    if not region:
        raise SystemExit("build_and_push: no region: pass --region or set AWS_REGION")
    return region


def resolve_account(explicit: str | None, region: str, endpoint_url: str | None) -> str:
    account = explicit or os.environ.get("AWS_ACCOUNT_ID")
    if account:
        return account
    import boto3

    return boto3.client("sts", region_name=region, endpoint_url=endpoint_url).get_caller_identity()["Account"]


def default_tag() -> str:
    """The commit's short hash (with -dirty for uncommitted changes), else "latest"."""
    try:
        result = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except OSError:
        return "latest"
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else "latest"


def commands(
    account: str,
    region: str,
    repository: str,
    tag: str,
    platform: str,
    context: Path,
    dockerfile: Path,
    flavor: str = "gpu",
) -> list[tuple[str, str]]:
    """(step, shell command) in the order they run."""
    registry = registry_host(account, region)
    uri = image_uri(account, region, repository, tag)
    local = f"{repository}:{tag}"
    q = shlex.quote
    return [
        (
            "login",
            (
                f"aws ecr get-login-password --region {q(region)} | "
                f"docker login --username AWS --password-stdin {q(registry)}"
            ),
        ),
        (
            "repository",
            (
                f"aws ecr describe-repositories --region {q(region)} --repository-names {q(repository)} "
                f">/dev/null 2>&1 || aws ecr create-repository --region {q(region)} "
                f"--repository-name {q(repository)} --image-scanning-configuration scanOnPush=true"
            ),
        ),
        (
            "build",
            (
                f"docker build --platform {q(platform)} --build-arg FLAVOR={q(flavor)} -f {q(str(dockerfile))} "
                f"-t {q(local)} {q(str(context))}"
            ),
        ),
        ("tag", f"docker tag {q(local)} {q(uri)}"),
        ("push", f"docker push {q(uri)}"),
    ]


def run_command(command: str) -> None:
    subprocess.run(["bash", "-o", "pipefail", "-c", command], check=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.sagemaker build-and-push",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--repository", default=DEFAULT_REPOSITORY, help=f"ECR repository (default: {DEFAULT_REPOSITORY})"
    )
    parser.add_argument("--tag", help="image tag (default: the git commit, e.g. 3f2c20d or 3f2c20d-dirty)")
    parser.add_argument("--region", help="AWS region (default: $AWS_REGION, $AWS_DEFAULT_REGION, AWS config)")
    parser.add_argument("--account", help="AWS account id (default: $AWS_ACCOUNT_ID, else sts get-caller-identity)")
    parser.add_argument(
        "--platform", default="linux/amd64", help="image platform (default: linux/amd64, as SageMaker runs)"
    )
    parser.add_argument(
        "--context", type=Path, default=PROJECT_ROOT, help="build context (default: the repository root)"
    )
    parser.add_argument(
        "--flavor",
        choices=("gpu", "cpu"),
        default="gpu",
        help="the Dockerfile's FLAVOR: gpu (NGC Triton, GPU instances) or cpu (Debian and the pip Triton)",
    )
    parser.add_argument("--endpoint-url", help="AWS endpoint for the sts look-up (tests)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    region = resolve_region(args.region)
    account = resolve_account(args.account, region, args.endpoint_url)
    tag = args.tag or default_tag()
    steps = commands(
        account, region, args.repository, tag, args.platform, args.context, args.context / "Dockerfile", args.flavor
    )
    for number, (step, command) in enumerate(steps, 1):
        if args.dry_run:
            print(command)
            continue
        print(f"[{number}/{len(steps)}] {step}: {command}", flush=True)
        try:
            run_command(command)
        except subprocess.CalledProcessError as e:
            print(f"build_and_push: step {step!r} failed with exit status {e.returncode}", file=sys.stderr)
            return 1
    if not args.dry_run:
        print(f"pushed {image_uri(account, region, args.repository, tag)}")
    return 0
