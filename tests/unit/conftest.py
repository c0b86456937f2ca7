"""The built repositories of every target, shared by the config tests (model and pipeline), the
boto3 clients that record what deploy sends to moto, and tiny decoder-only models (``causal_lms``)."""

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


class CausalLMs:
    """Tiny random-weight decoder-only models (vocabulary 256, width 32, 2 layers), each built the first
    time a test asks for it, seeded: a Hugging Face folder and its ``decoder.onnx``
    (``scripts.model_prep.causal_lm_graph``), with the PyTorch model to hold the graph's answers to."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict = {}

    @staticmethod
    def config(kind: str):
        import transformers

        shared = {"vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.1}
        decoder = {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
        }
        return {
            "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **shared),
            "llama": lambda: transformers.LlamaConfig(**decoder, **shared),
            "qwen2": lambda: transformers.Qwen2Config(**decoder, **shared),
            "qwen3": lambda: transformers.Qwen3Config(head_dim=8, **decoder, **shared),
            "mistral": lambda: transformers.MistralConfig(**decoder, **shared),
            "phi3": lambda: transformers.Phi3Config(pad_token_id=0, **decoder, **shared),
        }[kind]()

    def __call__(self, kind: str):
        """(folder, model): the folder holds config.json, generation_config.json and decoder.onnx."""
        if kind not in self.built:
            import torch
            from transformers import AutoModelForCausalLM

            from app.core.causal_lm_contract import GRAPH_FILE
            from scripts.model_prep.causal_lm_graph import export

            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(self.config(kind), attn_implementation="eager").eval()
            folder = self.root / kind
            model.save_pretrained(folder)
            export(model, folder / GRAPH_FILE)
            self.built[kind] = (folder, model)
        return self.built[kind]


@pytest.fixture(scope="session")
def causal_lms(tmp_path_factory) -> CausalLMs:
    return CausalLMs(tmp_path_factory.mktemp("causal-lms"))
