"""build_and_push --dry-run prints the login, build, tag and push with the full ECR URI, running nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from moto import mock_aws

from app.core.settings import PROJECT_ROOT
from scripts.sagemaker import build_and_push

COMMAND = ("-m", "scripts.sagemaker", "build-and-push")
URI = "111122223333.dkr.ecr.eu-west-1.amazonaws.com/multi-model:v1"


@pytest.fixture
def aws_env(monkeypatch):
    for name in ("AWS_ACCOUNT_ID", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_dry_run_prints_login_build_tag_push(aws_env):
    env = {**os.environ, "AWS_ACCOUNT_ID": "111122223333", "AWS_REGION": "eu-west-1"}
    result = subprocess.run(
        [sys.executable, *COMMAND, "--dry-run", "--repository", "multi-model", "--tag", "v1"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 5
    login, repository, build, tag, push = lines
    assert login == (
        "aws ecr get-login-password --region eu-west-1 | docker login --username AWS "
        "--password-stdin 111122223333.dkr.ecr.eu-west-1.amazonaws.com"
    )
    assert "aws ecr create-repository --region eu-west-1 --repository-name multi-model" in repository
    assert build.startswith("docker build --platform linux/amd64 ") and "-t multi-model:v1" in build
    assert tag == f"docker tag multi-model:v1 {URI}"
    assert push == f"docker push {URI}"


def test_dry_run_runs_nothing_and_takes_the_account_from_sts(aws_env, monkeypatch, capsys):
    monkeypatch.setattr(build_and_push, "run_command", lambda command: pytest.fail(f"ran {command}"))
    with mock_aws():
        assert build_and_push.main(["--dry-run", "--region", "us-east-1", "--tag", "abc"]) == 0
    out = capsys.readouterr().out
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-multi-model-triton:abc"  # moto's account
    assert f"docker push {uri}" in out


def test_without_dry_run_each_command_runs_in_order(aws_env, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(build_and_push, "run_command", ran.append)
    assert (
        build_and_push.main(
            ["--account", "111122223333", "--region", "eu-west-1", "--repository", "multi-model", "--tag", "v1"]
        )
        == 0
    )
    assert [c.split()[0:2] for c in ran] == [
        ["aws", "ecr"],
        ["aws", "ecr"],
        ["docker", "build"],
        ["docker", "tag"],
        ["docker", "push"],
    ]
    assert f"pushed {URI}" in capsys.readouterr().out


def test_default_tag_is_the_commit():
    tag = build_and_push.default_tag()
    assert tag and " " not in tag


def test_the_flavor_picks_the_dockerfiles_base(aws_env, monkeypatch, capsys):
    monkeypatch.setattr(build_and_push, "run_command", lambda command: pytest.fail(f"ran {command}"))
    for flavor in ("gpu", "cpu"):
        argv = ["--dry-run", "--region", "eu-west-1", "--account", "111122223333", "--tag", "v1"]
        assert build_and_push.main([*argv, *(["--flavor", flavor] if flavor == "cpu" else [])]) == 0
        build = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("docker build"))
        assert f"--build-arg FLAVOR={flavor} " in build
