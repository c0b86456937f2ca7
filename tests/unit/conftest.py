"""The built repositories of every target, shared by the config tests (model and pipeline), and the
boto3 clients that record what deploy sends to moto."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from scripts.sagemaker import deploy
from tests.support import REGION, TARGETS, build_repository


@pytest.fixture(scope="session")
def repositories(tmp_path_factory) -> dict[str, Path]:
    """One repository per target, built once (ONNX exports come from the build/onnx cache)."""
    built = {}
    for target in TARGETS:
        built[target] = tmp_path_factory.mktemp(f"repository-{target}")
        build_repository(built[target], target)
    return built


@pytest.fixture
def sent(aws):
    """Real boto3 clients (moto behind them) that record every request's parameters."""
    calls: list[tuple[str, dict]] = []
    session = boto3.session.Session(region_name=REGION)
    clients = deploy.Clients(
        session.client("sagemaker"),
        session.client("application-autoscaling"),
        session.client("cloudwatch"),
        session.client("logs"),
    )
    for client in (clients.sagemaker, clients.autoscaling, clients.cloudwatch, clients.logs):
        client.meta.events.register(
            "provide-client-params.*.*", lambda params, model, **_: calls.append((model.name, dict(params)))
        )
    return clients, calls
