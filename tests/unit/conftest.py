"""The built repositories of every target, shared by the config tests (model and pipeline), the
boto3 clients that record what deploy sends to moto, and the small decoder-only models by architecture
(``causal_lms``) with their graphs in ONNX Runtime (``graphs``)."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from scripts.model_prep.small_models.sets import Built
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


@pytest.fixture(scope="session")
def boto_session():
    """One boto3 session for every test's recording clients: it reads each service's model once
    (about 0.1 s a client), not once a test. moto is imported first: its handler, which answers
    in AWS's place while a test's mock is on, goes into the sessions made after it."""
    import moto  # noqa: F401

    return boto3.session.Session(region_name=REGION)


@pytest.fixture
def sent(aws, boto_session):
    """Real boto3 clients (moto behind them) that record every request's parameters."""
    calls: list[tuple[str, dict]] = []
    clients = deploy.Clients(
        boto_session.client("sagemaker"),
        boto_session.client("application-autoscaling"),
        boto_session.client("cloudwatch"),
        boto_session.client("logs"),
    )
    for client in (clients.sagemaker, clients.autoscaling, clients.cloudwatch, clients.logs):
        client.meta.events.register(
            "provide-client-params.*.*", lambda params, model, **_: calls.append((model.name, dict(params)))
        )
    return clients, calls


class CausalLMs:
    """The small-model set ``causal``'s tiny random-weight decoder-only models, by architecture: a folder
    with the Hugging Face files and the prepared ``decoder.onnx`` side by side, and the PyTorch model
    to hold the graph's answers to (loaded the first time a test asks for it)."""

    def __init__(self, small_models: Built, root: Path) -> None:
        self.small_models = small_models
        self.root = root
        self.built: dict = {}

    def __call__(self, kind: str):
        """(folder, model): the folder holds config.json, generation_config.json and decoder.onnx."""
        if kind not in self.built:
            from transformers import AutoModelForCausalLM

            from app.core.causal_lm_contract import GRAPH_FILE

            name = f"{kind}_random"
            source = self.small_models.models("causal") / name / "hf"
            folder = self.root / kind
            folder.mkdir()
            for path in source.iterdir():
                (folder / path.name).symlink_to(path)
            (folder / GRAPH_FILE).symlink_to(self.small_models.repository("causal") / name / "1" / GRAPH_FILE)
            self.built[kind] = (folder, AutoModelForCausalLM.from_pretrained(source).eval())
        return self.built[kind]


@pytest.fixture(scope="session")
def causal_lms(small_models: Built, tmp_path_factory) -> CausalLMs:
    return CausalLMs(small_models, tmp_path_factory.mktemp("causal-lms"))


@pytest.fixture(scope="module")
def graphs(causal_lms):
    """Each architecture's decoder graph in an ONNX Runtime session of one thread (the scheduler tests)."""
    from app.core.causal_lm_contract import ARCHITECTURES, GRAPH_FILE
    from app.triton.causal_lm_session import Graph, open_session

    return {kind: Graph(open_session(causal_lms(kind)[0] / GRAPH_FILE, 1)) for kind in ARCHITECTURES}
